"""View: one strided, offset, masked window onto a flat buffer (spec 004, "class View").

A View maps an index (i_0, ..., i_{n-1}) of its `shape` to the buffer position
`offset + sum(i_k * strides[k])`; the position is valid only where every `mask[k] = (lo, hi)`
holds `lo <= i_k < hi` (a padded region is invalid: nothing is read there). Each movement op of
the spec (reshape, permute, expand, pad, shrink, flip) maps a View to a View, except that
`reshape` returns None where no single View can express the result (ShapeTracker then appends a
View). `base + top` merges two Views (`top` indexes `base`'s positions read row-major) into one,
or gives None. Sizes are ints or symbolic index UOps (`sint`); merging and reshaping of symbolic
axes are limited to what stays exact (an axis kept as it is).

Views are canonical, so equal windows compare equal: a size-1 axis has stride 0, an axis masked
to one position has stride 0 (its position is in the offset), a mask covering the whole shape is
None, and a View that reads nothing (an empty mask) is all zero strides with mask (0, 0) per axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import dtypes
from unigrad.uop import Ops, UOp, sint
from unigrad.uop.uop import as_uop
from unigrad.uop.variable import products_equal, simplify_size, sizes_equal

__all__ = ["View", "strides_for_shape", "unravel"]

Mask = tuple[tuple[sint, sint], ...]


# ---- arithmetic on sizes (ints, or symbolic index UOps) ----

def _is(x: sint, v: int) -> bool: return isinstance(x, int) and x == v


def _same(a: sint, b: sint) -> bool:
  return a == b if isinstance(a, int) and isinstance(b, int) else sizes_equal(a, b)


def sint_mul(a: sint, b: sint) -> sint:
  return a * b if isinstance(a, int) and isinstance(b, int) else simplify_size(a * b)


def sint_add(a: sint, b: sint) -> sint:
  return a + b if isinstance(a, int) and isinstance(b, int) else simplify_size(a + b)


def _max(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return max(a, b)
  return simplify_size(as_uop(a).maximum(b))


def _min(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return min(a, b)
  return simplify_size(-((-as_uop(a)).maximum(-as_uop(b))))


def sint_prod(xs: Any) -> sint:
  out: sint = 1
  for x in xs: out = sint_mul(out, x)
  return out


def _ints(*groups: Any) -> bool:
  return all(isinstance(x, int) for g in groups for x in g)


def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  """Row-major strides of `shape`; a size-1 axis gets 0 (it never moves)."""
  out, acc = [], 1
  for s in reversed(shape):
    out.append(0 if _is(s, 1) else acc)
    acc = sint_mul(acc, s)
  return tuple(reversed(out))


def unravel(pos: int, shape: tuple[int, ...]) -> list[int]:
  """The row-major coordinates of flat position `pos` (the first one is not wrapped)."""
  out = []
  for s in reversed(shape[1:]):
    out.append(pos % s)
    pos //= s
  return [pos, *reversed(out)] if shape else []


def _empty_mask(n: int) -> Mask: return ((0, 0),) * n


def _is_empty(lo: sint, hi: sint) -> bool:
  return isinstance(lo, int) and isinstance(hi, int) and lo >= hi


@dataclass(frozen=True)
class View:
  """A strided, offset, masked view of a flat buffer (see the module docstring).

  >>> View.create((4, 8)).flip((False, True))
  View(shape=(4, 8), strides=(8, -1), offset=7, mask=None, contiguous=False)
  """
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Mask | None
  contiguous: bool

  @staticmethod
  def create(shape: tuple[sint, ...], strides: tuple[sint, ...] | None = None, offset: sint = 0,
             mask: Mask | None = None) -> View:
    """The canonical View (see the module docstring) of these fields."""
    shape = tuple(shape)
    if any(_is(s, 0) for s in shape): return View(shape, (0,) * len(shape), 0, None, True)
    strides = strides_for_shape(shape) if strides is None else tuple(strides)
    strides = tuple(0 if _is(s, 1) else st for s, st in zip(shape, strides))
    if mask is not None:
      mask = tuple((lo, hi) for lo, hi in mask)
      if any(_is_empty(lo, hi) for lo, hi in mask):
        return View(shape, (0,) * len(shape), 0, _empty_mask(len(shape)), False)
      # an axis valid at one position only: that position goes into the offset
      fixed = [isinstance(lo, int) and isinstance(hi, int) and hi - lo == 1 for lo, hi in mask]
      offset = sint_add(offset,
                        sum(sint_mul(lo, st) for f, (lo, _), st in zip(fixed, mask, strides) if f))
      strides = tuple(0 if f else st for f, st in zip(fixed, strides))
      if all(_is(lo, 0) and _same(hi, s) for (lo, hi), s in zip(mask, shape)): mask = None
    offset = simplify_size(offset)
    contiguous = _is(offset, 0) and mask is None and all(
      _same(a, b) for a, b in zip(strides, strides_for_shape(shape)))
    return View(shape, strides, offset, mask, contiguous)

  @property
  def size(self) -> sint:
    """The number of indices (the product of the shape)."""
    return sint_prod(self.shape)

  @property
  def reads_nothing(self) -> bool:
    """Every index is masked out (padding only)."""
    return self.mask is not None and any(_is_empty(lo, hi) for lo, hi in self.mask)

  def _full_mask(self) -> Mask:
    return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

  # ---- movement ops ----

  def permute(self, order: tuple[int, ...]) -> View:
    """Axes reordered: new axis k is old axis order[k]."""
    if sorted(order) != list(range(len(self.shape))):
      raise ValueError(f"permute {order} is not a permutation of {len(self.shape)} axes")
    mask = None if self.mask is None else tuple(self.mask[a] for a in order)
    return View.create(tuple(self.shape[a] for a in order), tuple(self.strides[a] for a in order),
                       self.offset, mask)

  def expand(self, new_shape: tuple[sint, ...]) -> View:
    """Size-1 axes broadcast to `new_shape` (stride 0: every index reads the same position)."""
    new_shape = tuple(new_shape)
    if len(new_shape) != len(self.shape):
      raise ValueError(f"expand {new_shape} needs {len(self.shape)} axes")
    grow = [not _same(a, b) for a, b in zip(self.shape, new_shape)]
    if any(g and not _is(a, 1) for g, a in zip(grow, self.shape)):
      raise ValueError(f"cannot expand {self.shape} to {new_shape}: only size-1 axes broadcast")
    if self.reads_nothing: return View.create(new_shape, mask=_empty_mask(len(new_shape)))
    mask = None if self.mask is None else tuple(
      (0, n) if g else m for g, m, n in zip(grow, self.mask, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def flip(self, flags: tuple[bool, ...]) -> View:
    """Axes with a True flag read backwards."""
    if len(flags) != len(self.shape): raise ValueError(f"flip needs {len(self.shape)} flags")
    offset = self.offset
    for f, s, st in zip(flags, self.shape, self.strides):
      if f: offset = sint_add(offset, sint_mul(sint_add(s, -1), st))
    strides = tuple(sint_mul(st, -1) if f else st for f, st in zip(flags, self.strides))
    mask = None if self.mask is None else tuple(
      (sint_add(s, sint_mul(hi, -1)), sint_add(s, sint_mul(lo, -1))) if f else (lo, hi)
      for f, (lo, hi), s in zip(flags, self.mask, self.shape))
    return View.create(self.shape, strides, offset, mask)

  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> View:
    """Keep indices [begin, end) of each axis."""
    if len(arg) != len(self.shape): raise ValueError(f"shrink needs {len(self.shape)} ranges")
    for (b, e), s in zip(arg, self.shape):
      if _ints((b, e, s)) and not 0 <= b <= e <= s:
        raise ValueError(f"shrink {arg} is out of bounds for shape {self.shape}")
    return self._window(arg)

  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> View:
    """Add (before, after) invalid indices around each axis."""
    if len(arg) != len(self.shape): raise ValueError(f"pad needs {len(self.shape)} pairs")
    if any(isinstance(x, int) and x < 0 for p in arg for x in p):
      raise ValueError(f"pad amounts must be >= 0, got {arg}")
    return self._window(tuple((sint_mul(b, -1), sint_add(s, a))
                              for (b, a), s in zip(arg, self.shape)))

  def _window(self, window: tuple[tuple[sint, sint], ...]) -> View:
    """New axis k covers old indices [start, end) (positions outside the old shape invalid)."""
    offset = self.offset
    for (start, _), st in zip(window, self.strides): offset = sint_add(offset, sint_mul(start, st))
    shape = tuple(sint_add(e, sint_mul(b, -1)) for b, e in window)
    mask = tuple((_max(sint_add(lo, sint_mul(b, -1)), 0), _min(sint_add(hi, sint_mul(b, -1)), n))
                 for (lo, hi), (b, _), n in zip(self._full_mask(), window, shape))
    return View.create(shape, self.strides, offset, mask)

  def reshape(self, new_shape: tuple[sint, ...]) -> View | None:
    """The same positions in row-major order seen with `new_shape`, or None when one View
    cannot express that (a padded axis merged with another one, strides that do not nest)."""
    new_shape = tuple(new_shape)
    if new_shape == self.shape: return self
    if not products_equal(self.shape, new_shape):
      raise ValueError(f"cannot reshape {self.shape} to {new_shape}: the sizes differ")
    if any(_is(s, 0) for s in new_shape) or self.contiguous: return View.create(new_shape)
    if self.reads_nothing: return View.create(new_shape, mask=_empty_mask(len(new_shape)))
    return _reshape(self, new_shape)

  # ---- merging and indexing ----

  def __add__(self, top: View) -> View | None:
    """One View reading what `top` reads through self (`top`'s positions index self's indices
    in row-major order), or None when no single View does."""
    if top.contiguous:
      return self.reshape(top.shape) if products_equal(self.shape, top.shape) else None
    if self.contiguous: return top
    if top.reads_nothing or self.reads_nothing:
      return View.create(top.shape, mask=_empty_mask(len(top.shape)))
    if not _ints(self.shape, self.strides, top.shape, top.strides, (self.offset, top.offset),
                 *(self.mask or ()), *(top.mask or ())):
      return None
    return _compose(self, top)

  def to_indexed_uops(self, idxs: tuple[UOp, ...] | None = None,
                      vexpr: UOp | None = None) -> tuple[UOp, UOp]:
    """(position, validity) as index and bool UOps over `idxs` (RANGEs by default)."""
    if idxs is None: idxs = tuple(UOp.range(s, i) for i, s in enumerate(self.shape))
    idx: UOp | None = None
    for i, st in zip(idxs, self.strides):
      if _is(st, 0): continue
      term = i if _is(st, 1) else i * as_uop(st)
      idx = term if idx is None else idx + term
    if idx is None: idx = as_uop(self.offset)
    elif not _is(self.offset, 0): idx = idx + as_uop(self.offset)
    valid = vexpr if vexpr is not None else UOp.const(dtypes.bool, True)
    if self.mask is None: return idx, valid
    if self.reads_nothing: return idx, UOp.const(dtypes.bool, False)
    for i, (lo, hi), s in zip(idxs, self.mask, self.shape):
      if not _is(lo, 0): valid = _and(valid, (i < as_uop(lo)).ne(True))
      if not _same(hi, s): valid = _and(valid, i < as_uop(hi))
    return idx, valid


def _and(a: UOp, b: UOp) -> UOp:
  return b if a.op is Ops.CONST and a.arg is True else a & b


# ---- reshape of a strided or masked view ----

@dataclass(frozen=True)
class _Axis:
  size: sint
  stride: sint
  lo: sint
  hi: sint


def _groups(old: list[_Axis], new: list[sint]) -> list[tuple[list[_Axis], list[sint]]] | None:
  """Pair runs of old and new axes with equal products (a symbolic axis only pairs with an
  equal one)."""
  out: list[tuple[list[_Axis], list[sint]]] = []
  i = j = 0
  while i < len(old) and j < len(new):
    if not isinstance(old[i].size, int) or not isinstance(new[j], int):
      if not _same(old[i].size, new[j]): return None
      out.append(([old[i]], [new[j]]))
      i, j = i + 1, j + 1
      continue
    og, ng, po, pn = [old[i]], [new[j]], old[i].size, new[j]
    i, j = i + 1, j + 1
    while po != pn:
      if po < pn:
        if i == len(old) or not isinstance(old[i].size, int): return None
        og.append(old[i])
        po, i = po * old[i].size, i + 1
      else:
        if j == len(new) or not isinstance(new[j], int): return None
        ng.append(new[j])
        pn, j = pn * new[j], j + 1
    out.append((og, ng))
  return out if i == len(old) and j == len(new) else None


def _merge(axes: list[_Axis]) -> tuple[int, int, int, int, int] | None:
  """Axes (outermost first) merged into one: (size, stride, lo, hi, offset correction), or None
  when the valid region is no interval of the merged index or the strides do not nest."""
  if not _ints(*((a.size, a.stride, a.lo, a.hi) for a in axes)): return None
  sizes = [int(a.size) for a in axes]
  inner = [math.prod(sizes[k + 1:]) for k in range(len(axes))]
  k = next((n for n, a in enumerate(axes) if a.hi - a.lo > 1), None)
  if k is None:  # one valid position
    lo = sum(int(a.lo) * r for a, r in zip(axes, inner))
    return math.prod(sizes), 0, lo, lo + 1, 0
  if any(a.lo != 0 or a.hi != a.size for a in axes[k + 1:]): return None
  stride = int(axes[-1].stride) if k < len(axes) - 1 else int(axes[k].stride)
  for a, r in zip(axes[k:], inner[k:]):
    if a.stride != stride * r: return None
  lo = sum(int(a.lo) * r for a, r in zip(axes[:k + 1], inner))
  hi = lo + (int(axes[k].hi) - int(axes[k].lo)) * inner[k]
  fixed = sum(int(a.lo) * r for a, r in zip(axes[:k], inner))
  return math.prod(sizes), stride, lo, hi, -stride * fixed


def _split_mask(lo: int, hi: int, sizes: list[int]) -> list[tuple[int, int]] | None:
  """The box of split coordinates whose row-major positions are exactly [lo, hi), or None."""
  if not sizes: return []
  rest = math.prod(sizes[1:])
  if lo // rest == (hi - 1) // rest:
    q = lo // rest
    sub = _split_mask(lo - q * rest, hi - q * rest, sizes[1:])
    return None if sub is None else [(q, q + 1), *sub]
  if lo % rest == 0 and hi % rest == 0:
    return [(lo // rest, hi // rest), *((0, s) for s in sizes[1:])]
  return None


def _reshape(v: View, new_shape: tuple[sint, ...]) -> View | None:
  mask = v._full_mask()
  old = [_Axis(s, st, lo, hi) for s, st, (lo, hi) in zip(v.shape, v.strides, mask) if not _is(s, 1)]
  kept = [s for s in new_shape if not _is(s, 1)]
  groups = _groups(old, kept)
  if groups is None: return None
  strides: list[sint] = []
  masks: list[tuple[sint, sint]] = []
  offset = v.offset
  for og, ng in groups:
    if len(og) == 1 and len(ng) == 1:
      strides.append(og[0].stride)
      masks.append((og[0].lo, og[0].hi))
      continue
    merged = _merge(og)
    if merged is None: return None
    _, stride, lo, hi, correction = merged
    sub = _split_mask(lo, hi, [int(s) for s in ng])
    if sub is None: return None
    inner = [math.prod(int(s) for s in ng[k + 1:]) for k in range(len(ng))]
    strides.extend(stride * r for r in inner)
    masks.extend(sub)
    offset = sint_add(offset, correction)
  it_st, it_mask = iter(strides), iter(masks)
  full_st = tuple(0 if _is(s, 1) else next(it_st) for s in new_shape)
  full_mask = tuple((0, 1) if _is(s, 1) else next(it_mask) for s in new_shape)
  return View.create(new_shape, full_st, offset, full_mask)


# ---- merging two views ----

def _signed_digits(step: int, shape: tuple[int, ...]) -> list[int]:
  """`step` as mixed-radix digits of `shape` (negated for a negative step)."""
  digits = unravel(abs(step), shape)
  return [-d for d in digits] if step < 0 else digits


def _compose(base: View, top: View) -> View | None:
  """Merge `top` over `base` (ints only): each coordinate of base must move linearly over top's
  valid box (no carry between base's axes), and each masked base axis must depend on at most
  one axis of top (its mask becomes a mask of that axis)."""
  shape = tuple(int(s) for s in base.shape)
  box = [(int(lo), int(hi)) for lo, hi in top._full_mask()]
  steps = [int(st) if hi - lo > 1 else 0 for st, (lo, hi) in zip(top.strides, box)]
  start = int(top.offset) + sum(st * lo for st, (lo, _) in zip(top.strides, box))
  if not 0 <= start < math.prod(shape): return None
  origin = unravel(start, shape)
  digits = [_signed_digits(st, shape) for st in steps]
  last_step = [hi - lo - 1 for lo, hi in box]
  reach = [(origin[j] + sum(min(0, d[j] * n) for d, n in zip(digits, last_step)),
            origin[j] + sum(max(0, d[j] * n) for d, n in zip(digits, last_step)))
           for j in range(len(shape))]
  if any(lo < 0 or hi >= s for (lo, hi), s in zip(reach, shape)): return None  # a carry
  mask = [list(b) for b in box]
  for j, (lo, hi) in enumerate(reach):
    if base.mask is None: break
    m0, m1 = int(base.mask[j][0]), int(base.mask[j][1])
    if m0 <= lo and hi < m1: continue
    deps = [i for i, d in enumerate(digits) if d[j] != 0]
    if len(deps) != 1: return None if deps else View.create(top.shape, mask=_empty_mask(len(box)))
    i, c = deps[0], digits[deps[0]][j]
    # base coordinate j at top index x_i is origin[j] + c * (x_i - box[i].lo)
    a, b = (m0 - origin[j]), (m1 - 1 - origin[j])
    first, last = (-(-a // c), b // c) if c > 0 else (-(-b // c), a // c)
    mask[i] = [max(mask[i][0], box[i][0] + first), min(mask[i][1], box[i][0] + last + 1)]
  strides = tuple(sum(int(st) * d[j] for j, st in enumerate(base.strides)) for d in digits)
  offset = int(base.offset) + sum(int(st) * o for st, o in zip(base.strides, origin))
  offset -= sum(st * lo for st, (lo, _) in zip(strides, box))
  return View.create(top.shape, strides, offset, tuple((lo, hi) for lo, hi in mask))
