"""Resampling of Tensor: `interpolate` with PyTorch's modes (F.interpolate).

Every mode resizes the spatial axes one at a time (all of them are separable): nearest and
nearest-exact pick one source sample, the linear modes blend two, bicubic blends four with Keys'
cubic convolution (A = -0.75, PyTorch's), area averages the source cells each output cell covers
(adaptive average pooling). The source samples are the spec's one-hot gathers (`take`), which
compile to direct gated loads; area is one weighted reduce over the axis. Source indices follow
PyTorch's rules and are computed in float32 like PyTorch's CPU kernels.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from unigrad.dtype import dtypes
from unigrad.frontend.nnops import int_tuple, take

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear",
                     "area")
CUBIC_A = -0.75  # Keys' cubic convolution parameter, as in PyTorch


def _trailing(x: Tensor, axis: int, out: int) -> tuple[int, ...]:
  """The shape that lays a length-`out` vector along `axis` (negative) of x."""
  return (out, *[1] * (-axis - 1))


def _nearest(x: Tensor, axis: int, out: int, scale: float, exact: bool) -> Tensor:
  size, cls = x.shape[axis], type(x)
  if out == size: return x
  dst = cls.arange(out, dtype=dtypes.float32, device=x.device)
  src = dst.add(0.5) if exact else dst
  return take(x, axis, src.mul(scale).floor().cast(dtypes.int64).minimum(size - 1))


def _source(x: Tensor, out: int, scale: float, align_corners: bool, clamp: bool) -> Tensor:
  """PyTorch's area_pixel_compute_source_index: the real source coordinate of each output."""
  dst = type(x).arange(out, dtype=dtypes.float32, device=x.device)
  if align_corners: return dst.mul(scale)
  real = dst.add(0.5).mul(scale).sub(0.5)
  return real.maximum(0) if clamp else real


def _linear(x: Tensor, axis: int, out: int, scale: float, align_corners: bool) -> Tensor:
  size = x.shape[axis]
  real = _source(x, out, scale, align_corners, clamp=True)
  i0 = real.floor().cast(dtypes.int64).minimum(size - 1)
  lam = (real - i0.cast(dtypes.float32)).clamp(0, 1).reshape(_trailing(x, axis, out)).cast(x.dtype)
  return take(x, axis, i0) * (1 - lam) + take(x, axis, (i0 + 1).minimum(size - 1)) * lam


def _cubic_weights(t: Tensor) -> list[Tensor]:
  """Keys' weights of the samples at offsets -1, 0, 1, 2 from floor(real), t = real - floor."""
  a = CUBIC_A
  def near(d: Tensor) -> Tensor: return ((a + 2) * d - (a + 3)) * d * d + 1  # |d| <= 1
  def far(d: Tensor) -> Tensor: return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # 1 < |d| < 2
  return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic(x: Tensor, axis: int, out: int, scale: float, align_corners: bool) -> Tensor:
  size = x.shape[axis]
  real = _source(x, out, scale, align_corners, clamp=False)
  fl = real.floor()
  weights = _cubic_weights(real - fl)
  i0 = fl.cast(dtypes.int64)
  acc: Tensor | None = None
  for k, w in zip((-1, 0, 1, 2), weights):
    sample = take(x, axis, (i0 + k).maximum(0).minimum(size - 1))
    term = sample * w.reshape(_trailing(x, axis, out)).cast(x.dtype)
    acc = term if acc is None else acc + term
  assert acc is not None
  return acc


def _area(x: Tensor, axis: int, out: int) -> Tensor:
  """Adaptive average pooling along `axis`: output o averages source cells
  [floor(o * n / out), ceil((o + 1) * n / out))."""
  size, cls, dev = x.shape[axis], type(x), x.device
  o = cls.arange(out, device=dev).reshape(out, 1)
  i = cls.arange(size, device=dev).reshape(1, size)
  start, end = (o * size) // out, ((o + 1) * size + out - 1) // out
  weight = ((i >= start) & (i < end)).where(1.0 / (end - start).cast(dtypes.float32), 0.0)
  weight = weight.cast(x.dtype).reshape(out, size, *[1] * (-axis - 1))
  return (x.unsqueeze(axis - 1) * weight).sum(axis, dtype=x.dtype)


def _resize_axis(x: Tensor, axis: int, out: int, scale: float, mode: str,
                 align_corners: bool) -> Tensor:
  """x resized along `axis` (negative) to `out` samples by `mode`."""
  if mode.startswith("nearest"): return _nearest(x, axis, out, scale, mode == "nearest-exact")
  if mode == "bicubic": return _bicubic(x, axis, out, scale, align_corners)
  if mode == "area": return _area(x, axis, out)
  return _linear(x, axis, out, scale, align_corners)


def _check_mode(x: Tensor, mode: str, n: int, align_corners: bool | None) -> None:
  if mode not in INTERPOLATE_MODES:
    raise NotImplementedError(f"interpolate mode {mode!r}: supported are {INTERPOLATE_MODES}")
  if align_corners is not None and (mode.startswith("nearest") or mode == "area"):
    raise ValueError("align_corners option can only be set with the interpolating modes: "
                     "linear | bilinear | bicubic | trilinear")
  if mode in ("bicubic", "area") and not dtypes.is_float(x.dtype):
    raise NotImplementedError(f"interpolate mode {mode!r} is not implemented for {x.dtype!r} "
                              "(PyTorch's neither): cast to a float dtype")
  if mode == "bicubic" and (x.ndim != 4 or n != 2):
    raise NotImplementedError(f"Input Error: bicubic needs a 4D input with 2 spatial sizes, got "
                              f"shape {x.shape}")


def _output_sizes(ins: Sequence[int], n: int, size: int | Sequence[int] | None,
                  scale_factor: float | Sequence[float] | None
                  ) -> tuple[tuple[int, ...], list[float | None]]:
  if size is not None: return int_tuple(size, n, "size"), [None] * n
  assert scale_factor is not None
  sf = (scale_factor,) * n if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
  if len(sf) != n: raise ValueError(f"scale_factor must have {n} values, got {scale_factor}")
  return tuple(int(math.floor(i * f)) for i, f in zip(ins, sf)), [1 / f for f in sf]


class ResampleMixin:
  """interpolate."""

  def interpolate(self, size: int | Sequence[int] | None = None,
                  scale_factor: float | Sequence[float] | None = None, mode: str = "nearest",
                  align_corners: bool | None = None) -> Tensor:
    """Resize the trailing spatial axes (all but N, C for an int size), PyTorch's
    F.interpolate with mode 'nearest', 'nearest-exact', 'linear', 'bilinear', 'bicubic',
    'trilinear' or 'area'. `Tensor.ones(1, 1, 2, 2).interpolate(size=(4, 4), mode="bicubic")`"""
    x: Tensor = self  # type: ignore[assignment]
    if (size is None) == (scale_factor is None):
      raise ValueError("exactly one of size or scale_factor should be defined")
    spec = size if size is not None else scale_factor
    n = len(spec) if isinstance(spec, (tuple, list)) else x.ndim - 2
    if n < 1 or n > x.ndim:
      raise ValueError(f"interpolate: cannot resize {n} spatial axes of shape {x.shape}")
    _check_mode(x, mode, n, align_corners)
    ins = x.shape[x.ndim - n:]
    outs, scales = _output_sizes(ins, n, size, scale_factor)
    if not mode.startswith("nearest") and not dtypes.is_float(x.dtype): x = x.float()
    for j in range(n):
      i, o = ins[j], outs[j]
      if align_corners: scale = (i - 1) / (o - 1) if o > 1 else 0.0
      else: scale = scales[j] if scales[j] is not None else i / o
      x = _resize_axis(x, j - n, o, scale, mode, bool(align_corners))
    return x
