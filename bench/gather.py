"""Gather benchmark: unigrad's one-hot gather (compiled to a direct indexed load) vs numpy fancy
indexing (and PyTorch when installed).

  python bench/gather.py [--n 1048576] [--k 1048576] [--repeat 20]

Reads n random int64 indices into a float32 table of k rows, three ways: `x[idx]` (1-D table),
`x.gather(0, idx)` and `x[idx]` on a (k, 4) table (rows of 4). Prints the best time of each
library and the ratio (>1 means unigrad is faster). unigrad's time is the whole call: building the
graph, the range check of the realized index on the host, the schedule-cache lookup and the kernel.
"""
from __future__ import annotations

import argparse

import numpy as np

from common import best_of, row, try_torch

from unigrad import Tensor


def bench_table(x_np: np.ndarray, idx_np: np.ndarray, repeat: int, torch) -> None:
  """x[idx] (and gather for a 1-D table) against numpy and torch."""
  x, idx = Tensor(x_np).realize(), Tensor(idx_np).realize()
  assert np.array_equal(x[idx].numpy(), x_np[idx_np]), "wrong result"
  theirs = {"numpy": best_of(lambda: x_np[idx_np], repeat)}
  xt, it = (torch.from_numpy(x_np), torch.from_numpy(idx_np)) if torch else (None, None)
  if torch: theirs["torch"] = best_of(lambda: xt[it], repeat)
  row(f"x[idx] x:{x_np.shape}", best_of(lambda: x[idx].realize(), repeat), theirs)
  if x_np.ndim != 1: return
  assert np.array_equal(x.gather(0, idx).numpy(), x_np[idx_np]), "wrong result"
  if torch: theirs["torch"] = best_of(lambda: torch.gather(xt, 0, it), repeat)
  row(f"gather(0, idx) x:{x_np.shape}", best_of(lambda: x.gather(0, idx).realize(), repeat), theirs)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=1 << 20, help="number of indices")
  ap.add_argument("--k", type=int, default=1 << 20, help="rows in the table")
  ap.add_argument("--repeat", type=int, default=20)
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  idx_np = rng.integers(0, args.k, args.n, dtype=np.int64)
  torch = try_torch()
  print(f"gather of {args.n} indices from {args.k} rows (ratio > 1: unigrad is faster)")
  for shape in ((args.k,), (args.k, 4)):
    bench_table(rng.standard_normal(shape, dtype=np.float32), idx_np, args.repeat, torch)


if __name__ == "__main__":
  main()
