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


def best_of(fn: Callable[[], object], repeat: int) -> float:
  """The fastest of `repeat` runs of `fn`, after the previous measurement's spinning threads
  have gone to sleep and one warm-up run."""
  time.sleep(SETTLE_S)
  fn()
  times = []
  clock = CLOCK[0]
  for _ in range(repeat):
    t0 = clock()
    fn()
    times.append(clock() - t0)
  return min(times)


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
