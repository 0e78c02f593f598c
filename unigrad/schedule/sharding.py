"""Sharding: the storage of values on n-tuple devices, and the views that lowering builds of it.

Storage (ARCHITECTURE decision 6, spec: "a BUFFER with a tuple device creates the fully sized
buffer across multiple devices"): a BUFFER on D of size N is split into n equal, contiguous chunks,
chunk j on d_j, each an ordinary single-device BUFFER registered in `shards`. This keeps the code
simple: every device-side step (rangeify, kernels, copies, buffer lifetimes) is the single-device
pipeline, and a realized value on D is a plain view of one buffer: sharded along axis a,
`BUFFER(n*k).reshape(n, *local).permute(...)` back to its shape (axis 0 moved to a); replicated,
`BUFFER(n*numel).reshape(n, *shape).replicated(0)` (n copies). Splits are only into equal chunks:
sharding a size that n does not divide is refused at the call (`Tensor.shard`), not padded.
The views (`reshape`, `permute`, `shrink`, `pad`, `slice_axis`, `chunk`, `concat`, ...) build
tensor-graph nodes over the per-device values; `gather_range` and `copy_to` move parts between
devices as COPYs. schedule/multi.py lowers a graph with them.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import TypeVar

from unigrad.dtype import DType, dtypes
from unigrad.schedule.callify import buffer_base, new_buffer
from unigrad.uop import Ops, UOp, shape_uop, sint

__all__ = ["MultiDeviceError", "new_multi_buffer", "is_multi_view", "multi_view", "shards",
           "shards_of", "local_shape"]

Locals = tuple[UOp, ...]
T = TypeVar("T")


class MultiDeviceError(RuntimeError):
  """A graph on an n-tuple device cannot be split across its devices (the message says why)."""


# BUFFER on an n-tuple device -> its n single-device BUFFERs (alive as long as the BUFFER is)
shards: weakref.WeakKeyDictionary[UOp, Locals] = weakref.WeakKeyDictionary()


# ---- views on UOps ----

def reshape(x: UOp, shape: Sequence[int]) -> UOp:
  if tuple(x.shape) == tuple(shape): return x
  return UOp(Ops.RESHAPE, x.dtype, (x, shape_uop(tuple(shape))))


def permute(x: UOp, order: Sequence[int]) -> UOp:
  if tuple(order) == tuple(range(len(order))): return x
  return UOp(Ops.PERMUTE, x.dtype, (x,), tuple(order))


def shrink(x: UOp, offsets: Sequence[sint], sizes: Sequence[sint]) -> UOp:
  if not any(offsets) and tuple(sizes) == tuple(x.shape): return x
  return UOp(Ops.SHRINK, x.dtype, (x, shape_uop(tuple(offsets)), shape_uop(tuple(sizes))))


def pad(x: UOp, offsets: Sequence[sint], shape: Sequence[sint]) -> UOp:
  if not any(offsets) and tuple(shape) == tuple(x.shape): return x
  return UOp(Ops.PAD, x.dtype, (x, shape_uop(tuple(offsets)), shape_uop(tuple(shape))))


def at(values: Sequence[T], axis: int, value: T) -> list[T]:
  out = list(values)
  out[axis] = value
  return out


def slice_axis(x: UOp, axis: int, start: int, size: int) -> UOp:
  """Elements [start, start+size) of `x` along `axis`."""
  return shrink(x, at([0] * len(x.shape), axis, start), at(x.shape, axis, size))


def chunk(x: UOp, axis: int, j: int, n: int) -> UOp:
  """Chunk j of n equal chunks of `x` along `axis`."""
  size = x.shape[axis] // n
  return slice_axis(x, axis, j * size, size)


def full(dtype: DType, value: object, shape: Sequence[int]) -> UOp:
  c = UOp.const(dtype, value)
  return UOp(Ops.EXPAND, dtype, (reshape(c, (1,) * len(shape)), shape_uop(tuple(shape))))


def concat(pieces: Sequence[UOp], axis: int) -> UOp:
  """The pieces joined along `axis`: each padded into place and selected by a mask padded the
  same way (a padded region is invalid, so it is never read as a value)."""
  if len(pieces) == 1: return pieces[0]
  starts = [sum(p.shape[axis] for p in pieces[:k]) for k in range(len(pieces) + 1)]
  whole = at(pieces[0].shape, axis, starts[-1])
  def place(x: UOp, k: int) -> UOp: return pad(x, at([0] * len(whole), axis, starts[k]), whole)
  out = place(pieces[-1], len(pieces) - 1)
  for k in reversed(range(len(pieces) - 1)):
    mask = place(full(dtypes.bool, True, pieces[k].shape), k)
    out = UOp(Ops.WHERE, out.dtype, (mask, place(pieces[k], k), out))
  return out


def gather_range(locs: Locals, axis: int, lo: int, hi: int, device: str) -> UOp:
  """Elements [lo, hi) (not empty) along `axis` of a value split along it into `locs`, assembled
  on `device` from only the parts that hold them."""
  size, pieces = locs[0].shape[axis], []
  for k, x in enumerate(locs):
    start, stop = max(lo, k * size), min(hi, (k + 1) * size)
    if start >= stop: continue
    pieces.append(copy_to(slice_axis(x, axis, start - k * size, stop - start), device))
  assert pieces, f"empty range [{lo}, {hi})"
  return concat(pieces, axis)


def copy_to(x: UOp, device: str) -> UOp:
  return x if x.device == device else UOp(Ops.COPY, x.dtype, (x,), device)


def local_shape(shape: Sequence[int], axis: int | None, n: int) -> tuple[int, ...]:
  """The shape each of n devices holds of a value of `shape` split along `axis`."""
  return tuple(shape) if axis is None else tuple(at(shape, axis, shape[axis] // n))


# ---- storage ----

def new_multi_buffer(devices: tuple[str, ...], dtype: DType, shape: Sequence[int],
                     axis: int | None) -> UOp:
  """A view of shape `shape` split along `axis` (None: replicated) of a fresh BUFFER on
  `devices`; its per-device shards are made when it is first lowered."""
  n = len(devices)
  if axis is not None and shape[axis] % n:
    raise MultiDeviceError(f"axis {axis} of shape {tuple(shape)} does not split evenly across "
                           f"{n} devices")
  buf = new_buffer(devices, dtype, (n * math.prod(local_shape(shape, axis, n)),))
  return multi_view(buf, shape, axis)


def multi_view(buf: UOp, shape: Sequence[int], axis: int | None) -> UOp:
  """`buf` (a BUFFER on n devices) seen as a value of `shape` with shard axis `axis`."""
  n = len(buf.arg.device)
  if axis is None:
    rep = UOp(Ops.REPLICATED, buf.dtype, (reshape(buf, (n, *shape)),), (0,))
    return reshape(rep, shape)
  loc = local_shape(shape, axis, n)
  x = reshape(buf, (n, *loc))
  x = permute(x, (*range(1, axis + 1), 0, *range(axis + 1, len(shape) + 1)))
  return reshape(x, shape)


# looked up once: `Ops.X` is slow on Python 3.11
_VIEW_OPS, _BUFFER = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.REPLICATED}), Ops.BUFFER


def is_multi_view(u: UOp) -> bool:
  """A RESHAPE/PERMUTE/REPLICATED view of a BUFFER on a tuple device: a realized value."""
  while u.op in _VIEW_OPS: u = u.src[0]
  return u.op is _BUFFER and isinstance(u.arg.device, tuple)


def shards_of(buf: UOp) -> Locals:
  """The per-device BUFFERs behind a BUFFER on a tuple device (fresh ones the first time)."""
  if (got := shards.get(buf)) is not None: return got
  devices, size = buf.arg.device, buf.shape[0]
  if size % len(devices):
    raise MultiDeviceError(f"a buffer of {size} elements does not split evenly across "
                           f"{len(devices)} devices")
  got = shards[buf] = tuple(new_buffer(d, buf.dtype, (size // len(devices),)) for d in devices)
  return got


def assemble(u: UOp, devices: tuple[str, ...], bufs: Sequence[UOp]) -> UOp:
  """The realized form of `u`: a BUFFER on `devices` whose shards are `bufs`, viewed as `u`."""
  bases = tuple(base for b in bufs if (base := buffer_base(b)) is not None)
  assert len(bases) == len(bufs), "locals realize into plain buffers"
  buf = new_buffer(devices, u.dtype, (sum(b.shape[0] for b in bases),))
  shards[buf] = bases
  return multi_view(buf, u.shape, u.axis if isinstance(u.device, tuple) else None)
