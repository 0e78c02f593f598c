"""The tinygrad/PyTorch names issue 15 adds to Tensor, against PyTorch (CPU and PYTHON devices):
comparisons, log10, relu6, softmin, mT, type_as, const, pad_to, static-size masked_select and
nonzero, isinf's detect flags, both random call forms, attention with GQA and dropout, and the
schedule inspectors."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unigrad import Tensor, Variable, dtypes
from unigrad.uop import Ops

RNG = np.random.default_rng(15)
PY = "PYTHON"


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


# ---- elementwise names ----

@pytest.mark.parametrize("name", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_comparison_methods_match_torch(name):
  a, b = np.array([1, 2, 3, 4]), np.array([2, 2, 2, 2])
  x = np.array([1.0, math.nan, -0.0, 2.5], dtype=np.float32)
  assert getattr(Tensor(a), name)(Tensor(b)).tolist() == getattr(torch.tensor(a), name)(
    torch.tensor(b)).tolist()
  assert getattr(Tensor(x), name)(0.0).tolist() == getattr(torch.tensor(x), name)(0.0).tolist()
  assert getattr(Tensor(a), name)(2.5).tolist() == getattr(torch.tensor(a), name)(2.5).tolist()


def test_log10_relu6_softmin_match_torch():
  x = np.array([1e-30, 0.001, 1.0, 10.0, 1000.0, 3.7, 0.0, -1.0, math.inf], dtype=np.float32)
  np.testing.assert_allclose(Tensor(x).log10().numpy(), torch.tensor(x).log10().numpy(),
                             rtol=1e-6, equal_nan=True)
  assert Tensor([1, 100]).log10().dtype == dtypes.float32
  assert Tensor([10.0, 1000.0]).log10().tolist() == [1.0, 3.0]
  y = np.array([-3.0, 0.0, 2.5, 6.0, 9.0], dtype=np.float32)
  assert Tensor(y).relu6().tolist() == F.relu6(torch.tensor(y)).tolist()
  assert Tensor([-3, 4, 9]).relu6().tolist() == [0, 4, 6]
  z = rnd(3, 4)
  np.testing.assert_allclose(Tensor(z).softmin(1).numpy(), F.softmin(torch.tensor(z), 1).numpy(),
                             rtol=1e-6, atol=1e-7)


def test_relu6_and_log10_gradients():
  x = np.array([-1.0, 0.5, 3.0, 7.0], dtype=np.float32)
  t, tt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
  (t.relu6() * 2 + (t * t + 1).log10()).sum().backward()
  (F.relu6(tt) * 2 + (tt * tt + 1).log10()).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6)


def test_isinf_detect_flags():
  x = [math.inf, -math.inf, 1.0, math.nan]
  assert Tensor(x).isinf().tolist() == torch.tensor(x).isinf().tolist()
  assert Tensor(x).isinf(detect_negative=False).tolist() == torch.tensor(x).isposinf().tolist()
  assert Tensor(x).isinf(detect_positive=False).tolist() == torch.tensor(x).isneginf().tolist()
  assert Tensor(x).isinf(False, False).tolist() == [False] * 4
  assert Tensor([1, 2]).isinf(True, False).tolist() == [False, False]


def test_mt_type_as_bfloat16():
  x = rnd(2, 3, 4)
  np.testing.assert_array_equal(Tensor(x).mT.numpy(), torch.tensor(x).mT.numpy())
  np.testing.assert_array_equal(Tensor(x).mH.numpy(), torch.tensor(x).mH.numpy())
  with pytest.raises(RuntimeError, match="mT"): _ = Tensor([1.0, 2.0]).mT
  assert Tensor([1.7, -2.2]).type_as(Tensor([1])).tolist() == [1, -2]
  assert Tensor([1, 2]).type_as(Tensor([0.5], dtype=dtypes.float16)).dtype == dtypes.float16
  with pytest.raises(TypeError): Tensor([1]).type_as(3)  # type: ignore[arg-type]
  assert Tensor([1.5]).bfloat16().dtype == dtypes.bfloat16


# ---- creation and shapes ----

def test_const_empty_like_pad_to():
  c = Tensor.const(2.5)
  assert c.shape == () and c.dtype == dtypes.float32 and c.uop.op is Ops.CONST and c.item() == 2.5
  assert Tensor.const(3).dtype == dtypes.int64 and Tensor.const(3, dtypes.int8).item() == 3
  with pytest.raises(TypeError): Tensor.const([1, 2])
  e = Tensor.ones(2, 3, dtype=dtypes.int16).empty_like()
  assert e.shape == (2, 3) and e.dtype == dtypes.int16
  assert Tensor.ones(2, 3).empty_like(dtype="float64").dtype == dtypes.float64
  p = Tensor([[1, 2, 3], [4, 5, 6]]).pad_to(4, None)
  assert p.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0], [0, 0, 0]]
  assert Tensor.ones(2, 3).pad_to((3, 5)).shape == (3, 5)
  with pytest.raises(ValueError, match="smaller"): Tensor.ones(2, 3).pad_to(1, 3)
  with pytest.raises(ValueError): Tensor.ones(2, 3).pad_to(4)


def test_max_shape_and_is_param():
  n = Variable("n", 1, 10)
  x = Tensor.ones(10, 3)[:n.bind(4)]
  assert x.max_shape == (10, 3) and x.max_numel() == 30
  assert Tensor.ones(2, 5).max_shape == (2, 5) and Tensor.ones(2, 5).max_numel() == 10
  t = Tensor([1.0])
  assert t.is_param and not t.is_param_(False).is_param and t.requires_grad is False
  assert t.is_param_().is_param and t.requires_grad is None


def test_linear_with_vars_and_schedule_linear():
  x = Tensor.ones(4) + 1
  lin = x.schedule_linear()
  assert lin.op is Ops.LINEAR and len(lin.src) == 1
  assert x.tolist() == [2.0] * 4  # inspecting ran nothing and changed nothing
  n = Variable("n", 1, 8)
  y = Tensor.ones(8)[:n.bind(3)] * 2
  lin, var_vals = y.linear_with_vars()
  assert lin.op is Ops.LINEAR and var_vals == {"n": 3}
  with pytest.raises(ValueError, match="linear_with_vars"): y.schedule_linear()


# ---- static-size selection ----

@pytest.mark.parametrize("size", [0, 1, 3, 6])
def test_nonzero_size_matches_nonzero_static(size):
  x = np.array([[0, 1, 2], [3, 0, 0]])
  want = torch.nonzero_static(torch.tensor(x), size=size).numpy()
  np.testing.assert_array_equal(Tensor(x).nonzero(size=size).numpy(), want)
  want9 = torch.nonzero_static(torch.tensor(x), size=size, fill_value=9).numpy()
  got = Tensor(x, device=PY).nonzero(as_tuple=True, size=size, fill_value=9)
  np.testing.assert_array_equal(np.stack([g.numpy() for g in got], 1), want9)


def test_nonzero_size_is_lazy_and_checks_size():
  t = Tensor([0.0, 2.0, 0.0, 1.0]) * 2
  out = t.nonzero(size=3)
  assert out.shape == (3, 1) and out.uop.op is not Ops.BUFFER
  assert out.tolist() == [[1], [3], [-1]]
  assert Tensor.zeros(0).nonzero(size=2).tolist() == [[-1], [-1]]
  with pytest.raises(RuntimeError, match="size"): t.nonzero(size=-1)
  with pytest.raises(RuntimeError): torch.nonzero_static(torch.zeros(3), size=-1)


def test_masked_select_size():
  x, m = np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([True, False, True])
  want = torch.tensor(x).masked_select(torch.tensor(m)).tolist()
  assert Tensor(x).masked_select(Tensor(m)).tolist() == want
  assert Tensor(x).masked_select(Tensor(m), size=6).tolist() == want + [0.0, 0.0]
  assert Tensor(x).masked_select(Tensor(m), size=2, fill_value=-1).tolist() == want[:2]
  t = Tensor(x, requires_grad=True)
  t.masked_select(Tensor(m), size=5).sum().backward()
  assert t.grad.tolist() == [[1.0, 0.0, 1.0]] * 2
  with pytest.raises(RuntimeError, match="BoolTensor"): Tensor(x).masked_select(Tensor([1, 0, 1]))


# ---- random call forms ----

def test_random_call_forms_pytorch_and_tinygrad():
  assert Tensor.randint(0, 10, (5,)).shape == (5,) and Tensor.randint(10, (2, 2)).shape == (2, 2)
  assert Tensor.randint(10, size=(3,)).shape == (3,) and Tensor.randint(7, shape=4).shape == (4,)
  r = Tensor.randint(3, 400, low=5, high=8).numpy()  # tinygrad: shape first
  assert r.shape == (3, 400) and r.min() == 5 and r.max() == 7 and r.dtype == np.int64
  assert Tensor.randint((2, 3), high=4).numpy().max() < 4
  assert Tensor.normal(2, 3).shape == (2, 3) and Tensor.normal(0.0, 2.0, (4,)).shape == (4,)
  assert Tensor.normal(4, mean=5.0, std=0.0).tolist() == [5.0] * 4
  assert Tensor.normal(0, 1, size=(2,)).shape == (2,)
  u = Tensor.uniform(500, low=2.0, high=3.0).numpy()
  assert u.shape == (500,) and 2.0 <= u.min() and u.max() < 3.0
  assert Tensor.uniform(-1, 1, (3, 3)).shape == (3, 3) and Tensor.uniform((2, 2)).shape == (2, 2)
  assert Tensor.uniform(4, requires_grad=True).requires_grad


def test_random_bad_arguments():
  with pytest.raises(TypeError): Tensor.randint(1, 2, 3, (3,))
  with pytest.raises(TypeError): Tensor.normal(3, foo=1)
  with pytest.raises(TypeError): Tensor.randint(1.5, 3, (2,))
  with pytest.raises(ValueError): Tensor.randint(5, 5, (2,))
  with pytest.raises(RuntimeError, match="std"): Tensor.normal(0.0, -1.0, (2,))
  with pytest.raises(RuntimeError): torch.normal(0.0, -1.0, (2,))


# ---- attention ----

def test_sdpa_enable_gqa_matches_torch():
  q, k, v = rnd(2, 4, 3, 8), rnd(2, 2, 5, 8), rnd(2, 2, 5, 8)
  for kw in (dict(), dict(is_causal=True), dict(scale=0.3)):
    want = F.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)), enable_gqa=True, **kw)
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), enable_gqa=True, **kw)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=1e-5)
  with pytest.raises((RuntimeError, ValueError)):  # without enable_gqa the heads must broadcast
    Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v)).realize()
  k3 = rnd(2, 3, 5, 8)
  with pytest.raises(RuntimeError, match="divide"):
    Tensor(q).scaled_dot_product_attention(Tensor(k3), Tensor(k3), enable_gqa=True)


def test_sdpa_dropout():
  q = rnd(1, 2, 64, 8)
  v = np.ones((1, 2, 64, 8), dtype=np.float32)
  Tensor.manual_seed(3)
  out = Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(v), dropout_p=0.25).numpy()
  # each output is (sum of the kept weights) / 0.75: mean 1, and it varies row to row
  assert abs(out.mean() - 1.0) < 0.05 and out.std() > 0.01
  assert not Tensor.training  # dropout_p applies outside training too, like PyTorch's functional
  zero = Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(v), dropout_p=1.0)
  assert np.all(zero.numpy() == 0)
  for p in (1.5, -0.1):
    with pytest.raises(RuntimeError, match="dropout"):
      Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(v), dropout_p=p)
