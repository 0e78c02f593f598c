"""nn.optim.lr_scheduler: the rate sequences of torch.optim.lr_scheduler, step by step."""
import math

import numpy as np
import pytest
import torch

from unigrad import Tensor, TinyJit, nn
from unigrad.nn.optim import lr_scheduler as ug_sched

STEPS = 25


def _pair(lr: float = 0.1):
  ug = nn.optim.SGD([Tensor.zeros(2).contiguous().requires_grad_()], lr=lr, momentum=0.9)
  tg = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=lr, momentum=0.9)
  return ug, tg


def _rates(sched, n: int = STEPS) -> list[float]:
  out = [sched.get_last_lr()[0]]
  for _ in range(n):
    sched.step()
    out.append(sched.get_last_lr()[0])
  return out


CASES = {
  "step": (lambda o: ug_sched.StepLR(o, step_size=4, gamma=0.5),
           lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)),
  "lambda": (lambda o: ug_sched.LambdaLR(o, lambda e: 1 / (1 + e)),
             lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + e))),
  "cosine": (lambda o: ug_sched.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
             lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.001)),
  "onecycle": (lambda o: ug_sched.OneCycleLR(o, max_lr=0.5, total_steps=STEPS + 1),
               lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=STEPS + 1,
                                                             cycle_momentum=False)),
  "onecycle_linear_3phase": (
    lambda o: ug_sched.OneCycleLR(o, max_lr=0.5, epochs=2, steps_per_epoch=13, pct_start=0.25,
                                  anneal_strategy="linear", three_phase=True),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, epochs=2, steps_per_epoch=13,
                                                  pct_start=0.25, anneal_strategy="linear",
                                                  three_phase=True, cycle_momentum=False)),
}


@pytest.mark.parametrize("name", CASES)
def test_rates_match_pytorch(name):
  make_ug, make_torch = CASES[name]
  ug, tg = _pair()
  ours = _rates(make_ug(ug))
  ts = make_torch(tg)
  theirs = [ts.get_last_lr()[0]]
  for _ in range(STEPS):
    tg.step()  # (torch warns when the scheduler steps before the optimizer)
    ts.step()
    theirs.append(ts.get_last_lr()[0])
  assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-12)
  # the optimizer's rate tensor holds the last rate (float32)
  assert ug.lr.item() == pytest.approx(ours[-1], rel=1e-6)


def test_scheduled_rate_reaches_a_jitted_step():
  """The rate is written into the optimizer's lr buffer: a TinyJit replay uses the new value."""
  w = Tensor([1.0]).contiguous().requires_grad_()
  opt = nn.optim.SGD([w], lr=1.0)
  sched = ug_sched.StepLR(opt, step_size=1, gamma=0.5)

  @TinyJit
  def step() -> Tensor:
    opt.zero_grad()
    (w * 1.0).sum().backward()  # gradient 1: w drops by lr
    opt.step()
    return w

  seen = []
  for _ in range(4):
    before = w.item()
    step()
    seen.append(before - w.item())
    sched.step()
  assert seen == pytest.approx([1.0, 0.5, 0.25, 0.125])


class _NoMomentum(nn.optim.Optimizer):
  def __init__(self): super().__init__([Tensor.zeros(1).contiguous().requires_grad_()], 0.1)


def test_onecycle_bad_input():
  ug, _ = _pair()
  with pytest.raises(ValueError, match="total_steps"):
    ug_sched.OneCycleLR(ug, max_lr=0.1)
  with pytest.raises(ValueError, match="momentum or beta1"):
    ug_sched.OneCycleLR(_NoMomentum(), max_lr=0.1, total_steps=10)
  s = ug_sched.OneCycleLR(ug, max_lr=0.1, total_steps=2)
  s.step()
  s.step()
  with pytest.raises(ValueError, match="total steps"):
    s.step()


def test_scheduler_over_optimizer_group():
  a = nn.optim.SGD([Tensor.zeros(1).contiguous().requires_grad_()], lr=0.1)
  b = nn.optim.Adam([Tensor.zeros(1).contiguous().requires_grad_()], lr=0.01)
  s = ug_sched.LambdaLR(nn.optim.OptimizerGroup(a, b), [lambda e: 0.5 ** e, lambda e: 1.0 + e])
  s.step()
  assert s.get_last_lr() == pytest.approx([0.05, 0.02])
  assert math.isclose(b.lr.item(), 0.02, rel_tol=1e-6)


# ---- OneCycleLR(cycle_momentum=True), PyTorch's default: momentum / beta1 cycled too ----

def _params_under_onecycle(opt_name: str, steps: int = 6, three_phase: bool = False):
  """Each step's parameters (ours, torch's) for an optimizer under OneCycleLR with momentum
  cycling, from the same start and gradients."""
  rng = np.random.default_rng(7)
  w0, grads = rng.standard_normal(3).astype(np.float32), rng.standard_normal((steps, 3))
  w, tw = Tensor(w0).requires_grad_(), torch.tensor(w0, requires_grad=True)
  if opt_name == "adam":
    opt, topt = nn.optim.Adam([w], lr=0.01), torch.optim.Adam([tw], lr=0.01)
  else:
    opt, topt = nn.optim.SGD([w], lr=0.01), torch.optim.SGD([tw], lr=0.01)
  kw = dict(max_lr=0.1, total_steps=steps, pct_start=0.4, three_phase=three_phase)
  sched, tsched = ug_sched.OneCycleLR(opt, **kw), torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
  ours, theirs = [], []
  for g in grads.astype(np.float32):
    w.grad, tw.grad = Tensor(g), torch.tensor(g)
    opt.step(), topt.step()
    sched.step(), tsched.step()
    ours.append(w.numpy().copy()), theirs.append(tw.detach().numpy().copy())
  return np.array(ours), np.array(theirs)


@pytest.mark.parametrize("opt_name,three_phase", [("adam", False), ("sgd", False), ("sgd", True)])
def test_onecycle_cycle_momentum_matches_pytorch_parameter_sequence(opt_name, three_phase):
  """Adam's b1 (with PyTorch's bias correction 1 - b1**t of each step's b1) or SGD's momentum
  (an SGD made without momentum gets buffers, as PyTorch's does) follow PyTorch's."""
  ours, theirs = _params_under_onecycle(opt_name, three_phase=three_phase)
  np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=1e-6)


def test_cycled_momentum_reaches_a_jitted_step():
  """b1 is a 0-d tensor: a TinyJit replay reads the value the schedule wrote (no recompile)."""
  w = Tensor([1.0, -2.0]).contiguous().requires_grad_()
  tw = torch.tensor([1.0, -2.0], requires_grad=True)
  opt, topt = nn.optim.Adam([w], lr=0.01), torch.optim.Adam([tw], lr=0.01)
  sched = ug_sched.OneCycleLR(opt, max_lr=0.1, total_steps=6)
  tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.1, total_steps=6)

  @TinyJit
  def step():
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
  for _ in range(5):
    step()
    topt.zero_grad()
    (tw * tw).sum().backward()
    topt.step()
    sched.step(), tsched.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), atol=1e-6, rtol=1e-6)
  assert opt.b1.item() == pytest.approx(topt.param_groups[0]["betas"][0], rel=1e-6)
