"""Kernel benchmark: the CPU backend's generated code vs numpy and PyTorch, measured in one run.

  python bench/kernels.py [--quick] [--beam N] [--targets native avx2] [--cpu-time]

matmul (256..2048, float32), batched matmul, conv2d (batch 16, 64->64, 3x3, 56x56), softmax and
layernorm over (4096, 4096), an elementwise chain and a sum; with --beam, BEAM's search time for
the 1024 matmul. Ratios > 1 mean unigrad is faster. Inputs are realized first; each timing
includes the launch (the schedule and program caches are warm).

--targets runs the table once per target ISA, each in a fresh process: `native` (the MARCH knob's
default) and `avx2` (MARCH=x86-64-v3, as on an AVX2-only machine; numpy's OpenBLAS is held to its
AVX2 kernels too, OPENBLAS_CORETYPE=Haswell, so both sides run the same ISA).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from common import CLOCK, best_of, row, try_torch

from unigrad import Context, Tensor
from unigrad.knobs import THREADS


def case(name: str, ours, np_fn, torch_fn, repeat: int) -> None:
  theirs = {}
  if np_fn is not None: theirs["numpy"] = best_of(np_fn, repeat)
  if torch_fn is not None: theirs["torch"] = best_of(torch_fn, repeat)
  row(name, best_of(lambda: ours().realize(), repeat), theirs)


def rand(*shape: int) -> np.ndarray:
  return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)


def matmuls(torch, sizes: list[int], repeat: int) -> None:
  for n in sizes:
    a, b = rand(n, n), rand(n, n)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    xa, xb = (torch.from_numpy(a), torch.from_numpy(b)) if torch else (None, None)
    case(f"matmul {n}", lambda ta=ta, tb=tb: ta @ tb, lambda a=a, b=b: a @ b,
         (lambda xa=xa, xb=xb: xa @ xb) if torch else None, repeat)
  a, b = rand(8, 256, 256), rand(8, 256, 256)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  xa, xb = (torch.from_numpy(a), torch.from_numpy(b)) if torch else (None, None)
  tfn = (lambda: xa @ xb) if torch else None
  case("batched matmul 8x256", lambda: ta @ tb, lambda: a @ b, tfn, repeat)


def conv(torch, repeat: int, quick: bool) -> None:
  shape = (2, 64, 28, 28) if quick else (16, 64, 56, 56)
  x, w = rand(*shape), rand(64, 64, 3, 3)
  tx, tw = Tensor(x).realize(), Tensor(w).realize()
  xt, wt = (torch.from_numpy(x), torch.from_numpy(w)) if torch else (None, None)
  tf = (lambda: torch.nn.functional.conv2d(xt, wt, padding=1)) if torch else None
  case(f"conv2d {shape} 3x3", lambda: tx.conv2d(tw, padding=1), None, tf, repeat)


def rowwise(torch, repeat: int, quick: bool) -> None:
  n = 1024 if quick else 4096
  x = rand(n, n)
  tx = Tensor(x).realize()
  xt = torch.from_numpy(x) if torch else None
  tfn = (lambda: xt.softmax(-1)) if torch else None
  case(f"softmax ({n},{n})", lambda: tx.softmax(-1), None, tfn, repeat)
  case(f"layernorm ({n},{n})", lambda: tx.layernorm(), None,
       (lambda: torch.nn.functional.layer_norm(xt, (n,))) if torch else None, repeat)


def elementwise(torch, repeat: int, quick: bool) -> None:
  n = 1 << (20 if quick else 24)
  a, b, c = rand(n), rand(n), rand(n)
  ta, tb, tc = (Tensor(v).realize() for v in (a, b, c))
  xa, xb, xc = (torch.from_numpy(v) for v in (a, b, c)) if torch else (None,) * 3
  case(f"relu(a*b+c) n={n}", lambda: (ta * tb + tc).relu(), lambda: np.maximum(a * b + c, 0),
       (lambda: torch.relu(xa * xb + xc)) if torch else None, repeat)
  case(f"exp(a*b+c) n={n}", lambda: (ta * tb + tc).exp(), lambda: np.exp(a * b + c),
       (lambda: torch.exp(xa * xb + xc)) if torch else None, repeat)
  tfn = (lambda: xa.sum()) if torch else None
  case(f"sum n={n}", lambda: ta.sum(), lambda: a.sum(), tfn, repeat)


def beam_time(width: int) -> None:
  """matmul 1024 with the heuristics' opts, BEAM's search time, and matmul 1024 with BEAM's
  choice, each against numpy's a @ b measured in the same run."""
  x, y = rand(1024, 1024), rand(1024, 1024)
  a, b = Tensor(x).realize(), Tensor(y).realize()
  theirs = {"numpy": best_of(lambda: x @ y, 5)}
  row("matmul 1024 heuristic", best_of(lambda: (a @ b).realize(), 5), theirs)
  with Context(BEAM=width, CACHELEVEL=0):
    t0 = time.perf_counter()
    (a @ b).realize()
    search = time.perf_counter() - t0
    t = best_of(lambda: (a @ b).realize(), 5)
  print(f"BEAM={width} search + compile for matmul 1024: {search:.1f} s")
  row(f"matmul 1024 BEAM={width}", t, {"numpy": best_of(lambda: x @ y, 5)})


# target name -> (MARCH, OPENBLAS_CORETYPE for numpy; None keeps OpenBLAS's own choice)
TARGETS = {"native": ("native", None), "avx2": ("x86-64-v3", "Haswell")}


def run_targets(targets: list[str]) -> None:
  """This script once per target, each in a process with that target's environment."""
  rest = [a for a in sys.argv[1:] if a != "--targets" and a not in TARGETS]
  for name in targets:
    march, coretype = TARGETS[name]
    env = {**os.environ, "MARCH": march}
    if coretype: env["OPENBLAS_CORETYPE"] = coretype
    print(f"== target {name}: MARCH={march}"
          + (f" OPENBLAS_CORETYPE={coretype}" if coretype else ""), flush=True)
    subprocess.run([sys.executable, __file__, *rest], env=env, check=True)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
  p.add_argument("--beam", type=int, default=0)
  p.add_argument("--repeat", type=int, default=5)
  p.add_argument("--targets", nargs="+", choices=list(TARGETS), default=None,
                 help="run the table for each target ISA (native, avx2), each in its own process")
  p.add_argument("--cpu-time", action="store_true",
                 help="time by the calling thread's CPU time, every library on one thread (a "
                      "loaded machine's preemption inflates wall times); needs THREADS=1 "
                      "OPENBLAS_NUM_THREADS=1")
  args = p.parse_args()
  if args.targets: return run_targets(args.targets)
  torch = try_torch()
  if args.cpu_time:
    if THREADS.value != 1 or os.environ.get("OPENBLAS_NUM_THREADS") != "1":
      raise SystemExit("--cpu-time needs THREADS=1 OPENBLAS_NUM_THREADS=1 (one thread each)")
    CLOCK[0] = time.thread_time
    if torch is not None: torch.set_num_threads(1)
  matmuls(torch, [256, 512] if args.quick else [256, 512, 1024, 2048], args.repeat)
  conv(torch, args.repeat, args.quick)
  rowwise(torch, args.repeat, args.quick)
  elementwise(torch, args.repeat, args.quick)
  if args.beam: beam_time(args.beam)


if __name__ == "__main__":
  main()
