"""Matmul speed by operand layout: each case against the contiguous `a @ b` of the same shape,
measured in the same run (and numpy's time for the case, for scale).

  python bench/matmul_layout.py [--sizes 256 512 1024] [--rounds 3] [--cpu-time]

`x @ W.T` is PyTorch's Linear layout (W stored (out, in)); `a.T @ b` reads the reduce axis of a
with a stride; batched and broadcast cases run 8 matrices of half the size. "vs contiguous" is
t(contiguous) / t(case): 1.00 means as fast, below 0.87 is more than 15% slower. Each case is the
fastest of `--rounds` interleaved rounds (the machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
from common import CLOCK, best_of

from unigrad import Tensor
from unigrad.knobs import THREADS


def rand(*shape: int) -> np.ndarray:
  return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)


Case = tuple[str, str, Callable[[], Tensor], Callable[[], np.ndarray]]


def cases(n: int) -> list[Case]:
  """(name, the contiguous case it is compared with, unigrad fn, numpy fn)."""
  a, b, h = rand(n, n), rand(n, n), n // 2
  ba, bb, w = rand(8, h, h), rand(8, h, h), rand(h, h)
  ta, tb, tba, tbb, tw = (Tensor(v).realize() for v in (a, b, ba, bb, w))
  bt = np.ascontiguousarray(b.T)
  return [
    (f"a @ b {n}", "", lambda: ta @ tb, lambda: a @ b),
    (f"a @ b.T {n}", f"a @ b {n}", lambda: ta @ tb.T, lambda: a @ b.T),
    (f"a.T @ b {n}", f"a @ b {n}", lambda: ta.T @ tb, lambda: a.T @ b),
    (f"a.T @ b.T {n}", f"a @ b {n}", lambda: ta.T @ tb.T, lambda: a.T @ bt),
    (f"8x{h} batched", "", lambda: tba @ tbb, lambda: ba @ bb),
    (f"8x{h} batched @ .T", f"8x{h} batched", lambda: tba @ tbb.transpose(-1, -2),
     lambda: ba @ bb.transpose(0, 2, 1)),
    (f"8x{h} broadcast", f"8x{h} batched", lambda: tba @ tw, lambda: ba @ w),
    (f"8x{h} broadcast @ W.T", f"8x{h} batched", lambda: tba @ tw.T, lambda: ba @ w.T),
  ]


def linear_cases() -> list[Case]:
  """all-MiniLM-L6-v2's FFN up-projection: x (8*32, 384) @ W.T, W (1536, 384)."""
  x, w = rand(256, 384), rand(1536, 384)
  wt = np.ascontiguousarray(w.T)
  tx, tw, twt = (Tensor(v).realize() for v in (x, w, wt))
  return [("linear x @ Wt (in,out)", "", lambda: tx @ twt, lambda: x @ wt),
          ("linear x @ W.T (out,in)", "linear x @ Wt (in,out)", lambda: tx @ tw.T,
           lambda: x @ w.T)]


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeat", type=int, default=5)
  p.add_argument("--cpu-time", action="store_true", help="time by the calling thread's CPU "
                 "time; needs THREADS=1 OPENBLAS_NUM_THREADS=1 (see bench/kernels.py)")
  args = p.parse_args()
  if args.cpu_time:
    if THREADS.value != 1 or os.environ.get("OPENBLAS_NUM_THREADS") != "1":
      raise SystemExit("--cpu-time needs THREADS=1 OPENBLAS_NUM_THREADS=1 (one thread each)")
    CLOCK[0] = time.thread_time
  table = [c for n in args.sizes for c in cases(n)] + linear_cases()
  ours: dict[str, float] = {}
  theirs: dict[str, float] = {}
  for _ in range(args.rounds):
    for name, _, fn, np_fn in table:
      t = best_of(lambda fn=fn: fn().realize(), args.repeat)
      ours[name] = min(ours.get(name, t), t)
      t = best_of(np_fn, args.repeat)
      theirs[name] = min(theirs.get(name, t), t)
  for name, base, _, _ in table:
    vs = f"vs contiguous x{ours[base] / ours[name]:5.2f}" if base else " " * 19
    print(f"{name:28s} unigrad {ours[name] * 1e3:8.3f} ms  {vs}  "
          f"numpy {theirs[name] * 1e3:8.3f} ms (x{theirs[name] / ours[name]:5.2f})")


if __name__ == "__main__":
  main()
