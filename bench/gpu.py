"""GPU-backend benchmark: matmul (float32, float16), softmax and layernorm on CUDA or CL against
PyTorch in the same run.

  python bench/gpu.py [--device CUDA|CL] [--n N] [--repeat R]

The device defaults to CUDA when a GPU is present, else CL; PyTorch runs on CUDA when the device
is CUDA (and torch sees a GPU), else on the CPU with every core. Each timing includes the launch
and waits for the device (`synchronize`). Ratios > 1 mean unigrad is faster. On PoCL (CL on the
CPU) the numbers only show that the path works; the issue's targets are for CUDA on H100/H200.
"""
from __future__ import annotations

import argparse

import numpy as np
from common import best_of, row, try_torch

from unigrad import Tensor, dtypes
from unigrad.runtime.device import Device


def main() -> None:
  gpu = Device.device_class("CUDA").is_available()
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--device", default="CUDA" if gpu else "CL")
  p.add_argument("--n", type=int, default=4096 if gpu else 512)
  p.add_argument("--repeat", type=int, default=5)
  args = p.parse_args()
  dev, n = Device[args.device], args.n
  torch = try_torch()
  tdev = "cuda" if args.device.startswith("CUDA") and torch and torch.cuda.is_available() else "cpu"
  print(f"unigrad on {dev.name} ({type(dev.renderer).__name__}), torch on {tdev}, n={n}")
  x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  y = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)

  def ours(fn):
    def run():
      fn().realize()
      dev.synchronize()
    return run

  def theirs(fn):
    def run():
      fn()
      if tdev == "cuda": torch.cuda.synchronize()
    return run

  a, b = Tensor(x, device=dev.name).realize(), Tensor(y, device=dev.name).realize()
  ah, bh = a.cast(dtypes.float16).realize(), b.cast(dtypes.float16).realize()
  ta = torch.from_numpy(x).to(tdev) if torch else None
  tb = torch.from_numpy(y).to(tdev) if torch else None
  half = torch.float16 if tdev == "cuda" else torch.float32 if torch else None
  th, tbh = (ta.to(half), tb.to(half)) if torch else (None, None)
  cases = [
    (f"matmul {n} float32", lambda: a @ b, lambda: ta @ tb),
    (f"matmul {n} float16", lambda: ah @ bh, lambda: th @ tbh),
    (f"softmax ({n}, {n})", lambda: a.softmax(-1), lambda: ta.softmax(-1)),
    (f"layernorm ({n}, {n})", lambda: a.layernorm(), lambda: torch.nn.functional.layer_norm(
      ta, (n,))),
  ]
  for name, mine, ref in cases:
    peers = {f"torch {tdev}": best_of(theirs(ref), args.repeat)} if torch else {}
    row(name, best_of(ours(mine), args.repeat), peers)


if __name__ == "__main__":
  main()
