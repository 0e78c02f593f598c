"""nn.optim.lr_scheduler: the rate sequences of torch.optim.lr_scheduler, step by step."""
import math

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


def test_onecycle_bad_input():
  ug, _ = _pair()
  with pytest.raises(ValueError, match="total_steps"):
    ug_sched.OneCycleLR(ug, max_lr=0.1)
  with pytest.raises(NotImplementedError, match="cycle_momentum"):
    ug_sched.OneCycleLR(ug, max_lr=0.1, total_steps=10, cycle_momentum=True)
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
