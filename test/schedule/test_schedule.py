"""Callify, rangeify and schedule: kernel counts, the schedule cache, assign ordering."""
import math

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.engine import entry
from unigrad.helpers import GlobalCounters
from unigrad.schedule.callify import callify
from unigrad.uop import Ops


def kernels(t: Tensor) -> int: return len(t.schedule().src)


@pytest.fixture
def abc():
  rng = np.random.default_rng(0)
  return [Tensor(rng.standard_normal((16, 16), dtype=np.float32)) for _ in range(3)]


def test_elementwise_chain_is_one_kernel(abc):
  a, b, c = abc
  assert kernels((a * b + c).relu()) == 1


def test_elementwise_fuses_into_reduce(abc):
  assert kernels((abc[0] + 1).sum(1)) == 1


def test_nested_reduce_at_most_two_kernels(abc):
  assert kernels(abc[0].sum(1).sum(0)) <= 2


def test_softmax_computes_its_exp_once(abc):
  # exp(x - max) is summed and divided by the sum: realized once (max, exp, sum, normalize),
  # not computed in both the sum's and the normalization's kernel
  x = abc[0]
  e = (x - x.max(-1, keepdim=True)).exp()
  calls = (e / e.sum(-1, keepdim=True)).schedule().src
  assert len(calls) <= 4
  assert sum(1 for c in calls for u in c.src[0].toposort() if u.op is Ops.EXP2) == 1


def test_log_softmax_keeps_exp_in_its_sum(abc):
  # exp(x - max) read only by its sum: nothing to share, no extra kernel
  assert kernels(abc[0].log_softmax(-1)) <= 3


def test_broadcast_expensive_value_realized_once(abc):
  a, b, _ = abc
  out = a.exp() @ b  # exp is broadcast over the matmul's N axis: computed once into a buffer
  calls = out.schedule().src
  assert len(calls) == 2
  exp_kernel = calls[0].src[0]
  assert sum(1 for u in exp_kernel.toposort() if u.op is Ops.EXP2) == 1


def test_schedule_cache_hits_for_same_program_on_other_buffers():
  entry.schedule_cache.clear()
  x, y = Tensor.empty(8, 8), Tensor.empty(8, 8)
  (x * 2 + 1).realize()
  assert len(entry.schedule_cache) == 1
  (y * 2 + 1).realize()
  assert len(entry.schedule_cache) == 1, \
    "the same function on other buffers must reuse the schedule"


def test_callify_body_is_the_same_node_for_the_same_program():
  x, y = Tensor.empty(4), Tensor.empty(4)
  cx = callify([(x + 1).uop], ["CPU"]).call
  cy = callify([(y + 1).uop], ["CPU"]).call
  assert cx.src[0] is cy.src[0] and cx.src[1] is not cy.src[1]


def test_realize_replaces_subgraph_in_live_tensors():
  a = Tensor([1.0, 2.0, 3.0])
  b = a + 1
  c = b * 2
  b.realize()
  assert b.uop.op is Ops.BUFFER
  recomputes = c.uop.op_in_backward_slice_with_self(Ops.ADD)
  assert not recomputes, "c must read b's buffer, not recompute it"
  GlobalCounters.reset()
  assert c.tolist() == [4.0, 6.0, 8.0]
  assert GlobalCounters.kernel_count == 1


def test_schedule_does_not_run():
  GlobalCounters.reset()
  lin = (Tensor.empty(4) + 1).schedule()
  assert lin.op is Ops.LINEAR and all(c.op is Ops.CALL for c in lin.src)
  assert GlobalCounters.kernel_count == 0


def test_assign_writes_buffer():
  a = Tensor([1.0, 2.0, 3.0]).realize()
  a.assign(a + 10)
  assert a.tolist() == [11.0, 12.0, 13.0]


def test_assign_reads_and_writes_same_buffer_at_other_positions():
  a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  a.assign(a.flip(0))  # every element reads a different position than it writes
  assert a.tolist() == [4.0, 3.0, 2.0, 1.0]


def test_read_before_assign_sees_old_values():
  a = Tensor([1.0, 2.0]).realize()
  old = a * 1
  a.assign(a + 5)
  Tensor.realize_all(old, a)
  assert old.tolist() == [1.0, 2.0] and a.tolist() == [6.0, 7.0]


def test_two_assigns_in_order():
  a = Tensor([1.0, 1.0]).realize()
  a.assign(a + 1)
  a.assign(a * 10)
  assert a.tolist() == [20.0, 20.0]


def test_contiguous_gets_its_own_kernel():
  a = Tensor.empty(4, 4)
  assert kernels((a.T + 1).contiguous() * 2) == 2


def test_zero_size_tensors():
  assert Tensor.empty(0, 3).sum(0).tolist() == [0.0, 0.0, 0.0]
  assert (Tensor.empty(2, 0) + 1).shape == (2, 0)
  assert (Tensor.empty(2, 0) + 1).tolist() == [[], []]


def test_size_one_axes_reduce():
  x = Tensor(np.arange(6, dtype=np.float32).reshape(1, 6, 1))
  assert x.sum((0, 2)).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
  assert x.max().item() == 5.0


def test_zero_size_output_runs_no_kernel_on_python_device():
  assert Tensor.zeros(0, 3, device="PYTHON").numpy().shape == (0, 3)


def test_store_into_an_empty_view_schedules_no_kernel():
  """A write into an empty view of a non-empty buffer would be a zero-trip loop, whose store
  codegen may move out of the loop (`x[1:1:2] = 9` wrote x[0]): it schedules nothing."""
  x = Tensor.empty(3, 4)
  for view in (x[1:1:2], x[0:2:-1], x[:, 3:0:2]):
    assert kernels(view.assign(Tensor.empty(*view.shape))) == 0


def test_empty_reduction_is_its_identity():
  assert Tensor.empty(3, 0, device="PYTHON").sum(1).tolist() == [0.0, 0.0, 0.0]
  assert Tensor.empty(2, 0).prod(1).tolist() == [1.0, 1.0]


def test_copy_to_another_device_is_a_copy_call():
  a = Tensor([1.0, 2.0, 3.0])
  moved = (a + 1).to("PYTHON")
  calls = moved.schedule().src
  assert [c.src[0].op for c in calls] == [Ops.SINK, Ops.COPY]
  assert moved.device == "PYTHON" and (moved * 2).tolist() == [4.0, 6.0, 8.0]
  assert a.T.to("PYTHON").tolist() == [1.0, 2.0, 3.0]


def test_pad_of_a_padded_index_keeps_the_outer_gate():
  padded = Tensor([1.0, 2, 3]).pad(((1, 1),)).pad(((0, 1),))
  assert padded.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]
  padded = Tensor([1.0, 2, 3], device="PYTHON").pad(((1, 1),)).pad(((2, 1),))
  assert padded.tolist() == [0.0] * 3 + [1.0, 2.0, 3.0, 0.0, 0.0]
  assert Tensor.arange(5).pad(((0, 1),)).tolist() == [0, 1, 2, 3, 4, 0]


# ---- scatter: a one-hot reduce over an output position becomes a fill and direct stores ----

def _store_kinds(t: Tensor) -> list[str]:
  """Per kernel: 'scatter' (its store address reads memory), 'fill' (it stores a constant), or
  'other'."""
  out = []
  for call in t.schedule().src:
    st = next(u for u in call.src[0].toposort() if u.op is Ops.STORE)
    if st.src[0].src[1].op_in_backward_slice_with_self(Ops.INDEX): out.append("scatter")
    elif st.src[1].op is Ops.CONST: out.append("fill")
    else: out.append("other")
  return out


@pytest.fixture
def hot():
  """(6, 5): target k of source n is hot when index[n] == k (index [4, 1, 4, 9, -1]), and the
  sources [1, 2, 3, 4, 5]."""
  index = Tensor([4, 1, 4, 9, -1]).reshape(1, 5)
  return Tensor.arange(6).reshape(6, 1).eq(index), Tensor([1.0, 2.0, 3.0, 4.0, 5.0]).reshape(1, 5)


def test_one_hot_sum_is_a_fill_and_a_scatter(hot):
  one_hot, val = hot
  out = one_hot.where(val, 0.0).sum(1)
  assert _store_kinds(out) == ["fill", "scatter"]  # out of range indices write nothing
  assert out.tolist() == [0.0, 2.0, 0.0, 0.0, 4.0, 0.0]


def test_one_hot_forms_that_become_scatters(hot):
  one_hot, val = hot
  ints, pos = Tensor([1, 2, 3, 4, 5]).reshape(1, 5), Tensor.arange(5).reshape(1, 5)
  cases = [(one_hot.logical_not().where(0.0, val).sum(1), [0, 2, 0, 0, 4, 0]),  # either side
           (one_hot.cast(ints.dtype).sum(1), [0, 1, 0, 0, 2, 0]),  # a count
           ((one_hot.cast(ints.dtype) * ints).sum(1), [0, 2, 0, 0, 4, 0]),  # exact integer product
           (one_hot.where(val, 1.0).prod(1), [1, 2, 1, 1, 3, 1]),
           (one_hot.where(pos, -1).max(1), [-1, 1, -1, -1, 2, -1])]  # max from below every value
  for t, want in cases:
    assert _store_kinds(t) == ["fill", "scatter"] and t.tolist() == want


def test_one_hot_forms_that_stay_reductions(hot):
  """Dropping the unselected terms must be exact: otherwise the reduce stays."""
  one_hot, val = hot
  inf = Tensor([1.0, math.inf, 2.0, 0.0, 0.0]).reshape(1, 5)
  cases = [(one_hot.where(val, 1.0).sum(1), [5.0, 6.0, 5.0, 5.0, 7.0, 5.0]),  # not the identity
           ((one_hot.float() * inf).sum(1), [math.nan, math.inf] + [math.nan] * 4),  # 0*inf
           (one_hot.where(val, -1.0).max(1), [-1.0, 2.0, -1.0, -1.0, 3.0, -1.0]),  # any float
           (one_hot.where(val, 9.0).max(1), [9.0] * 6)]  # may be above a value
  for t, want in cases:
    assert "scatter" not in _store_kinds(t)
    np.testing.assert_array_equal(t.numpy(), want)


def test_scatter_waits_for_its_fill_and_readers_wait_for_it(hot):
  one_hot, val = hot
  s = one_hot.where(val, 0.0).sum(1)
  out = s + s.flip(0)
  kinds = _store_kinds(out)
  assert kinds == ["fill", "scatter", "other"]
  assert out.tolist() == [0.0, 6.0, 0.0, 0.0, 6.0, 0.0]
