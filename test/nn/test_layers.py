"""nn.layers against torch.nn: outputs, input and parameter gradients, running statistics,
state-dict names, parameter identity and initialization bounds (CPU, small shapes)."""
import math

import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes
from unigrad import nn
from unigrad.nn.state import get_state_dict, load_state_dict

RTOL, ATOL = 1e-4, 1e-5


def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def copy_weights(ours, theirs: torch.nn.Module) -> None:
  """torch -> unigrad through load_state_dict (strict: every name must match)."""
  load_state_dict(ours, {k: Tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def close(u: Tensor, t: torch.Tensor, what: str = "") -> None:
  assert u is not None, f"{what}: no gradient"
  assert tuple(u.shape) == tuple(t.shape), what
  np.testing.assert_allclose(u.numpy(), t.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=what)


def run(ours, theirs: torch.nn.Module, *xs: np.ndarray, seed: int = 1) -> None:
  """Forward both on the same inputs, backward sum(out * r) for a random r, compare the output,
  the input gradients and every torch parameter's gradient (by state-dict name)."""
  ux = [Tensor(x, requires_grad=True) for x in xs]
  tx = [torch.tensor(x, requires_grad=True) for x in xs]
  uo, to = ours(*ux), theirs(*tx)
  r = rand(*to.shape, seed=seed)
  (uo * Tensor(r)).sum().backward()  # before realizing uo: realizing cuts the graph (as tinygrad)
  (to * torch.tensor(r)).sum().backward()
  close(uo, to, "output")
  for i, (u, t) in enumerate(zip(ux, tx)): close(u.grad, t.grad, f"input {i} grad")
  sd = get_state_dict(ours)
  for name, p in theirs.named_parameters(): close(sd[name].grad, p.grad, f"{name} grad")


def check(ours, theirs: torch.nn.Module, *xs: np.ndarray) -> None:
  copy_weights(ours, theirs)
  run(ours, theirs, *xs)


# ---- Linear, convolutions ----

@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
  check(nn.Linear(5, 4, bias), torch.nn.Linear(5, 4, bias), rand(2, 3, 5))


CONV2D = [  # stride, padding, dilation, groups, bias
  (1, 0, 1, 1, True), (2, 1, 1, 1, True), ((2, 1), (1, 2), (1, 2), 1, False),
  (1, 2, 2, 2, True), (2, 0, 1, 6, True), (1, "same", 2, 3, True), (1, "valid", 1, 1, False)]


@pytest.mark.parametrize("stride,padding,dilation,groups,bias", CONV2D)
def test_conv2d(stride, padding, dilation, groups, bias):
  args = (6, 6, (3, 2), stride, padding, dilation, groups, bias)
  check(nn.Conv2d(*args), torch.nn.Conv2d(*args), rand(2, 6, 7, 8))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 2, 2)])
def test_conv1d(stride, padding, dilation, groups):
  args = (4, 6, 3, stride, padding, dilation, groups)
  check(nn.Conv1d(*args), torch.nn.Conv1d(*args), rand(2, 4, 9))


CONVT2D = [  # stride, padding, output_padding, dilation, groups, bias
  (1, 0, 0, 1, 1, True), (2, 1, 1, 1, 1, True), ((2, 3), (0, 1), (1, 2), 1, 1, False),
  (2, 1, 0, 2, 2, True), (3, 2, 1, 1, 4, True)]


@pytest.mark.parametrize("stride,padding,output_padding,dilation,groups,bias", CONVT2D)
def test_conv_transpose2d(stride, padding, output_padding, dilation, groups, bias):
  ours = nn.ConvTranspose2d(4, 8, (3, 2), stride, padding, output_padding, dilation, groups, bias)
  theirs = torch.nn.ConvTranspose2d(4, 8, (3, 2), stride, padding, output_padding, groups, bias,
                                    dilation)
  check(ours, theirs, rand(2, 4, 5, 4))


def test_conv_transpose1d():
  ours = nn.ConvTranspose1d(4, 6, 3, 2, 1, 1, 1, 2)
  theirs = torch.nn.ConvTranspose1d(4, 6, 3, 2, 1, 1, 2)
  check(ours, theirs, rand(2, 4, 5))


# ---- BatchNorm ----

def randomize_affine(theirs: torch.nn.Module) -> None:
  with torch.no_grad():
    for i, p in enumerate(theirs.parameters()): p.copy_(torch.tensor(rand(*p.shape, seed=10 + i)))


def stats(ours) -> tuple:
  return ours.running_mean, ours.running_var, ours.num_batches_tracked


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (3, 3, 4, 2)])
def test_batchnorm_train_then_eval(shape):
  ours = nn.BatchNorm2d(3)
  theirs = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(3)
  randomize_affine(theirs)
  copy_weights(ours, theirs)
  theirs.train()
  with Tensor.train():
    for step in range(3):
      x = rand(*shape, seed=step) * 2 + step
      run(ours, theirs, x, seed=step)
      for k in ("weight", "bias"): getattr(ours, k).grad, getattr(theirs, k).grad = None, None
      close(ours.running_mean, theirs.running_mean, "running_mean")
      close(ours.running_var, theirs.running_var, "running_var (unbiased)")
      assert ours.num_batches_tracked.shape == ()
      assert ours.num_batches_tracked.item() == theirs.num_batches_tracked.item() == step + 1
  theirs.eval()
  with Tensor.train(False):
    rm, rv = ours.running_mean.numpy(), ours.running_var.numpy()
    run(ours, theirs, rand(*shape, seed=9))
    np.testing.assert_array_equal(ours.running_mean.numpy(), rm)  # eval leaves them alone
    np.testing.assert_array_equal(ours.running_var.numpy(), rv)
    assert ours.num_batches_tracked.item() == 3


def test_batchnorm_default_is_eval():
  """Tensor.training is False by default (unlike torch.nn.Module): running stats are used."""
  assert Tensor.training is False
  ours, theirs = nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2).eval()
  with torch.no_grad():
    theirs.running_mean.copy_(torch.tensor([0.5, -1.0]))
    theirs.running_var.copy_(torch.tensor([2.0, 0.25]))
  check(ours, theirs, rand(2, 2, 3, 3))


def test_batchnorm_no_running_stats_no_affine():
  ours = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
  theirs = torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False)
  assert list(get_state_dict(ours)) == list(theirs.state_dict()) == []  # no running stats
  for mode in (True, False):  # batch statistics in both modes, like torch
    theirs.train(mode)
    with Tensor.train(mode): run(ours, theirs, rand(4, 3, 2, 2, seed=int(mode)))


def test_batchnorm_momentum_eps():
  ours, theirs = nn.BatchNorm2d(2, eps=1e-3, momentum=0.3), torch.nn.BatchNorm2d(2, 1e-3, 0.3)
  with Tensor.train(): run(ours, theirs, rand(3, 2, 2, 2))
  close(ours.running_mean, theirs.running_mean, "running_mean")
  close(ours.running_var, theirs.running_var, "running_var")


def test_batchnorm_momentum_none_is_a_cumulative_average():
  """Regression: momentum=None (PyTorch: running stats are the cumulative average, weight
  1/num_batches_tracked) failed; it matches torch over several steps, then eval uses them."""
  ours, theirs = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
  with Tensor.train():
    for step in range(4):
      x = rand(5, 3, 2, 2, seed=step) * (step + 1) + step
      ours(Tensor(x)).realize()
      theirs(torch.tensor(x))
      close(ours.running_mean, theirs.running_mean, f"running_mean step {step}")
      close(ours.running_var, theirs.running_var, f"running_var step {step}")
      assert ours.num_batches_tracked.item() == theirs.num_batches_tracked.item() == step + 1
  theirs.eval()
  x = rand(2, 3, 2, 2, seed=9)
  close(ours(Tensor(x)), theirs(torch.tensor(x)), "eval output")


def test_batchnorm_loads_torch_checkpoint():
  """Regression: num_batches_tracked was shape (1,), so a torch state dict failed to load."""
  theirs = torch.nn.BatchNorm2d(3)
  theirs.train()(torch.randn(4, 3, 2, 2))
  ours = nn.BatchNorm2d(3)
  copy_weights(ours, theirs)
  for u, t in zip(stats(ours), (theirs.running_mean, theirs.running_var)): close(u, t)
  assert ours.num_batches_tracked.item() == 1
  sd = get_state_dict(ours)
  assert {k: tuple(v.shape) for k, v in sd.items()} == \
    {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
  assert sd["num_batches_tracked"].dtype == dtypes.int64


# ---- other norms ----

@pytest.mark.parametrize("shape", [(2, 6, 3, 4), (2, 6, 5)])
def test_groupnorm(shape):
  ours, theirs = nn.GroupNorm(3, 6, eps=1e-4), torch.nn.GroupNorm(3, 6, eps=1e-4)
  randomize_affine(theirs)
  check(ours, theirs, rand(*shape) * 3 + 1)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 6)])
def test_instancenorm(shape):
  cls = torch.nn.InstanceNorm2d if len(shape) == 4 else torch.nn.InstanceNorm1d
  ours, theirs = nn.InstanceNorm(3), cls(3, affine=True)
  randomize_affine(theirs)
  check(ours, theirs, rand(*shape) * 2 - 1)


@pytest.mark.parametrize("normalized,affine", [(6, True), ((4, 6), True), (6, False)])
def test_layernorm(normalized, affine):
  ours = nn.LayerNorm(normalized, eps=1e-5, elementwise_affine=affine)
  theirs = torch.nn.LayerNorm(normalized, eps=1e-5, elementwise_affine=affine)
  randomize_affine(theirs)
  check(ours, theirs, rand(3, 4, 6) + 2)


def test_layernorm_shape_error():
  with pytest.raises(ValueError): nn.LayerNorm(5)(Tensor(rand(2, 4)))


class TorchLayerNorm2d(torch.nn.LayerNorm):
  def forward(self, x): return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def test_layernorm2d():
  theirs = TorchLayerNorm2d(5)
  randomize_affine(theirs)
  check(nn.LayerNorm2d(5), theirs, rand(2, 5, 3, 4))


@pytest.mark.parametrize("affine,eps", [(True, 1e-6), (False, 1e-3)])
def test_rmsnorm(affine, eps):
  ours, theirs = nn.RMSNorm(6, eps, affine), torch.nn.RMSNorm(6, eps, affine)
  randomize_affine(theirs)
  check(ours, theirs, rand(2, 3, 6) * 0.1)


# ---- Embedding ----

def test_embedding():
  ours, theirs = nn.Embedding(7, 4), torch.nn.Embedding(7, 4)
  copy_weights(ours, theirs)
  idx = np.array([[0, 3, 3], [6, 1, 3]], np.int64)  # repeats: gradient rows accumulate
  uo, to = ours(Tensor(idx)), theirs(torch.tensor(idx))
  r = rand(*to.shape)
  (uo * Tensor(r)).sum().backward()
  (to * torch.tensor(r)).sum().backward()
  close(uo, to, "output")
  close(ours.weight.grad, theirs.weight.grad, "weight grad")
  close(ours(Tensor(np.int32(5))), theirs(torch.tensor(5)), "0-d index")


@pytest.mark.parametrize("bad", [[1, 4], [-1], [[0, 2], [100, 1]]], ids=str)
def test_embedding_out_of_range_index_raises_index_error(bad):
  """Regression: an index outside [0, vocab) read a zero row; like torch it raises IndexError
  (negative indices included: Embedding does not wrap them), before anything runs."""
  idx = np.array(bad, np.int64)
  with pytest.raises(IndexError, match="index out of range in self"):
    torch.nn.Embedding(4, 3)(torch.tensor(idx))
  ours = nn.Embedding(4, 3)
  with pytest.raises(IndexError, match=r"Embedding\(4, 3\): index out of range in self"):
    ours(Tensor(idx))
  with pytest.raises(IndexError, match="out of range"): ours(Tensor(idx.astype(np.int32)))


def test_embedding_in_range_edges_and_lazy_index():
  """0 and vocab-1 are fine; a lazy index is not checked (reading it would need a sync), as in
  Tensor indexing: there an out-of-range index still reads a zero row."""
  ours = nn.Embedding(4, 3)
  w = ours.weight.numpy()
  np.testing.assert_array_equal(ours(Tensor([0, 3])).numpy(), w[[0, 3]])
  lazy = Tensor([1, 2]) + 2  # [3, 4], not realized
  np.testing.assert_array_equal(ours(lazy).numpy(), np.stack([w[3], np.zeros(3, np.float32)]))


def test_embedding_float_index_raises():
  with pytest.raises(IndexError): nn.Embedding(4, 3)(Tensor([1.0]))


# ---- LSTMCell ----

class HC(torch.nn.Module):
  """Wraps an LSTMCell so (x, h, c) -> stacked (h', c'): one output for run()."""

  def __init__(self, cell, ours: bool) -> None:
    super().__init__()
    self.cell, self.ours = cell, ours

  def __call__(self, x, h=None, c=None):
    h2, c2 = self.cell(x, None if h is None else (h, c))
    return Tensor.stack(h2, c2) if self.ours else torch.stack([h2, c2])


@pytest.mark.parametrize("bias,state", [(True, True), (False, True), (True, False)])
def test_lstmcell(bias, state):
  ours, theirs = nn.LSTMCell(5, 4, bias), torch.nn.LSTMCell(5, 4, bias)
  copy_weights(ours, theirs)
  xs = [rand(3, 5)] + ([rand(3, 4, seed=2), rand(3, 4, seed=3)] if state else [])
  run(HC(ours, True), HC(theirs, False), *xs)
  sd = get_state_dict(ours)
  for name, p in theirs.named_parameters(): close(sd[name].grad, p.grad, f"{name} grad")


def test_lstmcell_gate_order():
  """Gates are i, f, g, o: only the g block of bias_ih is 1, so c = sigmoid(0) * tanh(1)."""
  cell = nn.LSTMCell(2, 3)
  for t in (cell.weight_ih, cell.weight_hh, cell.bias_hh): t.assign(t.zeros_like())
  cell.bias_ih.assign(Tensor([0.0] * 6 + [1.0] * 3 + [0.0] * 3))
  h, c = cell(Tensor(rand(1, 2)))
  np.testing.assert_allclose(c.numpy(), np.full((1, 3), 0.5 * math.tanh(1)), rtol=1e-6)
  np.testing.assert_allclose(h.numpy(), 0.5 * np.tanh(c.numpy()), rtol=1e-6)


# ---- parameters, state-dict names, initialization ----

LAYERS = {  # name -> (ours, torch)
  "Linear": (lambda: nn.Linear(5, 3), lambda: torch.nn.Linear(5, 3)),
  "Linear_nobias": (lambda: nn.Linear(5, 3, False), lambda: torch.nn.Linear(5, 3, False)),
  "Conv2d": (lambda: nn.Conv2d(4, 6, 3, groups=2), lambda: torch.nn.Conv2d(4, 6, 3, groups=2)),
  "Conv1d": (lambda: nn.Conv1d(4, 6, 3), lambda: torch.nn.Conv1d(4, 6, 3)),
  "ConvTranspose2d": (lambda: nn.ConvTranspose2d(4, 6, 3, groups=2),
                      lambda: torch.nn.ConvTranspose2d(4, 6, 3, groups=2)),
  "ConvTranspose1d": (lambda: nn.ConvTranspose1d(4, 6, 3),
                      lambda: torch.nn.ConvTranspose1d(4, 6, 3)),
  "BatchNorm2d": (lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3)),
  "GroupNorm": (lambda: nn.GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4)),
  "InstanceNorm": (lambda: nn.InstanceNorm(4), lambda: torch.nn.InstanceNorm2d(4, affine=True)),
  "LayerNorm": (lambda: nn.LayerNorm((3, 4)), lambda: torch.nn.LayerNorm((3, 4))),
  "LayerNorm2d": (lambda: nn.LayerNorm2d(4), lambda: TorchLayerNorm2d(4)),
  "RMSNorm": (lambda: nn.RMSNorm(4), lambda: torch.nn.RMSNorm(4)),
  "Embedding": (lambda: nn.Embedding(5, 3), lambda: torch.nn.Embedding(5, 3)),
  "LSTMCell": (lambda: nn.LSTMCell(3, 4), lambda: torch.nn.LSTMCell(3, 4)),
}


@pytest.mark.parametrize("name", LAYERS)
def test_state_dict_names_and_parameters(name):
  make_ours, make_theirs = LAYERS[name]
  ours, theirs = make_ours(), make_theirs()
  sd, tsd = get_state_dict(ours), theirs.state_dict()
  assert list(sd) == list(tsd)  # same names, same order
  assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in tsd.items()}
  params = dict(theirs.named_parameters())
  assert len({id(t) for t in sd.values()}) == len(sd)  # distinct tensors
  for k, t in sd.items():
    assert bool(t.requires_grad) is (k in params), k  # parameters only; running stats: buffers
  # distinct buffers: writing each one leaves all the others as they were
  before = {k: t.numpy().copy() for k, t in sd.items()}
  for i, (k, t) in enumerate(sd.items()):
    t.assign(Tensor.full(t.shape, 100 + i, dtype=t.dtype)).realize()
    for k2, t2 in sd.items():
      want = np.full(before[k2].shape, 100 + list(sd).index(k2)) if list(sd).index(k2) <= i \
        else before[k2]
      np.testing.assert_array_equal(t2.numpy(), want.astype(before[k2].dtype), err_msg=f"{k}->{k2}")


@pytest.mark.parametrize("name", LAYERS)
def test_init_like_torch(name):
  """Initial values: constant ones (norms, running stats) equal torch's; random weights are
  uniform within torch's bounds: 1/sqrt(fan_in) for Linear/Conv (kaiming a=sqrt(5)) weights and
  biases, 1/sqrt(hidden) for LSTMCell; Embedding is glorot uniform (tinygrad's), not N(0, 1)."""
  Tensor.manual_seed(3)  # a fixed draw: a 3-element bias can be legitimately small
  ours, theirs = LAYERS[name][0](), LAYERS[name][1]()
  tsd = theirs.state_dict()
  for k, t in get_state_dict(ours).items():
    ref, got = tsd[k].numpy(), t.numpy()
    if name == "Embedding": bound = math.sqrt(6 / sum(ref.shape))
    elif name == "LSTMCell": bound = 1 / math.sqrt(theirs.hidden_size)
    elif hasattr(theirs, "in_features") or hasattr(theirs, "kernel_size"):
      w = tsd["weight"]
      bound = 1 / math.sqrt(w.shape[1] * math.prod(w.shape[2:]))
    else:
      np.testing.assert_array_equal(got, ref, err_msg=k)
      continue
    assert np.abs(got).max() <= bound * (1 + 1e-6), k
    assert np.abs(got).max() > bound / 4, k  # not degenerate
    assert np.unique(got).size == got.size, k


def test_batchnorm_chained_lazy_updates():
  """Several training steps realized together: each update reads the previous (lazy) one."""
  ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  xs = [rand(4, 3, 2, 2, seed=i) + i for i in range(3)]
  with Tensor.train():
    outs = [ours(Tensor(x)) for x in xs]
    Tensor.realize_all(*outs)
  for u, x in zip(outs, xs): close(u, theirs(torch.tensor(x)), "output")
  close(ours.running_mean, theirs.running_mean, "running_mean")
  close(ours.running_var, theirs.running_var, "running_var")
  assert ours.num_batches_tracked.item() == 3


def test_lstmcell_unbatched():
  ours, theirs = nn.LSTMCell(3, 4), torch.nn.LSTMCell(3, 4)
  copy_weights(ours, theirs)
  (h, c), (th, tc) = ours(Tensor(rand(3))), theirs(torch.tensor(rand(3)))
  close(h, th, "h")
  close(c, tc, "c")
