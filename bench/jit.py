"""TinyJit replay overhead: a function of 10 small kernels, eager vs replayed, per kernel.

  python bench/jit.py [--kernels 10] [--repeat 200]

Each kernel adds 1 to a 16-element tensor and materializes it (`contiguous`), so the kernels
themselves take well under a microsecond and the time is overhead: graph building, scheduling
and Python for an eager call; only the launches for a replay. PyTorch eager runs the same ops.
"""
from __future__ import annotations

import argparse

from common import median_of, try_torch

from unigrad import Tensor, TinyJit


def chain(x: Tensor, n: int) -> Tensor:
  for _ in range(n): x = (x + 1.0).contiguous()
  return x


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--kernels", type=int, default=10)
  p.add_argument("--repeat", type=int, default=200)
  args = p.parse_args()
  n = args.kernels
  x = Tensor.zeros(16).contiguous().realize()
  jitted = TinyJit(lambda t: chain(t, n))
  jitted(x), jitted(x)
  assert jitted.captured is not None and jitted.captured.kernel_count == n, "not one kernel each"
  eager = median_of(lambda: chain(x, n).realize(), args.repeat)
  replay = median_of(lambda: jitted(x), args.repeat)
  print(f"{n}-kernel function of tiny tensors, median per call:")
  print(f"  unigrad eager     {eager * 1e6:9.1f} us  ({eager / n * 1e6:7.2f} us/kernel)")
  print(f"  unigrad TinyJit   {replay * 1e6:9.1f} us  ({replay / n * 1e6:7.2f} us/kernel)")
  torch = try_torch()
  if torch is not None:
    tx = torch.zeros(16)
    def tchain() -> None:
      y = tx
      for _ in range(n): y = (y + 1.0).contiguous()
    t = median_of(tchain, args.repeat)
    print(f"  torch eager       {t * 1e6:9.1f} us  ({t / n * 1e6:7.2f} us/op)   "
          f"TinyJit ratio x{t / replay:.2f}")


if __name__ == "__main__": main()
