"""Indexing of Tensor: advanced `__getitem__`, `__setitem__`, gather and scatter, masks, sorting.

Reads are the spec's one-hot gather, `(arange(K) == idx).where(x, 0).sum(K)`: the kernel
simplifier (codegen/simplify.py, collapse_gather) turns it into one bounds-gated indexed load, so a
gather of N elements costs O(N), with no loop over K. Writes (scatter, scatter_reduce, advanced
`__setitem__`) are the spec's one-hot reduction over the index axis,
`(arange(K) == idx).where(src, identity).reduce(N)`, which rangeify compiles to direct stores
(schedule/scatter.py): a kernel fills the K targets with the identity, then one loop over the N
sources, never split across threads, read-modify-writes `out[idx[n]]` in order. So a write costs
O(N) plus O(K) per target buffer, and the graph stays differentiable by the ordinary rules (the
gradient of a gather is such a scatter too). Overwrites (scatter, setitem) scatter the source
position with MAX (the last source wins, deterministically) and read the value back with the
direct gather. Shapes that depend on data (bool masks, masked_select, nonzero) realize the mask
and count on the host, like PyTorch. Sorting is a stable bitonic network over (key, position)
pairs: O(n log^2 n) work in log2(n)(log2(n)+1)/2 kernels.

Index checks follow PyTorch where they can be made without running anything: a Python list or an
already realized index tensor is read on the host and raises IndexError (RuntimeError for gather
and scatter) when out of range. A lazy index is not checked: out-of-range reads give 0 and
out-of-range writes are dropped.
"""
from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from unigrad.dtype import DType, dtypes
from unigrad import engine
from unigrad.frontend.composite import reversed_order, axis_to_last, is_nan
from unigrad.frontend.dtypes import check_int_value
from unigrad.frontend.gradient import in_autograd_graph
from unigrad.frontend.movement import canonical_axis, getitem_basic, place_basic
from unigrad.frontend.reduce import host_values as _host_values
from unigrad.uop import Ops, UOp
from unigrad.uop.properties import broadcast_shapes

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

INDEX_DTYPE_ERROR = "tensors used as indices must be long, int, byte or bool tensors"
REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
INT64_MAX = 2 ** 63 - 1


# ---- host reads (the only places that realize) ----

def _value_range(t: Tensor) -> tuple[int, int] | None:
  """(min, max) of a realized int tensor, None when it is empty."""
  v = _host_values(t)
  if len(v) == 0: return None
  return (int(v.min()), int(v.max())) if hasattr(v, "min") else (min(v), max(v))


def true_positions(t: Tensor) -> Tensor:
  """The flat positions (int64, 1-D) of the nonzero elements of `t` (realizes t)."""
  v = _host_values(t if t.dtype == dtypes.bool else t.ne(0))
  pos = v.nonzero()[0] if hasattr(v, "nonzero") else [i for i, b in enumerate(v) if b]
  return type(t)(pos, dtype=dtypes.int64, device=t.device)


def _mask_ranks(mask: Tensor) -> tuple[Tensor, int]:
  """Per element of a mask (flat): its rank among the selected ones, -1 where unselected; and how
  many are selected. Realizes the mask, counts on the host."""
  v = _host_values(mask if mask.dtype == dtypes.bool else mask.ne(0))
  if hasattr(v, "cumsum"): ranks, count = v.cumsum(dtype="int64") * v - 1, int(v.sum())
  else: ranks, count = [c * b - 1 for c, b in zip(itertools.accumulate(v), v)], sum(v)
  return type(mask)(ranks, dtype=dtypes.int64, device=mask.device), count


def unravel_positions(pos: Tensor, shape: tuple[int, ...]) -> list[Tensor]:
  """Flat positions -> one coordinate tensor per axis of `shape` (lazy integer arithmetic)."""
  strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
  return [(pos // st) % s if s > 1 else pos * 0 for st, s in zip(strides, shape)]


def checked_index(idx: Tensor, size: int, axis: int, wrap: bool, err: type[Exception]) -> Index:
  """idx as int64 (negatives wrapped when `wrap`); a realized idx is range-checked now, except
  inside a TinyJit capture: a replay runs on other index values, so the capture reads none (the
  index is treated as lazy: out-of-range positions read zeros)."""
  i = idx.cast(dtypes.int64)
  lo = -size if wrap else 0
  if not engine.is_realized(idx.uop) or engine.capturing:
    return Index(i, False) if not wrap else Index((i < 0).where(i + size, i), False)
  rng = _value_range(idx)
  if rng is None: return Index(i, True)
  bad = rng[0] if rng[0] < lo else rng[1] if rng[1] >= size else None
  if bad is not None:
    raise err(f"index {bad} is out of bounds for dimension {axis} with size {size}")
  return Index((i < 0).where(i + size, i) if rng[0] < 0 else i, True)


# ---- the one-hot read and write ----

def _reduce_axis(t: Tensor, op: Ops, axis: int) -> Tensor:
  """Reduce one axis away (a size-1 axis is just dropped)."""
  if t.shape[axis] != 1: return t._reduce(op, axis, False)
  return t.reshape(*t.shape[:axis], *t.shape[axis + 1:])


def _whole_sum(t: Tensor, axis: int) -> Tensor:
  """Sum over `axis` in t's dtype (the one-hot reductions codegen collapses to direct loads)."""
  return t.sum(axis, dtype=t.dtype)


def _arange(t: Tensor, n: int) -> Tensor:
  """arange(n) (int64) on t's device."""
  return type(t).arange(n, device=t.device)


def _arange_at(t: Tensor, n: int, axis: int, ndim: int) -> Tensor:
  """arange(n) (int64) laid along `axis` of an ndim-dimensional broadcast shape."""
  return _arange(t, n).reshape(*[n if a == axis else 1 for a in range(ndim)])


def one_hot_read(x: Tensor, dim: int, index: Tensor) -> Tensor:
  """out[..., i, ...] = x[..., index[..., i, ...], ...] along `dim` (index int64, x's other axes
  broadcast against index's), as the spec's one-hot gather: WHERE(arange(K) == index, x, 0)
  summed over K, which codegen turns into a direct gated load (out of range reads 0)."""
  if x.dtype == dtypes.bool: return one_hot_read(x.cast(dtypes.uint8), dim, index).cast(dtypes.bool)
  k = x.shape[dim]
  hot = index.unsqueeze(dim + 1).eq(_arange_at(x, k, dim + 1, index.ndim + 1))
  picked = hot.where(x.unsqueeze(dim), type(x).full((), 0, x.dtype, x.device))
  return _whole_sum(picked, dim + 1) if k > 1 else _reduce_axis(picked, Ops.ADD, dim + 1)


def take_rows(x: Tensor, idx: Tensor) -> Tensor:
  """x[idx] along axis 0 for a 1-D int64 idx: (K, *rest) -> (len(idx), *rest)."""
  return one_hot_read(x, 0, idx.reshape(idx.shape[0], *[1] * (x.ndim - 1)))


@dataclass(frozen=True)
class Scattered:
  """A one-hot scatter of `src` (shape I) by `index` along `dim` onto K target positions: `hot`
  is I with K inserted before `dim` (hot[.., k, m, ..] = index[.., m, ..] == k), so reducing axis
  dim + 1 gives, per target, the combination of every source written there. Each reduction is a
  one-hot whose unselected terms are the reduction's identity (MAX: below every position), the
  form rangeify compiles to a fill and an O(I) loop of direct stores instead of O(K*I)."""
  hot: Tensor
  src: Tensor
  dim: int

  def reduce(self, op: Ops, identity: Any) -> Tensor:
    fill = type(self.src).full((), identity, self.src.dtype, self.src.device)
    return _reduce_axis(self.hot.where(self.src.unsqueeze(self.dim), fill), op, self.dim + 1)

  def count(self) -> Tensor:
    """How many sources each target takes (int32 when that many fit: half the traffic)."""
    dt = dtypes.int32 if self.src.shape[self.dim] <= dtypes.int32.max else dtypes.int64
    return _reduce_axis(self.hot.cast(dt), Ops.ADD, self.dim + 1)

  def last(self, scalar: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The source each target takes when writes overwrite (the last one), or 0, and whether any
    source writes it: the one-hot max of the source position, then a direct read (none when every
    source is the same `scalar`: a read of a broadcast value would not collapse to a load)."""
    m = self.src.shape[self.dim]
    pos = _arange_at(self.src, m, self.dim + 1, self.hot.ndim)
    if m <= dtypes.int32.max: pos = pos.cast(dtypes.int32)  # half the traffic of int64
    j = _reduce_axis(self.hot.where(pos, -1), Ops.MAX, self.dim + 1)
    return (one_hot_read(self.src, self.dim, j) if scalar is None else scalar), j >= 0


def _scattered(k: int, dim: int, index: Tensor, src: Tensor) -> Scattered:
  hot = index.unsqueeze(dim).eq(_arange_at(src, k, dim, index.ndim + 1))
  return Scattered(hot, src, dim)


def _fit_to(x: Tensor, shape: tuple[int, ...], value: Any) -> Tensor:
  """x padded at the end of each axis to `shape`."""
  return x.pad([(0, s - e) for e, s in zip(x.shape, shape)], value=value)


# ---- index parsing ----

@dataclass(frozen=True)
class Index:
  """An int64 index tensor (negatives already wrapped) and whether its range was checked."""
  t: Tensor
  checked: bool


@dataclass
class Plan:
  """An index split into basic items (applied first as views) and advanced indices, each on an
  axis of the basic result."""
  basic: list = field(default_factory=list)
  adv: list[tuple[int, Index]] = field(default_factory=list)


def _index_tensor(it: Any, t: Tensor) -> Tensor:
  """A list/array item as a Tensor (an empty list is int64), checking a tensor's dtype."""
  if not hasattr(it, "uop"):
    first = it
    while isinstance(first, (list, tuple)) and first: first = first[0]
    empty = isinstance(first, (list, tuple))  # [] or [[]]: int64, like PyTorch
    it = type(t)(it, dtype=dtypes.int64 if empty else None, device=t.device)
  if dtypes.is_float(it.dtype): raise IndexError(INDEX_DTYPE_ERROR)
  if it.device != t.device:
    raise RuntimeError(f"indices should be on the indexed tensor's device {t.device}, got "
                       f"{it.device}")
  return it


def _normalize(idx: Any, t: Tensor) -> list:
  """The index as a list of ints, symbolic ints (index UOps: a bound Variable), slices, None,
  Ellipsis, bools and Tensors."""
  items = list(idx) if isinstance(idx, tuple) else [idx]
  out = []
  for it in items:
    if it is None or it is Ellipsis or isinstance(it, (slice, bool, UOp)): out.append(it)
    elif isinstance(it, (list, tuple)) or hasattr(it, "uop") or hasattr(it, "__array_interface__"):
      out.append(_index_tensor(it, t))
    elif hasattr(it, "__index__"): out.append(operator.index(it))
    else:
      raise IndexError("only integers (or bound Variables), slices, None, Ellipsis, lists and int "
                       f"or bool tensors are valid indices, got {type(it).__name__}")
  return out


def _is_mask(it: Any) -> bool:
  """A bool tensor, or a uint8 one (PyTorch's deprecated byte mask)."""
  return hasattr(it, "uop") and it.dtype in (dtypes.bool, dtypes.uint8)


def _consumed(it: Any) -> int:
  if it is None or it is Ellipsis or isinstance(it, bool): return 0
  return it.ndim if _is_mask(it) else 1


def _expand_ellipsis(items: list, ndim: int) -> list:
  if sum(1 for i in items if i is Ellipsis) > 1:
    raise IndexError("an index can only have a single ellipsis ('...')")
  used = sum(_consumed(i) for i in items)
  if used > ndim: raise IndexError(f"too many indices for tensor of dimension {ndim}")
  fill = [slice(None)] * (ndim - used)
  at = next((j for j, i in enumerate(items) if i is Ellipsis), None)  # `in` would compare Tensors
  if at is None: return items + fill
  return items[:at] + fill + items[at + 1:]


def _y_axis(plan: Plan) -> int:
  """The axis of the basic result that the last basic item made (ints remove theirs)."""
  return sum(1 for b in plan.basic if not isinstance(b, int)) - 1


def _add_scalar_mask(plan: Plan, t: Tensor, selected: bool) -> None:
  """A 0-d mask (True/False) adds an axis of size 1 that it selects once or never."""
  plan.basic.append(None)
  zeros = type(t).full((int(selected),), 0, dtypes.int64, t.device)
  plan.adv.append((_y_axis(plan), Index(zeros, True)))


def _check_mask(t: Tensor, mask: Tensor, axis: int, at: int) -> None:
  if tuple(mask.shape) != tuple(t.shape[axis:axis + mask.ndim]):
    raise IndexError(f"The shape of the mask {list(mask.shape)} at index {at} does not match the "
                     f"shape of the indexed tensor {list(t.shape)} at index {axis}")


def _add_mask(plan: Plan, t: Tensor, mask: Tensor, axis: int, at: int) -> None:
  """A bool mask over axes [axis, axis + mask.ndim) becomes one index per axis (realizes it)."""
  _check_mask(t, mask, axis, at)
  for coord in unravel_positions(true_positions(mask), tuple(mask.shape)):
    plan.basic.append(slice(None))
    plan.adv.append((_y_axis(plan), Index(coord, True)))


def _plan(t: Tensor, idx: Any) -> Plan:
  items = _expand_ellipsis(_normalize(idx, t), t.ndim)
  plan, axis = Plan(), 0
  for at, it in enumerate(items):
    if isinstance(it, bool): _add_scalar_mask(plan, t, it)
    elif not hasattr(it, "uop"):
      plan.basic.append(it)
      axis += it is not None
    elif _is_mask(it) and it.ndim == 0:
      _add_scalar_mask(plan, t, true_positions(it).shape[0] > 0)
    elif _is_mask(it):
      _add_mask(plan, t, it, axis, at)
      axis += it.ndim
    else:
      if axis >= t.ndim: raise IndexError(f"too many indices for tensor of dimension {t.ndim}")
      plan.basic.append(slice(None))
      index = checked_index(it, t.shape[axis], axis, wrap=True, err=IndexError)
      plan.adv.append((_y_axis(plan), index))
      axis += 1
  return plan


def _broadcast(adv: list[tuple[int, Index]]) -> tuple[int, ...]:
  try: return broadcast_shapes(*[i.t.shape for _, i in adv])
  except ValueError:
    shapes = ", ".join(str(list(i.t.shape)) for _, i in adv)
    raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with "
                     f"shapes {shapes}") from None


@dataclass(frozen=True)
class Flat:
  """The advanced axes of y moved first and merged: `x` is (K, *rest) and `lin` (N,) indexes K.
  The indices broadcast to B (N elements); the result has B at the first advanced axis when the
  advanced axes are adjacent, first otherwise, as in PyTorch (`result_shape`)."""
  x: Tensor
  lin: Tensor
  order: list[int]
  b_shape: tuple[int, ...]
  b_at: int

  @property
  def rest(self) -> tuple[int, ...]: return tuple(self.x.shape[1:])

  @property
  def result_shape(self) -> tuple[int, ...]:
    return (*self.rest[:self.b_at], *self.b_shape, *self.rest[self.b_at:])

  def to_result(self, t: Tensor) -> Tensor:
    """(N, *rest) -> the indexing result's shape."""
    t = t.reshape(*self.b_shape, *self.rest)
    nb, at = len(self.b_shape), self.b_at
    if at == 0: return t
    return t.permute(*range(nb, nb + at), *range(nb), *range(nb + at, t.ndim))

  def from_result(self, t: Tensor) -> Tensor:
    """The inverse of to_result: the result's shape -> (N, *rest)."""
    nb, at = len(self.b_shape), self.b_at
    if at: t = t.permute(*range(at, at + nb), *range(at), *range(at + nb, t.ndim))
    return t.reshape(math.prod(self.b_shape), *self.rest)


def _flatten_advanced(y: Tensor, adv: list[tuple[int, Index]]) -> Flat:
  axes = [a for a, _ in adv]
  b_shape = _broadcast(adv)
  sizes = [y.shape[a] for a in axes]
  rest = [a for a in range(y.ndim) if a not in axes]
  x = y.permute(*axes, *rest).reshape(math.prod(sizes), *[y.shape[a] for a in rest])
  lin, valid = None, None
  for (_, index), k, st in zip(adv, sizes, [math.prod(sizes[j + 1:]) for j in range(len(sizes))]):
    i = index.t.expand(b_shape)
    lin = i * st if lin is None else lin + i * st
    if not index.checked:
      ok = (i >= 0) & (i < k)
      valid = ok if valid is None else valid & ok
  assert lin is not None
  if valid is not None and len(adv) > 1: lin = valid.where(lin, -1)
  adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
  return Flat(x, lin.flatten(), [*axes, *rest], tuple(b_shape), axes[0] if adjacent else 0)


def _set_value(t: Tensor, idx: Any, v: Tensor) -> Tensor:
  """t with t[idx] = v, as a new lazy value (nothing is written)."""
  items = _normalize(idx, t)
  if len(items) == 1 and _is_mask(items[0]) and items[0].ndim > 0:
    return _masked_value(t, items[0], v)
  plan = _plan(t, idx)
  y = getitem_basic(t, tuple(plan.basic))
  new = _broadcast_value(v, tuple(y.shape)) if not plan.adv else _advanced_value(y, plan, v)
  return place_basic(t, tuple(plan.basic), new)


def _advanced_value(y: Tensor, plan: Plan, v: Tensor) -> Tensor:
  """y with its advanced-indexed positions (plan.adv, on y's axes) set to v: a one-hot scatter of
  the source positions, the last write winning, read back with the direct gather."""
  flat = _flatten_advanced(y, plan.adv)
  n, k = flat.lin.shape[0], flat.x.shape[0]
  src = flat.from_result(_broadcast_value(v, flat.result_shape))
  lin = flat.lin.reshape(n, *[1] * len(flat.rest))
  new, written = _scattered(k, 0, lin, src).last(v.reshape(()) if v.numel() == 1 else None)
  new = written.where(new, flat.x).reshape(*[y.shape[a] for a in flat.order])
  return new.permute(*[flat.order.index(a) for a in range(y.ndim)])


def _masked_value(t: Tensor, mask: Tensor, v: Tensor) -> Tensor:
  """t with t[mask] = v in O(numel): each selected element reads the value row of its rank among
  the selected ones (counted on the host) with the direct gather."""
  _check_mask(t, mask, 0, 0)
  ranks, count = _mask_ranks(mask)
  rest = tuple(t.shape[mask.ndim:])
  rows = _broadcast_value(v, (count, *rest))
  while v.ndim > len(rest) and v.shape[0] == 1: v = v.reshape(*v.shape[1:])
  # a value the same for every selected element is not read per rank (that would not collapse)
  if v.ndim <= len(rest): new = _broadcast_value(v, rest)
  else: new = take_rows(rows, ranks).reshape(*t.shape)
  selected = ranks.reshape(*mask.shape, *[1] * len(rest)) >= 0
  return selected.where(new, t)


def _check_in_place(t: Tensor) -> None:
  """An in-place write to a leaf that requires grad raises (its gradient would be of values it
  no longer holds), as in PyTorch; under `Tensor.no_grad` it is allowed (an initialization)."""
  if t.requires_grad and not type(t).no_grad:
    raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                       "operation. (Write it under `with Tensor.no_grad():`, or to a detach()ed "
                       "copy.)")


def _value_for(t: Tensor, value: Any) -> Tensor:
  """A setitem value as a tensor of t's dtype on t's device."""
  if not hasattr(value, "uop"):
    if not isinstance(value, (bool, int, float, list, tuple)):
      raise TypeError(f"can't assign a {type(value).__name__} to a Tensor")
    check_int_value(value, t.dtype)
    return type(t)(value, device=t.device).cast(t.dtype)
  if value.device != t.device:
    raise RuntimeError(f"setitem value is on {value.device}, the tensor on {t.device}")
  return value.cast(t.dtype)


def _broadcast_value(v: Tensor, shape: tuple[int, ...]) -> Tensor:
  try:
    while v.ndim > len(shape) and v.shape[0] == 1: v = v.reshape(*v.shape[1:])
    return v.expand(*shape)
  except ValueError:
    raise RuntimeError(f"shape mismatch: value tensor of shape {list(v.shape)} cannot be "
                       f"broadcast to indexing result of shape {list(shape)}") from None


def _own_storage(t: Tensor) -> None:
  """Give a lazy (not buffer-backed) tensor a buffer of its own, so writes have a target."""
  if engine.is_buffer_view(t.uop): return
  t.uop = t.contiguous().uop
  t.realize()


# ---- sorting ----

def _order_key(x: Tensor) -> Tensor:
  """An int64 that orders exactly like x: NaN is the largest, -0.0 equals 0.0."""
  if x.dtype == dtypes.uint64: return (x ^ (1 << 63)).bitcast(dtypes.int64)
  if not dtypes.is_float(x.dtype): return x.cast(dtypes.int64)
  f = x if x.dtype == dtypes.float64 else x.cast(dtypes.float32)
  f = is_nan(f).where(math.nan, f.eq(0).where(0.0, f))
  bits_dt = dtypes.int64 if f.dtype == dtypes.float64 else dtypes.int32
  bits = f.bitcast(bits_dt)
  # negative floats order backwards as signed ints: flip all but the sign bit
  return (bits < 0).where(bits ^ bits_dt.max, bits).cast(dtypes.int64)


def _exchange(x: Tensor, half: int, mirror: bool) -> Tensor:
  """One bitonic pass over (batch, n, 2) [key, position] pairs: blocks of 2*half put the smaller
  pair of each (j, j + half) first (with `mirror`, j pairs with its mirror image in the block)."""
  b, n, _ = x.shape
  v = x.reshape(b, n // (2 * half), 2, half, 2)
  lo, hi = v.shrink((None, None, (0, 1), None, None)), v.shrink((None, None, (1, 2), None, None))
  if mirror: hi = hi.flip(3)
  ka, ia = lo.shrink((None,) * 4 + ((0, 1),)), lo.shrink((None,) * 4 + ((1, 2),))
  kb, ib = hi.shrink((None,) * 4 + ((0, 1),)), hi.shrink((None,) * 4 + ((1, 2),))
  swap = (kb < ka) | (kb.eq(ka) & (ib < ia))
  small, big = swap.where(hi, lo), swap.where(lo, hi)
  if mirror: big = big.flip(3)
  return small.cat(big, dim=2).reshape(b, n, 2).contiguous()


def _bitonic_order(key: Tensor) -> Tensor:
  """The stable ascending order (int64 positions) of int64 keys along the last axis of (b, n)."""
  b, n = key.shape
  k = max(0, (n - 1).bit_length())
  pos = type(key).arange(n, device=key.device).reshape(1, n, 1).expand(b, n, 1)
  x = key.unsqueeze(-1).cat(pos, dim=-1).contiguous()
  # padding pairs (max key, max position) sort after every real pair
  if (1 << k) != n: x = x.pad(((0, 0), (0, (1 << k) - n), (0, 0)), value=INT64_MAX).contiguous()
  for p in range(k):
    x = _exchange(x, 1 << p, mirror=True)
    for q in range(p - 1, -1, -1): x = _exchange(x, 1 << q, mirror=False)
  return x.shrink((None, (0, n), (1, 2))).reshape(b, n)


def _check_gather_shapes(name: str, x: Tensor, dim: int, index: Tensor,
                         src: Tensor | None = None) -> None:
  if index.ndim != max(x.ndim, 1) and not (x.ndim == 0 and index.ndim == 0):
    raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
  if dtypes.is_float(index.dtype) or index.dtype == dtypes.bool:
    raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index")
  big = [a for a in range(index.ndim) if a != dim and index.shape[a] > x.shape[a]]
  if src is not None: big += [a for a in range(index.ndim) if index.shape[a] > src.shape[a]]
  if big:
    extra = "" if src is None else f" and to be no larger size than src {list(src.shape)}"
    raise RuntimeError(f"Size does not match at dimension {big[0]}: expected index "
                       f"{list(index.shape)} to be no larger than self {list(x.shape)} apart "
                       f"from dimension {dim}{extra}")


class IndexingMixin:
  """Advanced indexing, setitem, gather/scatter, masks, sort/argsort/topk (masked_select and
  nonzero: select.py)."""

  def __getitem__(self, idx: Any) -> Tensor:
    """PyTorch indexing: ints, slices (any step), None, Ellipsis, and advanced indices (int or
    bool tensors, lists) that broadcast together; negative indices wrap. Bool masks realize (the
    result's size depends on the data). `x[[0, 2], 1:]`, `x[x > 0]`"""
    plan = _plan(self, idx)
    y = getitem_basic(self, tuple(plan.basic))
    if not plan.adv: return y
    flat = _flatten_advanced(y, plan.adv)
    return flat.to_result(take_rows(flat.x, flat.lin))

  def __setitem__(self, idx: Any, value: Any) -> None:
    """Write `value` (broadcast, cast to this dtype) into the indexed positions of this tensor's
    buffer, now (a lazy tensor first gets a buffer of its own). Writing through a view writes the
    viewed buffer. Basic indices store into the view; a lone bool mask costs O(numel) (a direct
    read per element); other advanced indices cost O(N) direct stores of the index positions (N
    indices) and an O(numel) pass; repeated indices: the last one wins. On a tensor of an
    autograd graph (computed from a tensor that requires grad, or given such a value) nothing is
    written: the tensor takes the new value lazily, whose gradient is PyTorch's (the written
    positions' gradient goes to `value`, the others' to the old value; a use of the tensor made
    before the write keeps the old value and its gradient). `x[1:, [0, 2]] = 0`"""
    _check_in_place(self)
    v = _value_for(self, value)
    if in_autograd_graph(self.uop) or in_autograd_graph(v.uop):
      self.uop = _set_value(self, idx, v).uop
      return
    _own_storage(self)
    items = _normalize(idx, self)
    if len(items) == 1 and _is_mask(items[0]) and items[0].ndim > 0:
      self.assign(_masked_value(self, items[0], v)).realize()
      return
    plan = _plan(self, idx)
    y = getitem_basic(self, tuple(plan.basic))
    new = _broadcast_value(v, tuple(y.shape)) if not plan.adv else _advanced_value(y, plan, v)
    y.assign(new).realize()

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[i][j][k] = self[i][index[i][j][k]][k] for dim=1 (PyTorch's gather): index has self's
    number of dims, sizes at most self's except along `dim`. A direct indexed load per element,
    O(index.numel()). `Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[1], [0]]))` is `[[2], [3]]`."""
    d = canonical_axis(dim, max(self.ndim, 1))
    if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(-1)).reshape(index.shape)
    _check_gather_shapes("gather", self, d, index)
    i = checked_index(index, self.shape[d], d, wrap=False, err=RuntimeError).t
    x = self.shrink(tuple(None if a == d else (0, s) for a, s in enumerate(index.shape)))
    return one_hot_read(x, d, i)

  def _scatter_args(self, name: str, dim: int, index: Tensor,
                    src: Any) -> tuple[int, Index, Tensor]:
    d = canonical_axis(dim, max(self.ndim, 1))
    if not hasattr(src, "uop"): src = type(self).full(index.shape, src, self.dtype, self.device)
    elif src.dtype != self.dtype:
      raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype")
    _check_gather_shapes(name, self, d, index, src)
    i = checked_index(index, self.shape[d], d, wrap=False, err=RuntimeError)
    return d, i, src.shrink(tuple((0, s) for s in index.shape))

  def scatter(self, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    """A copy of self with self[i][index[i][j]] = src[i][j] for dim=1 (src a tensor or a
    scalar); reduce 'add' or 'multiply' combines instead. Repeated indices: the last source wins.
    O(self.numel() + index.numel()): the position each target takes is scattered by direct stores
    (one ordered loop over the indices), then read back with the direct gather."""
    if self.ndim == 0:
      return _scatter_0d(self, dim, index, src, lambda x, i, s: x.scatter(0, i, s, reduce))
    if reduce is not None:
      ops = {"add": "sum", "multiply": "prod"}
      if reduce not in ops: raise RuntimeError(f"reduce argument must be either add or multiply, "
                                               f"got {reduce}")
      if not hasattr(src, "uop"): src = type(self).full(index.shape, src, self.dtype, self.device)
      return self.scatter_reduce(dim, index, src, ops[reduce])
    scalar = None if hasattr(src, "uop") else type(self).full((), src, self.dtype, self.device)
    d, i, src = self._scatter_args("scatter", dim, index, src)
    if index.numel() == 0: return self._wrap(self.uop)
    val, written = _scattered(self.shape[d], d, i.t, src).last(scalar)
    shape = tuple(self.shape)
    return _fit_to(written, shape, False).where(_fit_to(val, shape, 0), self)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str,
                     include_self: bool = True) -> Tensor:
    """A copy of self where each target combines the sources scattered to it with `reduce`
    ('sum', 'prod', 'mean', 'amax', 'amin'), and its own value when include_self. Integer means
    floor-divide, like PyTorch. O(self.numel() + index.numel()): direct read-modify-write stores
    in one ordered loop over the indices (see the module docstring).
    `Tensor([0., 0.]).scatter_reduce(0, Tensor([1, 1]), Tensor([2., 3.]), "sum")` is `[0, 5]`."""
    if reduce not in REDUCTIONS:
      raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                         f"{reduce}")
    if self.ndim == 0:
      return _scatter_0d(self, dim, index, src,
                         lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self))
    d, i, src = self._scatter_args("scatter_reduce", dim, index, src)
    if index.numel() == 0: return self._wrap(self.uop)
    sc, shape = _scattered(self.shape[d], d, i.t, src), tuple(self.shape)
    count = _fit_to(sc.count(), shape, 0)
    return (count > 0).where(_combine(self, sc, reduce, include_self, count), self)

  def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
    """self where mask is False, `value` (a number or 0-d tensor, cast to self's dtype) where it
    is True; mask broadcasts. `x.masked_fill(x < 0, 0)`"""
    if mask.dtype != dtypes.bool:
      raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                         f"{mask.dtype!r}")
    if hasattr(value, "uop") and value.ndim != 0:
      raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor "
                         f"with {value.ndim} dimension(s).")
    v = value.cast(self.dtype) if hasattr(value, "uop") else type(self).full((), value, self.dtype,
                                                                              self.device)
    return mask.where(v, self)

  def sort(self, dim: int = -1, descending: bool = False,
           stable: bool = False) -> tuple[Tensor, Tensor]:
    """(values, indices) sorted along `dim`; always stable (equal values keep their order), NaN
    sorts as the largest. A bitonic network over a power-of-two padded axis, O(n log^2 n).
    `Tensor([3, 1, 2]).sort()` is `([1, 2, 3], [1, 2, 0])`."""
    d = canonical_axis(dim, max(self.ndim, 1))
    zero = type(self).full((), 0, dtypes.int64, self.device)
    if self.ndim == 0: return self._wrap(self.uop), zero
    x, back = axis_to_last(self, d)
    b, n = math.prod(x.shape[:-1]), x.shape[-1]
    if b * n == 0: return self._wrap(self.uop), self.full_like(0, dtypes.int64)
    key = _order_key(x)
    if descending: key = key.bitwise_not()
    order = _bitonic_order(key.reshape(b, n)).reshape(x.shape).permute(back)
    return self.gather(d, order), order

  def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 indices that sort self along `dim` (stable)."""
    return self.sort(dim, descending, stable)[1]

  def topk(self, k: int, dim: int = -1, largest: bool = True,
           sorted: bool = True) -> tuple[Tensor, Tensor]:
    """(values, indices) of the k largest (smallest when not largest) along `dim`, in order."""
    d = canonical_axis(dim, max(self.ndim, 1))
    n = self.shape[d] if self.ndim else 1
    if not 0 <= k <= n: raise RuntimeError("selected index k out of range")
    values, indices = self.sort(d, descending=largest)
    if self.ndim == 0: return values, indices
    keep = tuple((0, k) if a == d else None for a in range(self.ndim))
    return values.shrink(keep), indices.shrink(keep)


def _scatter_0d(x: Tensor, dim: int, index: Tensor, src: Any,
                fn: Callable[[Tensor, Tensor, Any], Tensor]) -> Tensor:
  """A scatter into a 0-d tensor: the same on one element (dim must be 0 or -1)."""
  canonical_axis(dim, 1)
  if index.ndim > 1:
    raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
  flat = src.reshape(-1) if hasattr(src, "uop") else src
  return fn(x.reshape(1), index.reshape(-1), flat).reshape(())


def _combine(x: Tensor, sc: Scattered, reduce: str, include_self: bool, count: Tensor) -> Tensor:
  """The value of a written target for scatter_reduce (count: sources written there)."""
  shape, dt = tuple(x.shape), x.dtype
  if reduce in ("sum", "mean"):
    s = _fit_to(sc.reduce(Ops.ADD, 0), shape, 0)
    if include_self: s, count = s + x, count + 1
    if reduce == "sum": return s
    n = count.maximum(1).cast(dt)  # unwritten targets keep self; no division by zero
    return s.div(n).cast(dt) if dtypes.is_float(dt) else s.floordiv(n)
  if reduce == "prod":
    p = _fit_to(sc.reduce(Ops.MUL, 1), shape, 1)
    return p * x if include_self else p
  flip = reduce == "amin"  # min(x) = reversed(max(reversed(x))), exactly
  src = reversed_order(sc.src) if flip else sc.src
  m = Scattered(sc.hot, src, sc.dim).reduce(Ops.MAX, _lowest(dt))
  m = _fit_to(reversed_order(m) if flip else m, shape, 0)
  if not include_self: return m
  return x.minimum(m) if flip else x.maximum(m)


def _lowest(dt: DType) -> Any: return -math.inf if dtypes.is_float(dt) else dt.min
