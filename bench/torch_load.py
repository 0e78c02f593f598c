"""torch_load of 2000x2000 views of a big storage vs torch.load (weights_only) of the same file.

  python bench/torch_load.py [--storage 5000000] [--repeat 3]

Each view is saved alone (with its whole storage, as torch.save does) in the zip and the legacy
format; the timed call loads the file and copies the view out as a numpy array (unigrad: read the
file, one buffer for the storage, one kernel for the view; torch: load and .numpy() of a
contiguous copy). The first call of each kind (which compiles the view's kernel) is reported
separately as `cold`. Prints best times and the ratio (>1 means unigrad is faster).
"""
from __future__ import annotations

import argparse
import io
import time

from common import best_of, row, try_torch

from unigrad.nn.state import torch_load


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--storage", type=int, default=5_000_000)
  ap.add_argument("--repeat", type=int, default=3)
  args = ap.parse_args()
  torch = try_torch()
  if torch is None: raise SystemExit("this benchmark compares with torch.load: install torch")
  base = torch.arange(args.storage, dtype=torch.float32)
  views = {"rows (2400, 1)": base.as_strided((2000, 2000), (2400, 1), 100),
           "transposed (1, 2400)": base.as_strided((2000, 2000), (1, 2400), 3),
           "overlap (1, 1)": base.as_strided((2000, 2000), (1, 1), 7),
           "irregular (3, 2)": base.as_strided((2000, 2000), (3, 2), 11)}
  for zipped in (True, False):
    for name, v in views.items():
      buf = io.BytesIO()
      torch.save({"w": v}, buf, _use_new_zipfile_serialization=zipped)
      data = buf.getvalue()
      t0 = time.perf_counter()
      torch_load(data)["w"].numpy()
      cold = time.perf_counter() - t0
      ours = best_of(lambda data=data: torch_load(data)["w"].numpy(), args.repeat)
      load = (lambda data=data:  # noqa: E731
              torch.load(io.BytesIO(data), weights_only=True)["w"].contiguous().numpy())
      theirs = best_of(load, args.repeat)
      print(f"{'zip' if zipped else 'legacy'} {name}: cold {cold * 1e3:.0f} ms")
      row(f"{'zip' if zipped else 'legacy'} {name}", ours, {"torch.load": theirs})


if __name__ == "__main__":
  main()
