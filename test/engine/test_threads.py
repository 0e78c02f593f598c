"""One process, several Python threads: each thread's results are its own and right (realize is
serialized by the engine's lock, the CPU pool runs one launch at a time, hash-consing and the
live-tensor set are locked, grad mode is per thread)."""
import threading

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.runtime.ops_cpu import find_c_compiler

THREADS, ITERS = 4, 24


def _one_step(tid: int, i: int, device: str) -> tuple[np.ndarray, np.ndarray]:
  """A computation and its numpy value; big enough that CPU kernels use the thread pool."""
  rng = np.random.default_rng(1000 * tid + i)
  m, k, n = (96, 64, 80) if device == "CPU" else (6, 4, 5)
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = rng.standard_normal((k, n)).astype(np.float32)
  case = (tid + i) % 4
  if case == 0: return (Tensor(a, device=device) @ Tensor(b, device=device)).relu().numpy(), \
    np.maximum(a @ b, 0)
  if case == 1: return (Tensor(a, device=device) * tid + i).sum(1).numpy(), (a * tid + i).sum(1)
  if case == 2:
    x = Tensor(a, device=device).contiguous().realize()
    x[1:5] = float(i)
    want = a.copy()
    want[1:5] = i
    return x.exp().max(0).numpy(), np.exp(want).max(0)
  t = Tensor(a, device=device, requires_grad=True)
  (t * t).sum().backward()
  return t.grad.numpy(), 2 * a


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_threads_doing_independent_computations_all_get_right_results(device):
  """Regression: with 2-4 threads about 5-10% of results were wrong (two threads launched on the
  CPU pool's one launch slot at once), and a WeakSet raised 'Set changed size during iteration'."""
  if device == "CPU" and find_c_compiler() is None: pytest.skip("no C compiler")
  iters = ITERS if device == "CPU" else 2
  bad: list[tuple[int, int]] = []
  errors: list[BaseException] = []

  def work(tid: int) -> None:
    try:
      for i in range(iters):
        got, want = _one_step(tid, i, device)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-3): bad.append((tid, i))
    except BaseException as e:  # noqa: BLE001 (reported by the main thread)
      errors.append(e)

  threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
  for t in threads: t.start()
  for t in threads: t.join(timeout=300)
  assert not any(t.is_alive() for t in threads), "a thread hung (deadlocked launches)"
  assert not errors, errors[0]
  assert not bad, f"wrong results (thread, step): {bad}"


def test_no_grad_is_per_thread():
  """Tensor.no_grad in one thread does not turn gradients off in another (PyTorch's grad mode is
  thread-local)."""
  inside, release = threading.Event(), threading.Event()

  def hold_no_grad() -> None:
    with Tensor.no_grad():
      inside.set()
      release.wait(10)

  other = threading.Thread(target=hold_no_grad)
  other.start()
  inside.wait(10)
  try:
    assert not Tensor.no_grad
    w = Tensor([1.0, 2.0], device="PYTHON", requires_grad=True)
    (w * 3).sum().backward()
    assert w.grad.tolist() == [3.0, 3.0]
  finally:
    release.set()
    other.join()
