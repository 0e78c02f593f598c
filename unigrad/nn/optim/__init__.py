"""Optimizers: SGD, LARS, Muon, Adam, AdamW, LAMB and OptimizerGroup (tinygrad's API), and
`lr_scheduler` (PyTorch's learning-rate schedules).

An optimizer builds the whole update of a step lazily: new moments are written with `assign`
(so their buffers are updated in place), then every parameter is assigned `p - update`, and one
`Tensor.realize_all` runs parameters and optimizer state together, so a step compiles to a few
fused kernels and replays from the schedule cache on the next step. Hyperparameters that change
during training (`lr`, SGD's `momentum`, Adam's `b1` and `b2`: lr_scheduler's OneCycleLR cycles
them) are 0-d tensors, so changing them (`opt.lr.assign(Tensor(0.1))`) does not recompile
anything, and a TinyJit replay reads the new value.

Deviations from tinygrad: `Adam` takes `weight_decay` (coupled L2, as in PyTorch's Adam);
parameters whose `.grad` is None are skipped in a step (as in PyTorch); Muon decays weights
decoupled (after orthogonalization, as PyTorch's Muon); optimizer state is float32 for 16-bit
parameters; no `fused` flag.
"""
from __future__ import annotations

from collections.abc import Iterable

from unigrad.dtype import DType, dtypes, least_upper_dtype
from unigrad.engine.interrupts import deferred_interrupts
from unigrad.frontend.tensor import Tensor
from unigrad.frontend.traced import traced

__all__ = ["Optimizer", "OptimizerGroup", "SGD", "LARS", "Muon", "Adam", "AdamW", "LAMB",
           "lr_scheduler"]


def _dedup(ts: list[Tensor]) -> list[Tensor]: return list({id(t): t for t in ts}.values())


def _state_dtype(dt: DType) -> DType:
  """Moments of 16-bit parameters are kept in float32, others in the parameter's dtype."""
  return least_upper_dtype(dt, dtypes.float32) if dtypes.is_float(dt) else dtypes.float32


def _zeros_buffer(shape: tuple, dtype: DType, device: str) -> Tensor:
  """Zeros in a new buffer of its own (`zeros().contiguous()` of equal shapes would be one node)."""
  zeros = Tensor.zeros(*shape, dtype=dtype, device=device)
  return Tensor.empty(*shape, dtype=dtype, device=device).assign(zeros)


class Optimizer:
  """Base class: holds the parameters (tensors with `requires_grad` not False) and the buffers
  (the others, realized with every step), and turns `_step` into in-place updates."""

  def __init__(self, params: Iterable[Tensor], lr: float) -> None:
    params = list(params)
    for x in params:
      if x.requires_grad is None and dtypes.is_float(x.dtype): x.requires_grad = True
    self.params: list[Tensor] = _dedup([x for x in params if x.requires_grad])
    if not self.params: raise ValueError("optimizer got an empty parameter list")
    self.buffers: list[Tensor] = _dedup([x for x in params if not x.requires_grad])
    self.device = self.params[0].device
    self.lr = Tensor(float(lr), self.device, dtypes.float32)

  def _new_state(self) -> list[Tensor]:
    """One zero tensor per parameter (the moments), each in its own buffer."""
    out = [_zeros_buffer(p.shape, _state_dtype(p.dtype), p.device) for p in self.params]
    Tensor.realize_all(*out)
    return out

  def zero_grad(self) -> None:
    """Forget the gradients (`grad = None`), as PyTorch's `zero_grad(set_to_none=True)`."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """One optimization step: all updates run in one realize."""
    Tensor.realize_all(*self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """Assign the new values lazily; returns the tensors whose realization performs the step."""
    live = [i for i, p in enumerate(self.params) if p.grad is not None]
    # a Ctrl-C waits until every update is assigned: half a step's assigns would run later; the
    # grad mode is switched inside the deferral, so a Ctrl-C cannot land between its exit's
    # bytecodes and leave gradients off (CI: the timer test's SIGINT broke later tests' backward)
    with deferred_interrupts(), Tensor.no_grad():
      new_values, state = self._step(live, [self._grad(i) for i in live])
      for i, v in zip(live, new_values): self.params[i].assign(v)
    return [*state, *self.params, *self.buffers]

  def _grad(self, i: int) -> Tensor:
    p, g = self.params[i], self.params[i].grad
    assert g is not None
    if tuple(g.shape) != tuple(p.shape):
      raise ValueError(f"param {i}: grad of shape {g.shape} does not match the param's {p.shape}")
    return g.detach()

  def _step(self, idx: list[int], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """The new values of params[i] for i in `idx`, and the state tensors to realize with them."""
    raise NotImplementedError


class OptimizerGroup(Optimizer):
  """Several optimizers stepped together in one realize. `OptimizerGroup(Muon(ws), AdamW(bs))`"""

  def __init__(self, *optimizers: Optimizer) -> None:  # no Optimizer.__init__: it has no own params
    self.optimizers = optimizers
    self.params = [p for o in optimizers for p in o.params]
    self.buffers = [b for o in optimizers for b in o.buffers]

  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]

  def zero_grad(self) -> None:
    for o in self.optimizers: o.zero_grad()

  def schedule_step(self) -> list[Tensor]:
    return [t for o in self.optimizers for t in o.schedule_step()]


def _trust_ratio(w_norm: Tensor, u_norm: Tensor, num: Tensor, den: Tensor) -> Tensor:
  """num / den where both norms are positive, else 1 (LARS and LAMB's layer-wise ratio)."""
  return (w_norm > 0).where((u_norm > 0).where(num / den, 1.0), 1.0)


def _norm(x: Tensor) -> Tensor: return x.square().sum().sqrt()


def _lamb_ratio(w: Tensor, up: Tensor) -> Tensor:
  wn, un = _norm(w), _norm(up)
  return _trust_ratio(wn, un, wn, un)


class LARS(Optimizer):
  """SGD with momentum and a layer-wise trust ratio (You et al. 2017, arXiv:1708.03888):
  r = tcoef * |w| / (|g| + wd * |w|); d = r * (g + wd * w); `classic` momentum accumulates
  lr * d (b = m b + lr d, w -= b), otherwise b = m b + d, w -= lr * b. `tcoef=0` gives SGD.
  With `ns_params`, the (momentum) update is orthogonalized by Newton-Schulz iterations (Muon)."""

  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.9,
               weight_decay: float = 1e-4, nesterov: bool = False, classic: bool = True,
               tcoef: float = 0.001, ns_params: tuple[float, ...] | None = None,
               ns_steps: int = 5) -> None:
    super().__init__(params, lr)
    # a 0-d tensor like lr: a new value (OneCycleLR's cycle_momentum) recompiles nothing
    self.momentum = Tensor(float(momentum), self.device, dtypes.float32)
    self.wd, self.nesterov, self.classic = weight_decay, nesterov, classic
    self.tcoef, self.ns_params, self.ns_steps = tcoef, ns_params, ns_steps
    if ns_params is not None and any(p.ndim == 0 for p in self.params):
      raise ValueError("Muon needs parameters with at least one dim (use AdamW for scalars)")
    if ns_params is not None and classic:
      raise ValueError("Muon with classic momentum would orthogonalize away the learning rate")
    self.b = self._new_state() if momentum else []

  def use_momentum(self) -> None:
    """Keep momentum buffers from now on (made with momentum 0, a schedule sets it later)."""
    if not self.b: self.b = self._new_state()

  def _step(self, idx: list[int], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    out = []
    for i, g in zip(idx, grads):
      w = self.params[i].detach()
      r: Tensor | float = self._ratio(w, g) if self.tcoef else 1.0
      if self.wd and self.ns_params is None: g = g + self.wd * w
      if self.classic: g = g * r * self.lr
      if self.b:
        self.b[i].assign((self.momentum * self.b[i] + g).cast(self.b[i].dtype))
        g = g + self.momentum * self.b[i] if self.nesterov else self.b[i]
      if self.ns_params is not None: g = self._orthogonalized(g, w)
      if not self.classic: g = g * r * self.lr
      out.append((w - g).cast(w.dtype))
    return out, self.b

  def _ratio(self, w: Tensor, g: Tensor) -> Tensor:
    wn, gn = _norm(w), _norm(g)
    return _trust_ratio(wn, gn, self.tcoef * wn, gn + self.wd * wn)

  def _orthogonalized(self, g: Tensor, w: Tensor) -> Tensor:
    assert self.ns_params is not None
    g2 = g.reshape(g.shape[0], -1).newton_schulz(self.ns_steps, self.ns_params).reshape(g.shape)
    return g2 + self.wd * w if self.wd else g2


def SGD(params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.0,  # noqa: N802
        weight_decay: float = 0.0, nesterov: bool = False, classic: bool = False) -> LARS:
  """Stochastic gradient descent, as PyTorch's (dampening 0): d = g + wd w; b = m b + d;
  d = d + m b (nesterov) or b; w -= lr d. `SGD(get_parameters(model), lr=0.1, momentum=0.9)`"""
  return LARS(params, lr, momentum, weight_decay, nesterov, classic, tcoef=0.0)


def Muon(params: Iterable[Tensor], lr: float = 3e-3, momentum: float = 0.96,  # noqa: N802
         weight_decay: float = 0.0, nesterov: bool = True, classic: bool = False,
         ns_params: tuple[float, ...] = (3.4445, -4.7750, 2.0315), ns_steps: int = 5) -> LARS:
  """Muon (K. Jordan): momentum SGD whose update, per parameter viewed as a matrix
  (shape[0], -1), is orthogonalized by `ns_steps` Newton-Schulz iterations; decoupled decay."""
  return LARS(params, lr, momentum, weight_decay, nesterov, classic, 0.0, ns_params, ns_steps)


class LAMB(Optimizer):
  """Adam moments with a layer-wise trust ratio (You et al. 2019, arXiv:1904.00962):
  up = m_hat / (sqrt(v_hat) + eps) + wd * w; w -= lr * |w| / |up| * up. `adam=True` drops the
  ratio (AdamW); `decoupled=False` adds wd * w to the gradient instead (Adam's L2 decay)."""

  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9,
               b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False,
               decoupled: bool = True) -> None:
    super().__init__(params, lr)
    # 0-d tensors like lr: a new b1 (OneCycleLR's cycle_momentum) recompiles nothing
    self.b1, self.b2 = (Tensor(float(b), self.device, dtypes.float32) for b in (b1, b2))
    self.eps, self.wd, self.adam, self.decoupled = eps, weight_decay, adam, decoupled
    self.t = Tensor(0.0, self.device, dtypes.float32)  # the step count
    # b1 ** t and b2 ** t with this step's b1 and b2, as PyTorch's bias corrections
    self.b1_t, self.b2_t = (Tensor(1.0, self.device, dtypes.float32) for _ in range(2))
    self.m, self.v = self._new_state(), self._new_state()

  def _step(self, idx: list[int], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    self.t.assign(self.t + 1)
    self.b1_t.assign(self.b1.pow(self.t))
    self.b2_t.assign(self.b2.pow(self.t))
    out = []
    for i, g in zip(idx, grads):
      w, m, v = self.params[i].detach(), self.m[i], self.v[i]
      new_m, new_v = _adam_moments(w, m, v, g, self.b1, self.b2, self.wd, self.decoupled)
      m.assign(new_m)
      v.assign(new_v)
      # the new weight reads the moments as assigned: their writes come first
      out.append(_lamb_weight(w, m, v, self.b1_t, self.b2_t, self.lr, self.eps, self.wd,
                              self.adam, self.decoupled))
    return out, [self.t, self.b1_t, self.b2_t, *self.m, *self.v]


# one parameter's step in two traced calls (about thirty ops per parameter and step)

@traced
def _adam_moments(w: Tensor, m: Tensor, v: Tensor, g: Tensor, b1: Tensor, b2: Tensor, wd: float,
                  decoupled: bool) -> tuple[Tensor, Tensor]:
  """The new first and second moments of a parameter's gradient (L2 decay added first)."""
  if wd and not decoupled: g = g + wd * w
  return (b1 * m + (1.0 - b1) * g).cast(m.dtype), (b2 * v + (1.0 - b2) * (g * g)).cast(v.dtype)


@traced
def _lamb_weight(w: Tensor, m: Tensor, v: Tensor, b1_t: Tensor, b2_t: Tensor, lr: Tensor,
                 eps: float, wd: float, adam: bool, decoupled: bool) -> Tensor:
  """The new weight from the new moments, b1_t and b2_t the decay powers."""
  up = (m / (1.0 - b1_t)) / ((v / (1.0 - b2_t)).sqrt() + eps)
  if wd and decoupled: up = up + wd * w
  r: Tensor | float = 1.0 if adam else _lamb_ratio(w, up)
  return (w - lr * r * up).cast(w.dtype)


def _betas(b1: float | tuple[float, float], b2: float,
           betas: tuple[float, float] | None) -> tuple[float, float]:
  """PyTorch's `betas=(b1, b2)` beside tinygrad's `b1`, `b2` (a pair given as `b1` is betas too,
  as from PyTorch's positional `Adam(params, lr, betas)`)."""
  if isinstance(b1, (tuple, list)):
    if betas is not None: raise TypeError("Adam got betas twice (as b1 and as betas)")
    betas = b1  # type: ignore[assignment]
  if betas is None: return float(b1), float(b2)  # type: ignore[arg-type]
  if len(betas) != 2: raise ValueError(f"betas must be a pair (b1, b2), got {betas!r}")
  for i, b in enumerate(betas):
    if not 0.0 <= b < 1.0: raise ValueError(f"Invalid beta parameter at index {i}: {b}")
  return float(betas[0]), float(betas[1])


def Adam(params: Iterable[Tensor], lr: float = 0.001, b1: float | tuple[float, float] = 0.9,  # noqa: N802
         b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
         betas: tuple[float, float] | None = None) -> LAMB:
  """Adam (Kingma & Ba), as PyTorch's: `weight_decay` is L2, added to the gradient.
  `Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))` or tinygrad's `b1=0.9, b2=0.99`."""
  return LAMB(params, lr, *_betas(b1, b2, betas), eps, weight_decay, adam=True, decoupled=False)


def AdamW(params: Iterable[Tensor], lr: float = 0.001, b1: float | tuple[float, float] = 0.9,  # noqa: N802
          b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01,
          betas: tuple[float, float] | None = None) -> LAMB:
  """Adam with decoupled weight decay (Loshchilov & Hutter), as PyTorch's AdamW."""
  return LAMB(params, lr, *_betas(b1, b2, betas), eps, weight_decay, adam=True)


from unigrad.nn.optim import lr_scheduler  # noqa: E402 (the schedulers build on Optimizer)
