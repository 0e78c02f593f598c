"""Movement ops of Tensor: views that become index arithmetic in rangeify, never copies.

Each method validates its arguments against the tensor's shape (raising ValueError/IndexError
naming the shapes) and emits one spec movement op (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unigrad.dtype import dtypes
from unigrad.frontend.dtypes import scalar_dtype
from unigrad.uop import Ops, UOp, shape_uop, sint
from unigrad.uop.alu import exec_cast
from unigrad.uop.variable import (divide_sizes, is_size, products_equal, resolve, shape_str,
                                  simplify_size)

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


_INT = frozenset({int})


def shape_arg(args: tuple) -> tuple:
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


def _distinct_axes(axes: list[int]) -> set[int]:
  """Canonical axes as a set; an axis named twice raises RuntimeError, as in PyTorch's flip."""
  seen: set[int] = set()
  for a in axes:
    if a in seen: raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
    seen.add(a)
  return seen


class MovementMixin:
  """reshape, permute, expand, pad, shrink, flip and indexing."""
  uop: UOp

  @property
  def shape(self) -> tuple[sint, ...]: raise NotImplementedError

  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError

  @property
  def ndim(self) -> int: return len(self.shape)

  def reshape(self, *shape: Any) -> Tensor:
    """A view with a new shape of the same size; one dim may be -1, and None keeps the size of
    the same axis (tinygrad's spelling). `x.reshape(2, -1)`, `x.reshape(None, 3, 4)`"""
    new = list(shape_arg(shape))
    if set(map(type, new)) <= _INT and set(map(type, self.shape)) <= _INT:
      if -1 not in new and min(new, default=0) >= 0 and math.prod(new) == math.prod(self.shape):
        return self._reshape_to(new)  # the usual case: static sizes, nothing to infer or report
    else: new = [simplify_size(s) if isinstance(s, UOp) else s for s in new]
    if any(s is None for s in new): new = self._kept_sizes(new)
    if sum(1 for s in new if _is_minus_one(s)) > 1:
      raise ValueError(f"only one dimension can be inferred, got {tuple(new)}")
    if any(isinstance(s, UOp) for s in (*new, *self.shape)): return self._reshape_symbolic(new)
    numel = math.prod(self.shape)
    if -1 in new:
      rest = math.prod(s for s in new if s != -1)
      if rest == 0 or numel % rest: raise self._bad_size(new, numel)
      new[new.index(-1)] = numel // rest
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in new):
      raise ValueError(f"invalid shape {tuple(new)}: sizes must be ints >= 0 (or one -1)")
    if math.prod(new) != numel: raise self._bad_size(new, numel)
    return self._reshape_to(new)

  def _kept_sizes(self, new: list) -> list:
    """`new` with each None replaced by this tensor's size on that axis."""
    for i, s in enumerate(new):
      if s is not None: continue
      if i >= self.ndim:
        raise ValueError(f"reshape: None at position {i} keeps the size of axis {i}, but the "
                         f"tensor has {self.ndim} axes (shape {shape_str(self.shape)})")
      new[i] = self.shape[i]
    return new

  def _bad_size(self, new: list, numel: int) -> ValueError:
    return ValueError(f"shape '{tuple(new)}' is invalid for input of size {numel} {self.shape}")

  def _reshape_to(self, new: Sequence[sint]) -> Tensor:
    if tuple(new) == self.shape: return self._wrap(self.uop)
    return self._wrap(UOp(Ops.RESHAPE, self.uop.dtype, (self.uop, shape_uop(new))))

  def _reshape_symbolic(self, new: list) -> Tensor:
    """reshape with symbolic sizes: -1 and the size check proven for every value."""
    if any(not is_size(s) or (isinstance(s, int) and s < -1) for s in new):
      raise ValueError(f"invalid shape {shape_str(new)}: sizes must be ints >= 0, index UOps "
                       "(symbolic sizes) or one -1")
    if any(_is_minus_one(s) for s in new):
      i = next(i for i, s in enumerate(new) if _is_minus_one(s))
      inferred = divide_sizes(self.shape, [s for s in new if not _is_minus_one(s)])
      if inferred is None: raise self._bad_reshape(new)
      new[i] = inferred
    if not products_equal(self.shape, new): raise self._bad_reshape(new)
    return self._reshape_to(new)

  def _bad_reshape(self, new: Sequence[sint]) -> ValueError:
    return ValueError(f"shape {shape_str(new)} is invalid for input of shape "
                      f"{shape_str(self.shape)} (the sizes must match for every value of the "
                      "variables)")

  def view(self, *shape: Any) -> Tensor: return self.reshape(*shape)

  def permute(self, *order: Any) -> Tensor:
    """Reorder the axes. `x.permute(1, 0)` transposes a matrix."""
    perm = tuple(canonical_axis(a, self.ndim) for a in shape_arg(order))
    if sorted(perm) != list(range(self.ndim)):
      raise ValueError(f"permute{perm} is not a permutation of the axes of {self.shape}")
    if perm == tuple(range(self.ndim)): return self._wrap(self.uop)
    return self._wrap(UOp(Ops.PERMUTE, self.uop.dtype, (self.uop,), perm))

  def expand(self, *shape: Any) -> Tensor:
    """Broadcast size-1 axes (and new leading axes); -1 keeps a size. `x.expand(4, 3)`"""
    new = shape_arg(shape)
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

  def _pad_raw(self, pads: Sequence[tuple[sint, sint]]) -> UOp:
    new = tuple(simplify_size(s + b + a) for (b, a), s in zip(pads, self.shape))
    return UOp(Ops.PAD, self.uop.dtype, (self.uop, shape_uop([b for b, _ in pads]), shape_uop(new)))

  def pad(self, padding: Sequence[Any], value: float = 0.0) -> Tensor:
    """Pad with `value`: `padding` is ((before, after), ...) per axis, or PyTorch's flat
    (last_before, last_after, ...) form. Negative amounts shrink."""
    pads = normalize_pads(padding, self.ndim)
    if all(_is_zero(b) and _is_zero(a) for b, a in pads): return self._wrap(self.uop)
    shrink = tuple((_neg_part(b), s - _neg_part(a)) for (b, a), s in zip(pads, self.shape))
    x = self.shrink(shrink) if any(_neg_part(b) or _neg_part(a) for b, a in pads) else self
    pos = [(b + _neg_part(b), a + _neg_part(a)) for b, a in pads]
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
    rng = [(0, s) if a is None else tuple(map(_size_arg, a)) for a, s in zip(arg, self.shape)]
    for axis, ((b, e), s) in enumerate(zip(rng, self.shape)):
      if not _in_order(0, b, e, s):
        raise ValueError(f"shrink ({_s(b)}, {_s(e)}) is out of bounds for axis {axis} of "
                         f"{shape_str(self.shape)}")
    if all(_is_zero(b) and (e is s or e == s) for (b, e), s in zip(rng, self.shape)):
      return self._wrap(self.uop)
    offs, sizes = [b for b, _ in rng], [e if _is_zero(b) else simplify_size(e - b) for b, e in rng]
    return self._wrap(UOp(Ops.SHRINK, self.uop.dtype, (self.uop, shape_uop(offs),
                                                       shape_uop(sizes))))

  def shrink_to(self, *shape: Any) -> Tensor:
    """Keep the first `shape[i]` elements of each axis (None keeps it)."""
    new = shape_arg(shape)
    if len(new) != self.ndim:
      raise ValueError(f"shrink_to{new} needs {self.ndim} sizes for shape {self.shape}")
    return self.shrink(tuple(None if n is None else (0, n) for n in new))

  def pad_to(self, *shape: Any) -> Tensor:
    """Zero-pad each axis at its end up to `shape[i]` (None keeps it), tinygrad's pad_to.
    `Tensor.ones(2, 3).pad_to(4, None)` has shape (4, 3)."""
    new = shape_arg(shape)
    if len(new) != self.ndim:
      raise ValueError(f"pad_to{new} needs {self.ndim} sizes for shape {self.shape}")
    if any(n is not None and _less(n, s) for n, s in zip(new, self.shape)):
      raise ValueError(f"pad_to{new} is smaller than shape {self.shape} (use shrink_to)")
    return self.pad(tuple((0, 0) if n is None else (0, n - s) for n, s in zip(new, self.shape)))

  def flip(self, *axis: Any) -> Tensor:
    """Reverse the order of elements along the given axes."""
    axes = _distinct_axes([canonical_axis(a, self.ndim) for a in shape_arg(axis)])
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

  @property
  def mT(self) -> Tensor:  # noqa: N802
    """The last two axes swapped (a batch of matrices transposed), PyTorch's `mT`."""
    if self.ndim < 2:
      raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. Got "
                         f"{self.ndim}-D tensor.")
    return self.transpose(-2, -1)

  @property
  def mH(self) -> Tensor:  # noqa: N802
    """The conjugate transpose of the last two axes: `mT` (unigrad has no complex dtypes)."""
    return self.mT

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
    shape = self.shape
    d = canonical_axis(dim, len(shape) + 1)
    new = (*shape[:d], 1, *shape[d:])
    if set(map(type, shape)) <= _INT: return self._reshape_to(new)  # nothing to check
    return self.reshape(*new)

  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(*[s for s in self.shape if s != 1])
    d = canonical_axis(dim, self.ndim)
    if self.ndim == 0 or self.shape[d] != 1: return self._wrap(self.uop)
    return self.reshape(*self.shape[:d], *self.shape[d + 1:])

  def __getitem__(self, idx: Any) -> Tensor:
    """Basic indexing: ints, slices (any step), None and Ellipsis. `x[1, ::2, None, ...]`"""
    return getitem_basic(self, idx)


def _is_minus_one(s: Any) -> bool: return isinstance(s, int) and s == -1


def _is_zero(x: sint) -> bool: return isinstance(x, int) and x == 0


def _neg_part(x: sint) -> int:
  """-x for a negative int amount, else 0 (symbolic amounts are never negative)."""
  return -x if isinstance(x, int) and x < 0 else 0


def _size_arg(x: Any) -> sint:
  """A movement argument: an int or a symbolic size (simplified)."""
  if isinstance(x, UOp):
    if not is_size(x): raise TypeError(f"a symbolic size must be a ()-shaped index UOp, got {x!r}")
    return simplify_size(x)
  return x


def _s(x: sint) -> str: return str(x) if isinstance(x, int) else x.render()


def _less(a: sint, b: sint) -> bool:
  return resolve(a < b) if isinstance(a, UOp) or isinstance(b, UOp) else a < b


def _in_order(*xs: sint) -> bool:
  """xs[0] <= xs[1] <= ... for sizes (symbolic ones decided by `resolve`)."""
  return all(resolve(a <= b) if isinstance(a, UOp) or isinstance(b, UOp) else a <= b
             for a, b in zip(xs, xs[1:]))


def normalize_pads(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
  if all(isinstance(p, (int, UOp)) for p in padding):
    if len(padding) % 2 or len(padding) // 2 > ndim:
      raise ValueError(f"flat padding {tuple(padding)} needs pairs for at most {ndim} axes")
    pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
    return [(0, 0)] * (ndim - len(pairs)) + pairs[::-1]
  if len(padding) != ndim:
    raise ValueError(f"padding needs {ndim} (before, after) pairs, got {len(padding)}")
  return [(0, 0) if p is None else (_pad_amount(p[0]), _pad_amount(p[1])) for p in padding]


def _pad_amount(x: Any) -> sint:
  """An int, or a symbolic amount (never negative: negative padding shrinks by an int)."""
  if not isinstance(x, UOp): return int(x)
  amount = _size_arg(x)
  if isinstance(amount, int): return amount
  if amount.vmin < 0:
    raise ValueError(f"a symbolic padding amount must be >= 0 for every value, got {x.render()}")
  return amount


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


@dataclass(frozen=True)
class BasicView:
  """What getitem_basic applies, in order: a shrink to `bounds` per axis, a flip of the axes in
  `flips`, every `steps[i]`-th element, then a reshape to `out_shape` (ints drop an axis, None
  adds one)."""
  bounds: tuple[tuple[sint, sint], ...]
  flips: tuple[bool, ...]
  steps: tuple[int, ...]
  out_shape: tuple[sint, ...]

  @property
  def strided_shape(self) -> tuple[sint, ...]:
    """The shape before the final reshape (each indexed axis kept, None axes absent)."""
    return tuple(-(-(hi - lo) // k) if k > 1 else hi - lo
                 for (lo, hi), k in zip(self.bounds, self.steps))


def basic_view(t: Tensor, idx: Any) -> BasicView:
  """The view ops of ints, slices, None and Ellipsis on `t` (bounds checked here)."""
  items = _expand_ellipsis(idx if isinstance(idx, tuple) else (idx,), t.ndim)
  bounds, flips, steps, out_shape, axis = [], [], [], [], 0
  for it in items:
    if it is None:
      out_shape.append(1)
      continue
    size = t.shape[axis]
    if _is_symbolic_item(it, size):
      lo, hi = _symbolic_window(it, size, axis)
      bounds.append((lo, hi)); flips.append(False); steps.append(1)  # noqa: E702
      if isinstance(it, slice): out_shape.append(hi if _is_zero(lo) else simplify_size(hi - lo))
      axis += 1
      continue
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
  return BasicView(tuple(bounds), tuple(flips), tuple(steps), tuple(out_shape))


def getitem_basic(t: Tensor, idx: Any) -> Tensor:
  """Apply ints, slices, None and Ellipsis as shrink/flip/reshape views."""
  v = basic_view(t, idx)
  x = t.shrink(v.bounds) if v.bounds else t
  if any(v.flips): x = x.flip(*[i for i, f in enumerate(v.flips) if f])
  if any(s > 1 for s in v.steps): x = _strided(x, list(v.steps))
  return x.reshape(*v.out_shape)


def place_basic(t: Tensor, idx: Any, w: Tensor) -> Tensor:
  """`t` with the elements getitem_basic(t, idx) views replaced by `w` (of the view's shape), as
  a new value (the transpose of each view op puts `w` in place: pad for shrink, flip, a padded
  reshape for steps; a mask placed the same way picks it). Differentiable in `t` and `w`."""
  v = basic_view(t, idx)
  mask = type(t).full(tuple(w.shape), True, dtypes.bool, t.device)
  return _unview(mask, v, t).where(_unview(w, v, t), t)


def _unview(w: Tensor, v: BasicView, t: Tensor) -> Tensor:
  """The transpose of getitem_basic's ops: `w` (the view's shape) at its place in t's shape,
  zeros (False) elsewhere."""
  x = w.reshape(*v.strided_shape, *t.shape[len(v.bounds):])
  for ax, ((lo, hi), k) in enumerate(zip(v.bounds, v.steps)):
    if k > 1: x = _unstride(x, ax, k, hi - lo)
  if any(v.flips): x = x.flip(*[i for i, f in enumerate(v.flips) if f])
  if not v.bounds: return x
  return x.pad([(lo, s - hi) for (lo, hi), s in zip(v.bounds, t.shape)] +
               [(0, 0)] * (t.ndim - len(v.bounds)))


def _unstride(x: Tensor, ax: int, k: int, size: sint) -> Tensor:
  """Axis `ax` of x spread to every k-th of `size` positions (zeros between): _strided's
  transpose."""
  n = x.shape[ax]
  x = x.unsqueeze(ax + 1)
  x = x.pad([(0, 0)] * (ax + 1) + [(0, k - 1)] + [(0, 0)] * (x.ndim - ax - 2)).flatten(ax, ax + 1)
  return x.shrink(tuple((0, size) if a == ax else (0, d) for a, d in enumerate(x.shape))) \
    if n * k != size else x


def _is_symbolic_item(it: Any, size: sint) -> bool:
  """A slice (or int) with a symbolic size or bound."""
  if isinstance(it, slice): return any(isinstance(v, UOp) for v in (it.start, it.stop, size))
  return isinstance(it, UOp) or (isinstance(it, int) and isinstance(size, UOp))


def _symbolic_window(it: Any, size: sint, axis: int) -> tuple[sint, sint]:
  """[lo, hi) of a step-1 slice or an index where a bound or the size is symbolic (negative int
  bounds count from the end, like Python's)."""
  if isinstance(it, slice):
    if it.step not in (None, 1):
      raise IndexError(f"a slice with a symbolic bound or size needs step 1, got {it.step}")
    lo = _from_end(0 if it.start is None else _size_arg(it.start), size)
    hi = _from_end(size if it.stop is None else _size_arg(it.stop), size)
    # clamped like Python's slices, but a bound equal to the size stays symbolic (x[:n] with
    # n == len(x) keeps its shape (n, ...), whatever n's value)
    lo, hi = (size if _less(size, lo) else lo), (size if _less(size, hi) else hi)
    return lo, (lo if _less(hi, lo) else hi)
  i = _from_end(_size_arg(it), size)
  if not (_in_order(0, i) and not _in_order(size, i)):
    raise IndexError(f"index {_s(it)} is out of bounds for dimension {axis} with size {_s(size)}")
  return i, simplify_size(i + 1)


def _from_end(x: sint, size: sint) -> sint:
  return simplify_size(size + x) if isinstance(x, int) and x < 0 else x


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
