"""Resize (and the older Upsample): every mode and coordinate transformation.

Each resized axis is one step. Shapes are static, so the source coordinate of every output index
is computed on the host (numpy): for 'nearest' an index gather, for 'linear' and 'cubic' a
(out, in) matrix of interpolation weights (antialiasing and exclude_outside included) applied by
a matmul along the axis; tf_crop_and_resize's points outside the input take extrapolation_value.
"""
from __future__ import annotations

import math
from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, check, dtypes, np, op, tensor, value_of

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@check("Resize", "Upsample")
def check_resize(n: Node) -> str | None:
  mode = n.attr("mode", "nearest")
  if mode in ("bilinear", "trilinear") and n.op_type == "Upsample": return None
  if mode not in MODES: return f"mode {mode!r} is not one of {list(MODES)}"
  ct = n.attr("coordinate_transformation_mode", "half_pixel")
  if ct not in TRANSFORMS: return f"coordinate_transformation_mode {ct!r} is not supported"
  nm = n.attr("nearest_mode", "round_prefer_floor")
  return None if nm in NEAREST else f"nearest_mode {nm!r} is not one of {list(NEAREST)}"


def _source(ct: str, o: np.ndarray, scale: float, i: int, out: int, roi: tuple[float, float]
            ) -> np.ndarray:
  """The input coordinate of output index `o` along an axis (ONNX measures the output as
  i * scale, not as its rounded size, where the two differ)."""
  width = scale * i
  if ct == "half_pixel": return (o + 0.5) / scale - 0.5
  if ct == "half_pixel_symmetric":
    off = i / 2 * (1 - out / width)
    return off + (o + 0.5) / scale - 0.5
  if ct == "pytorch_half_pixel": return (o + 0.5) / scale - 0.5 if width != 1 else o * 0 - 0.5
  if ct == "align_corners": return o * (i - 1) / (width - 1) if width != 1 else o * 0.0
  if ct == "asymmetric": return o / scale
  if ct == "tf_half_pixel_for_nn": return (o + 0.5) / scale
  start, end = roi  # tf_crop_and_resize
  if width == 1: return o * 0 + (end - start) * (i - 1) / 2 + start * (i - 1)
  return o * (end - start) * (i - 1) / (width - 1) + start * (i - 1)


def _nearest_index(x: np.ndarray, mode: str, i: int) -> np.ndarray:
  if mode == "round_prefer_floor": r = np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x))
  elif mode == "round_prefer_ceil": r = np.where(x - np.floor(x) == 0.5, np.ceil(x), np.round(x))
  elif mode == "floor": r = np.floor(x)
  else: r = np.ceil(x)
  return np.clip(r, 0, i - 1).astype(np.int64)


def _cubic(s: np.ndarray, a: float) -> np.ndarray:
  s = np.abs(s)
  return np.where(s <= 1, ((a + 2) * s - (a + 3)) * s * s + 1,
                  np.where(s < 2, ((a * s - 5 * a) * s + 8 * a) * s - 4 * a, 0.0))


def _coeffs(mode: str, ratio: float, scale: float, a: float, antialias: bool) -> np.ndarray:
  """The interpolation taps' weights for a point `ratio` in (0, 1] past the tap before it."""
  if not antialias:
    if mode == "linear": return np.array([1 - ratio, ratio])
    return _cubic(np.array([ratio + 1, ratio, 1 - ratio, 2 - ratio]), a)
  s = min(scale, 1.0)
  start = int(np.floor((-1 if mode == "linear" else -2) / s) + 1)
  stop = (2 - 2 * start + start) if mode == "linear" else 2 - start
  args = (np.arange(start, stop) - ratio) * s
  c = np.clip(1 - np.abs(args), 0, 1) if mode == "linear" else _cubic(args, a)
  return c / c.sum()


def _weights(n: Node, mode: str, x: np.ndarray, i: int, scale: float) -> np.ndarray:
  """(out, in) interpolation weights for source coordinates `x`: the taps nearest each point
  (edge values past the ends; with exclude_outside, those taps dropped and the rest rescaled)."""
  antialias = bool(n.attr("antialias", 0)) and scale < 1
  a = n.attr("cubic_coeff_a", -0.75)
  w = np.zeros((len(x), i))
  for row, xo in enumerate(x):
    ratio = 1.0 if float(xo).is_integer() else xo - np.floor(xo)
    c = _coeffs(mode, ratio, scale, a, antialias)
    taps = int(np.ceil(xo)) - len(c) // 2 + np.arange(len(c))
    if n.attr("exclude_outside", 0):
      c = np.where((taps >= 0) & (taps < i), c, 0.0)
      c = c / c.sum() if c.sum() else c
    np.add.at(w[row], np.clip(taps, 0, i - 1), c)
  return w


def _repeat_each(t: Tensor, axis: int, k: int) -> Tensor:
  """Each element along `axis` repeated k times in place (nearest upsampling by k)."""
  shape = list(t.shape)
  wide = t.unsqueeze(axis + 1).expand(*shape[:axis + 1], k, *shape[axis + 1:])
  return wide.reshape(*shape[:axis], shape[axis] * k, *shape[axis + 1:])


def _resize_axis(n: Node, t: Tensor, axis: int, out: int, scale: float,
                 roi: tuple[float, float]) -> Tensor:
  i = t.shape[axis]
  mode = n.attr("mode", "nearest")
  mode = "linear" if mode in ("bilinear", "trilinear") else mode
  ct = n.attr("coordinate_transformation_mode", "half_pixel")
  x = _source(ct, np.arange(out, dtype=np.float64), scale, i, out, roi)
  outside = (x < 0) | (x > i - 1) if ct == "tf_crop_and_resize" else np.zeros(out, bool)
  if mode == "nearest":
    idx = _nearest_index(x, n.attr("nearest_mode", "round_prefer_floor"), i)
    if out % i == 0 and np.array_equal(idx, np.arange(out) // (out // i)):
      return _repeat_each(t, axis, out // i)  # an integer upsampling: a view, no gather
    moved = t.permute(axis, *[k for k in range(t.ndim) if k != axis])
    res = moved[Tensor(idx, device=t.device)]
    res = res.permute(*range(1, axis + 1), 0, *range(axis + 1, t.ndim))
    w_out = None
  else:
    w = _weights(n, mode, x, i, scale)
    f = t if dtypes.is_float(t.dtype) else t.float()
    moved = f.permute(*[k for k in range(t.ndim) if k != axis], axis)
    wt = Tensor(w.T.astype(np.float32), device=t.device).cast(f.dtype)
    res = (moved @ wt).permute(*range(axis), t.ndim - 1, *range(axis, t.ndim - 1))
    w_out = f.dtype
  if outside.any():
    shp = [1] * t.ndim
    shp[axis] = out
    mask = Tensor(outside.reshape(shp), device=t.device)
    res = mask.where(n.attr("extrapolation_value", 0.0), res)
  return res.cast(t.dtype) if w_out is not None and w_out != t.dtype else res


def _sizes(n: Node, t: Tensor, scales: Any, sizes: Any) -> tuple[list[int], list[float],
                                                                   list[int]]:
  axes = n.attr("axes", None) or list(range(t.ndim))
  axes = [a + t.ndim if a < 0 else a for a in axes]
  ins = [t.shape[a] for a in axes]
  if sizes is not None and value_of(n, sizes, "sizes").size:
    outs = [int(v) for v in value_of(n, sizes, "sizes").reshape(-1)]
    policy = n.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
      pick = min if policy == "not_larger" else max
      s = pick(o / i for o, i in zip(outs, ins))
      outs = [int(math.floor(s * i + 0.5)) for i in ins]
      return axes, [s] * len(axes), outs
    return axes, [o / i for o, i in zip(outs, ins)], outs
  sc = [float(v) for v in value_of(n, scales, "scales").reshape(-1)]
  return axes, sc, [int(math.floor(i * s)) for i, s in zip(ins, sc)]


@op("Resize")
def resize(n: Node, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None) -> Tensor:
  t = tensor(n, x)
  if n.opset < 11: scales, roi = roi, None
  axes, sc, outs = _sizes(n, t, scales, sizes)
  r = value_of(n, roi, "roi").reshape(-1).tolist() if roi is not None and \
    value_of(n, roi, "roi").size else [0.0] * len(axes) + [1.0] * len(axes)
  for j, (a, s, o) in enumerate(zip(axes, sc, outs)):
    if o == t.shape[a] and s == 1.0 and n.attr("coordinate_transformation_mode") != \
        "tf_crop_and_resize": continue
    t = _resize_axis(n, t, a, o, s, (r[j], r[j + len(axes)]))
  return t


@op("Upsample")
def upsample(n: Node, x: Any, scales: Any = None) -> Tensor:
  t = tensor(n, x)
  sc = [float(v) for v in (value_of(n, scales, "scales").reshape(-1) if scales is not None
                           else n.attr("scales"))]
  node = Node("Resize", "", 13, n.name, [], [], {
    "mode": n.attr("mode", "nearest"), "coordinate_transformation_mode": "asymmetric",
    "nearest_mode": "floor"}, n.device, n.eager)
  return resize(node, t, None, np.array(sc, dtype=np.float32), None)
