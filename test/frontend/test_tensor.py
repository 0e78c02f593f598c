"""Tensor core: creation from data, realize and data out."""
import time

import numpy as np
import pytest

from unigrad import Tensor, dtypes


def test_zero_dim_numpy_array_keeps_its_shape():
  t = Tensor(np.float32(3.5))
  assert t.shape == () and t.item() == 3.5
  assert Tensor(np.array(7, dtype=np.int16)).shape == ()


def test_from_bytes_and_back():
  t = Tensor(bytes([1, 2, 3, 4]))
  assert t.dtype == dtypes.uint8 and t.tolist() == [1, 2, 3, 4]


def test_ragged_list_is_rejected():
  with pytest.raises(ValueError, match="ragged"):
    Tensor([[1, 2], [3]])


def test_item_needs_one_element():
  with pytest.raises(RuntimeError, match="cannot be converted"):
    Tensor([1.0, 2.0]).item()


def test_unknown_device_is_rejected_at_the_call():
  with pytest.raises(RuntimeError, match="NOPE"):
    Tensor([1.0], device="NOPE")


def test_equal_expressions_made_contiguous_do_not_share_storage():
  a, b = Tensor.zeros(3).contiguous().realize(), Tensor.zeros(3).contiguous().realize()
  a.assign(Tensor.ones(3))
  assert a.tolist() == [1.0, 1.0, 1.0] and b.tolist() == [0.0, 0.0, 0.0]


def test_assign_to_a_lazy_tensor_does_not_change_an_equal_one():
  a, b = Tensor.zeros(3), Tensor.zeros(3)
  a.assign(Tensor.ones(3))
  assert a.tolist() == [1.0, 1.0, 1.0] and b.tolist() == [0.0, 0.0, 0.0]


def test_repeated_matmuls_schedule_in_linear_time():
  x = Tensor.empty(8, 8)
  for _ in range(6):
    a = x @ x.T
    x = 3 * x + a @ x + a @ (a @ x)
  t0 = time.perf_counter()
  x.schedule()
  assert time.perf_counter() - t0 < 10


def test_rearrange_unflatten_linspace_replace():
  x = np.arange(24).reshape(2, 3, 4)
  t = Tensor(x)
  assert np.array_equal(t.rearrange("b c h -> h (b c)").numpy(), x.transpose(2, 0, 1).reshape(4, 6))
  assert t.rearrange("b c (h w) -> b c h w", h=2).shape == (2, 3, 2, 2)
  assert t.unflatten(-1, (2, -1)).shape == (2, 3, 2, 2)
  with pytest.raises(ValueError, match="same axes"):
    t.rearrange("b c h -> b c")
  want = np.linspace(-1, 1, 7, dtype=np.float32)
  np.testing.assert_allclose(Tensor.linspace(-1, 1, 7).numpy(), want)
  assert Tensor.linspace(0, 1, 1).tolist() == [0.0]
  a = Tensor([1.0, 2.0])
  assert a.replace(Tensor([3.0, 4.0])).tolist() == [3.0, 4.0]
  with pytest.raises(ValueError, match="does not match"):
    a.replace(Tensor([1.0]))


def test_relu_keeps_nan_like_pytorch():
  out = Tensor([float("nan"), -1.0, 0.0, 2.0]).relu().tolist()
  assert np.isnan(out[0]) and out[1:] == [0.0, 0.0, 2.0]
  x = Tensor([-1.0, 0.0, 3.0], requires_grad=True)
  x.relu().sum().backward()
  assert x.grad.tolist() == [0.0, 0.0, 1.0]
