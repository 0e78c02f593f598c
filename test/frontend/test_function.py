"""@function: one FUNCTION node per call, traced once per signature, differentiable."""
import gc
import weakref

import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes, function, nn
from unigrad.frontend.function import FunctionError
from unigrad.helpers import GlobalCounters
from unigrad.schedule.callify import CallifyError
from unigrad.uop import Ops


def test_call_builds_one_function_node_with_gettuple_per_result():
  @function
  def f(a, b): return a + b, (a * b).sum()
  s, t = f(Tensor([1.0, 2.0]), Tensor([3.0, 4.0]))
  assert s.uop.op is Ops.GETTUPLE and t.uop.op is Ops.GETTUPLE
  fn = s.uop.src[0]
  assert fn is t.uop.src[0] and fn.op is Ops.FUNCTION and fn.src[0].op is Ops.TUPLE
  body_ops = {u.op for u in fn.src[0].toposort()}
  assert Ops.BUFFER not in body_ops and Ops.PARAM in body_ops  # the body sees only PARAMs
  assert s.tolist() == [4.0, 6.0] and t.item() == 11.0


def test_same_signature_reuses_trace_and_kernels(device):
  @function
  def f(a, b): return ((a * 2 + b).relu() - 1).sum(axis=0)
  x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  f(Tensor(x, device), Tensor(x, device)).realize()
  compiled = GlobalCounters.programs_compiled
  for i in range(3):
    y = x + i
    out = f(Tensor(y, device), Tensor(x, device)).numpy()
    np.testing.assert_allclose(out, (np.maximum(y * 2 + x, 0) - 1).sum(0), rtol=1e-6)
  assert f.trace_count == 1
  assert GlobalCounters.programs_compiled == compiled


def test_new_shape_or_dtype_retraces():
  @function
  def f(a): return a * 2
  f(Tensor([1.0, 2.0])).realize()
  f(Tensor([1.0, 2.0, 3.0])).realize()
  assert f(Tensor([1, 2], dtype=dtypes.int32)).tolist() == [2, 4]
  assert f.trace_count == 3


def test_non_tensor_arguments_are_part_of_the_signature():
  @function
  def f(a, scale, mode="add"): return a + scale if mode == "add" else a * scale
  x = Tensor([1.0, 2.0])
  assert f(x, 3.0).tolist() == [4.0, 5.0]
  assert f(x, 3.0, mode="mul").tolist() == [3.0, 6.0]
  assert f(x, 2.0).tolist() == [3.0, 4.0]
  assert f.trace_count == 3


def test_gradients_flow_through_function_and_match_torch():
  rng = np.random.default_rng(1)
  xv, wv = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(
    np.float32)

  @function
  def f(x, w): return (x @ w).tanh(), x.exp().sum()
  x, w = Tensor(xv, requires_grad=True), Tensor(wv, requires_grad=True)
  a, b = f(x, w)
  (a.square().sum() + b).backward()
  tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
  ((tx @ tw).tanh().square().sum() + tx.exp().sum()).backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_backward_of_a_function_is_a_function():
  @function
  def f(x): return (x * x).sum()
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  g, = f(x).gradient(x)
  assert g.uop.op is Ops.GETTUPLE and g.uop.src[0].op is Ops.FUNCTION
  assert g.tolist() == [2.0, 4.0, 6.0]


def test_captured_weights_get_gradients():
  lin = nn.Linear(3, 2)

  @function
  def f(x): return lin(x).relu().sum()
  x = Tensor(np.ones((2, 3), np.float32))
  f(x).backward()
  tl = torch.nn.Linear(3, 2)
  with torch.no_grad():
    tl.weight.copy_(torch.tensor(lin.weight.numpy()))
    tl.bias.copy_(torch.tensor(lin.bias.numpy()))
  tl(torch.ones(2, 3)).relu().sum().backward()
  np.testing.assert_allclose(lin.weight.grad.numpy(), tl.weight.grad.numpy(), rtol=1e-6)
  np.testing.assert_allclose(lin.bias.grad.numpy(), tl.bias.grad.numpy(), rtol=1e-6)


def test_captured_tensor_is_read_at_each_call():
  scale = Tensor([2.0]).contiguous().realize()

  @function
  def f(x): return x * scale
  assert f(Tensor([1.0, 2.0])).tolist() == [2.0, 4.0]
  scale.assign(Tensor([3.0]))  # pending: the next call must see it, as without @function
  assert f(Tensor([1.0, 2.0])).tolist() == [3.0, 6.0]
  assert f.trace_count == 1


def test_captured_constant_tensor():
  table = Tensor([10.0, 20.0, 30.0])

  @function
  def f(i): return table[i]
  assert f(Tensor([2, 0])).tolist() == [30.0, 10.0]


def test_nested_functions():
  @function
  def inner(a, b): return a * b
  @function
  def outer(a, b): return inner(a, b) + inner(b, b)
  x = Tensor([1.0, 2.0], requires_grad=True)
  y = Tensor([3.0, 4.0])
  out = outer(x, y)
  assert out.tolist() == [12.0, 24.0]
  out.sum().backward()
  assert x.grad.tolist() == [3.0, 4.0]


def test_output_aliasing_an_input():
  @function
  def f(a, b): return a, a + b
  x = Tensor([1.0, 2.0])
  same, s = f(x, Tensor([1.0, 1.0]))
  assert same.tolist() == [1.0, 2.0] and s.tolist() == [2.0, 3.0]


def test_nested_arguments_and_several_outputs_structure():
  @function
  def f(pair, d): return {"sum": pair[0] + pair[1], "scaled": [d["x"] * 2]}
  out = f((Tensor([1.0]), Tensor([2.0])), {"x": Tensor([5.0])})
  assert out["sum"].tolist() == [3.0] and out["scaled"][0].tolist() == [10.0]


def test_method_decorated_with_function():
  class M:
    def __init__(self): self.w = Tensor([2.0, 3.0])
    @function
    def __call__(self, x): return x * self.w
  m = M()
  assert m(Tensor([1.0, 1.0])).tolist() == [2.0, 3.0]


def test_function_body_must_be_pure():
  """Changing an outside tensor other than by assign (here `replace`) cannot be traced."""
  state = Tensor([0.0, 0.0]).contiguous().realize()

  @function
  def f(x):
    state.replace(x)
    return x + 1
  with pytest.raises((FunctionError, CallifyError), match="function"):
    f(Tensor([1.0, 2.0]))
  assert state.tolist() == [0.0, 0.0]


def test_assign_inside_function_writes_at_every_call():
  """An assign to an outside tensor (BatchNorm's running statistics) becomes a result of the
  FUNCTION that each call assigns, the cached trace too; the body reads the new value after it."""
  state = Tensor([0.0, 0.0]).contiguous().realize()
  count = Tensor.zeros((), dtype="int32").contiguous().realize()

  @function
  def f(x):
    state.assign(state * 0.5 + x)
    count.assign(count + 1)
    return x + state
  assert f(Tensor([2.0, 4.0])).tolist() == [4.0, 8.0]
  assert state.tolist() == [2.0, 4.0]
  assert f(Tensor([2.0, 4.0])).tolist() == [5.0, 10.0]
  assert state.tolist() == [3.0, 6.0] and count.item() == 2 and f.trace_count == 1


def test_reading_values_inside_function_raises():
  @function
  def f(x): return x * x.sum().item()
  with pytest.raises(CallifyError, match="placeholder"):
    f(Tensor([1.0, 2.0]))


def test_function_returning_no_tensor_raises():
  @function
  def f(x): return 3
  with pytest.raises(FunctionError, match="returned no Tensor"):
    f(Tensor([1.0]))


def test_schedule_of_function_result():
  @function
  def f(a): return (a + 1).sum()
  sched = f(Tensor([1.0, 2.0])).schedule()
  assert sched.op is Ops.LINEAR and len(sched.src) >= 1


def test_nested_function_gradient_reaches_outer_inputs_read_before_the_inner_call():
  # the outer body reads x and w before the inner call, whose body has placeholders of its own
  # with the same slots: the backward must take the outer body's placeholders, not the inner's
  @function
  def inner(p, q): return (q * p.exp()).sum(0)
  @function
  def outer(x, w): return (x * w).sum(0) + inner(w, x) * 2
  xv, wv = np.arange(6, dtype=np.float32).reshape(2, 3) / 10, np.array([.1, .2, .3], np.float32)
  x, w = Tensor(xv, requires_grad=True), Tensor(wv, requires_grad=True)
  outer(x, w).sum().backward()
  tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
  ((tx * tw).sum(0) + (tx * tw.exp()).sum(0) * 2).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


def _arrays_at_recycled_addresses(n: int):
  """`n` numpy arrays with new contents each, each deleted before the next is made (numpy then
  reuses the freed address: keyed by `id()`, every one found the first one's trace)."""
  for i in range(n):
    arr = np.full(3, float(i), np.float32)
    yield i, arr
    del arr


def test_numpy_argument_at_a_recycled_address_follows_its_contents():
  @function
  def f(x, arr): return x + Tensor(arr)
  for i, arr in _arrays_at_recycled_addresses(20):
    assert f(Tensor.zeros(3), arr).tolist() == [float(i)] * 3
  arr = np.full(3, 30.0, np.float32)
  assert f(Tensor.zeros(3), arr).tolist() == [30.0] * 3
  arr += 1  # the same array, new contents
  assert f(Tensor.zeros(3), arr).tolist() == [31.0] * 3
  assert f(Tensor.zeros(3), np.full(3, 5.0, np.float32)).tolist() == [5.0] * 3  # equal: reused
  assert f.trace_count == 22


def test_unhashable_argument_is_kept_by_its_trace():
  """Other unhashable arguments are keyed by identity; the trace holds them, so a new object
  cannot take a traced one's address."""
  class Scale:
    __hash__ = None

    def __init__(self, k): self.k = k

  @function
  def f(x, s): return x * s.k
  for k in range(10):
    s = Scale(k)
    assert f(Tensor([1.0]), s).tolist() == [float(k)]
    del s


def test_a_tensor_dying_during_the_trace_is_not_taken_for_a_written_outside_tensor():
  """The trace holds every tensor alive when it began until it ends: one collected during the
  trace could give its id to a tensor made in the body, which was then taken for an outside
  tensor the body wrote (an order-dependent FunctionError in onnx's backend tests)."""
  doomed = [Tensor([1.0, 2.0])]
  ref = weakref.ref(doomed[0])
  alive_inside = []

  @function
  def f(x):
    doomed.clear()
    gc.collect()
    alive_inside.append(ref() is not None)
    return x + 1

  np.testing.assert_array_equal(f(Tensor([1.0, 2.0])).numpy(), [2.0, 3.0])
  assert alive_inside == [True]
