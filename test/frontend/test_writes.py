"""Lazy values and in-place writes (frontend/writes.py): a value is what its inputs held when it
was created; a view shows every write to its buffer; every pending write is seen by every later
read. Regression tests for round 3's repros, and the rule as a property over random
interleavings of reads, writes, realizes and backward, against PyTorch run eagerly."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from unigrad import Tensor, nn
from unigrad.nn.optim import SGD


def test_loss_read_after_step_is_the_loss_of_the_weights_that_made_the_gradients():
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.integers(0, 3, 16)
  for read_first in (False, True):
    Tensor.manual_seed(0)
    m = nn.Linear(4, 3)
    if read_first: m.weight.numpy(), m.bias.numpy()
    opt = SGD([m.weight, m.bias], lr=0.5)
    for _ in range(3):
      w, b = m.weight.numpy().copy(), m.bias.numpy().copy()
      loss = m(Tensor(x)).cross_entropy(Tensor(y))
      opt.zero_grad()
      loss.backward()
      grad = m.weight.grad
      opt.step()
      tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b)
      want = torch.nn.functional.cross_entropy(torch.tensor(x) @ tw.T + tb, torch.tensor(y))
      want.backward()
      assert loss.item() == pytest.approx(want.item(), rel=1e-5)
      np.testing.assert_allclose(grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_realized_detached_snapshot_keeps_its_value_in_backward():
  w = Tensor([1.0], requires_grad=True)
  old = (w * 2).detach().realize()
  w.assign(Tensor([3.0])).realize()
  loss = ((w * 2 - old) ** 2).sum()
  loss.backward()
  assert w.grad.tolist() == [16.0]  # PyTorch: 2 * (6 - 2) * 2


def test_assign_into_slice_is_seen_by_next_read_of_the_buffer():
  cache = Tensor.zeros(1, 2, 4).contiguous().realize()
  for pos in range(4):
    cache[:, :, pos].assign(Tensor([[float(pos + 1), -float(pos + 1)]]))
    seen = cache[:, :, :pos + 1].sum().item()
    assert seen == 0.0 and cache.numpy()[0, 0, :pos + 1].tolist() == list(range(1, pos + 2))


def test_lazy_value_keeps_inputs_old_values_after_assign():
  a = Tensor([1.0, 2.0]).realize()
  b = a * 10
  a.assign(Tensor([5.0, 6.0])).realize()
  assert b.tolist() == [10.0, 20.0] and a.tolist() == [5.0, 6.0]


def test_view_made_before_assign_sees_the_write():
  a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  v = a[1:3]
  a.assign(Tensor([5.0, 6.0, 7.0, 8.0]))
  assert (v * 1).tolist() == [6.0, 7.0] and v.tolist() == [6.0, 7.0]


def test_pending_write_is_seen_by_a_numpy_view():
  a = Tensor([1.0, 2.0]).realize()
  n = a.numpy()
  a.assign(Tensor([3.0, 4.0]))
  assert a.numpy().tolist() == [3.0, 4.0] and n.tolist() == [3.0, 4.0]


# ---- the rule as a property: random programs against PyTorch run eagerly ----

@st.composite
def programs(draw):
  """Steps over two buffers (`a`, `b`, 4 floats each) and a trainable `w`: values computed from
  anything made so far, views of the buffers, whole and slice writes, realizes, reads, and
  backward/SGD steps on w. Each step names what it uses by its index in the list of values."""
  steps = []
  n = 3  # values 0, 1, 2 are a, b, w
  for _ in range(draw(st.integers(1, 12))):
    kind = draw(st.sampled_from(["compute", "compute", "view", "assign", "assign_slice",
                                 "realize", "read", "backward", "step"]))
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    if kind in ("compute", "view"): n += 1
    steps.append((kind, i, j, draw(st.integers(0, 2)), draw(st.floats(-3, 3, width=16))))
  return steps


def _run(steps, lib):
  """Run `steps` with unigrad (lib='ug') or PyTorch; returns each read's values and the final
  values of everything."""
  ug = lib == "ug"
  mk = (lambda v, rg=False: Tensor(v, requires_grad=rg).realize()) if ug else \
    (lambda v, rg=False: torch.tensor(v, requires_grad=rg))
  a, b, w = mk([1.0, 2.0, 3.0, 4.0]), mk([-1.0, 0.5, 2.0, 0.0]), mk([0.5] * 4, True)
  vals, owners, reads, views = [a, b, w], [a, b], [], {}
  num = (lambda t: t.numpy().copy()) if ug else (lambda t: t.detach().numpy().copy())
  for kind, i, j, k, c in steps:
    x, y, o = vals[i], vals[j].detach().sum(), owners[i % 2]
    if kind == "compute":
      x = x.detach() if x is w else x
      vals.append([x * c + y, (x - c).relu(), x.sum().expand(4) + c][k])
    elif kind == "view":
      views[len(vals)] = True
      vals.append([o[1:3].reshape(2), o.reshape(2, 2)[:, 0], o[::2]][k])
    elif kind == "assign":
      if ug: o.assign(o * 0.5 + y * c)
      else: o.copy_(o * 0.5 + y * c)
    elif kind == "assign_slice":
      if ug: o[k:k + 2].assign(Tensor([c, -c]))
      else: o[k:k + 2].copy_(torch.tensor([c, -c]))
    elif kind == "realize":  # realizing a view gives it a buffer of its own (README): a clone
      if ug: x.realize()
      elif views.get(i): vals[i], views[i] = x.clone(), False
    elif kind == "read": reads.append(num(x))
    elif kind == "backward":
      loss = (w * y).sum() + (w * w).sum()
      w.grad = None
      loss.backward()
      reads.append(num(w.grad))
    elif kind == "step" and w.grad is not None:
      if ug:
        with Tensor.no_grad(): w.assign(w - 0.1 * w.grad)
      else:
        with torch.no_grad(): w -= 0.1 * w.grad
  return reads, [num(v) for v in vals]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
# values made before a step, combined after it with the stepped weights: one read both the old
# and the new contents of w in one kernel (a wrong sum; with a pending write to `a` as well, a
# cycle in the assign graph)
@example([("compute", 0, 0, 0, 0.0)] + [("assign", 0, 0, 0, 0.0)] * 4 + [
  ("backward", 0, 0, 0, 0.0), ("compute", 2, 0, 0, 1.0), ("compute", 0, 0, 0, 0.0),
  ("step", 0, 0, 0, 0.0), ("compute", 4, 2, 0, 1.0)])
@example([("compute", 0, 0, 0, 0.0), ("backward", 0, 0, 0, 0.0), ("assign", 0, 0, 0, 0.0),
          ("compute", 2, 0, 0, 0.0), ("compute", 0, 0, 0, 0.0), ("step", 0, 0, 0, 0.0),
          ("compute", 3, 2, 0, 0.0)])
def test_interleaved_reads_writes_realizes_and_backward_match_pytorch(steps):
  got_reads, got = _run(steps, "ug")
  want_reads, want = _run(steps, "torch")
  assert len(got_reads) == len(want_reads)
  for g, w in zip(got_reads + got, want_reads + want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_value_made_before_a_write_keeps_old_contents_when_combined_with_the_written_buffer():
  a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  w = Tensor([0.5] * 4).realize()
  before = w * 1.0 + a.sum()
  w.assign(w - 0.1)
  both = before * 1.0 + w.sum()  # old w through `before`, new w through w itself
  assert both.tolist() == pytest.approx([10.5 + 1.6] * 4)
  assert before.tolist() == pytest.approx([10.5] * 4) and w.tolist() == pytest.approx([0.4] * 4)


def test_values_reading_old_and_new_contents_of_two_written_buffers_have_no_cycle():
  a, w = Tensor([1.0, 2.0]).realize(), Tensor([3.0, 4.0]).realize()
  old_a = a * 2
  a.assign(a + 1)
  new_a_old_w = w * 1.0 + a.sum()  # must run after a's write and before w's
  w.assign(w * 0)
  old_a_new_w = old_a * 1.0 + w.sum()  # reads a before its write and w after its write
  assert old_a_new_w.tolist() == [2.0, 4.0] and new_a_old_w.tolist() == [8.0, 9.0]
  assert a.tolist() == [2.0, 3.0] and w.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("keep_old", [False, True])
def test_write_of_a_value_made_before_another_write_stores_the_old_contents(keep_old):
  a, b = Tensor([1.0, 2.0]).realize(), Tensor([0.0, 0.0]).realize()
  old = a * 2
  a.assign(a + 1)
  b.assign(old + a)  # old a through `old`, new a through a: once stored 2 * new a + new a
  if not keep_old: del old
  assert b.tolist() == [4.0, 7.0] and a.tolist() == [2.0, 3.0]
  if keep_old: assert old.tolist() == [2.0, 4.0]


def test_pending_write_is_seen_by_a_dlpack_consumer():
  a = Tensor([1.0, 2.0]).realize()
  a.assign(Tensor([3.0, 4.0]))
  assert torch.from_dlpack(a).tolist() == [3.0, 4.0]


def test_lazy_value_keeps_old_values_after_assign_on_several_devices():
  devs = ("CPU:0", "CPU:1")
  t = Tensor([1.0, 2.0]).to(devs).realize()
  s = Tensor([1.0, 2.0, 3.0, 4.0]).shard(devs, axis=0).realize()
  b, c = t * 10, s * 10
  t.assign(Tensor([5.0, 6.0]).to(devs)).realize()
  s.assign(Tensor([5.0, 6.0, 7.0, 8.0]).shard(devs, axis=0)).realize()
  assert b.tolist() == [10.0, 20.0] and c.tolist() == [10.0, 20.0, 30.0, 40.0]
  assert t.tolist() == [5.0, 6.0] and s.tolist() == [5.0, 6.0, 7.0, 8.0]


@pytest.mark.parametrize("write_realized", [False, True])
def test_backward_through_an_overwritten_realized_value_does_not_reach_its_old_graph(
    write_realized):
  """Regression: y = x*2 realized, then y.assign(z): a backward through y used y's old history
  (x got gradient 2, where PyTorch gives 0), or, with the assign still pending, substituted the
  history into the assign's target (a kernel storing into a computed value: a compile error)."""
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  y = (x * 2).realize()
  y.assign(Tensor([5.0, 5.0, 5.0]))
  if write_realized: y.realize()
  w = Tensor([1.0, 1.0, 1.0], requires_grad=True)
  (y * w).sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), [5.0, 5.0, 5.0])
  assert x.grad is None or not x.grad.numpy().any(), "the overwritten value does not depend on x"


def test_backward_through_an_overwritten_realized_contiguous_does_not_reach_its_old_graph():
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  y = (x * 2).contiguous().realize()
  y.assign(Tensor([5.0, 5.0, 5.0])).realize()
  w = Tensor([1.0, 1.0, 1.0], requires_grad=True)
  (y * w).sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), [5.0, 5.0, 5.0])
  assert x.grad is None or not x.grad.numpy().any(), "the overwritten value does not depend on x"


def test_backward_through_a_realized_value_still_reaches_its_graph():
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  y = (x * 2).realize()
  (y * Tensor([1.0, 2.0, 3.0])).sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])
