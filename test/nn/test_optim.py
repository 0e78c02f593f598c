"""nn.optim: trajectories against torch.optim (SGD, Adam, AdamW) and numpy references (LARS, LAMB,
Muon); one realize per step, in-place buffers, schedule-cache replay, groups, errors, autograd."""
import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes
from unigrad import engine
from unigrad.engine import entry
from unigrad.nn import optim
from unigrad.nn.state import get_state_dict

SHAPES = [(4, 5), (5,), ()]
STEPS = 4


def init_and_grads(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
  rng = np.random.default_rng(seed)
  init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
  return init, grads


def paired_params(init) -> tuple[list[Tensor], list[torch.Tensor]]:
  """The same starting values as unigrad and as torch parameters."""
  ours = [Tensor(x.copy()) for x in init]
  return ours, [torch.tensor(x.copy(), requires_grad=True) for x in init]


def run_ours(make, init, grads) -> list[list[np.ndarray]]:
  params = [Tensor(x.copy()) for x in init]
  opt = make(params)
  out = []
  for step in grads:
    for p, g in zip(params, step): p.grad = Tensor(g)
    opt.step()
    out.append([p.numpy().copy() for p in params])  # numpy() shares the buffer the step updates
  return out


def run_torch(make, init, grads) -> list[list[np.ndarray]]:
  params = [torch.tensor(x.copy(), requires_grad=True) for x in init]
  opt = make(params)
  out = []
  for step in grads:
    for p, g in zip(params, step): p.grad = torch.tensor(g)
    opt.step()
    out.append([p.detach().numpy().copy() for p in params])
  return out


def assert_trajectories(ours, ref, rtol=1e-5, atol=1e-5) -> None:
  for step, (a, b) in enumerate(zip(ours, ref)):
    for i, (x, y) in enumerate(zip(a, b)):
      np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"step {step} param {i}")


TORCH_CASES = {
  "sgd": (lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
  "sgd_momentum": (lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
                   lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
  "sgd_nesterov_wd": (
    lambda p: optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
  "sgd_wd": (lambda p: optim.SGD(p, lr=0.1, weight_decay=0.3),
             lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.3)),
  "adam": (lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
  "adam_l2": (
    lambda p: optim.Adam(p, lr=0.01, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.2),
    lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.2)),
  "adamw": (lambda p: optim.AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
  "adamw_wd": (lambda p: optim.AdamW(p, lr=0.02, weight_decay=0.5),
               lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.5)),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_matches_torch(case):
  ours, theirs = TORCH_CASES[case]
  init, grads = init_and_grads()
  assert_trajectories(run_ours(ours, init, grads), run_torch(theirs, init, grads))


# ---- numpy references of the published algorithms ----

def np_norm(x: np.ndarray) -> float: return float(np.sqrt((x.astype(np.float64) ** 2).sum()))


def ref_lamb(init, grads, lr, b1, b2, eps, wd):
  ws, ms, vs, out = [x.astype(np.float64) for x in init], [0.0] * 3, [0.0] * 3, []
  for t, step in enumerate(grads, 1):
    for i, g in enumerate(step):
      ms[i] = b1 * ms[i] + (1 - b1) * g
      vs[i] = b2 * vs[i] + (1 - b2) * g * g
      up = (ms[i] / (1 - b1 ** t)) / (np.sqrt(vs[i] / (1 - b2 ** t)) + eps) + wd * ws[i]
      wn, un = np_norm(ws[i]), np_norm(up)
      ws[i] = ws[i] - lr * (wn / un if wn > 0 and un > 0 else 1.0) * up
    out.append([w.copy() for w in ws])
  return out


def ref_lars(init, grads, lr, momentum, wd, tcoef):
  ws, bs, out = [x.astype(np.float64) for x in init], [0.0] * 3, []
  for step in grads:
    for i, g in enumerate(step):
      wn, gn = np_norm(ws[i]), np_norm(g)
      r = tcoef * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
      bs[i] = momentum * bs[i] + lr * r * (g + wd * ws[i])
      ws[i] = ws[i] - bs[i]
    out.append([w.copy() for w in ws])
  return out


def ref_muon(init, grads, lr, momentum, wd, coeffs=(3.4445, -4.7750, 2.0315), steps=5):
  def orthogonalize(g: np.ndarray) -> np.ndarray:
    x = g.reshape(g.shape[0], -1).astype(np.float64)
    flip = x.shape[0] > x.shape[1]
    if flip: x = x.T
    x = x / (np.sqrt((x ** 2).sum()) + 1e-7)
    for _ in range(steps):
      a = x @ x.T
      x = coeffs[0] * x + (coeffs[1] * a + coeffs[2] * a @ a) @ x
    return (x.T if flip else x).reshape(g.shape)
  ws, bs, out = [x.astype(np.float64) for x in init], [0.0] * 3, []
  for step in grads:
    for i, g in enumerate(step):
      bs[i] = momentum * bs[i] + g
      ws[i] = ws[i] - lr * (orthogonalize(g + momentum * bs[i]) + wd * ws[i])
    out.append([w.copy() for w in ws])
  return out


def test_lamb_matches_reference():
  init, grads = init_and_grads(1)
  ours = run_ours(lambda p: optim.LAMB(p, lr=0.05, eps=1e-6, weight_decay=0.1), init, grads)
  assert_trajectories(ours, ref_lamb(init, grads, 0.05, 0.9, 0.999, 1e-6, 0.1))


def test_lars_matches_reference():
  init, grads = init_and_grads(2)
  ours = run_ours(lambda p: optim.LARS(p, lr=0.5, momentum=0.9, weight_decay=0.01, tcoef=0.02),
                  init, grads)
  assert_trajectories(ours, ref_lars(init, grads, 0.5, 0.9, 0.01, 0.02))


def test_muon_matches_reference():
  init, grads = init_and_grads(3)
  init, grads = init[:2], [g[:2] for g in grads]  # matrices and vectors; Muon rejects scalars
  rng = np.random.default_rng(4)
  init.append(rng.standard_normal((6, 3)).astype(np.float32))  # a tall matrix
  for g in grads: g.append(rng.standard_normal((6, 3)).astype(np.float32))
  ours = run_ours(lambda p: optim.Muon(p, lr=0.02, momentum=0.9, weight_decay=0.1), init, grads)
  assert_trajectories(ours, ref_muon(init, grads, 0.02, 0.9, 0.1), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="at least one dim"): optim.Muon([Tensor(1.0)])


# ---- mechanics ----

def assert_same_params(params: list[Tensor], tparams: list[torch.Tensor], rtol: float) -> None:
  for p, tp in zip(params, tparams):
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=rtol, atol=1e-6)


def count_realizes(monkeypatch) -> list[int]:
  calls, orig = [], Tensor.realize_all
  def counting(*ts):
    calls.append(len(ts))
    return orig(*ts)
  monkeypatch.setattr(Tensor, "realize_all", staticmethod(counting))
  return calls


def test_one_realize_in_place_and_cache_replay(monkeypatch):
  params = [Tensor(np.ones((3, 4), np.float32)), Tensor(np.ones(4, np.float32))]
  opt = optim.Adam(params, lr=0.1)
  calls = count_realizes(monkeypatch)
  buffers = [engine.buffer_of(p.uop) for p in params]
  for step in range(3):
    for p in params: p.grad = Tensor(np.full(p.shape, step + 1.0, np.float32))
    if step == 2: cached = len(entry.schedule_cache)
    opt.step()
  assert len(calls) == 3, "a step realizes everything in one call"
  assert [engine.buffer_of(p.uop) for p in params] == buffers, "params are updated in place"
  assert [engine.buffer_of(m.uop) for m in opt.m] == [engine.buffer_of(m.uop) for m in opt.m]
  assert len(entry.schedule_cache) == cached, "the third step replays the cached schedule"


def test_state_buffers_are_distinct():
  params = [Tensor(np.ones(4, np.float32)), Tensor(np.ones(4, np.float32))]
  opt = optim.Adam(params)
  state = [opt.b1_t, opt.b2_t, *opt.m, *opt.v]
  assert len({id(engine.buffer_of(t.uop)) for t in state}) == len(state)


def test_lr_tensor_can_change_between_steps():
  init, grads = init_and_grads(5)
  params, tparams = paired_params(init)
  opt = optim.SGD(params, lr=0.1, momentum=0.5)
  topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.5)
  for step, g in enumerate(grads):
    lr = 0.1 / (step + 1)
    opt.lr.assign(Tensor(lr))
    topt.param_groups[0]["lr"] = lr
    for p, tp, gi in zip(params, tparams, g): p.grad, tp.grad = Tensor(gi), torch.tensor(gi)
    opt.step(); topt.step()  # noqa: E702
  assert_same_params(params, tparams, 1e-6)


def test_params_without_grad_are_skipped_and_zero_grad():
  init, grads = init_and_grads(6)
  params, tparams = paired_params(init)
  opt = optim.SGD(params, lr=0.1, momentum=0.9)
  topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9)
  for step, g in enumerate(grads):
    opt.zero_grad(); topt.zero_grad()  # noqa: E702
    assert all(p.grad is None for p in params)
    for i, (p, tp) in enumerate(zip(params, tparams)):
      if (i + step) % 3: p.grad, tp.grad = Tensor(g[i]), torch.tensor(g[i])
    opt.step(); topt.step()  # noqa: E702
  assert_same_params(params, tparams, 1e-6)


def test_optimizer_group_steps_together(monkeypatch):
  init, grads = init_and_grads(7)
  params, tparams = paired_params(init)
  group = optim.OptimizerGroup(optim.SGD(params[:1], lr=0.1, momentum=0.9),
                               optim.AdamW(params[1:], lr=0.01))
  assert group[0].params == params[:1] and group.params == params
  topts = [torch.optim.SGD(tparams[:1], lr=0.1, momentum=0.9),
           torch.optim.AdamW(tparams[1:], lr=0.01)]
  calls = count_realizes(monkeypatch)
  for g in grads:
    group.zero_grad()
    for p, tp, gi in zip(params, tparams, g): p.grad, tp.grad = Tensor(gi), torch.tensor(gi)
    group.step()
    for o in topts: o.step()
  assert len(calls) == len(grads)
  assert_same_params(params, tparams, 1e-5)


def test_buffers_half_params_and_errors():
  w = Tensor(np.ones(3, np.float16))
  frozen = Tensor(np.ones(3, np.float32), requires_grad=False)
  counter = Tensor(np.zeros(1, np.int64))
  opt = optim.Adam([w, frozen, counter], lr=0.1)
  assert opt.params == [w] and opt.buffers == [frozen, counter]
  assert opt.m[0].dtype == dtypes.float32 and w.requires_grad is True
  w.grad = Tensor(np.ones(3, np.float16))
  opt.step()
  assert w.dtype == dtypes.float16
  np.testing.assert_allclose(w.numpy(), 0.9, rtol=1e-3)
  w.grad = Tensor(np.ones(4, np.float16))
  with pytest.raises(ValueError, match="grad of shape"): opt.step()
  with pytest.raises(ValueError, match="empty parameter list"): optim.SGD([])


def test_optimizer_state_is_in_state_dict():
  opt = optim.Adam([Tensor(np.ones(2, np.float32))])
  assert {"lr", "b1_t", "b2_t", "m.0", "v.0", "params.0"} <= set(get_state_dict(opt))


# ---- end to end with autograd ----

def test_training_a_linear_model_matches_torch():
  rng = np.random.default_rng(8)
  x = rng.standard_normal((16, 3)).astype(np.float32)
  y = rng.standard_normal((16, 1)).astype(np.float32)
  w0, b0 = rng.standard_normal((3, 1)).astype(np.float32), np.zeros(1, np.float32)
  w, b = Tensor(w0.copy(), requires_grad=True), Tensor(b0.copy(), requires_grad=True)
  tw, tb = torch.tensor(w0.copy(), requires_grad=True), torch.tensor(b0.copy(), requires_grad=True)
  opt, topt = optim.AdamW([w, b], lr=0.05), torch.optim.AdamW([tw, tb], lr=0.05)
  for _ in range(5):
    opt.zero_grad(); topt.zero_grad()  # noqa: E702
    ((Tensor(x) @ w + b - Tensor(y)) ** 2).mean().backward()
    ((torch.from_numpy(x) @ tw + tb - torch.from_numpy(y)) ** 2).mean().backward()
    opt.step(); topt.step()  # noqa: E702
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-4, atol=1e-5)
