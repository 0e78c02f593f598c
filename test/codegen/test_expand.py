"""The expand stage (codegen/expand.py): unrolled ranges, reductions lowered to accumulators."""
import pytest

from unigrad.codegen.expand import invariant_reduce
from unigrad.dtype import dtypes
from unigrad.uop import AxisType, Ops, UOp
from unigrad.uop.ops import RangeArg, ReduceArg


def rng(i: int, n: int | UOp) -> UOp:
  size = n if isinstance(n, UOp) else UOp.const(dtypes.index, n)
  return UOp(Ops.RANGE, dtypes.index, (size,), RangeArg(i, AxisType.REDUCE))


def reduce(op: Ops, value: UOp, *ranges: UOp) -> UOp:
  return UOp(Ops.REDUCE, value.dtype, (value, *ranges), ReduceArg(op))


def test_sum_of_a_value_free_of_its_range_is_the_value_times_its_size():
  """After unrolling, the prefix-sum arange of a nibble's shift sums a constant 1 over its range:
  it rendered a loop per use, and the shift by that non-constant became one scalar,
  bounds-guarded shift per lane (every int8 matvec of a Q4 weight)."""
  folded = invariant_reduce(reduce(Ops.ADD, UOp.const(dtypes.int64, 1), rng(0, 2)))
  assert folded is not None and folded.simplify().arg == 2


def test_only_the_ranges_the_value_is_free_of_are_dropped():
  r0, r1 = rng(0, 3), rng(1, 4)
  x = r0.cast(dtypes.int32) * 5
  folded = invariant_reduce(reduce(Ops.ADD, x, r0, r1))
  assert folded is not None and folded.op is Ops.REDUCE and folded.src[1:] == (r0,)
  assert invariant_reduce(reduce(Ops.ADD, x, r0)) is None


@pytest.mark.parametrize("size, folds", [(3, True), (None, False)])
def test_max_over_a_free_range_is_the_value_where_the_range_cannot_be_empty(size, folds):
  """A max over an empty range is its identity (the dtype's minimum), not the value."""
  n = UOp.const(dtypes.index, size) if size else UOp.variable("n", 0, 8)
  v = UOp.const(dtypes.float32, 2.5)
  folded = invariant_reduce(reduce(Ops.MAX, v, rng(0, n)))
  assert (folded is v) if folds else folded is None
