"""Pipeline benchmark: unigrad vs numpy (and PyTorch when installed), measured in one run.

  python bench/pipeline.py [--n 16777216] [--repeat 10]

Prints, per workload, the best time of each library and the ratio (>1 means unigrad is faster):
- a fused elementwise chain relu(a*b+c) and exp(a*b+c) on n float32;
- sum of n float32;
- first-call latency of a small op with a cold and a warm compile cache;
- time spent in schedule + codegen per kernel (the compiler's own overhead).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from common import best_of, row, try_torch

from unigrad import Tensor
from unigrad.codegen.pipeline import full_rewrite
from unigrad.engine import entry
from unigrad.renderer.cstyle import CRenderer


def bench_elementwise(n: int, repeat: int) -> None:
  rng = np.random.default_rng(0)
  na, nb, nc = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
  a, b, c = Tensor(na).realize(), Tensor(nb).realize(), Tensor(nc).realize()
  torch = try_torch()
  for name, ours_fn, np_fn, t_fn in [
    ("relu(a*b+c)", lambda: (a * b + c).relu(), lambda: np.maximum(na * nb + nc, 0),
     lambda ta, tb, tc: torch.relu(ta * tb + tc)),
    ("exp(a*b+c)", lambda: (a * b + c).exp(), lambda: np.exp(na * nb + nc),
     lambda ta, tb, tc: torch.exp(ta * tb + tc)),
    ("sum", lambda: a.sum(), lambda: na.sum(), lambda ta, tb, tc: ta.sum()),
  ]:
    ref = np_fn()
    got = ours_fn().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max())))
    ours = best_of(lambda f=ours_fn: f().realize(), repeat)
    theirs = {"numpy": best_of(np_fn, repeat)}
    if torch is not None:
      ta, tb, tc = (torch.from_numpy(x) for x in (na, nb, nc))
      theirs["torch"] = best_of(lambda f=t_fn, a=ta, b=tb, c=tc: f(a, b, c), repeat)
    row(f"{name} n={n}", ours, theirs)


FIRST_CALL = """
import time, sys
t0 = time.perf_counter()
from unigrad import Tensor
t1 = time.perf_counter()
(Tensor([1.0, 2.0, 3.0]) * 3 + 1).realize()
t2 = time.perf_counter()
print(f"{t1 - t0:.6f} {t2 - t1:.6f}")
"""


def bench_first_call() -> None:
  with tempfile.TemporaryDirectory() as cache:
    env = {**os.environ, "CACHEDIR": cache}
    for label in ("cold cache", "warm cache"):
      out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env,
                           capture_output=True, text=True, check=True)
      imp, first = map(float, out.stdout.split())
      print(f"first call ({label}): import {imp * 1e3:8.2f} ms, "
            f"first small op {first * 1e3:8.2f} ms")


def bench_compile_overhead(repeat: int) -> None:
  """Schedule + codegen (no C compile) per kernel, for a few typical graphs."""
  x = Tensor.empty(64, 64)
  shifted = x - x.max(1, keepdim=True)
  graphs = {"elementwise": (x * 2 + 1).relu(), "reduce": (x + 1).sum(1),
            "softmax": shifted.exp() / shifted.exp().sum(1, keepdim=True),
            "matmul": x @ x}
  ren = CRenderer()
  for name, t in graphs.items():
    def run(t: Tensor = t) -> int:
      entry.schedule_cache.clear()
      lin = t.schedule()
      for call in lin.src: full_rewrite(call.src[0], ren)
      return len(lin.src)
    k = run()
    tm = best_of(run, repeat)
    print(f"schedule+codegen {name:12s} {k} kernel(s): {tm / k * 1e3:8.3f} ms per kernel")


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--n", type=int, default=1 << 24)
  p.add_argument("--repeat", type=int, default=10)
  args = p.parse_args()
  bench_elementwise(args.n, args.repeat)
  bench_first_call()
  bench_compile_overhead(args.repeat)


if __name__ == "__main__":
  main()
