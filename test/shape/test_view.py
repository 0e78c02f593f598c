"""View and ShapeTracker (spec 004): the tutorial's examples, merging of views, bad input."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shape.chains import evaluate, movement_chain
from unigrad.shape import ShapeTracker, View, strides_for_shape
from unigrad.uop import UOp
from unigrad.uop.variable import Variable


# ---- the tutorial's examples, as it prints them ----

def test_spec_view_examples():
  v = View(shape=(4, 8), strides=(8, 1), offset=0, mask=None, contiguous=True)
  assert View.create((4, 8)) == v
  assert v.reshape((32,)) == View((32,), (1,), 0, None, True)
  assert v.flip((False, True)) == View((4, 8), (8, -1), 7, None, False)
  assert v.pad(((2, 2), (2, 2))) == View((8, 12), (8, 1), -18, ((2, 6), (2, 10)), False)
  padded = View.create((3, 2)).pad(((1, 1), (1, 1)))
  assert padded == View((5, 4), (2, 1), -3, ((1, 4), (1, 3)), False)
  assert padded.reshape((20,)) is None  # a padded axis cannot merge with another


def test_spec_shapetracker_examples():
  st = ShapeTracker((View.create((3, 2)),))
  st_rfp = st.reshape((2, 3)).flip((True, False)).pad(((1, 1), (1, 1)))
  assert st_rfp.views == (View((4, 5), (-3, 1), 5, ((1, 3), (1, 4)), False),)
  flat = st_rfp.reshape((20,))
  assert flat.views == (st_rfp.views[0], View((20,), (1,), 0, None, True))
  idx, valid = st_rfp.to_indexed_uops()
  assert idx.render() == "(((r0*-3)+r1)+5)"
  rngs = (UOp.range(4, 0), UOp.range(5, 1))
  assert st_rfp.to_indexed_uops(rngs) == (idx, valid)  # RANGE i of the shape's axis i
  for r0 in range(4):
    for r1 in range(5):
      env = {rngs[0]: r0, rngs[1]: r1}
      assert evaluate(valid, env) == (1 <= r0 < 3 and 1 <= r1 < 4)
      assert evaluate(idx, env) == r0 * -3 + r1 + 5


def test_as_strided_views_of_the_tutorial():
  """The tutorial's as_strided examples are Views over a (4, 8) buffer."""
  every_other = View.create((4, 4), (8, 2))
  odd = View.create((4, 4), (8, 2), offset=1)
  diagonal = View.create((4,), (9,))
  cases = ((every_other, [0, 2, 4, 6]), (odd, [1, 3, 5, 7]), (diagonal, [0, 9, 18, 27]))
  for v, first_row in cases:
    rngs = tuple(UOp.range(s, i) for i, s in enumerate(v.shape))
    idx, _ = ShapeTracker((v,)).to_indexed_uops(rngs)
    env = {r: 0 for r in rngs}
    assert [evaluate(idx, {**env, rngs[-1]: i}) for i in range(4)] == first_row


# ---- canonical form ----

def test_canonical_views():
  assert strides_for_shape((2, 1, 3)) == (3, 0, 1)
  assert View.create((2, 0, 3)).strides == (0, 0, 0)  # nothing to read
  assert View.create((3,), mask=((0, 3),)).mask is None  # a full mask is no mask
  assert View.create((3, 2), mask=((1, 1), (0, 2))) == View((3, 2), (0, 0), 0, ((0, 0), (0, 0)),
                                                           False)
  one = View.create((3, 4), (4, 1), 0, ((2, 3), (0, 4)))  # axis 0 valid at one position
  assert one.strides == (0, 1) and one.offset == 8


def test_reshape_keeps_masks_it_can():
  v = View.create((4,)).pad(((2, 2),))  # (8,), valid [2, 6)
  assert v.reshape((2, 4)) is None  # [2, 6) is no box of (2, 4)
  w = View.create((4,)).pad(((4, 4),))  # (12,), valid [4, 8)
  assert w.reshape((3, 4)) == View((3, 4), (0, 1), 0, ((1, 2), (0, 4)), False)
  assert View.create((2, 3)).pad(((1, 1), (0, 0))).reshape((4, 3, 1)).mask == ((1, 3), (0, 3),
                                                                              (0, 1))


def test_reshape_of_a_transpose():
  t = View.create((2, 3, 4)).permute((2, 0, 1))  # (4, 2, 3), strides (1, 12, 4)
  assert t.reshape((4, 6)) == View((4, 6), (1, 4), 0, None, False)
  assert t.reshape((8, 3)) is None


# ---- merging ----

def test_merge_after_a_reshape_that_needed_two_views():
  st = ShapeTracker.from_shape((4,)).pad(((1, 1),)).reshape((2, 3))
  assert len(st.views) == 2
  col = st.shrink(((0, 2), (1, 2)))  # the padding is no longer read: one view again
  assert col.views == (View((2, 1), (3, 0), 0, None, False),)


def test_merge_moves_a_base_mask_onto_the_top_axis():
  base = View.create((2, 3)).pad(((0, 0), (1, 0)))  # (2, 4), column 0 padding
  top = View.create((4, 2), (1, 4))  # base transposed, read through base's positions
  assert base + top == View((4, 2), (1, 3), -1, ((1, 4), (0, 2)), False)
  # a base coordinate that depends on two top axes: no single mask (kept as two views)
  assert View.create((6,)).pad(((2, 0),)) + View.create((2, 4), (1, 2)) is None


def test_merge_refuses_carries():
  base = View.create((2, 3)).permute((1, 0))  # (3, 2), strides (1, 3)
  assert base + View.create((4,), offset=1) is None
  assert len(ShapeTracker((base,)).reshape((6,)).shrink(((1, 5),)).views) == 2


@st.composite
def two_views(draw: st.DrawFn) -> tuple[View, View]:
  _, base = draw(movement_chain().filter(lambda c: len(c[1].views) == 1))
  size = base.views[0].size
  _, top = draw(movement_chain(numel=size).filter(lambda c: len(c[1].views) == 1))
  return base.views[0], top.views[0]


@settings(max_examples=300, deadline=None)
@given(two_views())
def test_merged_view_reads_what_both_views_read(views: tuple[View, View]):
  base, top = views
  merged = base + top
  if merged is None: return
  rngs = tuple(UOp.range(s, i) for i, s in enumerate(top.shape))
  both_idx, both_valid = ShapeTracker((base, top)).to_indexed_uops(rngs)
  one_idx, one_valid = merged.to_indexed_uops(rngs)
  for point in itertools.product(*(range(s) for s in top.shape)):
    env = dict(zip(rngs, point))
    ok = bool(evaluate(both_valid, env))
    assert ok == bool(evaluate(one_valid, env)), point
    if ok: assert evaluate(both_idx, env) == evaluate(one_idx, env), point


def test_real_strides():
  st = ShapeTracker.from_shape((2, 3)).permute((1, 0))
  assert st.real_strides() == (1, 3) and st.unit_stride_axes() == [0]
  assert st.reshape((6,)).real_strides() == (None,)  # a transpose read flat: no constant step
  padded = ShapeTracker.from_shape((4,)).pad(((1, 1),)).reshape((2, 3))
  assert len(padded.views) == 2
  assert padded.real_strides() == (None, None)  # both axes decide validity
  assert padded.real_strides(ignore_valid=True) == (3, 1)
  assert padded.unit_stride_axes(ignore_valid=True) == [1]
  assert ShapeTracker.from_shape((3, 1)).expand((3, 4)).real_strides() == (1, 0)


# ---- symbolic shapes ----

def test_symbolic_views():
  n = Variable("n", 1, 10)
  v = View.create((n, 4))
  assert v.contiguous and v.strides == (4, 1)
  assert v.permute((1, 0)).strides == (1, 4)
  assert v.reshape((n, 2, 2)).contiguous
  assert v.flip((True, False)).offset.render() == (((n - 1) * 4).simplify()).render()
  st = ShapeTracker.from_shape((n, 4)).permute((1, 0))
  assert st.reshape((2, 2, n)).views == (View((2, 2, n), (2, 1, 4), 0, None, False),)
  assert len(st.reshape((n * 4,)).views) == 2  # a transpose does not flatten


# ---- bad input ----

def test_bad_movement_arguments():
  v = View.create((2, 3))
  with pytest.raises(ValueError, match="permutation"): v.permute((0, 0))
  with pytest.raises(ValueError, match="expand"): v.expand((4, 3))
  with pytest.raises(ValueError, match="out of bounds"): v.shrink(((0, 3), (0, 3)))
  with pytest.raises(ValueError, match=">= 0"): v.pad(((-1, 0), (0, 0)))
  with pytest.raises(ValueError, match="sizes differ"): v.reshape((5,))
  with pytest.raises(ValueError, match="flags"): v.flip((True,))
