"""Tensors with symbolic dimensions (a bound Variable in the shape) against numpy, on PYTHON and
CPU: creation, views by a variable (getitem, shrink, pad, reshape), elementwise ops, reductions
over the symbolic axis, matmul with a symbolic M, softmax; and the errors of unbound variables."""
import numpy as np
import pytest

from unigrad import Tensor, UnboundVariableError, Variable
from unigrad.uop.variable import VariableBindError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 6)).astype(np.float32)
W = RNG.standard_normal((6, 5)).astype(np.float32)
N = Variable("n", 1, 16)


def softmax(a, axis):
  e = np.exp(a - a.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


CASES = {
  "getitem": (lambda x, w, n: x[:n], lambda v: X[:v]),
  "getitem_start": (lambda x, w, n: x[n - 1:], lambda v: X[v - 1:]),
  "shrink": (lambda x, w, n: x.shrink(((0, n), None)), lambda v: X[:v]),
  "shrink_last_axis": (lambda x, w, n: x.T[:, :n], lambda v: X.T[:, :v]),
  "elementwise": (lambda x, w, n: (x[:n] * 2 + 1).exp(), lambda v: np.exp(X[:v] * 2 + 1)),
  "broadcast": (lambda x, w, n: x[:n] - x[:n].max(axis=1, keepdim=True),
                lambda v: X[:v] - X[:v].max(1, keepdims=True)),
  "sum_symbolic_axis": (lambda x, w, n: (x[:n] * 2).sum(axis=0), lambda v: (X[:v] * 2).sum(0)),
  "sum_other_axis": (lambda x, w, n: x[:n].sum(axis=1), lambda v: X[:v].sum(1)),
  "sum_all": (lambda x, w, n: x[:n].sum(), lambda v: X[:v].sum()),
  "max": (lambda x, w, n: x[:n].max(axis=0), lambda v: X[:v].max(0)),
  "mean": (lambda x, w, n: x[:n].mean(axis=0), lambda v: X[:v].mean(0)),
  "matmul": (lambda x, w, n: x[:n] @ w, lambda v: X[:v] @ W),
  "matmul_symbolic_k": (lambda x, w, n: x[:, :n] @ w[:n], lambda v: X[:, :v] @ W[:v]),
  "softmax_symbolic_axis": (lambda x, w, n: x[:n].softmax(axis=0), lambda v: softmax(X[:v], 0)),
  "softmax_rows": (lambda x, w, n: x.T[:, :n].softmax(axis=1), lambda v: softmax(X.T[:, :v], 1)),
  "reshape": (lambda x, w, n: x[:n].reshape(n, 3, -1), lambda v: X[:v].reshape(v, 3, 2)),
  "reshape_flat": (lambda x, w, n: x[:n].reshape(-1), lambda v: X[:v].reshape(-1)),
  "pad_by_variable": (lambda x, w, n: x[:n].pad(((0, n), (1, 0))),
                      lambda v: np.pad(X[:v], ((0, v), (1, 0)))),
  "pad_value": (lambda x, w, n: x[:n].pad(((2, 1), None), value=3.0),
                lambda v: np.pad(X[:v], ((2, 1), (0, 0)), constant_values=3.0)),
  "times_n": (lambda x, w, n: x[:n] * n, lambda v: X[:v] * v),
  "mean_all": (lambda x, w, n: x[:n].mean(), lambda v: X[:v].mean()),
}


@pytest.mark.parametrize("name", CASES)
def test_symbolic_op_matches_numpy(device, name):
  ours, ref = CASES[name]
  x, w = Tensor(X, device=device).realize(), Tensor(W, device=device).realize()
  for v in (1, 5, 16):
    got = ours(x, w, N.bind(v))
    want = ref(v)
    assert got.numpy().shape == want.shape, name
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=f"{name} n={v}")


def test_symbolic_shape_and_concrete_shape(device):
  n = N.bind(4)
  t = Tensor(X, device=device)[:n]
  assert t.shape == (n, 6) and t.concrete_shape == (4, 6)
  assert t.tolist() == X[:4].tolist()
  assert t.realize().shape == (n, 6) and t.numpy().shape == (4, 6)


def test_empty_with_a_symbolic_size(device):
  n = N.bind(3)
  t = Tensor.empty(n, 4, device=device)
  assert t.shape == (n, 4)
  t.assign(Tensor.full((n, 4), 2.0, device=device))
  np.testing.assert_equal(t.numpy(), np.full((3, 4), 2, np.float32))


def test_realized_symbolic_tensor_is_reused(device):
  """A realized symbolic tensor reads as its buffer's row-major prefix (no recompute)."""
  t = (Tensor(X, device=device)[:N.bind(5)] + 1).realize()
  u = t.uop
  np.testing.assert_allclose((t * 2).numpy(), (X[:5] + 1) * 2, rtol=1e-6)
  assert t.uop is u and t.numpy().shape == (5, 6)


def test_numpy_of_an_unbound_symbolic_shape_names_the_variable(device):
  t = Tensor(X, device=device)[:Variable("k", 1, 16)]
  with pytest.raises(UnboundVariableError,
                     match=r"symbolic shape where a concrete one is needed.*'k' in \[1, 16\]"):
    t.numpy()
  with pytest.raises(UnboundVariableError, match="'k'"): t.tolist()


def test_realizing_an_unbound_variable_names_it(device, no_kernels):
  k = Variable("k", 1, 16)
  t = Tensor(X, device=device)[:k].sum(0)  # a concrete shape that needs k's value
  with pytest.raises(UnboundVariableError, match=r"'k' in \[1, 16\] has no value"):
    t.realize()


def test_one_variable_bound_twice_in_one_realize_raises(device, no_kernels):
  x = Tensor(X, device=device)
  a, b = x[:N.bind(2)].sum(0), x[:N.bind(3)].sum(0)
  with pytest.raises(VariableBindError, match="bound to both"): Tensor.realize_all(a, b)


def test_two_values_do_not_broadcast(device):
  x = Tensor(X, device=device)
  with pytest.raises(ValueError, match="do not broadcast"): x[:N.bind(2)] + x[:N.bind(3)]


def test_symbolic_views_check_their_arguments(device):
  x = Tensor(X, device=device)
  n = N.bind(4)
  with pytest.raises(IndexError, match="step 1"): x[:n:2]
  with pytest.raises(ValueError, match="invalid for input of shape"): x[:n].reshape(5, -1)
  with pytest.raises(ValueError, match="out of bounds"): x.shrink(((n, 2), None))
  with pytest.raises(ValueError, match=">= 0"): x.pad(((n - 5, 0), None))


def test_symbolic_ops_run_through_the_pipeline_on_null():
  """NULL compiles and launches every case (SPEC=1 checks each stage); nothing executes."""
  x, w = Tensor(X, device="NULL").realize(), Tensor(W, device="NULL").realize()
  for name, (ours, _) in CASES.items():
    t = ours(x, w, N.bind(7)).realize()
    assert t.concrete_shape == CASES[name][1](7).shape, name


def test_cat_and_stack_with_symbolic_sizes(device):
  n = N.bind(3)
  a = Tensor(X[:, 0], device=device)[:n]
  np.testing.assert_allclose(Tensor.cat(a, Tensor([7.0, 8.0], device=device)).numpy(),
                             np.concatenate([X[:3, 0], [7.0, 8.0]]), rtol=1e-6)
  np.testing.assert_allclose(Tensor.stack(a, a * 2).numpy(), np.stack([X[:3, 0], X[:3, 0] * 2]),
                             rtol=1e-6)


def test_symbolic_arange_is_the_arange_of_the_bound_value(device):
  np.testing.assert_array_equal(Tensor.arange(N.bind(3), device=device).numpy(), np.arange(3))
  with pytest.raises(TypeError, match="only the stop may be symbolic"):
    Tensor.arange(N.bind(3), 8, device=device)


def test_assign_into_a_symbolic_buffer(device):
  x = Tensor(X, device=device).realize()
  for v in (3, 5):
    n = N.bind(v)
    t = Tensor.empty(n, 6, device=device)
    t.assign(x[:n] + 1).realize()
    np.testing.assert_allclose(t.numpy(), X[:v] + 1, rtol=1e-6)
    t.assign(t * 2).realize()
    np.testing.assert_allclose(t.numpy(), (X[:v] + 1) * 2, rtol=1e-6)


def test_gradients_through_symbolic_shapes_match_torch(device):
  torch = pytest.importorskip("torch")
  for v in (2, 7):
    x = Tensor(X, device=device, requires_grad=True)
    w = Tensor(W, device=device, requires_grad=True)
    (x[:N.bind(v)] @ w).softmax(0).max(1).mean().backward()
    tx, tw = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    (tx[:v] @ tw).softmax(0).max(1).values.mean().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_index_by_a_bound_variable_like_tinygrad():
  """tinygrad's stunning_mnist.py indexes its batches with a bound Variable (`X[vi.bind(i)]`):
  the row at the variable's value, one graph for every value."""
  x = Tensor(np.arange(12, dtype=np.int32).reshape(4, 3))
  vi = Variable("i", 0, 3)
  for i in range(4):
    assert x[vi.bind(i)].tolist() == [3 * i, 3 * i + 1, 3 * i + 2]
    assert x[vi.bind(i), 1:].tolist() == [3 * i + 1, 3 * i + 2]
  with pytest.raises(IndexError, match="out of bounds"):
    x[Variable("j", 0, 9).bind(4)]
