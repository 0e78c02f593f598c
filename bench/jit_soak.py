"""TinyJit soak: thousands of jitted training steps must run in flat memory.

  python bench/jit_soak.py [--steps 2000] [--warmup 200] [--every 200] [--bound-mb 8]

An MLP (64-32-10, Adam, dropout) trained through TinyJit on random batches gathered from a
dataset tensor, `step(X[idx], Y[idx])`, reading the loss every step: the usual training loop.
Prints the resident memory (RSS) and the live Tensors and device Buffers every `--every` steps;
exits with status 1 if, after the warm-up, RSS grew by more than `--bound-mb` MiB or the number
of live Tensors or Buffers grew at all (a replay that kept anything per step).
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from unigrad import Tensor, TinyJit, nn
from unigrad.nn.state import get_parameters
from unigrad.runtime.device import Buffer


@dataclass(frozen=True)
class Sample:
  """Memory after `step` steps: RSS in bytes, live Tensors, live device Buffers."""
  step: int
  rss: int
  tensors: int
  buffers: int


def rss_bytes() -> int:
  """The process's resident memory now (Linux), else its peak so far."""
  try:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sample(step: int) -> Sample:
  gc.collect()
  kinds = [type(o) for o in gc.get_objects()]  # (isinstance would ask some objects' __class__)
  return Sample(step, rss_bytes(), sum(issubclass(k, Tensor) for k in kinds),
                sum(issubclass(k, Buffer) for k in kinds))


def training_step() -> Callable[[], float]:
  """One jitted training step on a new random batch; returns its loss."""
  Tensor.manual_seed(0)
  rng = np.random.default_rng(0)
  X = Tensor(rng.random((512, 64), dtype=np.float32)).realize()
  Y = Tensor(rng.integers(0, 10, 512).astype(np.int32)).realize()
  model = [nn.Linear(64, 32), nn.Linear(32, 10)]
  opt = nn.optim.Adam(get_parameters(model), lr=1e-3)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model[1](model[0](x).relu().dropout(0.1)).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    return loss

  def run() -> float:
    idx = Tensor.randint(0, 512, (32,))
    with Tensor.train(): return step(X[idx], Y[idx]).item()
  return run


def soak(steps: int, warmup: int, every: int, log: Callable[[Sample], None]) -> list[Sample]:
  """Samples of memory at `warmup` and every `every` steps after it, up to `steps`."""
  run = training_step()
  samples = []
  for i in range(1, steps + 1):
    run()
    if i >= warmup and (i - warmup) % every == 0 or i == steps:
      samples.append(sample(i))
      log(samples[-1])
  return samples


def growth(samples: list[Sample], bound_mb: float) -> str | None:
  """What grew after the first sample, or None if memory stayed flat."""
  first, last = samples[0], max(samples, key=lambda s: s.rss)
  if last.rss - first.rss > bound_mb * 2**20:
    return f"RSS grew {(last.rss - first.rss) / 2**20:.1f} MiB (bound {bound_mb} MiB)"
  if (t := max(s.tensors for s in samples)) > first.tensors:
    return f"live Tensors grew from {first.tensors} to {t}"
  if (b := max(s.buffers for s in samples)) > first.buffers:
    return f"live Buffers grew from {first.buffers} to {b}"
  return None


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--warmup", type=int, default=200)
  p.add_argument("--every", type=int, default=200)
  p.add_argument("--bound-mb", type=float, default=8.0)
  args = p.parse_args()

  def log(s: Sample) -> None:
    print(f"step {s.step:6d}  RSS {s.rss / 2**20:8.1f} MiB  tensors {s.tensors:6d}  "
          f"buffers {s.buffers:6d}", flush=True)
  samples = soak(args.steps, args.warmup, args.every, log)
  if (why := growth(samples, args.bound_mb)) is not None:
    print(f"FAIL: {why}")
    return 1
  print("memory flat")
  return 0


if __name__ == "__main__":
  sys.exit(main())
