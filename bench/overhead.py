"""Eager overhead: a chain of small elementwise ops on a tiny tensor, unigrad vs PyTorch eager.

  python bench/overhead.py [--ops 200] [--repeat 5] [--profile once|each] [--cpu-time]

`x = Tensor.ones(4).contiguous().realize(); for _ in range(ops): x = x * 1.0001 + 0.5` then
`x.realize()` ("once": graph building, one schedule-cache hit, one launch), and the variant that
realizes after every step ("each": a realize per step). Prints microseconds per step (two tensor
ops) for each variant and for PyTorch (the same steps, eager), and the ratio (>1: unigrad faster).
`--profile` prints cProfile's top entries for one run of a variant (where the time goes);
`--cpu-time` times by the thread's CPU time (THREADS=1: a loaded machine's preemption does not
count).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from common import CLOCK, best_of, try_torch

from unigrad import Tensor
from unigrad.runtime.ops_cpu import cpu_threads


def chain(ops: int, each: bool) -> Tensor:
  x = Tensor.ones(4).contiguous().realize()
  for _ in range(ops):
    x = x * 1.0001 + 0.5
    if each: x.realize()
  return x.realize()


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--ops", type=int, default=200)
  p.add_argument("--repeat", type=int, default=5)
  p.add_argument("--profile", choices=["once", "each"])
  p.add_argument("--cpu-time", action="store_true", help="time by the thread's CPU time "
                 "(needs THREADS=1)")
  args = p.parse_args()
  if args.cpu_time:
    if cpu_threads() != 1: raise SystemExit("--cpu-time needs THREADS=1")
    CLOCK[0] = time.thread_time
  want = 1.0
  for _ in range(args.ops): want = want * 1.0001 + 0.5
  assert abs(chain(args.ops, False).tolist()[0] - want) < 1e-3 * want
  torch = try_torch()
  theirs = None
  if torch is not None:
    torch.set_num_threads(1)
    def torch_chain() -> object:
      x = torch.ones(4)
      for _ in range(args.ops): x = x * 1.0001 + 0.5
      return x
    theirs = best_of(torch_chain, args.repeat) / args.ops
  for each in (False, True):
    ours = best_of(lambda e=each: chain(args.ops, e), args.repeat) / args.ops
    name = "realize each step" if each else "realize once"
    line = f"{name:18s} unigrad {ours * 1e6:8.1f} us/step"
    if theirs is not None:
      line += f"  torch eager {theirs * 1e6:6.1f} us/step  ratio {theirs / ours:6.3f}"
    print(line)
  if args.profile:
    prof = cProfile.Profile()
    prof.enable()
    chain(args.ops, args.profile == "each")
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
  main()
