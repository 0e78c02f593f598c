"""Gather and scatter benchmark: unigrad's one-hot gather (compiled to a direct indexed load) and
one-hot scatters (compiled to direct stores) vs numpy (and PyTorch when installed).

  python bench/gather.py [--n 1048576] [--k 1048576] [--repeat 20]

Reads n random int64 indices into a float32 table of k rows, three ways: `x[idx]` (1-D table),
`x.gather(0, idx)` and `x[idx]` on a (k, 4) table (rows of 4). Then writes n float32 sources
into k targets by the same indices (many repeat when n >= k): `scatter` (the last source wins;
numpy `np.put`), `scatter_reduce` 'sum' and 'amax' (numpy `np.add.at`, `np.maximum.at`) and
`x[idx] = src` (in place; numpy fancy assignment). Prints the best time of each library and the
ratio (>1 means unigrad is faster). unigrad's time is the whole call: building the graph, the
range check of the realized index on the host, the schedule-cache lookup and the kernels.
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


def _numpy_scatter(x: np.ndarray, idx: np.ndarray, src: np.ndarray, how: str) -> np.ndarray:
  out = x.copy()
  if how == "scatter": np.put(out, idx, src)
  elif how == "sum": np.add.at(out, idx, src)
  else: np.maximum.at(out, idx, src)
  return out


def bench_scatter(x_np: np.ndarray, idx_np: np.ndarray, src_np: np.ndarray, repeat: int,
                  torch) -> None:
  """scatter and scatter_reduce (sum, amax) of src by idx into a copy of x, and x[idx] = src."""
  x, idx, src = (Tensor(a).realize() for a in (x_np, idx_np, src_np))
  xt, it, st = (torch.from_numpy(a) for a in (x_np, idx_np, src_np)) if torch else (None,) * 3
  for how in ("scatter", "sum", "amax"):
    def ours(how: str = how) -> Tensor:
      if how == "scatter": return x.scatter(0, idx, src).realize()
      return x.scatter_reduce(0, idx, src, how).realize()
    want = _numpy_scatter(x_np, idx_np, src_np, how)
    assert np.allclose(ours().numpy(), want, rtol=1e-5, atol=1e-5), f"wrong {how} result"
    theirs = {"numpy": best_of(lambda how=how: _numpy_scatter(x_np, idx_np, src_np, how), repeat)}
    if torch and how == "scatter": theirs["torch"] = best_of(lambda: xt.scatter(0, it, st), repeat)
    elif torch: theirs["torch"] = best_of(lambda how=how: xt.scatter_reduce(0, it, st, how), repeat)
    name = "scatter(0, idx, src)" if how == "scatter" else f"scatter_reduce {how}"
    row(f"{name} x:{x_np.shape}", best_of(ours, repeat), theirs)
  y, y_np = Tensor(x_np.copy()).realize(), x_np.copy()
  def set_ours() -> None: y[idx] = src
  def set_numpy() -> None: y_np[idx_np] = src_np
  theirs = {"numpy": best_of(set_numpy, repeat)}
  if torch:
    yt = xt.clone()
    def set_torch() -> None: yt[it] = st
    theirs["torch"] = best_of(set_torch, repeat)
  row(f"x[idx] = src x:{x_np.shape}", best_of(set_ours, repeat), theirs)
  assert np.array_equal(y.numpy(), y_np), "wrong setitem result"


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
  print(f"scatter of {args.n} sources into {args.k} targets (ratio > 1: unigrad is faster)")
  x_np = rng.standard_normal(args.k, dtype=np.float32)
  bench_scatter(x_np, idx_np, rng.standard_normal(args.n, dtype=np.float32), args.repeat, torch)


if __name__ == "__main__":
  main()
