"""Exported C against unigrad and PyTorch: the digits CNN forward (examples/train_digits.py).

  python bench/export.py [--batch 64] [--repeat 50]

Rows: the exported C called natively (`nf(x)`: argument checks and a new output Tensor
included, single-threaded; with the CPU device's kernels, then with `threads=1`), unigrad's own
run of the same kernels (TinyJit replay, THREAD chunks on every core), and PyTorch eager on the
same weights, with every core and with one thread. The machine's load moves these a lot: run it
twice.
Bit-exactness of the exported result against unigrad is checked first.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import best_of, try_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_digits import DigitsCNN  # noqa: E402

from unigrad import Tensor, TinyJit, dtypes  # noqa: E402
from unigrad.export import NumericalFunction  # noqa: E402


def torch_forward(torch, model: DigitsCNN):  # noqa: ANN001, ANN201
  f = torch.nn.functional
  w = {k: torch.tensor(getattr(model, m).__dict__[p].numpy())
       for k, (m, p) in {"c1w": ("c1", "weight"), "c1b": ("c1", "bias"), "c2w": ("c2", "weight"),
                         "c2b": ("c2", "bias"), "fcw": ("fc", "weight"),
                         "fcb": ("fc", "bias")}.items()}
  def fwd(x):  # noqa: ANN001, ANN202
    h = f.max_pool2d(f.conv2d(x.reshape(-1, 1, 8, 8), w["c1w"], w["c1b"], padding=1).relu(), 2)
    h = f.conv2d(h, w["c2w"], w["c2b"], padding=1).relu()
    return f.linear(h.flatten(1), w["fcw"], w["fcb"])
  return fwd


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--repeat", type=int, default=50)
  args = p.parse_args()
  Tensor.manual_seed(0)
  model = DigitsCNN()
  nf = NumericalFunction(model, ((args.batch, 64), dtypes.float32), name="digits_cnn")
  x = Tensor.rand(args.batch, 64).realize()
  jitted = TinyJit(lambda t: model(t).realize())
  assert bytes(nf(x)._bytes()) == bytes(jitted(x)._bytes()), "exported C differs from unigrad"
  jitted(x)
  nf1 = NumericalFunction(model, ((args.batch, 64), dtypes.float32), name="digits_cnn1", threads=1)
  c = best_of(lambda: nf(x), args.repeat)
  c1 = best_of(lambda: nf1(x), args.repeat)
  ours = best_of(lambda: jitted(x), args.repeat)
  print(f"digits CNN forward, batch {args.batch} ({len(nf.rendered_kernels)} kernels), best of "
        f"{args.repeat}:")
  print(f"  exported C (1 thread)      {c * 1e6:9.1f} us   (the CPU device's kernels)")
  print(f"  exported C, threads=1      {c1 * 1e6:9.1f} us   (kernels shaped for one thread)")
  print(f"  unigrad TinyJit            {ours * 1e6:9.1f} us   C's speed vs it x{ours / c:.2f}")
  torch = try_torch()
  if torch is None: return
  fwd, tx = torch_forward(torch, model), torch.tensor(x.numpy())
  with torch.no_grad():
    t_all = best_of(lambda: fwd(tx), args.repeat)
    torch.set_num_threads(1)
    t_one = best_of(lambda: fwd(tx), args.repeat)
  print(f"  torch eager (all cores)    {t_all * 1e6:9.1f} us   C's speed vs it x{t_all / c:.2f}")
  print(f"  torch eager (1 thread)     {t_one * 1e6:9.1f} us   C's speed vs it x{t_one / c:.2f}")


if __name__ == "__main__":
  main()
