"""Behaviours a tinygrad or PyTorch user meets (issue 29), each against PyTorch where it defines
them and tinygrad where only tinygrad does."""
import numpy as np
import pytest
import torch

from unigrad import Tensor, nn
from unigrad.helpers import GlobalCounters

RNG = np.random.default_rng(29)


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)
def arr(*values: float) -> np.ndarray: return np.array(values, dtype=np.float32)


def grads_like_torch(fn, *arrays, tfn=None):
  """fn's gradients for every input equal PyTorch's (zeros where PyTorch's are zeros)."""
  tts = [torch.tensor(a, requires_grad=True) for a in arrays]
  (tfn or fn)(*tts).sum().backward()
  uts = [Tensor(a, requires_grad=True) for a in arrays]
  fn(*uts).sum().backward()
  for u, t in zip(uts, tts):
    np.testing.assert_allclose(u.grad.numpy(), t.grad.numpy(), atol=1e-6)


# ---- backward through ops without a gradient ----

def test_backward_through_sign_gives_zero_gradient():
  x = rnd(2, 3)
  x[0, 0] = 0.0
  grads_like_torch(lambda a: a.sign() * 3, x)


def test_backward_through_sign_of_a_0d_tensor():
  grads_like_torch(lambda a: a.sign(), np.float32(-0.5))


def test_backward_through_sign_beside_a_differentiable_path():
  grads_like_torch(lambda a: a.sign() + a * a, rnd(4))


def test_backward_through_copysign_gives_pytorch_gradient():
  x, y = rnd(2, 3), rnd(3)
  x[1, 1] = 0.0  # PyTorch's gradient is 0 where self is 0
  grads_like_torch(lambda a, b: a.copysign(b) * a, x, y,
                   tfn=lambda a, b: torch.copysign(a, b) * a)


def test_backward_through_copysign_gives_other_zero_gradient():
  grads_like_torch(lambda a, b: a.copysign(b), rnd(3), rnd(3),
                   tfn=lambda a, b: torch.copysign(a, b))


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "gt", "le", "ge"])
def test_backward_through_comparison_gives_zero_gradient(op):
  # PyTorch's comparison has no grad_fn (backward raises); tinygrad gives zeros: unigrad too
  x = Tensor(rnd(3), requires_grad=True)
  getattr(x, "__" + op + "__")(0.5).float().sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), np.zeros(3, np.float32))


def test_backward_through_comparison_and_where():
  grads_like_torch(lambda a: (a > 0).where(a, a * 2) + (a == a).float(), rnd(5),
                   tfn=lambda a: torch.where(a > 0, a, a * 2) + (a == a).float())


@pytest.mark.parametrize("size,step", [(2, 1), (2, 2), (3, 2), (2, 8), (0, 8), (0, 1)])
def test_backward_through_unfold(size, step):
  grads_like_torch(lambda a: a.unfold(1, size, step) * 2, rnd(2, 5))


def test_backward_through_detach_still_raises():
  x = Tensor(rnd(2), requires_grad=True)
  with pytest.raises(RuntimeError, match="does not require grad"):
    x.detach().sign().sum().backward()


# ---- requires_grad=None: a lazy gradient, as tinygrad gives it (issue 29, docs/api.md) ----

def test_requires_grad_none_gets_a_grad_like_tinygrad_false_gets_none():
  xs, ws, fs = rnd(4, 3), rnd(3, 2), rnd(4, 2)
  x, w, f = Tensor(xs), Tensor(ws, requires_grad=True), Tensor(fs, requires_grad=False)
  assert x.requires_grad is None
  ((x @ w) * f).square().sum().backward()
  tx, tw = torch.tensor(xs, requires_grad=True), torch.tensor(ws, requires_grad=True)
  ((tx @ tw) * torch.tensor(fs)).square().sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)
  assert f.grad is None


def test_requires_grad_none_alone_gets_a_grad():
  """No tensor requires grad: tinygrad's `Tensor.randn(3)` in a loss still gets one."""
  a = Tensor(arr(1, -2, 3))
  (a * a).sum().backward()
  assert a.grad.tolist() == [2.0, -4.0, 6.0]


def _mlp_step_kernels(x_requires_grad):
  """Kernels one SGD step runs when the input batch has `x_requires_grad`."""
  x = Tensor(rnd(8, 4), requires_grad=x_requires_grad)
  w = Tensor(rnd(4, 2), requires_grad=True)
  opt = nn.optim.SGD([w], lr=0.1)
  before = GlobalCounters.kernel_count
  loss = (x @ w).square().sum()
  loss.backward()
  Tensor.realize_all(loss, *opt.schedule_step())
  return GlobalCounters.kernel_count - before, x


def test_unread_requires_grad_none_gradient_is_never_scheduled():
  """An input batch's gradient (requires_grad None) nobody reads costs no kernel in the step
  (it reads the weights the step overwrites: as a live value it would be computed first), and
  reading it after the step raises instead of giving a gradient at the new weights."""
  n_none, x = _mlp_step_kernels(None)
  n_false, _ = _mlp_step_kernels(False)
  assert n_none == n_false
  with pytest.raises(RuntimeError, match="overwritten since"):
    _ = x.grad


def test_requires_grad_none_grad_read_before_the_step_is_kept():
  x, w = Tensor(arr(1, 2)), Tensor(arr(3, 4), requires_grad=True)
  (x * w).sum().backward()
  g = x.grad  # read: now a tensor of its own, computed before the step overwrites w
  nn.optim.SGD([w], lr=0.1).step()
  assert g.tolist() == [3.0, 4.0] and x.grad is g


def test_requires_grad_false_alone_raises():
  x = Tensor(rnd(2), requires_grad=False)
  with pytest.raises(RuntimeError, match="does not require grad"):
    (x * 2).sum().backward()


def test_comparison_beside_a_differentiable_path_gives_no_gradient_like_pytorch():
  a, b = Tensor(rnd(3), requires_grad=True), Tensor(rnd(3), requires_grad=True)
  ((a > 0).where(b, b * 2)).sum().backward()
  assert a.grad is None
  np.testing.assert_allclose(b.grad.numpy(), np.where(a.numpy() > 0, 1, 2))


def test_sign_beside_another_leaf_gives_zeros_like_pytorch():
  a, b = Tensor(rnd(3), requires_grad=True), Tensor(rnd(3), requires_grad=True)
  (a.sign() * b).sum().backward()
  np.testing.assert_array_equal(a.grad.numpy(), np.zeros(3, np.float32))
  np.testing.assert_array_equal(b.grad.numpy(), np.sign(a.numpy()))


# ---- zero-size tensors ----

def test_zero_size_clone_keeps_shape_and_is_its_own_tensor():
  z = Tensor.ones(0, 3)
  c = z.clone()
  assert c.shape == (0, 3) and c.numpy().shape == (0, 3) and c.uop is not z.uop


def test_zero_size_pad_gives_the_padding():
  z = Tensor.ones(0, 2)
  np.testing.assert_array_equal(z.pad(((1, 1), (0, 0)), value=3).numpy(),
                                torch.nn.functional.pad(torch.ones(0, 2), (0, 0, 1, 1), value=3))
  assert z.pad(((0, 0), (1, 1))).shape == (0, 4)


def test_zero_size_sum_and_prod_give_the_identity():
  z, tz = Tensor.ones(0, 3), torch.ones(0, 3)
  np.testing.assert_array_equal(z.sum(0).numpy(), tz.sum(0).numpy())
  np.testing.assert_array_equal(z.prod(0).numpy(), tz.prod(0).numpy())
  assert z.sum().item() == 0 and z.prod().item() == 1
  assert z.max(1).shape == (0,)  # reducing a non-empty axis of an empty tensor is fine


@pytest.mark.parametrize("op", ["max", "min"])
def test_zero_size_reduction_without_identity_raises_like_pytorch(op):
  z, tz = Tensor.ones(0, 3), torch.ones(0, 3)
  for args in ((0,), ()):
    with pytest.raises(Exception) as theirs: getattr(tz, op)(*args)
    with pytest.raises(theirs.type, match=op): getattr(z, op)(*args)


def test_zero_size_backward_gives_zero_size_grad():
  x = Tensor.ones(0, 3, requires_grad=True)
  (x.clone().pad(((1, 1), (0, 0))) * 2).sum().backward()
  assert x.grad.shape == (0, 3) and x.grad.numpy().shape == (0, 3)


# ---- docs/api.md, "Deliberate differences in behaviour": unigrad's side of each row ----

def test_documented_difference_integer_results_are_int64():
  long = Tensor([1, 2]).dtype
  assert str(long) == "dtypes.long" and Tensor.arange(3).dtype == long
  assert Tensor.full((2,), 3).dtype == long and Tensor.randint(3, high=5).dtype == long
  x = Tensor([1.0, 3.0, 2.0])
  assert x.argmax().dtype == long and x.argmin().dtype == long
  assert x.topk(2)[1].dtype == long and x.sort()[1].dtype == long and x.cummax(0)[1].dtype == long
  assert Tensor([0, 2]).one_hot(3).dtype == long
  i8 = Tensor([1, 2], dtype="int8")
  assert i8.sum().dtype == long and i8.prod().dtype == long and Tensor([True]).sum().dtype == long


def test_documented_difference_scalars_and_numpy_elements_have_pytorchs_dtypes():
  f32 = Tensor(2.5).dtype
  assert str(f32) == "dtypes.float"
  i = Tensor([1, 5])
  assert (i * 2.5).dtype == f32 and i.clamp(0, 2.5).dtype == f32
  assert Tensor([True]).where(1, 2.5).dtype == f32
  assert str(Tensor([np.float64(1.5)]).dtype) == "dtypes.double"


def test_documented_difference_gelu_mean_numpy_and_empty_max():
  assert Tensor([1.0]).gelu().item() == pytest.approx(0.841345, abs=1e-6)  # exact, PyTorch's
  assert Tensor([1.0]).gelu(approximate="tanh").item() == pytest.approx(0.841192, abs=1e-6)
  with pytest.raises(RuntimeError): Tensor([1, 2]).mean()
  assert Tensor([True, False]).mean().item() == 0.5
  t = Tensor([1.0, 2.0]).realize()
  t.numpy()[0] = 9.0
  assert t.tolist() == [9.0, 2.0]
  with pytest.raises(RuntimeError): Tensor([]).max()


def test_documented_difference_errors_grad_flag_and_max_forms():
  with pytest.raises(RuntimeError): Tensor([1, 2]).item()
  with pytest.raises(IndexError): Tensor([1, 2])[5]
  with pytest.raises(ValueError): Tensor([2]) ** -1
  with pytest.raises(ValueError): Tensor([1, 2]) + Tensor([1, 2, 3])
  assert Tensor([1.0]).requires_grad is None
  x = Tensor([[1.0, 2.0], [4.0, 3.0]])
  assert isinstance(x.max(1), Tensor) and isinstance(x.max(axis=1), Tensor)
  assert [v.tolist() for v in x.max(dim=1)] == [[2.0, 4.0], [1, 0]]
  assert x.reshape(None, 2).shape == (2, 2)
  assert (Tensor([1, 2]) // Tensor([0, 1])).tolist() == [0, 2]
  assert Tensor([1, 2]).softmax(0).dtype == Tensor(0.5).dtype
  assert type(x.shape) is tuple and x.size() == (2, 2) and x.size(1) == 2


def test_documented_difference_layers_are_plain_objects():
  lin = nn.Linear(2, 2)
  assert not hasattr(lin, "parameters") and not hasattr(lin, "eval")
  model = nn.Sequential(lin, nn.BatchNorm(2))
  assert [type(m).__name__ for m in model.modules()] == ["Sequential"]
  assert len(nn.state.get_parameters(lin)) == 2
