"""nn behaviours a tinygrad or PyTorch user meets (issue 29), against PyTorch."""
import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes
from unigrad.nn import BatchNorm, Conv1d, Conv2d, LSTMCell
from unigrad.nn.state import StateDictError, get_state_dict, load_state_dict


def test_lstm_cell_weights_assigned_from_numpy_match_torch():
  # tinygrad's test: assign() of numpy arrays (each was taken for a 0-d scalar and failed)
  layer, theirs = LSTMCell(8, 4), torch.nn.LSTMCell(8, 4)
  with torch.no_grad():
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
      getattr(layer, name).assign(getattr(theirs, name).numpy())
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    h, c = layer(Tensor(x))
    th, tc = theirs(torch.tensor(x))
    h, c = layer(Tensor(x), (h, c))
    th, tc = theirs(torch.tensor(x), (th, tc))
  np.testing.assert_allclose(h.numpy(), th.numpy(), atol=1e-6)
  np.testing.assert_allclose(c.numpy(), tc.numpy(), atol=1e-6)


def test_assign_takes_array_data_and_scalars():
  t = Tensor.zeros(2, 2).contiguous().realize()
  t.assign(np.arange(4, dtype=np.float64).reshape(2, 2))  # converted to t's dtype
  np.testing.assert_array_equal(t.numpy(), [[0, 1], [2, 3]])
  assert t.dtype == dtypes.float32
  t.assign([[5, 6], [7, 8]])
  np.testing.assert_array_equal(t.numpy(), [[5, 6], [7, 8]])
  t.assign(np.float32(2))
  np.testing.assert_array_equal(t.numpy(), [[2, 2], [2, 2]])
  with pytest.raises(ValueError, match="shape"): t.assign(np.ones(3, np.float32))


def test_batchnorm_without_running_stats_has_pytorch_state_dict():
  ours = get_state_dict(BatchNorm(3, track_running_stats=False))
  theirs = torch.nn.BatchNorm2d(3, track_running_stats=False).state_dict()
  assert list(ours) == list(theirs)


def test_batchnorm_without_running_stats_rejects_num_batches_tracked_like_pytorch():
  layer = BatchNorm(1, track_running_stats=False)
  sd = {"weight": Tensor.ones(1), "bias": Tensor.ones(1), "num_batches_tracked": Tensor.ones(1)}
  with pytest.raises(StateDictError, match="Unexpected key.*num_batches_tracked"):
    load_state_dict(layer, sd)
  assert load_state_dict(layer, sd, strict=False).unexpected_keys == ["num_batches_tracked"]
  layer(Tensor.ones(2, 1, 2, 2)).realize()  # batch statistics, no running ones


def test_batchnorm_loads_num_batches_tracked_of_shape_1():
  layer = BatchNorm(2)
  sd = {k: v for k, v in get_state_dict(BatchNorm(2)).items()}
  sd["num_batches_tracked"] = Tensor([7], dtype=dtypes.int64)  # tinygrad's (1,) counter
  load_state_dict(layer, sd)
  assert layer.num_batches_tracked.shape == () and layer.num_batches_tracked.item() == 7


def test_batchnorm_state_without_num_batches_tracked_keeps_the_counter():
  layer = BatchNorm(2)
  sd = {k: v for k, v in get_state_dict(BatchNorm(2)).items() if k != "num_batches_tracked"}
  assert load_state_dict(layer, sd).missing_keys == []
  assert layer.num_batches_tracked.item() == 0


@pytest.mark.parametrize("make", [lambda: Conv2d(1, 1, 3, stride=2, padding="same"),
                                  lambda: Conv2d(1, 1, 3, stride=(1, 2), padding="same"),
                                  lambda: Conv1d(1, 1, 3, stride=2, padding="same")])
def test_conv_padding_same_with_stride_raises_like_pytorch(make):
  with pytest.raises(ValueError, match="strided"):
    torch.nn.Conv2d(1, 1, 3, stride=2, padding="same")
  with pytest.raises(ValueError, match="padding='same' is not supported for strided"): make()


def test_conv_invalid_padding_string_raises_like_pytorch():
  with pytest.raises(ValueError, match="Invalid padding string"):
    torch.nn.Conv2d(1, 1, 3, padding="x")
  with pytest.raises(ValueError, match="Invalid padding string 'x'"): Conv2d(1, 1, 3, padding="x")
  assert Conv2d(1, 1, 3, padding="same")(Tensor.ones(1, 1, 4, 4)).shape == (1, 1, 4, 4)


def test_batchnorm_buffers_are_not_params_like_tinygrad():
  """Regression: num_batches_tracked had requires_grad None, so `is_param` was True and tinygrad's
  gradaccum_mnist.py, which splits `get_parameters(model)` by `is_param`, took it for a weight
  (its `t.grad` was None after backward)."""
  bn = BatchNorm(3)
  assert [t.is_param for t in (bn.weight, bn.bias)] == [True, True]
  assert [t.is_param for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked)] == \
    [False, False, False]
