"""Symbolic shapes: run `x[:n] @ w` and `(x[:n] * 2).sum(0)` for n = 1..N, once with a bound
Variable (each kernel compiled once for every n) and once with static slices (compiled per n),
in fresh processes' worth of caches (the program and schedule caches are cleared, the disk cache
is off). Prints the first-pass time of each (compiles included), the number of programs
compiled, and a warm pass per n against numpy.

  CACHELEVEL=0 python bench/symbolic.py [N]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from unigrad import Tensor, Variable
from unigrad.engine import entry, execute, programs


def run_pass(x: Tensor, w: Tensor, sizes: range, symbolic: bool) -> None:
  n = Variable("n", 1, sizes.stop - 1)
  for v in sizes:
    k = n.bind(v) if symbolic else v
    Tensor.realize_all(x[:k] @ w, (x[:k] * 2).sum(axis=0))


def first_pass(x: Tensor, w: Tensor, sizes: range, symbolic: bool) -> tuple[float, int]:
  execute.forget_programs()
  entry.schedule_cache.clear()
  t0 = time.perf_counter()
  run_pass(x, w, sizes, symbolic)
  return time.perf_counter() - t0, len(programs.programs.runners)


def main() -> None:
  top = int(sys.argv[1]) if len(sys.argv) > 1 else 64
  rng = np.random.default_rng(0)
  xs, ws = rng.standard_normal((top, 256), np.float32), rng.standard_normal((256, 64), np.float32)
  x, w = Tensor(xs).realize(), Tensor(ws).realize()
  sizes = range(1, top + 1)
  for symbolic in (True, False):
    name = "Variable n" if symbolic else "static n"
    t, programs = first_pass(x, w, sizes, symbolic)
    t0 = time.perf_counter()
    run_pass(x, w, sizes, symbolic)
    warm = time.perf_counter() - t0
    print(f"{name:11s} first pass {t * 1e3:9.1f} ms ({programs:3d} programs compiled), "
          f"warm pass {warm * 1e3:7.1f} ms")
  t0 = time.perf_counter()
  for v in sizes: (xs[:v] @ ws, (xs[:v] * 2).sum(0))
  print(f"numpy       warm pass {(time.perf_counter() - t0) * 1e3:7.1f} ms")


if __name__ == "__main__":
  main()
