"""ShapeTracker.to_indexed_uops against rangeify (property tests): for random chains of movement
ops over a flat buffer, the position and validity of every index, evaluated, equal what
rangeify's index pushing builds for the same tensor-graph chain."""
from hypothesis import given, settings

from shape.chains import assert_same_reads, evaluate, flat_param, movement_chain
from unigrad.schedule.callify import buffer_view
from unigrad.shape import ShapeTracker, view_chain
from unigrad.uop import Ops, UOp, shape_uop
from unigrad.uop.variable import Variable

@settings(max_examples=400, deadline=None)
@given(movement_chain())
def test_tracker_reads_what_rangeify_reads(chain: tuple[UOp, ShapeTracker]):
  x, tracker = chain
  assert tracker.shape == tuple(x.shape)
  assert_same_reads(x, tracker)


@settings(max_examples=150, deadline=None)
@given(movement_chain())
def test_view_chain_builds_the_same_tracker(chain: tuple[UOp, ShapeTracker]):
  x, tracker = chain
  base, from_graph = view_chain(x)
  assert base.op is Ops.PARAM
  assert from_graph == tracker


@settings(max_examples=150, deadline=None)
@given(movement_chain())
def test_merging_never_adds_views(chain: tuple[UOp, ShapeTracker]):
  """Each View after the first comes from a reshape that the View before it could not express."""
  x, tracker = chain
  reshapes = sum(1 for u in x.toposort() if u.op is Ops.RESHAPE)
  assert len(tracker.views) <= reshapes


# ---- symbolic shapes ----

SYMBOLIC_CHAINS = {
  "permute_flip": lambda x, t: (UOp(Ops.FLIP, x.dtype, (UOp(Ops.PERMUTE, x.dtype, (x,), (1, 0)),),
                                    (True, False)), t.permute((1, 0)).flip((True, False))),
  "pad_shrink": lambda x, t: _pad_shrink(x, t),
  "unsqueeze_expand": lambda x, t: _unsqueeze_expand(x, t),
}


def _pad_shrink(x: UOp, t: ShapeTracker) -> tuple[UOp, ShapeTracker]:
  n = x.shape[0]
  padded = UOp(Ops.PAD, x.dtype, (x, shape_uop((1, 2)), shape_uop((n + 2, 7))))
  t = t.pad(((1, 1), (2, 2)))
  shrunk = UOp(Ops.SHRINK, x.dtype, (padded, shape_uop((0, 1)), shape_uop((n + 1, 5))))
  return shrunk, t.shrink(((0, n + 1), (1, 6)))


def _unsqueeze_expand(x: UOp, t: ShapeTracker) -> tuple[UOp, ShapeTracker]:
  n = x.shape[0]
  r = UOp(Ops.RESHAPE, x.dtype, (x, shape_uop((n, 1, 3))))
  e = UOp(Ops.EXPAND, x.dtype, (r, shape_uop((n, 4, 3))))
  return e, t.reshape((n, 1, 3)).expand((n, 4, 3))


def test_symbolic_chains_read_what_rangeify_reads():
  n = Variable("n", 1, 8)
  for name, build in SYMBOLIC_CHAINS.items():
    base = buffer_view(flat_param(24), (n, 3))  # a symbolic shape: the buffer's prefix
    x, tracker = build(base, ShapeTracker.from_shape((n, 3)))
    assert len(tracker.views) == 1, name
    assert view_chain(x)[1] == tracker, name
    for value in (1, 3, 8):
      concrete = tuple(s if isinstance(s, int) else int(evaluate(s, {n: value})) for s in x.shape)
      assert_same_reads(x, tracker, {n: value}, concrete)
