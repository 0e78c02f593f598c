"""BatchNorm in training: gradients reach the layers before it, and `@function` models holding it
(tinygrad's beautiful_mnist decorates one) update the running statistics at every call."""
import numpy as np
import torch

from unigrad import Tensor, function, nn


def _models():
  Tensor.manual_seed(0)
  ours = [nn.Conv2d(1, 3, 3), nn.BatchNorm(3)]
  theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3))
  with torch.no_grad():
    theirs[0].weight.copy_(torch.from_numpy(ours[0].weight.numpy()))
    theirs[0].bias.copy_(torch.from_numpy(ours[0].bias.numpy()))
  return ours, theirs


X = np.random.default_rng(0).standard_normal((4, 1, 6, 6)).astype(np.float32)
Y = np.array([0, 2, 1, 1])


def _loss(out):
  """The loss, after running the pending writes (as any realize before backward does: here a
  loss's range check of lazy labels)."""
  Tensor.realize_all()
  return out.mean((2, 3)).sparse_categorical_crossentropy(Tensor(Y))


def _torch_reference(theirs, steps: int):
  theirs.train()
  for _ in range(steps):
    theirs.zero_grad()
    out = theirs(torch.from_numpy(X))
    torch.nn.functional.cross_entropy(out.mean((2, 3)), torch.from_numpy(Y)).backward()
  return theirs


def test_conv_gradient_survives_the_running_statistics_write():
  """The statistics' write realizes the convolution's rearranged weight (a CONTIGUOUS): its
  history must be kept, or the convolution's weight got no gradient."""
  (conv, bn), theirs = _models()
  with Tensor.train():
    _loss(bn(conv(Tensor(X)))).backward()
  ref = _torch_reference(theirs, 1)
  assert conv.weight.grad is not None
  np.testing.assert_allclose(conv.weight.grad.numpy(), ref[0].weight.grad.numpy(), rtol=1e-4,
                             atol=1e-6)


def test_function_model_with_batchnorm_writes_running_statistics():
  (conv, bn), theirs = _models()
  model = function(lambda x: bn(conv(x)))
  with Tensor.train():
    for _ in range(2):  # the second call replays the trace: it must write again
      conv.weight.grad = None
      _loss(model(Tensor(X))).backward()
  assert model.trace_count == 1
  ref = _torch_reference(theirs, 2)
  np.testing.assert_allclose(bn.running_mean.numpy(), ref[1].running_mean.numpy(), rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(bn.running_var.numpy(), ref[1].running_var.numpy(), rtol=1e-5)
  assert bn.num_batches_tracked.item() == 2
  np.testing.assert_allclose(conv.weight.grad.numpy(), ref[0].weight.grad.numpy(), rtol=1e-4,
                             atol=1e-6)
  # eval mode: its own trace, reading the running statistics and writing nothing
  with Tensor.train(False):
    out = model(Tensor(X)).numpy()
  ref.eval()
  np.testing.assert_allclose(out, ref(torch.from_numpy(X)).detach().numpy(), rtol=1e-4, atol=1e-5)
  assert bn.num_batches_tracked.item() == 2
