"""Realize on a schedule cache hit: no re-scheduling, one walk of the graph, same semantics; a
CPU schedule runs as one command buffer; the last realized graph is held until the next."""
import gc
import math
import threading
import weakref

import numpy as np
import pytest

import torch

from unigrad import Context, Tensor, function, nn
from unigrad import engine
from unigrad.engine import entry, execute, programs
from unigrad.helpers import GlobalCounters
from unigrad.runtime.device import Device
from unigrad.schedule import callify as callify_mod
from unigrad.schedule.callify import callify
from unigrad.uop import Ops, UOp


@pytest.fixture
def count_schedules(monkeypatch):
  """How many times the scheduler ran (create_schedule is only called on a cache miss)."""
  calls = []
  real = entry.create_schedule
  def counting(*args):
    calls.append(args)
    return real(*args)
  monkeypatch.setattr(entry, "create_schedule", counting)
  return calls


def test_cache_hit_does_not_reschedule(count_schedules):
  x = Tensor([1.0, 2.0, 3.0], device="PYTHON").realize()
  y = Tensor([5.0, 6.0, 7.0], device="PYTHON").realize()
  first = (x * 2 + 1).realize()
  misses = len(count_schedules)
  for t in (x, y, x):
    out = (t * 2 + 1).realize()
    assert out.uop.op is Ops.BUFFER and out.uop is not first.uop, "a new buffer each time"
  assert len(count_schedules) == misses, "the same program on other buffers is a cache hit"
  assert out.tolist() == [3.0, 5.0, 7.0] and first.tolist() == [3.0, 5.0, 7.0]
  assert (y * 2 + 1).tolist() == [11.0, 13.0, 15.0]


def test_cache_hit_walks_the_graph_once(count_schedules, monkeypatch):
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="PYTHON").realize()
  b = Tensor(np.ones((4, 2), dtype=np.float32), device="PYTHON").realize()
  (Tensor.empty(3, 4, device="PYTHON") @ b).realize()  # compiles and fills the schedule cache
  scheduled = len(count_schedules)
  walks, substitutes = [], []
  toposort, substitute = UOp.toposort, UOp.substitute
  def counting_toposort(self, *args, **kwargs):
    walks.append(self)
    return toposort(self, *args, **kwargs)
  def counting_substitute(*args, **kwargs):
    substitutes.append(args)
    return substitute(*args, **kwargs)
  monkeypatch.setattr(UOp, "toposort", counting_toposort)
  monkeypatch.setattr(UOp, "substitute", counting_substitute)
  c = a @ b
  mapping = engine.realize([c.uop], [c.device])
  assert len(walks) == 1 and not substitutes, "one toposort, no substitute on a cache hit"
  assert len(count_schedules) == scheduled
  out = mapping[c.uop]
  np.testing.assert_allclose(np.frombuffer(engine.copyout(out), np.float32).reshape(3, 2),
                             np.arange(12, dtype=np.float32).reshape(3, 4) @ np.ones((4, 2)))


def test_a_cached_schedule_run_with_more_arguments_keeps_its_intermediates_apart():
  # the second function's log_softmax output is the first's body with one more (unused)
  # argument: the cached LINEAR numbered its intermediates from the old count, so the max it
  # keeps between kernels went into w (found by onnx's SoftmaxCrossEntropyLoss tests)
  x = np.random.default_rng(0).random((3, 5, 2), dtype=np.float32)
  f2 = function(lambda x, y: (x.sum() + y.sum(), x.log_softmax(1)))
  f3 = function(lambda x, y, w: (x.sum() + y.sum() + w.sum(), x.log_softmax(1)))
  def t(a): return Tensor(a, device="PYTHON")
  want = torch.from_numpy(x).log_softmax(1).numpy()
  np.testing.assert_allclose(f2(t(x), t(np.ones(6, np.float32)))[1].numpy(), want, rtol=1e-6)
  w = t(np.ones(5, np.float32))
  np.testing.assert_allclose(f3(t(x), t(np.ones(6, np.float32)), w)[1].numpy(), want, rtol=1e-6)
  assert w.tolist() == [1.0] * 5


def test_multi_kernel_schedule_frees_intermediates_and_repeats(device):
  rng = np.random.default_rng(0)
  data = rng.standard_normal((8, 16)).astype(np.float32)
  x = Tensor(data, device=device).realize()
  want = np.exp(data - data.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  for _ in range(3):  # the second and third run replay the cached schedule and launch plan
    np.testing.assert_allclose(x.softmax(-1).numpy(), want, rtol=1e-5, atol=1e-6)


def test_callify_maps_targets_contiguous_and_assigns():
  x = Tensor([1.0, 2.0], device="PYTHON").realize()
  c = (x + 1).contiguous()
  y = c * 2
  res = callify([y.uop], ["PYTHON"])
  assert set(res.becomes) == {y.uop, c.uop}
  assert res.call.src[0] is res.body and res.call.src[1:] == res.bufs
  assert all(u.op is Ops.BUFFER for u in res.bufs) and len(res.bufs) == 3  # y, c, x
  assert not any(u.op is Ops.BUFFER for u in res.body.toposort()), "the body sees only PARAMs"
  other = Tensor([3.0, 4.0], device="PYTHON").realize()
  again = callify([((other + 1).contiguous() * 2).uop], ["PYTHON"])
  assert again.body is res.body, "the same program on other buffers is the same body"


def test_contiguous_of_a_buffer_is_no_copy():
  x = Tensor([1.0, 2.0], device="PYTHON").realize()
  res = callify([(x.contiguous() + 1).uop], ["PYTHON"])
  assert len(res.bufs) == 2 and Ops.AFTER not in {u.op for u in res.body.toposort()}


def test_assign_holding_a_contiguous_runs_once():
  """A pending assign read by another tensor is realized with it, and x then is its buffer: the
  assign must not run a second time (it used to, when its value held a CONTIGUOUS)."""
  x = Tensor([1.0, 2.0], device="PYTHON").realize()
  x.assign(x.contiguous() + 1)
  z = x * 2
  z.realize()
  assert x.uop.op is Ops.BUFFER
  assert z.tolist() == [4.0, 6.0]
  assert x.tolist() == [2.0, 3.0]
  assert (x + 0).tolist() == [2.0, 3.0]


def test_realized_intermediate_keeps_its_history_for_backward():
  w = Tensor([1.0, 2.0, 3.0], device="PYTHON", requires_grad=True)
  h = (w * w).realize()
  assert h.uop in engine.history
  h.sum().backward()
  assert w.grad.tolist() == [2.0, 4.0, 6.0]


def test_new_kernels_of_a_schedule_compile_together_on_every_core(monkeypatch):
  # a model's first call compiles tens of kernels: the C compiler runs on every core at once
  # (compile_ahead), before the first launch; each kernel is compiled once and the results match
  compiler = Device["CPU"].compiler
  threads, real = [], compiler.compile_cached
  def recording(src, refresh=False):
    threads.append(threading.current_thread() is threading.main_thread())
    return real(src, refresh)
  monkeypatch.setattr(compiler, "compile_cached", recording)
  with Context(THREADS=2):
    x = Tensor(np.arange(16, dtype=np.float32), device="CPU").realize()
    a = (x * 3.0625 + 1.1875).contiguous()
    out = (a * (a.sum() * 7.4375)).realize()
  assert len(threads) == 3 and not any(threads)  # a, the sum, the product: off the main thread
  ref = np.arange(16, dtype=np.float32) * 3.0625 + 1.1875
  np.testing.assert_allclose(out.numpy(), ref * (ref.sum() * 7.4375), rtol=1e-5)


def test_realizing_the_same_graph_again_does_not_callify_it_again(monkeypatch):
  x = Tensor([1.0, 2.0, 3.0], device="PYTHON").realize()
  first = (x * 2 + 1).realize()  # its history holds the graph: x * 2 + 1 rebuilds the same nodes
  calls = []
  real = entry.callify
  monkeypatch.setattr(entry, "callify", lambda *a: calls.append(a) or real(*a))
  again = x * 2 + 1
  assert again.uop is engine.history[first.uop][0]
  again.realize()
  assert not calls, "the template of the same graph was used"
  assert again.uop.op is Ops.BUFFER and again.uop is not first.uop, "a new buffer each time"
  assert again.tolist() == [3.0, 5.0, 7.0] and first.tolist() == [3.0, 5.0, 7.0]
  x.assign(Tensor([0.0, 1.0, 2.0], device="PYTHON")).realize()
  calls.clear()
  assert (x * 2 + 1).tolist() == [1.0, 3.0, 5.0] and not calls, "the buffers' new contents"
  assert (x * 3).tolist() == [0.0, 3.0, 6.0] and len(calls) == 1, "another graph: callified"


def test_a_cpu_schedule_runs_as_one_command_buffer_repointed_each_run(monkeypatch):
  runs, real = [], execute.Executor.run
  monkeypatch.setattr(execute.Executor, "run", lambda run, *a: runs.append(run) or real(run, *a))
  rng = np.random.default_rng(0)
  outs = []
  for _ in range(3):  # new input and output buffers each run: the arguments are re-pointed
    data = rng.standard_normal((8, 16)).astype(np.float32)
    out = Tensor(data, device="CPU").softmax(-1).realize()
    want = np.exp(data - data.max(-1, keepdims=True))
    outs.append((out, want / want.sum(-1, keepdims=True)))
  assert len(runs) == 3 and runs[0] is runs[1] is runs[2] and len(runs[0].runners) >= 2
  for out, want in outs: np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def test_per_kernel_timing_and_other_devices_launch_one_by_one(monkeypatch, capsys):
  x = Tensor(np.arange(8, dtype=np.float32), device="CPU")
  with Context(DEBUG=2): assert x.softmax().numpy().sum() == pytest.approx(1.0)
  timed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("*** CPU")]
  assert len(timed) >= 2, "DEBUG=2 times and prints every kernel of the schedule on its own"
  made, real = [], execute.Executor._make_segments
  monkeypatch.setattr(execute.Executor, "_make_segments",
                      lambda self, *a: made.append(self) or real(self, *a))
  assert Tensor([1.0, 2.0], device="PYTHON").softmax().numpy().sum() == pytest.approx(1.0)
  assert made and all(seg.batch is None for ex in made for seg in ex.segments), \
    "PYTHON has no native command buffers: its kernels launch one by one"


def test_the_last_graph_is_held_until_the_next_realize(monkeypatch):
  # an eager step's weight views (transpose, reshape, broadcast) outlive it, so the next step
  # finds them in the hash-cons cache; the very same graph again is not callified again
  w, x = Tensor.rand(4, 3).realize(), Tensor.rand(2, 3).realize()
  wt = w.T
  view = weakref.ref(wt.uop)
  (x @ wt).realize()
  del wt
  gc.collect()
  assert view() is not None and w.T.uop is view(), "the next step's transpose is the same node"
  calls = []
  real = entry.callify
  monkeypatch.setattr(entry, "callify", lambda *a: calls.append(a) or real(*a))
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-6)
  assert not calls, "the same graph: its callify result was reused"
  (x + 1).realize()
  gc.collect()
  assert view() is None, "let go at the next realize"


@pytest.fixture
def callifies(monkeypatch):
  """The graphs callify walked (a graph matched to the last one is not walked by callify)."""
  calls = []
  real = entry.callify
  monkeypatch.setattr(entry, "callify", lambda *a: calls.append(a) or real(*a))
  return calls


def test_a_step_on_new_inputs_is_matched_to_the_last_graph(callifies):
  rng = np.random.default_rng(0)
  w, b = Tensor(rng.standard_normal((4, 3), dtype=np.float32)), Tensor([0.5, -1.0, 2.0])
  xs = [rng.standard_normal((2, 4), dtype=np.float32) for _ in range(3)]
  outs = [(Tensor(x) @ w + b).relu().softmax(-1).realize() for x in xs]
  assert len(callifies) == 1, "the second and third step: matched to the step before"
  for x, out in zip(xs, outs):
    want = np.maximum(x @ w.numpy() + b.numpy(), 0)
    want = np.exp(want - want.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), want / want.sum(-1, keepdims=True), rtol=1e-5)


def test_a_step_of_traced_ops_is_matched_to_the_last_graph_without_resolving_calls(
    callifies, monkeypatch):
  # an eager transformer layer on new inputs: its Linear, GELU and LayerNorm are calls; a step
  # alike the last is matched call by call, without making the calls' results again
  rng = np.random.default_rng(0)
  ln, lin = nn.LayerNorm(8), nn.Linear(8, 8)
  Tensor.realize_all(ln.weight, ln.bias, lin.weight, lin.bias)
  callifies.clear()
  made = []
  real = callify_mod.call_result
  monkeypatch.setattr(callify_mod, "call_result", lambda *a: made.append(a) or real(*a))
  xs = [rng.standard_normal((2, 8), dtype=np.float32) for _ in range(3)]
  outs = [ln(lin(Tensor(x)).gelu()).realize() for x in xs]
  assert len(callifies) == 1 and len(made) == 3, "the first step only (three calls)"
  w, b = lin.weight.numpy(), lin.bias.numpy()
  for x, out in zip(xs, outs):
    want = torch.nn.functional.layer_norm(torch.nn.functional.gelu(torch.tensor(x @ w.T + b)),
                                          (8,))
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_calls_are_resolved_in_callifys_walk(monkeypatch):
  # no separate pass rebuilding every node above a call (a training step's whole backward)
  monkeypatch.setattr(entry, "inline_functions", lambda *a: pytest.fail("inlined first"))
  x = Tensor(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)
  x.gelu().layernorm().sum().backward()
  tx = torch.tensor(x.numpy(), requires_grad=True)
  torch.nn.functional.layer_norm(torch.nn.functional.gelu(tx), (4,)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_call_whose_body_holds_a_contiguous_is_inlined_first():
  @function
  def f(a): return (a * 2).contiguous() + 1
  x = Tensor([1.0, 2.0])
  assert (f(x) * 3).tolist() == [9.0, 15.0]
  assert (f(Tensor([0.0, -1.0])) * 3).tolist() == [3.0, -3.0]


def test_training_steps_on_new_batches_are_matched_to_the_last_step(callifies):
  # several targets (the loss and the optimizer's assigns), a `.contiguous()` (its own storage
  # tag at every step) and a cross-entropy whose realized labels are checked on the host (no
  # realize of its own between the steps)
  rng = np.random.default_rng(0)
  lin = nn.Linear(6, 3)
  tlin = torch.nn.Linear(6, 3)
  with torch.no_grad():
    tlin.weight[:], tlin.bias[:] = (torch.tensor(p.numpy()) for p in (lin.weight, lin.bias))
  opt = nn.optim.SGD([lin.weight, lin.bias], lr=0.1)
  topt = torch.optim.SGD(tlin.parameters(), lr=0.1)
  for step in range(5):
    if step == 2: callifies.clear()  # the first steps also realize the new parameters
    xv, yv = rng.standard_normal((5, 6), dtype=np.float32), rng.integers(0, 3, 5)
    with Tensor.train():
      opt.zero_grad()
      loss = lin(Tensor(xv)).relu().contiguous().cross_entropy(Tensor(yv.astype(np.int32)))
      loss.backward()
      Tensor.realize_all(loss, *opt.schedule_step())
    topt.zero_grad()
    tloss = torch.nn.functional.cross_entropy(tlin(torch.tensor(xv)).relu(), torch.tensor(yv))
    tloss.backward()
    topt.step()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
  assert not callifies, "each step matched to the step before"
  np.testing.assert_allclose(lin.weight.numpy(), tlin.weight.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_cross_entropy_checks_realized_labels_without_running_a_kernel():
  logits, y = Tensor.rand(4, 3).realize(), Tensor([0, 2, 1, 2]).realize()
  before = GlobalCounters.kernel_count
  loss = logits.cross_entropy(y)
  assert GlobalCounters.kernel_count == before
  want = torch.nn.functional.cross_entropy(torch.tensor(logits.numpy()), torch.tensor([0, 2, 1, 2]))
  assert loss.item() == pytest.approx(want.item(), rel=1e-6)


def test_a_graph_unlike_the_last_one_is_callified(callifies):
  x1, x2 = Tensor([1.0, 2.0]).realize(), Tensor([3.0, 4.0]).realize()
  assert (1 / (x1 * 0.0)).tolist() == [math.inf, math.inf]
  assert (1 / (x2 * -0.0)).tolist() == [-math.inf, -math.inf], "-0.0 is not 0.0"
  assert (x1 * 3).tolist() == [3.0, 6.0] and (x2.reshape(2, 1) * 3).tolist() == [[9.0], [12.0]]
  assert (Tensor([1, 2]) * 3).tolist() == [3, 6], "another dtype"
  assert len(callifies) == 5


def test_optimizer_steps_on_new_batches_update_in_place(callifies):
  w = Tensor([1.0, 2.0]).realize()
  for g in ([0.5, 0.5], [1.0, -1.0], [2.0, 0.0]):
    w.assign(w - Tensor(g) * 0.5).realize()
  assert w.tolist() == [1.0 - 1.75, 2.0 + 0.25] and len(callifies) == 1


def test_realize_substitutes_the_live_tensors_and_histories_in_one_walk_each(monkeypatch):
  # a training step: the gradients are live lazy tensors over one graph with the realized targets
  def step(walks: list) -> tuple:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = (x * 2).exp()
    live = h * 3, h + 1, h.sum()  # not realized: each is pointed at the buffers
    a, b = (h * 4).sum(), h.max()
    count = len(walks)
    Tensor.realize_all(a, b)
    return x, a, live, len(walks) - count
  walks = []
  real = UOp.substitute
  monkeypatch.setattr(UOp, "substitute", lambda *a, **k: walks.append(a[0]) or real(*a, **k))
  step(walks)  # schedules and compiles (which substitute too)
  x, a, (g1, g2, g3), walked = step(walks)
  assert walked <= 2, "one walk for the live tensors, one for the histories"
  want = np.exp(np.array([2.0, 4.0, 6.0]))
  np.testing.assert_allclose(g1.numpy(), want * 3, rtol=1e-6)
  np.testing.assert_allclose(g2.numpy(), want + 1, rtol=1e-6)
  np.testing.assert_allclose(g3.numpy(), want.sum(), rtol=1e-6)
  a.backward()
  np.testing.assert_allclose(x.grad.numpy(), 8 * want, rtol=1e-6)


def test_realizing_one_tensor_walks_no_graph_again(monkeypatch):
  a, b = Tensor.rand(8, 8).realize(), Tensor.rand(8, 8).realize()
  (a @ b).realize()  # compiled
  walks = []
  real = UOp.substitute
  monkeypatch.setattr(UOp, "substitute", lambda *x, **k: walks.append(x[0]) or real(*x, **k))
  out = a @ b
  below = out.uop.src[0]  # the REDUCE under the output's RESHAPE: in no other test's graph
  out.realize()
  # (lazy tensors other tests left alive are walked: never this graph)
  assert not any(below in w.toposort() for w in walks), "its history is its graph as it is"
  np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=1e-5)


def test_kernel_settings_follow_every_knob_change():
  """The settings a run's kernels are chosen by are read again after any knob was set (a cached
  read must not keep the last values): under NOOPT the same expression runs the unoptimized
  kernel, a program of its own, and gives the same values."""
  a = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8)).realize()
  before = programs.settings()
  want = (a @ a).numpy()
  with Context(NOOPT=1):
    assert programs.settings() != before and programs.settings()[1] is True
    runners = len(programs.programs.runners)
    np.testing.assert_allclose((a @ a).numpy(), want)
    assert len(programs.programs.runners) > runners, "NOOPT compiled its own program"
  assert programs.settings() == before
