"""ShapeTracker: a stack of Views for movement ops that one View cannot express (spec 004).

`views[0]` reads the buffer; each later View indexes the positions of the one before it in
row-major order. Movement ops apply to the last View; a reshape the last View cannot express
appends a fresh contiguous View. After every op the last two Views are merged while a single
View does the same (`View.__add__`), so a chain that one View can express ends as one View.
`to_indexed_uops` gives the buffer position and the validity of an index, the same expressions
(evaluated at every index) that rangeify builds for the same movement ops.
`view_chain(u)` reads a tensor graph's chain of movement ops down to its base node.
"""
from __future__ import annotations

from dataclasses import dataclass

from unigrad.shape.view import View, sint_add, sint_mul, sint_prod
from unigrad.uop import Ops, UOp, sint
from unigrad.uop.properties import as_shape
from unigrad.uop.symbolic import linear_terms
from unigrad.uop.uop import as_uop

__all__ = ["ShapeTracker", "view_chain"]


@dataclass(frozen=True)
class ShapeTracker:
  """Views applied in order (see the module docstring).

  >>> st = ShapeTracker.from_shape((3, 2)).reshape((2, 3)).flip((True, False))
  >>> st.pad(((1, 1), (1, 1))).views
  (View(shape=(4, 5), strides=(-3, 1), offset=5, mask=((1, 3), (1, 4)), contiguous=False),)
  """
  views: tuple[View, ...]

  @staticmethod
  def from_shape(shape: tuple[sint, ...]) -> ShapeTracker:
    return ShapeTracker((View.create(tuple(shape)),))

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape

  @property
  def size(self) -> sint: return self.views[-1].size

  @property
  def contiguous(self) -> bool:
    """One View reading the buffer's first positions in row-major order."""
    return len(self.views) == 1 and self.views[0].contiguous

  def _last(self, v: View) -> ShapeTracker:
    return ShapeTracker((*self.views[:-1], v)).simplify()

  def simplify(self) -> ShapeTracker:
    """Merge the last two Views while one View does the same."""
    views = self.views
    while len(views) >= 2 and (merged := views[-2] + views[-1]) is not None:
      views = (*views[:-2], merged)
    return self if views is self.views else ShapeTracker(views)

  def __add__(self, top: ShapeTracker) -> ShapeTracker:
    """`top`'s views applied after these (top indexes this tracker's indices row-major)."""
    st = self
    for v in top.views: st = ShapeTracker((*st.views, v)).simplify()
    return st

  # ---- movement ops ----

  def reshape(self, new_shape: tuple[sint, ...]) -> ShapeTracker:
    new = self.views[-1].reshape(tuple(new_shape))
    if new is not None: return self._last(new)
    return ShapeTracker((*self.views, View.create(tuple(new_shape)))).simplify()

  def permute(self, order: tuple[int, ...]) -> ShapeTracker:
    return self._last(self.views[-1].permute(tuple(order)))

  def expand(self, new_shape: tuple[sint, ...]) -> ShapeTracker:
    return self._last(self.views[-1].expand(tuple(new_shape)))

  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> ShapeTracker:
    return self._last(self.views[-1].pad(tuple(arg)))

  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> ShapeTracker:
    return self._last(self.views[-1].shrink(tuple(arg)))

  def flip(self, flags: tuple[bool, ...]) -> ShapeTracker:
    return self._last(self.views[-1].flip(tuple(flags)))

  # ---- index expressions ----

  def to_indexed_uops(self, idxs: tuple[UOp, ...] | None = None) -> tuple[UOp, UOp]:
    """(buffer position, validity) as UOps over `idxs` (RANGEs 0..n-1 by default)."""
    if idxs is None: idxs = tuple(UOp.range(s, i) for i, s in enumerate(self.shape))
    idx, valid = self.views[-1].to_indexed_uops(tuple(idxs))
    for v in reversed(self.views[:-1]):
      idx, valid = v.to_indexed_uops(_unflatten(idx, v.shape), valid)
    return idx, valid


  def real_strides(self, ignore_valid: bool = False) -> tuple[sint | None, ...]:
    """Each axis' stride in the buffer: how far the position moves per step along it, or None
    where that is no constant (the axis is merged into or split from another View's axes, or,
    unless `ignore_valid`, a mask depends on it)."""
    if len(self.views) == 1 and self.views[0].mask is None: return self.views[0].strides
    rngs = tuple(UOp.range(s, i) for i, s in enumerate(self.shape))
    idx, valid = self.to_indexed_uops(rngs)
    terms, _ = linear_terms(idx.simplify())
    nonlinear = [t for t in terms if t not in rngs]
    masked = set() if ignore_valid else set(valid.simplify().toposort())
    return tuple(None if r in masked or any(r in t.toposort() for t in nonlinear)
                 else terms.get(r, 0) for r in rngs)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    """The axes along which consecutive indices read consecutive positions."""
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if st == 1]


def _unflatten(flat: UOp, shape: tuple[sint, ...]) -> tuple[UOp, ...]:
  """Row-major coordinates of a flat position (`flat // inner % size`; the first not wrapped)."""
  out: list[UOp] = []
  inner: sint = 1
  for k in reversed(range(len(shape))):
    v = flat if inner == 1 else flat // as_uop(inner)
    out.append(v % as_uop(shape[k]) if k > 0 else v)
    inner = sint_mul(inner, shape[k])
  return tuple(reversed(out))


def view_chain(u: UOp) -> tuple[UOp, ShapeTracker]:
  """(base, tracker): the node under `u`'s chain of movement ops and the ShapeTracker that maps
  `u`'s indices to the base's positions read row-major."""
  chain: list[UOp] = []
  while u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP):
    chain.append(u)
    u = u.src[0]
  st = ShapeTracker.from_shape((sint_prod(u.shape),)).reshape(tuple(u.shape))
  for m in reversed(chain): st = _apply(st, m)
  return u, st


def _apply(st: ShapeTracker, m: UOp) -> ShapeTracker:
  """One movement op of the tensor graph (spec encodings: shapes and offsets in src)."""
  if m.op is Ops.RESHAPE: return st.reshape(as_shape(m.src[1]))
  if m.op is Ops.PERMUTE: return st.permute(m.arg)
  if m.op is Ops.EXPAND: return st.expand(as_shape(m.src[1]))
  if m.op is Ops.FLIP: return st.flip(m.arg)
  offs, sizes = as_shape(m.src[1]), as_shape(m.src[2])
  if m.op is Ops.SHRINK: return st.shrink(tuple((o, sint_add(o, n)) for o, n in zip(offs, sizes)))
  before = zip(offs, st.shape, sizes)
  return st.pad(tuple((o, sint_add(n, sint_mul(sint_add(o, s), -1))) for o, s, n in before))
