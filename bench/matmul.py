"""Matmul kernel time: the heuristics' compiled kernel for a @ b alone (no realize, no Python
around the launch) against numpy's a @ b, measured in one run.

  python bench/matmul.py [--sizes 256 512 1024 2048] [--targets native avx2] [--cpu-time]

Square float32 matmuls. The kernel is launched directly (`get_runner(kernel).program`) on
buffers of random values, so the time is the C kernel's (with THREADS>1 its thread pool's); the
name shows its opts' axes. --cpu-time and --targets work as in bench/kernels.py (one thread each,
the calling thread's CPU time; each target ISA in its own process, numpy's OpenBLAS held to AVX2
for avx2).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from common import CLOCK, row
from kernels import TARGETS

from unigrad import Tensor
from unigrad.engine.programs import get_runner
from unigrad.knobs import THREADS
from unigrad.runtime.device import Buffer
from unigrad.uop import Ops


def kernel_time(n: int, repeat: int) -> tuple[str, float]:
  """The best of `repeat` launches of the kernel of a @ b (n x n, float32), and its name."""
  call = next(c for c in (Tensor.empty(n, n) @ Tensor.empty(n, n)).schedule().src
              if c.src[0].op_in_backward_slice_with_self(Ops.REDUCE))
  runner = get_runner(call.src[0], "CPU")
  params = sorted((u for u in call.src[0].toposort() if u.op is Ops.PARAM and u.arg.name is None),
                  key=lambda p: p.arg.slot)
  rng = np.random.default_rng(0)
  bufs = [Buffer("CPU", p.shape[0], p.dtype).copyin(
    rng.standard_normal(p.shape[0], dtype=np.float32).tobytes()) for p in params]
  best = float("inf")
  for _ in range(repeat + 1):
    t0 = CLOCK[0]()
    runner.program(*bufs, global_size=runner.global_size)
    best = min(best, CLOCK[0]() - t0)
  return runner.name, best


def numpy_time(n: int, repeat: int) -> float:
  rng = np.random.default_rng(0)
  a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  a @ b
  best = float("inf")
  for _ in range(repeat):
    t0 = CLOCK[0]()
    a @ b
    best = min(best, CLOCK[0]() - t0)
  return best


def run_targets(targets: list[str]) -> None:
  """This script once per target ISA, each in a process with that target's environment."""
  rest = [a for a in sys.argv[1:] if a != "--targets" and a not in TARGETS]
  for name in targets:
    march, coretype = TARGETS[name]
    env = {**os.environ, "MARCH": march, **({"OPENBLAS_CORETYPE": coretype} if coretype else {})}
    print(f"== target {name}: MARCH={march}", flush=True)
    subprocess.run([sys.executable, __file__, *rest], env=env, check=True)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
  p.add_argument("--repeat", type=int, default=5)
  p.add_argument("--targets", nargs="+", choices=list(TARGETS), default=None)
  p.add_argument("--cpu-time", action="store_true", help="one thread, the thread's CPU time")
  args = p.parse_args()
  if args.targets: return run_targets(args.targets)
  if args.cpu_time:
    if THREADS.value != 1 or os.environ.get("OPENBLAS_NUM_THREADS") != "1":
      raise SystemExit("--cpu-time needs THREADS=1 OPENBLAS_NUM_THREADS=1 (one thread each)")
    CLOCK[0] = time.thread_time
  for n in args.sizes:
    repeat = args.repeat if n >= 1024 else 4 * args.repeat
    name, ours = kernel_time(n, repeat)
    time.sleep(0.25)  # the pool's threads stop spinning before numpy runs
    theirs = numpy_time(n, repeat)
    row(f"matmul {n}", ours, {"numpy": theirs})
    print(f"  {name}: {2 * n ** 3 / ours * 1e-9:.1f} GFLOPS", flush=True)


if __name__ == "__main__":
  sys.exit(main())
