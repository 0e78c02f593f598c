"""TinyJit: eager first call, capture on the second, replays of the captured kernels after."""
import importlib.util
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unigrad import Context, Tensor, TinyJit, Variable, dtypes, function, nn
from unigrad.engine import CaptureError
from unigrad.frontend.jit import JitError
from unigrad.helpers import GlobalCounters
from unigrad.nn.state import get_parameters


def test_replays_run_no_python_and_compile_nothing(device):
  calls = []

  @TinyJit
  def f(a, b):
    calls.append(1)
    return (a * b + 1).relu().sum(), a - b
  rng = np.random.default_rng(0)
  for i in range(5):
    x, y = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    if i == 2: compiled = GlobalCounters.programs_compiled
    s, d = f(Tensor(x, device), Tensor(y, device))
    np.testing.assert_allclose(s.item(), np.maximum(x * y + 1, 0).sum(), rtol=1e-5)
    np.testing.assert_allclose(d.numpy(), x - y, rtol=1e-6)
  assert len(calls) == 2  # eager, capture; then replays only
  assert GlobalCounters.programs_compiled == compiled
  assert f.captured is not None and f.captured.kernel_count >= 1


def test_cpu_replay_is_one_native_batch():
  @TinyJit
  def f(a):
    for _ in range(5): a = (a * 2).contiguous()
    return a
  x = Tensor.ones(4, device="CPU").contiguous().realize()
  for _ in range(3): out = f(x)
  assert out.tolist() == [32.0] * 4
  prog = f.captured
  assert prog.kernel_count == 5 and len(prog.executor.segments) == 1 and \
    prog.executor.segments[0].batch is not None


def _digits_step(jit: bool, steps: int, device: str = "CPU"):
  Tensor.manual_seed(7)
  rng = np.random.default_rng(0)
  X = Tensor(rng.random((100, 64), dtype=np.float32), device)
  Y = Tensor(rng.integers(0, 10, 100).astype(np.int32), device)
  model = [nn.Linear(64, 32), nn.Linear(32, 10)]
  for layer in model:
    layer.weight.to_(device), layer.bias.to_(device)
  opt = nn.optim.Adam(get_parameters(model), lr=1e-2)

  def step():
    idx = Tensor.randint(0, 100, (16,), device=device)
    opt.zero_grad()
    h = model[0](X[idx]).relu().dropout(0.2)
    loss = model[1](h).sparse_categorical_crossentropy(Y[idx])
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    return loss
  fn = TinyJit(step) if jit else step
  with Tensor.train():
    losses = [fn().item() for _ in range(steps)]
  return losses, model[0].weight.numpy()


def test_training_step_with_random_batches_and_dropout_matches_eager():
  """forward, backward, Adam assigns, randint and dropout: bit-identical to running eagerly."""
  eager_losses, eager_w = _digits_step(False, 5)
  jit_losses, jit_w = _digits_step(True, 5)
  assert jit_losses == eager_losses
  np.testing.assert_array_equal(jit_w, eager_w)
  assert len(set(jit_losses)) == 5


def test_random_numbers_advance_on_every_replay_like_eager():
  @TinyJit
  def f(a): return a + Tensor.rand(3), Tensor.randn(2)
  Tensor.manual_seed(0)
  jit = [[t.tolist() for t in f(Tensor.zeros(3))] for _ in range(4)]
  Tensor.manual_seed(0)
  eager = [[(Tensor.zeros(3) + Tensor.rand(3)).tolist(), Tensor.randn(2).tolist()]
           for _ in range(4)]
  assert jit == eager


def test_output_aliasing_an_input_follows_the_new_input():
  @TinyJit
  def f(a, b): return a, a + b
  for i in range(4):
    x = Tensor([float(i), 1.0])
    same, s = f(x, Tensor([1.0, 1.0]))
    assert same.tolist() == [float(i), 1.0] and s.tolist() == [i + 1.0, 2.0]


def test_outputs_are_overwritten_by_the_next_replay_unless_cloned():
  @TinyJit
  def f(a): return a * 2
  f(Tensor([1.0])), f(Tensor([1.0]))
  first = f(Tensor([3.0]))
  kept = first.clone().realize()
  f(Tensor([5.0]))
  assert kept.tolist() == [6.0]


def test_numpy_of_a_result_is_not_overwritten_by_the_next_call():
  """Regression: numpy() of a jit result shared the program's buffer, so every array handed out
  by the capture call and the replays changed at each later call ([0, 8, 8, 8, 8]). It is a
  copy the caller owns (tinygrad's numpy() always copies), views of a result's buffer too;
  numpy() of other tensors still shares memory."""
  @TinyJit
  def f(x): return x * 2, (x + 1)[1:]
  got = []
  for i in range(5):
    a, b = f(Tensor([float(i), 10.0]))
    got.append((a.numpy(), b.numpy(), a[0].numpy(), a.T.numpy()))
  for i, (a, b, a0, at) in enumerate(got):
    assert a.tolist() == [2.0 * i, 20.0] and b.tolist() == [11.0] and a0 == 2.0 * i, i
    assert at.tolist() == [2.0 * i, 20.0]
  plain = Tensor([1.0, 2.0]).realize()
  view = plain.numpy()
  view[0] = 7.0
  assert plain.tolist() == [7.0, 2.0]  # shared, PyTorch's way


def test_non_tensor_argument_change_recaptures():
  calls = []

  @TinyJit
  def f(a, mode):
    calls.append(mode)
    return a * 2 if mode == "double" else a * 3
  x = Tensor([1.0])
  for _ in range(3): assert f(x, "double").tolist() == [2.0]
  for _ in range(3): assert f(x, "triple").tolist() == [3.0]
  assert f(x, "double").tolist() == [2.0]
  assert calls == ["double", "double", "triple", "triple"]


def test_shape_or_dtype_change_recaptures():
  @TinyJit
  def f(a): return a + 1
  for n in (2, 2, 2, 3, 3, 3, 2):
    assert f(Tensor([1.0] * n)).tolist() == [2.0] * n
  for _ in range(3): assert f(Tensor([1, 2], dtype=dtypes.int32)).tolist() == [2, 3]


def test_different_number_or_kind_of_arguments_raises():
  @TinyJit
  def f(a, b): return a + b
  f(Tensor([1.0]), Tensor([2.0]))
  with pytest.raises(JitError, match=r"expected 2 entries, got 3"):
    f(Tensor([1.0]), Tensor([2.0]), Tensor([3.0]))
  with pytest.raises(JitError, match=r"\[1\]: expected Tensor, got float"):
    f(Tensor([1.0]), 2.0)


def test_reading_values_while_capturing_raises():
  @TinyJit
  def f(a): return a * a.sum().item()
  f(Tensor([1.0, 2.0]))
  with pytest.raises(CaptureError, match="read tensor values"):
    f(Tensor([1.0, 2.0]))


def test_reset_starts_over():
  calls = []

  @TinyJit
  def f(a):
    calls.append(1)
    return a + 1
  for _ in range(3): f(Tensor([1.0]))
  f.reset()
  assert f.captured is None
  for _ in range(3): f(Tensor([1.0]))
  assert len(calls) == 4


def test_jit_off_runs_eagerly():
  calls = []

  @TinyJit
  def f(a):
    calls.append(1)
    return a + 1
  with Context(JIT=0):
    for _ in range(3): f(Tensor([1.0]))
  assert len(calls) == 3


def test_view_inputs_and_repeated_inputs():
  @TinyJit
  def f(a, b): return a - b
  base = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  for _ in range(3):
    out = f(base.T, base.T)  # views: copied into buffers of their own
    assert out.tolist() == [[0.0, 0.0]] * 3
  x = Tensor([1.0, 2.0])
  for _ in range(3): assert f(x, x).tolist() == [0.0, 0.0]


def test_method_and_nested_jit():
  class Model:
    def __init__(self): self.w = Tensor([2.0, 3.0])
    @TinyJit
    def __call__(self, x): return inner(x) * self.w

  @TinyJit
  def inner(x): return x + 1
  m = Model()
  for i in range(4): assert m(Tensor([float(i), 0.0])).tolist() == [2.0 * (i + 1), 3.0]


def test_replay_on_null_device():
  @TinyJit
  def f(a): return (a + 1).sum()
  for _ in range(3): out = f(Tensor.empty(4, device="NULL"))
  assert out.shape == (1,) or out.shape == ()
  assert f.captured.kernel_count >= 1


def test_captured_intermediates_share_one_arena():
  @TinyJit
  def f(a, b):
    for _ in range(6): a = a @ b  # each product is an intermediate of the next
    return a.sum()
  x = np.random.default_rng(0).random((32, 32), dtype=np.float32)
  for i in range(3): out = f(Tensor(x + i), Tensor(np.eye(32, dtype=np.float32)))
  np.testing.assert_allclose(out.item(), (x + 2).sum(), rtol=1e-4)
  prog = f.captured
  assert prog.inter_bytes >= 5 * 32 * 32 * 4
  assert 0 < prog.arena_bytes <= 2 * 32 * 32 * 4


def test_bound_variable_replays_across_values_without_recompiling(device):
  rng = np.random.default_rng(3)
  xv, wv = rng.standard_normal((64, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(
    np.float32)
  x, w = Tensor(xv, device), Tensor(wv, device)
  n = Variable("n", 1, 64)
  calls = []

  @TinyJit
  def f(x, k):
    calls.append(1)
    return (x[:k] @ w).relu().sum(axis=0), x[:k] * 2
  for k in list(range(1, 8)) + [64, 33, 5]:
    if k == 4: compiled = GlobalCounters.programs_compiled
    s, y = f(x, n.bind(k))
    np.testing.assert_allclose(s.numpy(), np.maximum(xv[:k] @ wv, 0).sum(0), rtol=1e-5, atol=1e-5)
    assert y.shape[0].arg.value == k
    np.testing.assert_allclose(y.numpy(), xv[:k] * 2)
  assert len(calls) == 2 and GlobalCounters.programs_compiled == compiled


def test_symbolic_input_shape_replays():
  n = Variable("n", 1, 16)
  base = Tensor(np.arange(16, dtype=np.float32))

  @TinyJit
  def f(x): return (x + 1).sum()
  for k in (3, 3, 3, 7, 16, 1):
    assert f(base[:n.bind(k)].contiguous()).item() == sum(range(k)) + k
  assert len(f.entries) == 1


def test_value_checks_run_eagerly_and_not_while_capturing_or_tracing():
  """cross_entropy's class-range check reads values: eagerly it raises at the call; a TinyJit
  capture and an @function trace skip it (the eager first call checked)."""
  logits = Tensor(np.zeros((2, 3), np.float32))
  with pytest.raises(IndexError):
    logits.sparse_categorical_crossentropy(Tensor([0, 5])).realize()

  @TinyJit
  def f(x, y): return x.sparse_categorical_crossentropy(y)
  for _ in range(3): assert abs(f(logits, Tensor([0, 2])).item() - np.log(3)) < 1e-6

  @function
  def g(x, y): return x.sparse_categorical_crossentropy(y)
  assert abs(g(logits, Tensor([1, 2])).item() - np.log(3)) < 1e-6


def test_embedding_lookup_captures_and_replays_new_indices():
  """nn.Embedding range-checks realized indices by reading them: eagerly it raises at the call,
  a capture reads nothing (it raised CaptureError, so no model with an embedding could be
  captured) and every replay gathers the rows of its own indices."""
  emb = nn.Embedding(10, 3)
  w = emb.weight.numpy()
  with pytest.raises(IndexError, match="out of range"): emb(Tensor([1, 10]))

  @TinyJit
  def f(idx): return emb(idx) * 2
  for ids in ([1, 2, 3], [0, 9, 4], [5, 5, 7], [8, 0, 1]):
    np.testing.assert_allclose(f(Tensor(ids, dtype=dtypes.int32)).numpy(), w[ids] * 2, rtol=1e-6)
  assert f.captured is not None


def _sgd_linear(jit: bool, batch, steps: int = 5) -> np.ndarray:
  """`steps` of SGD on a linear model, each on `batch(X, Y, step)`; returns the weights."""
  Tensor.manual_seed(3)
  rng = np.random.default_rng(0)
  X = Tensor(rng.random((50, 8), dtype=np.float32)).realize()
  Y = Tensor(rng.random((50, 1), dtype=np.float32)).realize()
  w = Tensor(np.full((8, 1), 0.1, np.float32), requires_grad=True).realize()
  opt = nn.optim.SGD([w], lr=0.1)

  def step(x, y):
    opt.zero_grad()
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    return loss
  fn = TinyJit(step) if jit else step
  for k in range(steps): fn(*batch(X, Y, k))
  return w.numpy()


def _numpy_index(X, Y, k):
  idx = Tensor(np.random.default_rng(k).integers(0, 50, 10).astype(np.int32))
  return X[idx], Y[idx]


def _randint_index(X, Y, k):
  idx = Tensor.randint(0, 50, (10,))
  return X[idx], Y[idx]


def _realized_gather(X, Y, k):
  a, b = _numpy_index(X, Y, k)
  return a.realize(), b.realize()


def _slice_views(X, Y, k): return X[7 * k:7 * k + 10], Y[7 * k:7 * k + 10]


def _computed_from_realized(X, Y, k):
  a, b = _slice_views(X, Y, k)
  return (a * 2).realize() + 1, (b + 1).realize() * 3


@pytest.mark.parametrize("batch", [_numpy_index, _randint_index, _realized_gather, _slice_views,
                                   _computed_from_realized])
def test_gathered_and_view_inputs_train_like_eager(batch):
  """f(X[idx], Y[idx]): a realized input remembers the graph that computed it (autograd sees
  through it), so backward read X and the capture's idx instead of the input: every replay
  trained on the capture's batch. An input is a value: each call trains on its own batch."""
  np.testing.assert_allclose(_sgd_linear(True, batch), _sgd_linear(False, batch), atol=1e-6)


def _feed_back(step, state: tuple, n: int = 10) -> list:
  """`n` calls of `step`, each on the results of the one before, jitted and eagerly."""
  jit, eager = TinyJit(step), step
  ja, ea = tuple(Tensor(s) for s in state), tuple(Tensor(s) for s in state)
  for _ in range(n):
    ja, ea = jit(*ja), eager(*ea)
    for j, e in zip(ja, ea): np.testing.assert_allclose(j.numpy(), e.numpy(), rtol=1e-5)
  return [t.tolist() for t in ja]


def test_results_fed_back_as_inputs_swap():
  assert _feed_back(lambda a, b: (b, a), ([1.0], [2.0]), 5) == [[2.0], [1.0]]
  assert _feed_back(lambda a, b: (b * 1, a * 1), ([1.0], [2.0]), 5) == [[2.0], [1.0]]
  m = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
  _feed_back(lambda a, b: (b @ Tensor(m), a @ Tensor(m)), ([[1.0, 2.0]], [[3.0, 4.0]]), 5)


def test_results_fed_back_as_inputs_fibonacci():
  """(a, b) -> (b, a + b): the first result is a view of input b, the second the replay's own
  buffer; fed back, that buffer was both an input and what the replay writes."""
  assert _feed_back(lambda a, b: (b, a + b), ([0.0], [1.0])) == [[55.0], [89.0]]
  assert _feed_back(lambda a, b: (b * 1, a + b), ([0.0], [1.0])) == [[55.0], [89.0]]


def test_results_fed_back_as_inputs_lstm_state():
  rng = np.random.default_rng(0)
  wx, wh = (Tensor(rng.standard_normal((4, 16)).astype(np.float32) * 0.5) for _ in range(2))
  x = Tensor(rng.standard_normal((2, 4)).astype(np.float32))

  def cell(h, c):
    i, f, g, o = (x @ wx + h @ wh).chunk(4, dim=1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return (o.sigmoid() * c.tanh()).realize(), c.realize()
  _feed_back(cell, (np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)))


def test_numpy_argument_at_a_recycled_address_follows_its_contents():
  @TinyJit
  def f(x, arr): return (x + Tensor(arr)).contiguous()
  for i in range(30):
    arr = np.full(3, float(i // 3), np.float32)  # each value three times: eager, capture, replay
    assert f(Tensor.zeros(3), arr).tolist() == [float(i // 3)] * 3
    del arr


def _in_threads(*workers) -> None:
  """Run each worker in a thread of its own; re-raise the first failure."""
  errors = []

  def run(work):
    try: work()
    except BaseException as e: errors.append(e)  # noqa: BLE001 (re-raised below)
  threads = [threading.Thread(target=run, args=(w,)) for w in workers]
  for t in threads: t.start()
  for t in threads: t.join()
  if errors: raise errors[0]


def test_jit_shared_by_two_threads_gives_each_its_own_results():
  """Regression: two threads calling one jit got 25-51 wrong results of 600. A jit runs one call
  at a time; its results are overwritten by the next call from any thread, so each thread
  reads (or clones) them under `jit.lock`."""
  w = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
  wn = w.numpy()

  @TinyJit
  def f(x): return (x @ w).relu() + 1, x.sum()

  def results(xv: np.ndarray, clone: bool) -> tuple[np.ndarray, float]:
    with f.lock:
      out, s = f(Tensor(xv))
      if not clone: return out.numpy(), s.item()  # a result's numpy() is a copy
      out, s = out.clone().realize(), s.clone().realize()
    return out.numpy(), s.item()

  def work(seed: int, clone: bool):
    rng = np.random.default_rng(seed)
    for _ in range(300):
      xv = rng.standard_normal((2, 4)).astype(np.float32)
      out, s = results(xv, clone)
      np.testing.assert_allclose(out, np.maximum(xv @ wn, 0) + 1, rtol=1e-5)
      np.testing.assert_allclose(s, xv.sum(), rtol=1e-5, atol=1e-5)
  _in_threads(lambda: work(0, False), lambda: work(1, True))
  assert len(f.entries) == 1


def test_capture_records_only_its_own_thread():
  """Regression: the active capture was global: another thread's realize was recorded into it
  and its reads raised CaptureError. One thread captures over and over (reset), another
  realizes and reads meanwhile."""
  w = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
  wn = w.numpy()
  done = threading.Event()

  @TinyJit
  def f(x): return (x @ w).realize().relu() + 1

  def capture_often():
    rng = np.random.default_rng(0)
    try:
      for i in range(60):
        if i % 3 == 0: f.reset()
        xv = rng.standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_allclose(f(Tensor(xv)).numpy(), np.maximum(xv @ wn, 0) + 1, rtol=1e-5)
    finally: done.set()

  def eager():
    rng = np.random.default_rng(1)
    while not done.is_set():
      xv = rng.standard_normal((2, 4)).astype(np.float32)
      np.testing.assert_allclose(((Tensor(xv) * 2) @ w).numpy(), xv * 2 @ wn, rtol=1e-5)
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)  # switch threads often: inside the captures too
  try: _in_threads(capture_often, eager)
  finally: sys.setswitchinterval(interval)


def _bench_module(name: str):
  """bench/<name>.py imported as a module (bench/ is scripts, not a package)."""
  path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses)
  spec.loader.exec_module(module)
  return module


def test_jit_training_soak_runs_in_flat_memory():
  """The short version of `python bench/jit_soak.py` (2,000 steps): after a warm-up, jitted
  training steps on gathered batches keep no Tensor, Buffer or memory per step. Growth is counted
  from the second sample: a process that ran other tests first (a pytest-xdist worker) may grow
  once, by a one-time allocation of the allocator or the runtime, during the first window."""
  soak = _bench_module("jit_soak")
  samples = soak.soak(200, 40, 40, lambda s: None)
  assert len(samples) == 5
  assert soak.growth(samples[1:], 8.0) is None
  leaking = [soak.Sample(40, 0, 10, 5), soak.Sample(80, 0, 11, 5)]
  assert "Tensors grew" in soak.growth(leaking, 8.0)


def test_assigns_pending_at_return_are_replayed_batchnorm_running_stats_update():
  def run():
    Tensor.manual_seed(0)
    bn, lin = nn.BatchNorm2d(4), nn.Linear(4, 4)
    opt = nn.optim.SGD([lin.weight, lin.bias], lr=0.1)

    def step(x):
      with Tensor.train():
        opt.zero_grad()
        loss = bn(lin(x).reshape(-1, 4, 1, 1)).sum()
        loss.backward()
        Tensor.realize_all(loss, *opt.schedule_step())  # the running stats' assigns: pending
      return loss
    rng = np.random.default_rng(0)
    return step, bn, [Tensor(rng.standard_normal((8, 4)).astype(np.float32)) for _ in range(5)]
  step, bn, xs = run()
  eager = []
  for x in xs: step(x), eager.append(bn.running_mean.numpy().copy())
  step, bn, xs = run()
  jitted, jit = [], TinyJit(step)
  for x in xs: jit(x), jitted.append(bn.running_mean.numpy().copy())
  np.testing.assert_allclose(np.array(jitted), np.array(eager), rtol=1e-6, atol=1e-7)
  assert bn.num_batches_tracked.item() == 5


def test_lazy_values_made_before_a_capture_or_between_replays_keep_their_values():
  w = Tensor([1.0, 2.0]).realize()
  before = w * 10

  @TinyJit
  def step(x):
    w.assign(w + x).realize()
    return (w * 1).sum()
  between = []
  for _ in range(4):
    mid = w * 100
    step(Tensor([1.0, 1.0]))
    between.append(mid.tolist())
  assert before.tolist() == [10.0, 20.0] and w.tolist() == [5.0, 6.0]
  assert between == [[100.0, 200.0], [200.0, 300.0], [300.0, 400.0], [400.0, 500.0]]
  assert len(step.captured.launches) == 2, "the value made before the capture is not replayed"


def test_an_old_tensor_given_a_lazy_value_between_replays_keeps_the_value_it_read():
  """A replay looks again only at the tensors made since the last one and those lazy then,
  unless a tensor got a new node (replace, setitem, a gradient's sum): here one made before the
  capture, realized then, is given a value reading what the replay overwrites."""
  w = Tensor([1.0, 2.0]).realize()

  @TinyJit
  def step(x):
    w.assign(w + x).realize()
    return (w * 1).sum()
  held = Tensor([0.0, 0.0]).realize()
  for _ in range(3): step(Tensor([1.0, 1.0]))
  held.replace(w * 100)  # w is [4, 5] now
  step(Tensor([1.0, 1.0]))
  assert held.tolist() == [400.0, 500.0] and w.tolist() == [5.0, 6.0]


def test_a_captured_holder_dying_between_replays_is_noticed():
  """A replay skips the check of its outside tensors while none of the watched ones died and no
  tensor got a new node; one dying (its other holder still holding the buffer) is looked at."""
  w = Tensor([1.0, 2.0]).realize()
  box = {"view": w.reshape(2)}

  @TinyJit
  def f(x): return x * box["view"]
  for _ in range(3): assert f(Tensor([1.0, 1.0])).tolist() == [1.0, 2.0]
  del box["view"]  # w still holds the buffer: no error
  assert f(Tensor([1.0, 1.0])).tolist() == [1.0, 2.0]
  del w
  with pytest.raises(JitError, match="rebound, deleted or replaced"): f(Tensor([1.0, 1.0]))


# ---- the class, not only the instances: random call sequences against the eager function ----

@st.composite
def jit_calls(draw):
  """Per call: how its input is made (a gather, a slice view, numpy, a computed value) with
  its rows, and whether the recurrent state fed in is the last call's result."""
  n = draw(st.integers(3, 8))
  return [(draw(st.sampled_from(["gather", "view", "numpy", "computed"])),
           draw(st.integers(0, 12)), draw(st.booleans())) for _ in range(n)]


def _run_calls(calls, jitted):
  data = np.arange(64, dtype=np.float32).reshape(16, 4) / 16
  X, w = Tensor(data).realize(), Tensor([0.5, -0.5, 1.0, 2.0]).realize()
  s = Tensor.zeros(4).contiguous().realize()

  def f(x, h):
    out = (x * w).sum(1) + h
    w.assign(w - 0.1 * x.mean(0))   # realized with the result
    s.assign(s * 0.5 + x.sum(0))    # still pending when f returns
    return out.realize(w), h * 0.5
  fn = TinyJit(f) if jitted else f
  h, seen = Tensor.zeros(4).contiguous().realize(), []
  for kind, row, feed in calls:
    x = {"gather": lambda r: X[Tensor([r, r + 3, (r * 5) % 16, 15 - r])],
         "view": lambda r: X[r:r + 4], "numpy": lambda r: Tensor(data[r:r + 4] * 2),
         "computed": lambda r: X[r:r + 4] * 3 - 1}[kind](row)
    out, nh = fn(x, h if feed else Tensor.zeros(4).contiguous().realize())
    seen.append(out.numpy().copy())
    h = nh
  return np.array(seen), w.numpy().copy(), s.numpy().copy()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(jit_calls())
def test_random_call_sequences_replay_like_the_eager_function(calls):
  for got, want in zip(_run_calls(calls, True), _run_calls(calls, False)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- tinygrad's TinyJit footguns (issue 29): each is correct or a JitError naming what changed

def test_captured_tensor_rebound_after_capture_raises_jit_error():
  """`w = Tensor(...)` instead of `w.assign(...)`: the replay would read the old buffer."""
  held = {"w": Tensor([1.0, 2.0]).realize()}

  @TinyJit
  def f(x): return x * held["w"]
  for _ in range(3): assert f(Tensor([1.0, 1.0])).tolist() == [1.0, 2.0]
  held["w"] = Tensor([10.0, 20.0]).realize()
  with pytest.raises(JitError, match=r"shape \(2,\), dtypes.float.*rebound, deleted or replaced "
                     r"since the capture.*assign"):
    f(Tensor([1.0, 1.0]))
  for _ in range(3): assert f(Tensor([1.0, 1.0])).tolist() == [10.0, 20.0]  # captured anew


def test_captured_tensor_replaced_raises_jit_error():
  w = Tensor([1.0]).realize()

  @TinyJit
  def f(): return w * 2
  for _ in range(3): f()
  w.replace(Tensor([5.0]).realize())
  with pytest.raises(JitError, match="replaced since the capture"): f()


def test_captured_tensor_assigned_stays_valid_even_if_the_write_is_pending():
  """assign keeps the buffer: no error, and a write still pending at the call runs first."""
  w = Tensor([0.0]).realize()

  @TinyJit
  def f(): return w * 2
  out = []
  for i in range(5):
    w.assign(Tensor([float(i)]))  # not realized
    out.append(f().item())
  assert out == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_tensor_rebound_inside_the_function_raises_at_capture():
  """`state = state + x` inside: every replay would read the state of the capture."""
  box = {"h": Tensor([0.0]).realize()}

  @TinyJit
  def f(x):
    box["h"] = (box["h"] + x).realize()
    return box["h"]
  f(Tensor([1.0]))
  with pytest.raises(JitError, match="while the function was being captured"): f(Tensor([1.0]))


def test_keyword_argument_order_does_not_matter():
  @TinyJit
  def f(first, second): return first - second
  for i in range(3):
    assert f(second=Tensor([1.0]), first=Tensor([float(i)])).tolist() == [i - 1.0]
    assert f(first=Tensor([float(i)]), second=Tensor([1.0])).tolist() == [i - 1.0]


def test_results_realized_inside_or_left_lazy_replay_alike():
  @TinyJit
  def f(a, b): return a + b, (a * b).realize()
  for i in range(4):
    s, p = f(Tensor([float(i)]), Tensor([2.0]))
    assert (s.tolist(), p.tolist()) == ([i + 2.0], [i * 2.0])


def _program(jit: TinyJit):
  (entry,) = jit.entries.values()
  return entry.program


def test_a_capture_keeps_only_the_buffers_read_after_it_and_frees_the_rest():
  """Buffers realized inside the function that nothing holds afterwards (a layer-by-layer
  forward's activations) become the program's own intermediates, placed in one arena by lifetime,
  and their memory goes back during the capture; a constant uploaded inside the function and a
  result someone holds stay arguments with their contents. Replays give the eager values. (Under
  no_grad: with gradients on, the held layer's autograd history would hold the layers before it
  too.)"""
  rng = np.random.default_rng(0)
  w = Tensor(rng.standard_normal((64, 64), dtype=np.float32) / 8).realize()
  kept: list[Tensor] = []

  @Tensor.no_grad()
  def f(x):
    bias = Tensor(np.arange(64, dtype=np.float32) / 64)  # uploaded here, read by every layer
    for i in range(8):
      x = (x @ w + bias).relu().realize()
      if i == 3: kept[:] = [x]  # held outside: its buffer is written by each call
    return x

  def want(x):
    for i in range(8):
      x = np.maximum(x @ w.numpy() + np.arange(64, dtype=np.float32) / 64, 0)
      if i == 3: mid = x
    return x, mid

  step = TinyJit(f)
  for _ in range(2): step(Tensor(rng.standard_normal((16, 64), dtype=np.float32)))
  prog = _program(step)
  assert len(prog.args) == 5  # x, w, bias, the held 4th layer, the result: 6 layers in the arena
  assert prog.arena_bytes >= 16 * 64 * 4 and len(prog.launches) == 8
  for _ in range(2):
    x = rng.standard_normal((16, 64), dtype=np.float32)
    got, (out, mid) = step(Tensor(x)).numpy(), want(x)
    np.testing.assert_allclose(got, out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kept[0].numpy(), mid, rtol=1e-5, atol=1e-5)


def test_a_capture_does_not_hold_every_intermediate_at_once():
  """A buffer no later kernel can read (its node is gone) and each run's arena give their memory
  back during the capture, not at its end (a 1000-token prefill held 2 GB at once)."""
  w, seen = Tensor.ones(256, 256).contiguous().realize(), []

  @Tensor.no_grad()
  def f(x):
    for _ in range(16): x = (x @ w * (1 / 256)).realize()  # 256 KB a layer, 4 MB in all
    seen.append(GlobalCounters.mem_used)  # the capture still holds every run's Buffers here
    return x

  step, x = TinyJit(f), Tensor.ones(256, 256).contiguous().realize()
  step(x)
  before = GlobalCounters.mem_used
  step(x)  # the capture
  assert seen[-1] - before < 4 * 256 * 256 * 4
  np.testing.assert_allclose(step(x).numpy(), np.ones((256, 256)), rtol=1e-6)
