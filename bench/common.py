"""Helpers shared by the benchmarks: best-of timing, the optional torch import, a result row."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any


# a library's worker threads spin for a while after its last call (OpenBLAS ~0.1 s, OpenMP and
# unigrad's pool a few ms), taking a core from whatever runs next on a 2-core machine
SETTLE_S = 0.25


# the clock best_of reads: wall time, or (bench/kernels.py --cpu-time) the calling thread's CPU
# time, which a loaded machine's preemption does not inflate (single-threaded runs only)
CLOCK: list[Callable[[], float]] = [time.perf_counter]


# best_of times at least this long: five runs of a 0.2 ms matmul are the first five after the
# warm-up (caches, freshly mapped buffers), whose fastest is not yet the steady state
MIN_TIMED_S = 0.05


def best_of(fn: Callable[[], object], repeat: int) -> float:
  """The fastest of at least `repeat` runs of `fn` (more, to fill MIN_TIMED_S), after the
  previous measurement's spinning threads have gone to sleep and one warm-up run."""
  time.sleep(SETTLE_S)
  fn()
  times = _times(fn, repeat)
  while sum(times) < MIN_TIMED_S: times += _times(fn, repeat)
  return min(times)


def median_of(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
  """The median of `repeat` timed runs of `fn` after `warmup` untimed ones (steps short enough
  to be preempted now and then are better summarized by the median than the minimum)."""
  for _ in range(warmup): fn()
  return sorted(_times(fn, repeat))[repeat // 2]


def _times(fn: Callable[[], object], repeat: int) -> list[float]:
  """The time of each of `repeat` runs of `fn` on the chosen clock (wall or process CPU time)."""
  clock, times = CLOCK[0], []
  for _ in range(repeat):
    t0 = clock()
    fn()
    times.append(clock() - t0)
  return times


def try_torch() -> Any:
  """torch using every core, or None when it is not installed (it is never a dependency)."""
  try:
    import torch  # noqa: PLC0415 (optional: compared only when installed)
  except ImportError:
    return None
  torch.set_num_threads(os.cpu_count() or 1)
  return torch


def row(name: str, ours: float, theirs: dict[str, float]) -> None:
  """One result line: unigrad's time, then each peer's time and its ratio (>1: unigrad faster)."""
  parts = [f"{name:28s} unigrad {ours * 1e3:8.3f} ms"]
  for lib, t in theirs.items(): parts.append(f"{lib} {t * 1e3:8.3f} ms (x{t / ours:5.2f})")
  print("  ".join(parts))


# ---- a small transformer, shared by the compile-time benchmarks ----

def make_transformer(layers: int, d: int = 64, t: int = 16) -> tuple[list, list, Any]:
  """`layers` pre-norm blocks (attention over 4 heads, MLP with GELU) with realized parameters,
  and a realized input of `t` tokens of width `d`: (blocks, parameters, input)."""
  from unigrad import Tensor  # noqa: PLC0415 (the timing children time their own import)
  from unigrad.nn.layers import LayerNorm, Linear  # noqa: PLC0415
  Tensor.manual_seed(0)
  blocks = [(LayerNorm(d), Linear(d, 3 * d), Linear(d, d), LayerNorm(d), Linear(d, 4 * d),
             Linear(4 * d, d)) for _ in range(layers)]
  params = [p for block in blocks for m in block for p in (m.weight, m.bias)]
  Tensor.realize(*params)
  return blocks, params, Tensor.rand(t, d).realize()


def transformer_loss(blocks: list, params: list, x: Any, heads: int = 4) -> list:
  """Build (nothing runs) the forward pass, a mean-square loss and its backward: [loss, *grads]."""
  t, d = x.shape
  for ln1, qkv, proj, ln2, fc1, fc2 in blocks:
    q, k, v = [y.reshape(t, heads, d // heads).permute(1, 0, 2)
               for y in qkv(ln1(x)).chunk(3, dim=-1)]
    a = q.scaled_dot_product_attention(k, v, is_causal=True).permute(1, 0, 2).reshape(t, d)
    x = x + proj(a)
    x = x + fc2(fc1(ln2(x)).gelu())
  loss = x.square().mean()
  loss.backward()
  return [loss, *[p.grad for p in params]]
