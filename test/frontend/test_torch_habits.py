"""Small PyTorch spellings a ported program uses: `Tensor.cat([a, b], 1)` with a positional dim,
and the mean of a bool tensor (an accuracy: `(pred == y).mean()`)."""
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
