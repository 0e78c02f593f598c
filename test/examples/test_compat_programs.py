"""Small whole programs written the way tinygrad's and PyTorch's users write them, run end to end.

test_tinygrad_examples.py runs tinygrad's own example files; these are the habits around them,
each program a few lines of training on the shipped UCI digits (`nn.datasets.digits()`, 64
features, 10 classes; a two-layer MLP, so few kernels) with its result checked:
- tinygrad's style: a plain class, `nn.state.get_parameters`, a loop under `with Tensor.train():`
  (`opt.zero_grad()`, `loss.backward()`, `opt.step()`), the same step under `@TinyJit` ending in
  `Tensor.realize(loss, *opt.schedule_step())` giving the same weights as the eager loop, and the
  trained weights through `get_state_dict` -> `safe_save` -> `safe_load` -> `load_state_dict`.
- PyTorch's style: an `nn.Module` with `nn.Sequential`, BatchNorm and Dropout, `model.train()` /
  `model.eval()`, `Adam(model.parameters(), betas=...)` with `StepLR`, checked step by step
  against the same program in PyTorch from the same initial weights, then `state_dict()` loaded
  into the PyTorch model (and PyTorch's back) giving the same predictions.
"""
import numpy as np
import pytest
import torch

from unigrad import Tensor, TinyJit, nn
from unigrad.nn.optim.lr_scheduler import StepLR
from unigrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

BATCH, STEPS = 32, 6


@pytest.fixture(scope="module")
def data():
  """The digits as float features in [0, 1] and int labels, and fixed batch indices per step."""
  x_train, y_train, x_test, y_test = nn.datasets.digits()
  x_train = (x_train.reshape(-1, 64).float() / 255).realize()
  x_test = (x_test.reshape(-1, 64).float() / 255).realize()
  picks = np.random.default_rng(0).integers(0, x_train.shape[0], (STEPS, BATCH))
  return x_train, y_train, x_test, y_test, picks


class TinyNet:
  """tinygrad's way: a plain class whose attributes are layers, called as a function."""
  def __init__(self):
    self.l1, self.l2 = nn.Linear(64, 32), nn.Linear(32, 10)

  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).relu())


def _twin(net: TinyNet) -> TinyNet:
  """A second TinyNet holding copies of `net`'s weights."""
  other = TinyNet()
  load_state_dict(other, {k: v.numpy() for k, v in get_state_dict(net).items()})
  return other


def _accuracy(net, x: Tensor, y: Tensor) -> float:
  return float((net(x).argmax(axis=1) == y).mean().item())


def test_tinygrad_style_training_loop_under_tensor_train(data):
  x_train, y_train, x_test, y_test, _ = data
  Tensor.manual_seed(0)
  net = TinyNet()
  opt = nn.optim.Adam(get_parameters(net), lr=1e-2)
  before, losses = _accuracy(net, x_test, y_test), []
  assert not Tensor.training
  with Tensor.train():
    for _ in range(40):
      assert Tensor.training
      samples = Tensor.randint(BATCH, high=x_train.shape[0])
      opt.zero_grad()
      loss = net(x_train[samples]).sparse_categorical_crossentropy(y_train[samples]).backward()
      opt.step()
      losses.append(loss.item())
  assert not Tensor.training
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) * 0.6, losses
  assert _accuracy(net, x_test, y_test) > max(before, 0.5)


def test_tinygrad_style_tinyjit_step_equals_the_eager_loop(data):
  """The step under TinyJit (`Tensor.realize(loss, *opt.schedule_step())`, replayed from its third
  call) trains exactly as the eager step does."""
  x_train, y_train, _, _, picks = data
  eager = TinyNet()
  jitted = _twin(eager)
  opt_e = nn.optim.Adam(get_parameters(eager), lr=1e-2)
  opt_j = nn.optim.Adam(get_parameters(jitted), lr=1e-2)

  @TinyJit
  @Tensor.train()
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt_j.zero_grad()
    loss = jitted(x).sparse_categorical_crossentropy(y).backward()
    Tensor.realize(loss, *opt_j.schedule_step())
    return loss

  for pick in picks:
    x, y = x_train[Tensor(pick)], y_train[Tensor(pick)]
    with Tensor.train():
      opt_e.zero_grad()
      want = eager(x).sparse_categorical_crossentropy(y).backward()
      opt_e.step()
    np.testing.assert_allclose(step(x, y).item(), want.item(), rtol=1e-5)
  assert step.captured is not None
  for (k, w), j in zip(get_state_dict(eager).items(), get_state_dict(jitted).values()):
    np.testing.assert_allclose(j.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_tinygrad_style_state_dict_round_trip_through_safetensors(data, tmp_path):
  x_train, y_train, x_test, _, _ = data
  net = TinyNet()
  opt = nn.optim.Adam(get_parameters(net), lr=1e-2)  # the kernels of the loop above
  with Tensor.train():
    for _ in range(3):
      samples = Tensor.randint(BATCH, high=x_train.shape[0])
      opt.zero_grad()
      net(x_train[samples]).sparse_categorical_crossentropy(y_train[samples]).backward()
      opt.step()
  state = get_state_dict(net)
  assert list(state) == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
  safe_save(state, str(tmp_path / "net.safetensors"))
  fresh = TinyNet()
  load_state_dict(fresh, safe_load(str(tmp_path / "net.safetensors")))
  np.testing.assert_array_equal(fresh(x_test).numpy(), net(x_test).numpy())


# ---- PyTorch's style ----

class Classifier(nn.Module):
  def __init__(self) -> None:
    super().__init__()
    # no bias before BatchNorm: its gradient is rounding noise, which Adam scales up to steps of
    # size lr in either library, differently (the outputs in train mode do not see it)
    self.features = nn.Sequential(nn.Linear(64, 32, bias=False), nn.BatchNorm(32), Tensor.relu,
                                  nn.Dropout(0.0))
    self.head = nn.Linear(32, 10)

  def forward(self, x: Tensor) -> Tensor: return self.head(self.features(x))


class TorchClassifier(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.features = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False),
                                        torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.0))
    self.head = torch.nn.Linear(32, 10)

  def forward(self, x): return self.head(self.features(x))


def _train_pytorch_style(model, make_opt, make_sched, loss_fn, as_input, batches) -> list[float]:
  """The PyTorch loop, written once for either library: train(), zero_grad, backward, step, the
  scheduler's step, eval() at the end."""
  opt = make_opt(model.parameters())
  sched = make_sched(opt)
  model.train()
  losses = []
  for x, y in batches:
    opt.zero_grad()
    loss = loss_fn(model(as_input(x)), as_input(y))
    loss.backward()
    opt.step()
    sched.step()
    losses.append(loss.item())
  model.eval()
  return losses


def test_pytorch_style_program_matches_pytorch(data):
  x_train, y_train, x_test, _, picks = data
  xs, ys, xt = x_train.numpy(), y_train.numpy().astype(np.int64), x_test.numpy()
  batches = [(xs[p], ys[p]) for p in picks]
  ours, theirs = Classifier(), TorchClassifier()
  assert list(ours.state_dict()) == list(theirs.state_dict())
  ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
  got = _train_pytorch_style(
    ours, lambda ps: nn.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99)),
    lambda opt: StepLR(opt, step_size=2, gamma=0.5), Tensor.cross_entropy, Tensor, batches)
  want = _train_pytorch_style(
    theirs, lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99)),
    lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    torch.nn.functional.cross_entropy, torch.from_numpy, batches)
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert not ours.training and not ours.features.training
  with torch.no_grad(): want_eval = theirs(torch.from_numpy(xt)).numpy()
  np.testing.assert_allclose(ours(Tensor(xt)).numpy(), want_eval, rtol=1e-4, atol=1e-4)
  # the trained state, BatchNorm's running statistics and counter included, into PyTorch's model
  fresh = TorchClassifier().eval()
  fresh.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in ours.state_dict().items()})
  with torch.no_grad(): np.testing.assert_allclose(fresh(torch.from_numpy(xt)).numpy(),
                                                   want_eval, rtol=1e-4, atol=1e-4)
  assert int(ours.state_dict()["features.1.num_batches_tracked"].item()) == STEPS
