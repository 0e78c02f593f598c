"""PyTorch's module habits (nn.Module, Sequential, ModuleList, Dropout, Adam(betas=...)),
compared with torch.nn where it defines the behaviour."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

from unigrad import Tensor, nn


class Net(nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.fc = nn.Linear(4, 6)
    self.bn = nn.BatchNorm(6)
    self.body = nn.Sequential(nn.Linear(6, 6), Tensor.relu, nn.Dropout(0.5))
    self.heads = nn.ModuleList([nn.Linear(6, 2), nn.Linear(6, 3)])
    self.register_buffer("scale", Tensor([2.0]))

  def forward(self, x: Tensor) -> Tensor:
    h = self.body(self.bn(self.fc(x)))
    return self.heads[0](h) * self.scale


class TorchNet(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.fc = torch.nn.Linear(4, 6)
    self.bn = torch.nn.BatchNorm1d(6)
    self.body = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Dropout(0.5))
    self.heads = torch.nn.ModuleList([torch.nn.Linear(6, 2), torch.nn.Linear(6, 3)])
    self.register_buffer("scale", torch.tensor([2.0]))

  def forward(self, x):
    return self.heads[0](self.body(self.bn(self.fc(x)))) * self.scale


def test_names_and_modes_match_pytorch():
  ours, theirs = Net(), TorchNet()
  assert list(ours.state_dict()) == list(theirs.state_dict())
  assert [k for k, _ in ours.named_parameters()] == [k for k, _ in theirs.named_parameters()]
  assert [k for k, _ in ours.named_buffers()] == [k for k, _ in theirs.named_buffers()]
  assert len(list(ours.parameters())) == len(list(theirs.parameters()))
  assert [k for k, _ in ours.named_children()] == [k for k, _ in theirs.named_children()]
  assert ours.training and ours.body[2].training
  assert ours.eval() is ours and not ours.training and not ours.body[2].training
  assert not ours.heads.training
  ours.train()
  assert ours.body[2].training and len(ours.body) == 3 and len(ours.heads) == 2


def test_forward_matches_pytorch_in_eval_and_train():
  ours, theirs = Net(), TorchNet()
  ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
  x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
  ours.eval(), theirs.eval()
  np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.from_numpy(x)).detach().numpy(),
                             rtol=1e-5, atol=1e-5)
  # training mode: BatchNorm uses the batch and updates its statistics (dropout off: p=0)
  ours.body[2].p = theirs.body[2].p = 0.0
  ours.train(), theirs.train()
  out, ref = ours(Tensor(x)), theirs(torch.from_numpy(x))
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ours.bn.running_var.numpy(), theirs.bn.running_var.numpy(), rtol=1e-5)


def test_module_mode_scopes_tensor_training():
  """model.train()/eval() decide what the layers inside see, whatever Tensor.training is."""
  class Probe(nn.Module):
    def forward(self, x):
      return x * (2.0 if Tensor.training else 1.0)
  p = Probe()
  with Tensor.train(False):
    assert p(Tensor([1.0])).item() == 2.0  # a new module trains, as in PyTorch
  with Tensor.train(True):
    assert p.eval()(Tensor([1.0])).item() == 1.0


def test_dropout():
  d = nn.Dropout(0.5)
  x = Tensor.ones(1000)
  y = d(x).numpy()
  assert set(np.unique(y)) <= {0.0, 2.0} and 300 < (y == 0).sum() < 700
  assert (d.eval()(x).numpy() == 1.0).all()
  with pytest.raises(ValueError, match="between 0 and 1"):
    nn.Dropout(1.5)


def test_sequential_from_ordered_dict_and_slicing():
  seq = nn.Sequential(OrderedDict([("lin", nn.Linear(3, 2)), ("act", Tensor.relu)]))
  assert list(seq.state_dict()) == ["lin.weight", "lin.bias"]
  assert seq(Tensor.ones(1, 3)).shape == (1, 2) and len(seq[:1]) == 1
  ml = nn.ModuleList()
  ml.append(nn.Linear(2, 2)).extend([nn.Linear(2, 1)])
  assert list(ml.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_module_without_forward_raises():
  with pytest.raises(NotImplementedError, match="forward"):
    nn.Module()(Tensor([1.0]))


def test_adam_betas_same_as_b1_b2():
  def run(**kw):
    Tensor.manual_seed(0)
    w = Tensor([1.0, -2.0]).contiguous().requires_grad_()
    opt = nn.optim.Adam([w], lr=0.1, **kw)
    for _ in range(3):
      opt.zero_grad()
      (w * w).sum().backward()
      opt.step()
    return w.numpy()
  a, b = run(betas=(0.8, 0.9)), run(b1=0.8, b2=0.9)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, run())
  tw = torch.tensor([1.0, -2.0], requires_grad=True)
  topt = torch.optim.Adam([tw], lr=0.1, betas=(0.8, 0.9))
  for _ in range(3):
    topt.zero_grad()
    (tw * tw).sum().backward()
    topt.step()
  np.testing.assert_allclose(a, tw.detach().numpy(), rtol=1e-5)
  with pytest.raises(ValueError, match="beta"):
    nn.optim.Adam([Tensor([1.0]).requires_grad_()], betas=(0.9, 1.5))
  with pytest.raises(TypeError, match="betas"):
    nn.optim.AdamW([Tensor([1.0]).requires_grad_()], b1=(0.9, 0.99), betas=(0.9, 0.99))
