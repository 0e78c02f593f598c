"""Strides of Tensor (PyTorch's memory model on unigrad's lazy graph): stride, storage_offset,
is_contiguous and as_strided.

A tensor is a *strided view* when its graph is movement ops over a realized BUFFER that one View
with no mask and no negative stride expresses (`strided_view_of`: a transpose, slice, broadcast
or reshape of a buffer): then its strides, storage offset and storage (for as_strided, numpy and
DLPack export) are the buffer's, and reading it runs no kernel. Every other tensor is computed
into a fresh row-major buffer when realized, so it reports row-major strides and its own values
are its storage. `strided(flat, shape, strides, offset)` builds any strided reading of a 1-D
tensor from movement ops (reshape, pad, shrink, expand, permute, flip), so the result stays lazy
and differentiable.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unigrad.frontend.movement import canonical_axis
from unigrad.schedule.callify import is_plain_buffer
from unigrad.shape import View, view_chain
from unigrad.uop import Ops, UOp, sint

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


@dataclass(frozen=True)
class StridedView:
  """A tensor's reading of a buffer: `storage` is the buffer's node as the tensor's graph holds
  it (a BUFFER, or the reshaped BUFFER a leaf tensor holds, so gradients reach that leaf)."""
  storage: UOp
  buffer: UOp  # the BUFFER node itself
  view: View

  @property
  def strides(self) -> tuple[int, ...]: return tuple(int(s) for s in self.view.strides)

  @property
  def offset(self) -> int: return int(self.view.offset)


def strided_view_of(u: UOp) -> StridedView | None:
  """How `u` reads its buffer, when it is a strided view (see the module docstring)."""
  if isinstance(u.device, tuple): return None
  base, tracker = view_chain(u)
  if base.op is not Ops.BUFFER or len(tracker.views) != 1: return None
  v = tracker.views[0]
  ints = (*v.shape, *v.strides, v.offset, *base.shape)
  if v.mask is not None or not all(isinstance(x, int) for x in ints): return None
  if any(s < 0 for s in v.strides): return None
  storage = u
  while not is_plain_buffer(storage): storage = storage.src[0]
  return StridedView(storage, base, v)


def torch_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
  """Strides as PyTorch reports them: a size-1 axis (where any stride reads the same) gets the
  stride of the row-major layout of the axes after it, as `unsqueeze` and `contiguous` give."""
  out = list(strides)
  for k in reversed(range(len(shape))):
    if shape[k] == 1: out[k] = out[k + 1] * max(shape[k + 1], 1) if k + 1 < len(shape) else 1
  return tuple(out)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
  """PyTorch's row-major strides (a size-0 axis counts as 1)."""
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= max(s, 1)
  return tuple(reversed(out))


def is_contiguous_layout(shape: Sequence[int], strides: Sequence[int]) -> bool:
  """PyTorch's rule: row-major, ignoring size-1 axes; an empty tensor is contiguous."""
  if any(s == 0 for s in shape): return True
  return all(st == c for s, st, c in zip(shape, strides, contiguous_strides(shape)) if s != 1)


# ---- any strided reading of a 1-D tensor, from movement ops ----

def strided(flat: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int) -> Tensor:
  """Element `i` of the result is `flat[offset + sum(i_k * strides[k])]` (the caller checks the
  bounds). Negative strides read backwards (flip), zero strides broadcast (expand); strides that
  nest (slices, transposes of a buffer) become one reshape and shrink, any others overlapping
  windows (expand, reshape, pad, shrink per axis)."""
  shape, steps = list(shape), list(strides)
  if any(s == 0 for s in shape): return flat.shrink(((0, 0),)).reshape(shape)
  flips = []
  for k, n in enumerate(shape):
    if n == 1: steps[k] = 0
    if steps[k] < 0:
      offset, steps[k] = offset + steps[k] * (n - 1), -steps[k]
      flips.append(k)
  live = sorted((k for k in range(len(shape)) if steps[k]), key=lambda k: -steps[k])
  sizes, live_steps = [shape[k] for k in live], [steps[k] for k in live]
  x = _nested(flat, sizes, live_steps, offset)
  if x is None: x = _windows(flat, sizes, live_steps, offset)
  x = x.permute([live.index(k) for k in sorted(live)]) if live else x
  x = x.reshape([shape[k] if steps[k] else 1 for k in range(len(shape))]).expand(shape)
  return x.flip(*flips) if flips else x


def _segment(flat: Tensor, start: int, length: int) -> Tensor:
  """flat[start:start+length], padded past flat's end (those positions are never read)."""
  end = min(start + length, flat.shape[0])
  seg = flat.shrink(((start, end),))
  return seg.pad(((0, start + length - end),)) if start + length > end else seg


def _nested(flat: Tensor, sizes: list[int], steps: list[int], offset: int) -> Tensor | None:
  """Strides (descending) that each divide the one before and do not overlap: one segment of
  the buffer reshaped to (n0, s0/s1, ..., s_last) and shrunk to the sizes."""
  if not sizes: return _segment(flat, offset, 1).reshape(())
  pairs = list(zip(steps, steps[1:]))
  if any(a % b or a < b * n for (a, b), n in zip(pairs, sizes[1:])): return None
  dims = [sizes[0], *(a // b for a, b in pairs), steps[-1]]
  x = _segment(flat, offset, sizes[0] * steps[0]).reshape(dims)
  x = x.shrink(tuple((0, n) for n in (*sizes, 1)))
  return x.reshape(sizes)


def _windows(flat: Tensor, sizes: list[int], steps: list[int], offset: int) -> Tensor:
  """Any strides: per axis, n copies of the remaining span read from rows of length span+step
  (row i starts i*step further into the data), keeping the first span-(n-1)*step elements."""
  span = sum((n - 1) * s for n, s in zip(sizes, steps)) + 1
  x = _segment(flat, offset, span)
  lead: list[int] = []
  for n, s in zip(sizes, steps):
    x = x.reshape(*lead, 1, span).expand(*lead, n, span).reshape(*lead, n * span)
    x = x.pad(((0, 0),) * len(lead) + ((0, n * s),)).reshape(*lead, n, span + s)
    x = x.shrink(tuple((0, d) for d in (*lead, n)) + ((0, span - (n - 1) * s),))
    lead, span = [*lead, n], span - (n - 1) * s
  return x.reshape(sizes)


# ---- argument checks (PyTorch's messages and types) ----

def _int_list(x: Any, what: str) -> list[int]:
  if isinstance(x, int) and not isinstance(x, bool): return [x]
  if not isinstance(x, (tuple, list)) or any(isinstance(v, bool) or not hasattr(v, "__index__")
                                             for v in x):
    raise TypeError(f"as_strided(): argument '{what}' must be tuple of ints, got {x!r}")
  return [operator.index(v) for v in x]


def _check_as_strided(size: list[int], stride: list[int], offset: int) -> None:
  if len(size) != len(stride): raise RuntimeError("mismatch in length of strides and shape")
  if any(s < 0 for s in stride):
    raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got "
                       f"strides: {stride}")
  if any(n < 0 for n in size):
    raise RuntimeError(f"as_strided: negative dimension in size {size}")
  if offset < 0: raise RuntimeError(f"Tensor: invalid storage offset {offset}")


class StridedMixin:
  """stride, storage_offset, is_contiguous and as_strided (see the module docstring)."""
  uop: UOp

  @property
  def shape(self) -> tuple[sint, ...]: raise NotImplementedError

  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError

  def stride(self, dim: int | None = None) -> Any:
    """The strides in elements, like PyTorch's: a strided view of a buffer reports how it reads
    the buffer, any other tensor the row-major layout it is computed into. `x.T.stride()`"""
    from_view = strided_view_of(self.uop)
    shape = self._concrete_shape("stride")
    if from_view is None or math.prod(shape) == 0: strides = contiguous_strides(shape)
    else: strides = torch_strides(shape, from_view.strides)
    if dim is None: return strides
    if not shape: raise IndexError("stride: a 0-d tensor has no dimensions")
    return strides[canonical_axis(dim, len(shape))]

  def storage_offset(self) -> int:
    """The position of element 0 in its storage (non-zero for a slice of a buffer)."""
    from_view = strided_view_of(self.uop)
    return from_view.offset if from_view else 0

  def is_contiguous(self) -> bool:
    """Whether the elements are in row-major order in storage (PyTorch's rule: size-1 axes
    and empty tensors aside)."""
    shape = self._concrete_shape("is_contiguous")
    return is_contiguous_layout(shape, self.stride())

  def _concrete_shape(self, what: str) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in self.shape):
      raise RuntimeError(f"{what} needs a concrete shape, got the symbolic shape {self.shape}")
    return tuple(int(s) for s in self.shape)

  def as_strided(self, size: Any, stride: Any, storage_offset: int | None = None) -> Tensor:
    """A view of this tensor's storage with the given sizes, strides and offset, like PyTorch's
    (the storage is the buffer a strided view reads, else this tensor's own row-major values).
    No copy: the result is movement ops, lazy and differentiable. Out-of-bounds reads raise
    RuntimeError. `Tensor.arange(16).as_strided((4,), (5,))` is the diagonal of a 4x4."""
    dims, steps = _int_list(size, "size"), _int_list(stride, "stride")
    if storage_offset is not None and (isinstance(storage_offset, bool) or
                                       not hasattr(storage_offset, "__index__")):
      raise TypeError(f"as_strided(): argument 'storage_offset' must be int, not "
                      f"{type(storage_offset).__name__}")
    numel = math.prod(self._concrete_shape("as_strided"))
    sv = strided_view_of(self.uop)
    flat_uop = sv.storage if sv else self.uop
    storage = self._wrap(flat_uop).reshape(int(sv.buffer.shape[0]) if sv else numel)
    offset = operator.index(storage_offset) if storage_offset is not None else (
      sv.offset if sv else 0)
    _check_as_strided(dims, steps, offset)
    itemsize = self.uop.dtype.itemsize
    need = offset + sum((n - 1) * s for n, s in zip(dims, steps)) + 1 if all(dims) else 0
    if need > storage.shape[0]:
      raise RuntimeError(f"setStorage: sizes {dims}, strides {steps}, storage offset {offset}, "
                         f"and itemsize {itemsize} requiring a storage size of {need * itemsize} "
                         f"are out of bounds for storage of size {storage.shape[0] * itemsize}")
    return strided(storage, dims, steps, offset)
