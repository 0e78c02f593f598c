"""Small PyTorch spellings a ported program uses: `Tensor.cat([a, b], 1)` with a positional dim,
the mean of a bool tensor (an accuracy: `(pred == y).mean()`), and `dim=` for the reduced axis
(`x.sum(dim=1)`, `x.softmax(dim=-1)`, `values, indices = x.max(dim=1)`)."""
import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes


def test_cat_and_stack_take_a_positional_dim():
  a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  np.testing.assert_array_equal(Tensor.cat([Tensor(a), Tensor(b)], 1).numpy(),
                                torch.cat([ta, tb], 1).numpy())
  np.testing.assert_array_equal(Tensor.cat((Tensor(a), Tensor(b)), -2).numpy(),
                                torch.cat((ta, tb), -2).numpy())
  np.testing.assert_array_equal(Tensor.stack([Tensor(a), Tensor(b)], 2).numpy(),
                                torch.stack([ta, tb], 2).numpy())
  with pytest.raises(TypeError, match="dim twice"):
    Tensor.cat([Tensor(a), Tensor(b)], 1, dim=1)


def test_bool_mean_is_the_fraction_true():
  t = Tensor([[True, False, True, True], [False, False, True, False]])
  m = t.mean()
  assert m.dtype == dtypes.default_float and m.item() == 0.5
  assert t.mean(1).tolist() == [0.75, 0.25]
  assert ((Tensor([1, 2, 3]) == Tensor([1, 0, 3])).mean() * 100).item() == pytest.approx(200 / 3)
  with pytest.raises(RuntimeError, match="floating point"):
    Tensor([1, 2]).mean()  # integers still need a float dtype, as in PyTorch


# each takes `dim=` as PyTorch's does, the same argument as tinygrad's `axis`
DIM_METHODS = ("sum", "prod", "mean", "std", "var", "logsumexp", "softmax", "log_softmax",
               "cumsum", "cumprod", "argmax", "argmin", "any", "all", "cummax", "cummin",
               "logcumsumexp", "std_mean", "var_mean")


@pytest.mark.parametrize("name", DIM_METHODS)
def test_reductions_take_pytorchs_dim_keyword(name):
  a = np.array([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], np.float32)
  for dim in (0, -1):
    want = getattr(torch, name)(torch.from_numpy(a), dim=dim)
    got, by_axis = getattr(Tensor(a), name)(dim=dim), getattr(Tensor(a), name)(axis=dim)
    if isinstance(want, torch.Tensor): got, by_axis, want = (got,), (by_axis,), (want,)
    assert len(got) == len(want)
    for g, b, w in zip(got, by_axis, want):
      np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, err_msg=f"{name}(dim={dim})")
      np.testing.assert_array_equal(b.numpy(), g.numpy())
  with pytest.raises(TypeError, match="twice"):
    getattr(Tensor(a), name)(0, dim=1)


def test_max_and_min_with_dim_give_values_and_indices_like_pytorch():
  """`x.max(dim=1)` is PyTorch's (values, indices); `x.max(1)` and `x.max(axis=1)` stay
  tinygrad's values (a tinygrad program's `x.max(axis=1)` is a Tensor)."""
  a = np.array([[1.0, 5.0, 5.0], [4.0, 2.0, 6.0]], np.float32)
  for name in ("max", "min"):
    for keepdim in (False, True):
      got = getattr(Tensor(a), name)(dim=1, keepdim=keepdim)
      want = getattr(torch.from_numpy(a), name)(dim=1, keepdim=keepdim)
      values, indices = got
      np.testing.assert_array_equal(values.numpy(), want.values.numpy())
      np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
      assert indices.dtype == dtypes.int64
    assert isinstance(getattr(Tensor(a), name)(1), Tensor)
    np.testing.assert_array_equal(getattr(Tensor(a), name)(axis=1).numpy(),
                                  getattr(torch.from_numpy(a), name)(1).values.numpy())
    with pytest.raises(TypeError, match="twice"):
      getattr(Tensor(a), name)(axis=1, dim=1)
