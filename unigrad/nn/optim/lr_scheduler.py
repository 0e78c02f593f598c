"""Learning-rate schedules with PyTorch's classes and formulas (torch.optim.lr_scheduler).

A scheduler sets the optimizer's `lr` (a 0-d tensor, so a new rate recompiles nothing and a
TinyJit step reads it) at construction (step 0) and at each `step()`. An `OptimizerGroup` is
scheduled like PyTorch's parameter groups: one rate per optimizer in it. The rates are kept as
Python floats (`get_last_lr()`), so a step reads nothing back from the device.

  opt = nn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  sched = nn.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
  for epoch in range(100): train(...); sched.step()

`OneCycleLR(cycle_momentum=True)` (PyTorch's default) cycles SGD's `momentum` or Adam's `b1`
the same way: they are 0-d tensors too.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from unigrad.dtype import dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.optim import LAMB, LARS, Optimizer, OptimizerGroup

__all__ = ["LRScheduler", "StepLR", "LambdaLR", "CosineAnnealingLR", "OneCycleLR"]


def _optimizers(opt: Optimizer) -> list[Optimizer]:
  if isinstance(opt, OptimizerGroup): return [o for x in opt.optimizers for o in _optimizers(x)]
  if not isinstance(opt, Optimizer):
    raise TypeError(f"{type(opt).__name__} is not an Optimizer")
  return [opt]


class LRScheduler:
  """Base class: subclasses give `get_lr()`, the rates at `last_epoch` (PyTorch's chainable
  form: it may read the current rates, `self._lrs`)."""

  def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
    self.optimizer = optimizer
    self.groups = _optimizers(optimizer)
    self._lrs = [float(o.lr.item()) for o in self.groups]
    if last_epoch == -1:  # as PyTorch's group.setdefault("initial_lr", lr)
      for o, lr in zip(self.groups, self._lrs):
        if not hasattr(o, "initial_lr"): o.initial_lr = lr  # type: ignore[attr-defined]
    else:
      if not all(hasattr(o, "initial_lr") for o in self.groups):
        raise KeyError("param 'initial_lr' is not specified in the optimizer when resuming a "
                       "scheduler (last_epoch != -1)")
    self.base_lrs = [float(o.initial_lr) for o in self.groups]  # type: ignore[attr-defined]
    self.last_epoch = last_epoch
    self._step_count = 0
    self.step()

  def get_lr(self) -> list[float]: raise NotImplementedError

  def get_last_lr(self) -> list[float]:
    """The rates set by the last step (one per optimizer)."""
    return list(self._lrs)

  def step(self) -> None:
    """Advance one epoch (or batch) and set the optimizer's rate."""
    self._step_count += 1
    self.last_epoch += 1
    self._lrs = [float(x) for x in self.get_lr()]
    for o, lr in zip(self.groups, self._lrs):
      o.lr.assign(Tensor(lr, o.lr.device, dtypes.float32)).realize()

  def state_dict(self) -> dict[str, Any]:
    """The scheduler's state (callables left out, as in PyTorch)."""
    return {k: v for k, v in vars(self).items()
            if k not in ("optimizer", "groups") and not callable(v) and k != "lr_lambdas"}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    vars(self).update(state)
    for o, lr in zip(self.groups, self._lrs):
      o.lr.assign(Tensor(lr, o.lr.device, dtypes.float32)).realize()


class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""

  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
               last_epoch: int = -1) -> None:
    if not isinstance(step_size, int) or step_size <= 0:
      raise ValueError(f"step_size must be a positive int, got {step_size!r}")
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer, last_epoch)

  def get_lr(self) -> list[float]:
    if self.last_epoch == 0 or self.last_epoch % self.step_size != 0: return self._lrs
    return [lr * self.gamma for lr in self._lrs]


class LambdaLR(LRScheduler):
  """lr = base_lr * lr_lambda(epoch) (one function, or one per optimizer of a group)."""

  def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable],
               last_epoch: int = -1) -> None:
    n = len(_optimizers(optimizer))
    if isinstance(lr_lambda, (list, tuple)):
      if len(lr_lambda) != n: raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
      self.lr_lambdas = list(lr_lambda)
    else: self.lr_lambdas = [lr_lambda] * n  # type: ignore[list-item]
    super().__init__(optimizer, last_epoch)

  def get_lr(self) -> list[float]:
    return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class CosineAnnealingLR(LRScheduler):
  """Cosine from base_lr down to eta_min over T_max steps (and back up over the next T_max):
  lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2, computed step by step
  from the current rate as PyTorch does."""

  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803
               last_epoch: int = -1) -> None:
    if T_max <= 0: raise ValueError(f"T_max must be positive, got {T_max}")
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer, last_epoch)

  def get_lr(self) -> list[float]:
    t, tm, lo = self.last_epoch, self.T_max, self.eta_min
    if t == 0: return self._lrs
    if self._step_count == 1 and t > 0:  # resumed: the closed form
      return [lo + (b - lo) * (1 + math.cos(t * math.pi / tm)) / 2 for b in self.base_lrs]
    if (t - 1 - tm) % (2 * tm) == 0:
      return [lr + (b - lo) * (1 - math.cos(math.pi / tm)) / 2
              for lr, b in zip(self._lrs, self.base_lrs)]
    ratio = (1 + math.cos(math.pi * t / tm)) / (1 + math.cos(math.pi * (t - 1) / tm))
    return [ratio * (lr - lo) + lo for lr in self._lrs]


class OneCycleLR(LRScheduler):
  """The 1cycle policy (Smith & Topin): from max_lr/div_factor up to max_lr over the first
  pct_start of `total_steps` (or epochs * steps_per_epoch), then down to
  max_lr/div_factor/final_div_factor; `three_phase` comes back to the start rate first.
  `anneal_strategy` 'cos' or 'linear'. Stepping past total_steps raises ValueError."""

  def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float],
               total_steps: int | None = None, epochs: int | None = None,
               steps_per_epoch: int | None = None, pct_start: float = 0.3,
               anneal_strategy: str = "cos", cycle_momentum: bool = True,
               base_momentum: float = 0.85, max_momentum: float = 0.95, div_factor: float = 25.0,
               final_div_factor: float = 1e4, three_phase: bool = False,
               last_epoch: int = -1) -> None:
    groups = _optimizers(optimizer)
    if total_steps is None:
      if epochs is None or steps_per_epoch is None:
        raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
      if epochs <= 0 or steps_per_epoch <= 0:
        raise ValueError(f"epochs and steps_per_epoch must be positive, got {epochs} and "
                         f"{steps_per_epoch}")
      total_steps = epochs * steps_per_epoch
    if not isinstance(total_steps, int) or total_steps <= 0:
      raise ValueError(f"Expected positive integer total_steps, but got {total_steps!r}")
    if not 0 <= pct_start <= 1:
      raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
    if anneal_strategy not in ("cos", "linear"):
      raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', got {anneal_strategy!r}")
    self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
    points = _momentum_points(groups, cycle_momentum, base_momentum, max_momentum, three_phase)
    max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
    if len(max_lrs) != len(groups):
      raise ValueError(f"expected {len(groups)} values for max_lr, got {len(max_lrs)}")
    p = float(pct_start * total_steps)
    ends = [p - 1, 2 * p - 2, total_steps - 1] if three_phase else [p - 1, total_steps - 1]
    self.phases: list[list[tuple[float, float, float]]] = []  # per group: (end, start, to)
    for o, hi in zip(groups, max_lrs):
      lo = hi / div_factor
      low = [lo, hi, lo, lo / final_div_factor] if three_phase else [lo, hi, lo / final_div_factor]
      self.phases.append([(e, low[i], low[i + 1]) for i, e in enumerate(ends)])
      if last_epoch == -1:
        o.initial_lr, o.max_lr, o.min_lr = lo, hi, lo / final_div_factor  # type: ignore[attr-defined]
    # per optimizer, the momentum's phases (end, start, to) when it is cycled
    self.momenta = [[(e, m[i], m[i + 1]) for i, e in enumerate(ends)] for m in points]
    super().__init__(optimizer, last_epoch)

  def step(self) -> None:
    """Advance one step: the rate, and with cycle_momentum the momentum (SGD's `momentum`,
    Adam's `b1`), as PyTorch's."""
    super().step()
    if not self.momenta: return
    for o, phases in zip(self.groups, self.momenta):
      m = self._at(phases, self.last_epoch)
      target = o.b1 if isinstance(o, LAMB) else o.momentum  # type: ignore[attr-defined]
      target.assign(Tensor(m, target.device, dtypes.float32)).realize()

  def _at(self, phases: list[tuple[float, float, float]], t: int) -> float:
    """The annealed value of `phases` ((end, start, to) each) at step t."""
    begin = 0.0
    for i, (end, start, to) in enumerate(phases):
      if t <= end or i == len(phases) - 1:
        return self._anneal(start, to, (t - begin) / (end - begin))
      begin = end
    raise AssertionError("no phase")

  def _anneal(self, start: float, end: float, pct: float) -> float:
    if self.anneal_strategy == "linear": return (end - start) * pct + start
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

  def get_lr(self) -> list[float]:
    t = self.last_epoch
    if t > self.total_steps:
      raise ValueError(f"Tried to step {t} times. The specified number of total steps is "
                       f"{self.total_steps}")
    return [self._at(phases, t) for phases in self.phases]


def _momentum_points(groups: list[Optimizer], cycle: bool, base: float | Sequence[float],
                     top: float | Sequence[float], three_phase: bool) -> list[list[float]]:
  """Per optimizer, the momentum at OneCycleLR's phase boundaries (max, base, max; three phases:
  max, base, max, max), as PyTorch's; [] without cycle_momentum. An optimizer made without
  momentum (SGD's momentum=0) gets its buffers, as PyTorch's SGD then uses one."""
  if not cycle: return []
  bases = list(base) if isinstance(base, (list, tuple)) else [base] * len(groups)
  tops = list(top) if isinstance(top, (list, tuple)) else [top] * len(groups)
  if len(bases) != len(groups) or len(tops) != len(groups):
    raise ValueError(f"expected {len(groups)} values for base_momentum and max_momentum")
  for o in groups:
    if isinstance(o, LARS): o.use_momentum()
    elif not isinstance(o, LAMB):
      raise ValueError(f"optimizer must support momentum or beta1 with `cycle_momentum` option "
                       f"enabled ({type(o).__name__} has neither; pass cycle_momentum=False)")
  seq = (1, 0, 1, 1) if three_phase else (1, 0, 1)
  return [[float((lo, hi)[k]) for k in seq] for lo, hi in zip(bases, tops)]
