"""Zero-copy interop benchmark: numpy() of a transposed view, DLPack export and import, from_blob,
each against the same call in numpy / PyTorch, and against a copy of the same data.

  python bench/interop.py [--n 2048] [--repeat 20]

unigrad's numpy() of a realized buffer's transpose is a numpy view (no kernel); the "copy" column
is what the call cost before it shared memory: a transposing kernel into a new buffer and a copy
out (`x.T.contiguous().realize()` then bytes to numpy). Ratios >1 mean unigrad is faster.
"""
from __future__ import annotations

import argparse

import numpy as np

from common import best_of, row, try_torch

from unigrad import Tensor, dtypes


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=2048)
  ap.add_argument("--repeat", type=int, default=20)
  args = ap.parse_args()
  torch = try_torch()
  a_np = np.random.default_rng(0).standard_normal((args.n, args.n)).astype(np.float32)
  a = Tensor(a_np).realize()
  assert np.array_equal(a.T.numpy(), a_np.T)

  def copy_path() -> np.ndarray:
    c = a.T.contiguous().realize()
    return np.frombuffer(c._bytes(), np.float32).reshape(args.n, args.n).copy()
  theirs = {"numpy .T": best_of(lambda: a_np.T, args.repeat),
            "copy": best_of(copy_path, max(3, args.repeat // 5))}
  if torch is not None:
    at = torch.from_numpy(a_np)
    theirs["torch .T.numpy()"] = best_of(lambda: at.T.numpy(), args.repeat)
  row(f"numpy() of x.T {args.n}^2", best_of(lambda: a.T.numpy(), args.repeat), theirs)
  flat = a_np.reshape(-1)
  row("from_blob", best_of(lambda: Tensor.from_blob(flat.ctypes.data, a_np.shape, dtypes.float32),
                           args.repeat),
      {"Tensor(ndarray) copy": best_of(lambda: Tensor(a_np), max(3, args.repeat // 5))})
  if torch is None: return
  row("torch.from_dlpack(x.T)", best_of(lambda: torch.from_dlpack(a.T), args.repeat),
      {"torch.from_dlpack(np)": best_of(lambda: torch.from_dlpack(a_np.T), args.repeat)})
  row("Tensor.from_dlpack(torch)", best_of(lambda: Tensor.from_dlpack(at), args.repeat),
      {"torch.from_dlpack(np)": best_of(lambda: torch.from_dlpack(a_np), args.repeat)})


if __name__ == "__main__":
  main()
