"""Movement ops of Tensor: views that become index arithmetic in rangeify, never copies.

Each method validates its arguments against the tensor's shape (raising ValueError/IndexError
naming the shapes) and emits one spec movement op (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unigrad.dtype import dtypes
from unigrad.frontend.dtypes import scalar_dtype
from unigrad.uop import Ops, UOp, shape_uop, sint
from unigrad.uop.alu import exec_cast

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


def _shape_arg(args: tuple) -> tuple:
  """Accept f(2, 3) and f((2, 3))."""
  if len(args) == 1 and isinstance(args[0], (tuple, list)): return tuple(args[0])
  return tuple(args)


def canonical_axis(axis: int, ndim: int) -> int:
  """`axis` in [0, ndim), accepting negative axes like PyTorch."""
  if not isinstance(axis, int) or isinstance(axis, bool):
    raise TypeError(f"axis must be an int, got {type(axis).__name__}")
  n = max(ndim, 1)
  if not -n <= axis < n:
    raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                     f"but got {axis})")
  return axis + n if axis < 0 else axis


class MovementMixin:
  """reshape, permute, expand, pad, shrink, flip and indexing."""
  uop: UOp

  @property
  def shape(self) -> tuple[sint, ...]: raise NotImplementedError

  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError

  @property
  def ndim(self) -> int: return len(self.shape)

  def reshape(self, *shape: Any) -> Tensor:
    """A view with a new shape of the same size; one dim may be -1. `x.reshape(2, -1)`"""
    new = list(_shape_arg(shape))
    if sum(1 for s in new if s == -1) > 1:
      raise ValueError(f"only one dimension can be inferred, got {tuple(new)}")
    numel = math.prod(self.shape)
    bad = ValueError(f"shape '{tuple(new)}' is invalid for input of size {numel} {self.shape}")
    if -1 in new:
      rest = math.prod(s for s in new if s != -1)
      if rest == 0 or numel % rest: raise bad
      new[new.index(-1)] = numel // rest
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in new):
      raise ValueError(f"invalid shape {tuple(new)}: sizes must be ints >= 0 (or one -1)")
    if math.prod(new) != numel: raise bad
    if tuple(new) == self.shape: return self._wrap(self.uop)
    return self._wrap(UOp(Ops.RESHAPE, self.uop.dtype, (self.uop, shape_uop(new))))

  def view(self, *shape: Any) -> Tensor: return self.reshape(*shape)

  def permute(self, *order: Any) -> Tensor:
    """Reorder the axes. `x.permute(1, 0)` transposes a matrix."""
    perm = tuple(canonical_axis(a, self.ndim) for a in _shape_arg(order))
    if sorted(perm) != list(range(self.ndim)):
      raise ValueError(f"permute{perm} is not a permutation of the axes of {self.shape}")
    if perm == tuple(range(self.ndim)): return self._wrap(self.uop)
    return self._wrap(UOp(Ops.PERMUTE, self.uop.dtype, (self.uop,), perm))

  def expand(self, *shape: Any) -> Tensor:
    """Broadcast size-1 axes (and new leading axes); -1 keeps a size. `x.expand(4, 3)`"""
    new = _shape_arg(shape)
    if len(new) < self.ndim:
      raise ValueError(f"expand: the shape {new} has fewer dims than the tensor's {self.shape}")
    for i, n in enumerate(new):
      if isinstance(n, int) and (n < -1 or (n == -1 and i < len(new) - self.ndim)):
        raise ValueError(f"expand: size {n} for axis {i} of {tuple(new)} is invalid (sizes are "
                         ">= 0; -1 keeps an existing axis' size)")
    old = (1,) * (len(new) - self.ndim) + tuple(self.shape)
    full = tuple(o if n == -1 else n for o, n in zip(old, new))
    bad = [i for i, (o, n) in enumerate(zip(old, full)) if o != n and o != 1]
    if bad:
      raise ValueError(f"cannot expand {self.shape} to {new}: axes {bad} must be 1 or equal")
    if full == tuple(self.shape): return self._wrap(self.uop)
    x = self.uop
    if len(old) != self.ndim: x = UOp(Ops.RESHAPE, x.dtype, (x, shape_uop(old)))
    return self._wrap(UOp(Ops.EXPAND, x.dtype, (x, shape_uop(full))))

  def _pad_raw(self, pads: Sequence[tuple[int, int]]) -> UOp:
    new = tuple(b + s + a for (b, a), s in zip(pads, self.shape))
    return UOp(Ops.PAD, self.uop.dtype, (self.uop, shape_uop([b for b, _ in pads]), shape_uop(new)))

  def pad(self, padding: Sequence[Any], value: float = 0.0) -> Tensor:
    """Pad with `value`: `padding` is ((before, after), ...) per axis, or PyTorch's flat
    (last_before, last_after, ...) form. Negative amounts shrink."""
    pads = _normalize_pads(padding, self.ndim)
    if all(p == (0, 0) for p in pads): return self._wrap(self.uop)
    shrink = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pads, self.shape))
    x = self.shrink(shrink) if any(b < 0 or a < 0 for b, a in pads) else self
    pos = [(max(0, b), max(0, a)) for b, a in pads]
    padded = x._wrap(x._pad_raw(pos))
    if value == 0: return padded
    mask = x._wrap(UOp.const(dtypes.bool, True)).expand(x.shape)._wrap_pad(pos)
    # like PyTorch, the value takes the tensor's dtype (1.5 pads an int tensor with 1)
    fill = UOp.const(self.dtype, exec_cast(value, scalar_dtype(value), self.dtype))
    return mask.where(padded, x._wrap(fill))

  def _wrap_pad(self, pads: Sequence[tuple[int, int]]) -> Tensor:
    return self._wrap(self._pad_raw(pads))

  def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
    """Keep [start, end) per axis (None keeps the axis). `x.shrink(((0, 2), None))`"""
    if len(arg) != self.ndim:
      raise ValueError(f"shrink needs {self.ndim} (start, end) pairs for shape {self.shape}, "
                       f"got {len(arg)}")
    rng = [(0, s) if a is None else tuple(a) for a, s in zip(arg, self.shape)]
    for axis, ((b, e), s) in enumerate(zip(rng, self.shape)):
      if not 0 <= b <= e <= s:
        raise ValueError(f"shrink ({b}, {e}) is out of bounds for axis {axis} of {self.shape}")
    if all(b == 0 and e == s for (b, e), s in zip(rng, self.shape)): return self._wrap(self.uop)
    offs, sizes = [b for b, _ in rng], [e - b for b, e in rng]
    return self._wrap(UOp(Ops.SHRINK, self.uop.dtype, (self.uop, shape_uop(offs),
                                                       shape_uop(sizes))))

  def shrink_to(self, *shape: Any) -> Tensor:
    """Keep the first `shape[i]` elements of each axis (None keeps it)."""
    new = _shape_arg(shape)
    if len(new) != self.ndim:
      raise ValueError(f"shrink_to{new} needs {self.ndim} sizes for shape {self.shape}")
    return self.shrink(tuple(None if n is None else (0, n) for n in new))

  def flip(self, *axis: Any) -> Tensor:
    """Reverse the order of elements along the given axes."""
    axes = {canonical_axis(a, self.ndim) for a in _shape_arg(axis)}
    if not axes: return self._wrap(self.uop)
    flags = tuple(i in axes for i in range(self.ndim))
    return self._wrap(UOp(Ops.FLIP, self.uop.dtype, (self.uop,), flags))

  # ---- derived views ----
  def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
    order = list(range(self.ndim))
    a, b = canonical_axis(dim0, self.ndim), canonical_axis(dim1, self.ndim)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))  # noqa: N802

  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split axis `dim` into `sizes` (one may be -1). `x.unflatten(1, (2, 3))`"""
    d = canonical_axis(dim, self.ndim)
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

  def rearrange(self, formula: str, **sizes: int) -> Tensor:
    """einops-style axis rearrangement: `x.rearrange("b c h w -> b (h w) c")`, with named sizes
    for split groups (`"b (h w) -> b h w", h=4`)."""
    return rearrange(self, formula, **sizes)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = canonical_axis(start_dim, self.ndim), canonical_axis(end_dim, self.ndim)
    return self.reshape(*self.shape[:s], math.prod(self.shape[s:e + 1]), *self.shape[e + 1:])

  def unsqueeze(self, dim: int) -> Tensor:
    d = canonical_axis(dim, self.ndim + 1)
    return self.reshape(*self.shape[:d], 1, *self.shape[d:])

  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(*[s for s in self.shape if s != 1])
    d = canonical_axis(dim, self.ndim)
    if self.ndim == 0 or self.shape[d] != 1: return self._wrap(self.uop)
    return self.reshape(*self.shape[:d], *self.shape[d + 1:])

  def __getitem__(self, idx: Any) -> Tensor:
    """Basic indexing: ints, slices (any step), None and Ellipsis. `x[1, ::2, None, ...]`"""
    return getitem_basic(self, idx)


def _normalize_pads(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
  if all(isinstance(p, int) for p in padding):
    if len(padding) % 2 or len(padding) // 2 > ndim:
      raise ValueError(f"flat padding {tuple(padding)} needs pairs for at most {ndim} axes")
    pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
    return [(0, 0)] * (ndim - len(pairs)) + pairs[::-1]
  if len(padding) != ndim:
    raise ValueError(f"padding needs {ndim} (before, after) pairs, got {len(padding)}")
  return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]


def _expand_ellipsis(idx: tuple, ndim: int) -> list:
  if sum(1 for i in idx if i is Ellipsis) > 1:
    raise IndexError("an index can only have a single ellipsis ('...')")
  used = sum(1 for i in idx if i is not None and i is not Ellipsis)
  if used > ndim: raise IndexError(f"too many indices ({used}) for a tensor of dimension {ndim}")
  out: list = []
  for i in idx: out.extend([slice(None)] * (ndim - used) if i is Ellipsis else [i])
  if Ellipsis not in idx: out.extend([slice(None)] * (ndim - used))
  return out


def _slice_window(it: slice, size: int) -> tuple[int, int, int]:
  """(lo, n, step) of a slice: n elements starting at lo, stepping |step| in the original order."""
  start, stop, step = it.indices(size)
  n = len(range(start, stop, step))
  return (start if step > 0 else start + (n - 1) * step) if n else 0, n, step


def getitem_basic(t: Tensor, idx: Any) -> Tensor:
  """Apply ints, slices, None and Ellipsis as shrink/flip/reshape views."""
  items = _expand_ellipsis(idx if isinstance(idx, tuple) else (idx,), t.ndim)
  bounds, flips, steps, out_shape, axis = [], [], [], [], 0
  for it in items:
    if it is None:
      out_shape.append(1)
      continue
    size = t.shape[axis]
    if isinstance(it, bool) or not isinstance(it, (int, slice)):
      raise IndexError("only integers, slices, None and Ellipsis are valid indices here, got "
                       f"{type(it).__name__}")
    if isinstance(it, int):
      if not -size <= it < size:
        raise IndexError(f"index {it} is out of bounds for dimension {axis} with size {size}")
      i = it + size if it < 0 else it
      bounds.append((i, i + 1)); flips.append(False); steps.append(1)  # noqa: E702
    else:
      if it.step == 0: raise ValueError("slice step cannot be zero")
      lo, n, step = _slice_window(it, size)
      bounds.append((lo, lo + (n - 1) * abs(step) + 1 if n else lo))
      flips.append(step < 0); steps.append(abs(step)); out_shape.append(n)  # noqa: E702
    axis += 1
  x = t.shrink(tuple(bounds)) if bounds else t
  if any(flips): x = x.flip(*[i for i, f in enumerate(flips) if f])
  if any(s > 1 for s in steps): x = _strided(x, steps)
  return x.reshape(*out_shape)


def _strided(x: Tensor, steps: list[int]) -> Tensor:
  """Every steps[i]-th element along each axis (pad to a multiple, reshape, take index 0)."""
  padded_shape = [math.ceil(s / k) * k for s, k in zip(x.shape, steps)]
  x = x.pad([(0, p - s) for p, s in zip(padded_shape, x.shape)])
  x = x.reshape(*[d for p, k in zip(padded_shape, steps) for d in (p // k, k)])
  x = x.shrink(tuple(b for p, k in zip(padded_shape, steps) for b in ((0, p // k), (0, 1))))
  return x.reshape(*[p // k for p, k in zip(padded_shape, steps)])


def _parse_side(side: str) -> list[list[str]]:
  """'b (h w) c' -> [['b'], ['h', 'w'], ['c']]."""
  groups: list[list[str]] = []
  cur: list[str] | None = None
  for tok in side.replace("(", " ( ").replace(")", " ) ").split():
    if tok == "(":
      if cur is not None: raise ValueError("rearrange: nested parentheses are not supported")
      cur = []
    elif tok == ")":
      if cur is None: raise ValueError("rearrange: unbalanced ')'")
      groups.append(cur)
      cur = None
    elif cur is not None: cur.append(tok)
    else: groups.append([tok])
  if cur is not None: raise ValueError("rearrange: unbalanced '('")
  return groups


def rearrange(t: Tensor, formula: str, **sizes: int) -> Tensor:
  if formula.count("->") != 1: raise ValueError(f"rearrange: expected one '->' in {formula!r}")
  lhs, rhs = (_parse_side(s) for s in formula.split("->"))
  if len(lhs) != t.ndim:
    raise ValueError(f"rearrange: {formula!r} names {len(lhs)} axes, the tensor has {t.ndim}")
  names = [n for g in lhs for n in g]
  if sorted(names) != sorted(n for g in rhs for n in g) or len(set(names)) != len(names):
    raise ValueError(f"rearrange: both sides of {formula!r} must name the same axes once")
  dims: dict[str, int] = dict(sizes)
  for g, s in zip(lhs, t.shape):
    unknown = [n for n in g if n not in dims]
    known = math.prod(dims[n] for n in g if n in dims)
    if len(unknown) > 1: raise ValueError(f"rearrange: give the sizes of all but one of {g}")
    if unknown: dims[unknown[0]] = s // known if known else 0
    if math.prod(dims[n] for n in g) != s:
      raise ValueError(f"rearrange: group {g} does not match size {s}")
  x = t.reshape(*[dims[n] for n in names]).permute(*[names.index(n) for g in rhs for n in g])
  return x.reshape(*[math.prod(dims[n] for n in g) for g in rhs])
