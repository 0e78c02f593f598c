"""First-call cost of a small transformer in a fresh process: cold vs warm on-disk caches.

  python bench/compile_cache.py [--layers 2] [--profile]

Runs the same program (a transformer block stack: attention, layernorm, MLP, loss, backward)
in fresh subprocesses sharing one temporary cache directory: a cold cache, a warm cache,
`CACHELEVEL=1` on the warm cache (compiled binaries only: the behaviour before schedules and
kernels were cached) and `CACHELEVEL=0` (no disk caches at all). Each run prints the import
time, the graph-building time and the time of the first realize (schedule + codegen + C compile
+ run; of it, the time spent finding and decoding disk cache hits), and the count of schedule and
codegen disk cache misses.
`--profile` prints the warm run's top cProfile entries (where the first call's time goes).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = """
import cProfile, pstats, sys, time
sys.path.insert(0, {bench_dir!r})
from common import make_transformer, transformer_loss
t0 = time.perf_counter()
from unigrad import Tensor
from unigrad.engine import compcache
t1 = time.perf_counter()
model = make_transformer({layers})
prof = cProfile.Profile() if {profile} else None
t2 = time.perf_counter()
if prof: prof.enable()
outs = transformer_loss(*model)
t3 = time.perf_counter()
Tensor.realize(*outs)
t4 = time.perf_counter()
if prof:
  prof.disable()
  pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
s = compcache.stats
print(f"{{t1 - t0:.4f}} {{t3 - t2:.4f}} {{t4 - t3:.4f}} {{s.lookup_s:.4f}} {{s.schedule_misses}} "
      f"{{s.kernel_misses}} {{outs[0].item():.6f}}")
"""


def run(label: str, cache: str, layers: int, profile: bool, extra: dict[str, str]) -> str:
  env = {**os.environ, "CACHEDIR": cache, **extra}
  code = CHILD.format(layers=layers, profile=profile, bench_dir=os.path.dirname(__file__))
  out = subprocess.run([sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, check=True)
  imp, build, first, lookup, smiss, kmiss, loss = out.stdout.split()
  print(f"{label:20s} import {float(imp) * 1e3:6.0f} ms  build graph {float(build) * 1e3:6.1f} ms"
        f"  first realize {float(first) * 1e3:8.1f} ms"
        f" (cache lookups {float(lookup) * 1e3:6.1f} ms)"
        f"  misses: schedule {smiss}, kernel {kmiss}  loss {loss}")
  if profile: print(out.stderr)
  return loss


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--profile", action="store_true")
  args = p.parse_args()
  with tempfile.TemporaryDirectory() as cache:
    losses = {run("cold cache", cache, args.layers, False, {}),
              run("warm cache", cache, args.layers, args.profile, {}),
              run("warm, CACHELEVEL=1", cache, args.layers, False, {"CACHELEVEL": "1"}),
              run("CACHELEVEL=0", cache, args.layers, False, {"CACHELEVEL": "0"})}
  assert len(losses) == 1, f"the runs disagree: {losses}"


if __name__ == "__main__":
  main()
