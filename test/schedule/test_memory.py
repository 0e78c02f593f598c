"""Memory plan: intermediates share one arena by lifetime."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unigrad import Tensor, nn
from unigrad.engine import commands
from unigrad.schedule.callify import callify
from unigrad.schedule.schedule import create_schedule
from unigrad.schedule.memory import ALIGN, Lifetime, plan_memory

lifetimes = st.lists(st.builds(lambda a, n, b: Lifetime(a, a + n, b), st.integers(0, 20),
                               st.integers(0, 6), st.integers(1, 5000)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(lifetimes)
def test_overlapping_lifetimes_never_share_bytes(lives):
  plan = plan_memory(lives)
  for i, a in enumerate(lives):
    assert plan.offsets[i] % ALIGN == 0 and plan.offsets[i] + a.nbytes <= plan.size
    for j in range(i):
      b = lives[j]
      if a.overlaps(b):
        oa, ob = plan.offsets[i], plan.offsets[j]
        assert oa + a.nbytes <= ob or ob + b.nbytes <= oa


def test_disjoint_lifetimes_share_memory_whatever_their_sizes():
  plan = plan_memory([Lifetime(0, 1, 1000), Lifetime(2, 3, 64), Lifetime(4, 5, 5000)])
  assert plan.offsets == (0, 0, 0) and plan.size == 5056


def test_chain_needs_two_buffers():
  plan = plan_memory([Lifetime(i, i + 1, 4096) for i in range(10)])
  assert plan.size == 2 * 4096


def test_mlp_forward_backward_peak_is_below_the_sum_of_intermediates():
  layers = [nn.Linear(64, 64) for _ in range(6)]
  x = Tensor(np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32))
  h = x
  for lin in layers: h = lin(h).relu()
  h.sum().backward()
  grads = [g for lin in layers for g in (lin.weight.grad, lin.bias.grad)]
  res = callify([g.uop for g in grads], [g.device for g in grads])
  plan = commands.command_buffer(create_schedule(res.body, len(res.bufs), "CPU"), len(res.bufs))
  assert len(plan.inter) >= 6
  arena = sum(plan.arenas.values())
  assert 0 < arena < plan.inter_bytes * 0.8, (arena, plan.inter_bytes)


def test_planned_arena_gives_the_same_results_as_torch():
  rng = np.random.default_rng(1)
  ws = [rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(6)]
  x = rng.standard_normal((8, 16)).astype(np.float32)
  tw = [Tensor(w, requires_grad=True) for w in ws]
  h = Tensor(x)
  for w in tw: h = (h @ w).relu() + h
  h.square().sum().backward()
  Tensor.realize_all(*(w.grad for w in tw))
  pw = [torch.tensor(w, requires_grad=True) for w in ws]
  g = torch.tensor(x)
  for w in pw: g = (g @ w).relu() + g
  g.square().sum().backward()
  for a, b in zip(tw, pw): np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4,
                                                      atol=1e-4)
