"""Train a small CNN on the UCI 8x8 handwritten digits (shipped in unigrad/nn/data) and save it.

  python examples/train_digits.py                      # CPU, ~97-99% test accuracy, TinyJit steps
  python examples/train_digits.py --device PYTHON --steps 2 --batch 4 --test-size 8  # interpreter
  mpiexec -n 2 python examples/train_digits.py --distributed  # data parallel: half a batch a rank

Shows a progress bar with loss and accuracy, evaluates on a held-out 20% split and writes the
weights as safetensors.
"""
from __future__ import annotations

import argparse
import gzip
import sys
import time
from typing import Any

from unigrad import Context, Device, Tensor, TinyJit, dtypes, nn
from unigrad.nn.datasets import DIGITS_PATH
from unigrad.nn.state import get_parameters, get_state_dict, safe_save
import unigrad.distributed as dist  # mpi4py (unigrad[mpi]) is imported by dist.init() only
from unigrad.distributed.data_parallel import DistributedOptimizer

DATA = DIGITS_PATH  # unigrad/nn/data/digits.csv.gz, shipped with the package


def load_digits() -> tuple[list[list[float]], list[int]]:
  """The 1797 digits as (pixels scaled to [0, 1], labels)."""
  xs, ys = [], []
  with gzip.open(DATA, "rt") as f:
    for line in f:
      vals = [int(v) for v in line.strip().split(",")]
      xs.append([v / 16.0 for v in vals[:64]])
      ys.append(vals[64])
  return xs, ys


def split(xs: list, ys: list, seed: int = 0) -> tuple:
  """A fixed shuffled 80/20 train/test split (a small LCG, so no numpy is needed)."""
  order, state = list(range(len(xs))), seed + 1
  for i in range(len(order) - 1, 0, -1):
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    j = state % (i + 1)
    order[i], order[j] = order[j], order[i]
  n_test = len(xs) // 5
  test, train = order[:n_test], order[n_test:]
  train_set = [xs[i] for i in train], [ys[i] for i in train]
  test_set = [xs[i] for i in test], [ys[i] for i in test]
  return train_set, test_set


class DigitsCNN:
  """conv 1->8 (3x3) - relu - maxpool 2 - conv 8->16 (3x3) - relu - linear 256->10."""

  def __init__(self) -> None:
    self.c1 = nn.Conv2d(1, 8, 3, padding=1)
    self.c2 = nn.Conv2d(8, 16, 3, padding=1)
    self.fc = nn.Linear(16 * 4 * 4, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.c1(x.reshape(-1, 1, 8, 8)).relu().max_pool2d(2)
    x = self.c2(x).relu()
    return self.fc(x.flatten(1))


def progress(step: int, total: int, loss: float, acc: float, t0: float) -> None:
  done = int(30 * step / total)
  bar = "#" * done + "-" * (30 - done)
  elapsed = time.perf_counter() - t0
  sys.stderr.write(f"\r[{bar}] {step:4d}/{total} loss {loss:.4f} acc {acc * 100:5.1f}% "
                   f"{elapsed:6.1f}s")
  sys.stderr.flush()


def evaluate(model: DigitsCNN, xs: list, ys: list, device: str, batch: int = 360) -> float:
  correct = 0
  with Tensor.train(False):
    for i in range(0, len(xs), batch):
      pred = model(Tensor(xs[i:i + batch], device=device)).argmax(-1).tolist()
      correct += sum(int(p == y) for p, y in zip(pred, ys[i:i + batch]))
  return correct / len(xs)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--device", default=None)
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--out", default="digits_cnn.safetensors")
  p.add_argument("--seed", type=int, default=42)
  p.add_argument("--test-size", type=int, default=None, help="evaluate on the first N test digits")
  p.add_argument("--no-jit", action="store_true", help="build and schedule every step (no TinyJit)")
  p.add_argument("--distributed", action="store_true",
                 help="data parallel over the MPI ranks (run under mpiexec; needs unigrad[mpi]): "
                      "each rank takes its part of every batch, the gradients are averaged")
  args = p.parse_args()
  with Context(**({"DEV": args.device} if args.device else {})): train(args)


def train(args: argparse.Namespace) -> None:
  device = Device.DEFAULT
  rank, ranks = 0, 1
  if args.distributed:  # every rank draws the same batches (same seed) and keeps its part
    dist.init()
    rank, ranks = dist.rank(), dist.world_size()
    if args.batch % ranks: raise SystemExit(f"--batch {args.batch} does not split over {ranks}")
  Tensor.manual_seed(args.seed)
  (xtr, ytr), (xte, yte) = split(*load_digits())
  xte, yte = xte[:args.test_size], yte[:args.test_size]
  X, Y = Tensor(xtr, device=device), Tensor(ytr, dtype=dtypes.int32, device=device)
  model = DigitsCNN()
  opt: Any = nn.optim.Adam(get_parameters(model), lr=args.lr)
  if args.distributed: opt = DistributedOptimizer(opt)
  where = f"rank {rank} of {ranks}, " if args.distributed else ""
  print(f"training on {where}{device}: {len(xtr)} train / {len(xte)} test digits, "
        f"{args.steps} steps of {args.batch}")
  part = args.batch // ranks

  def train_step() -> tuple[Tensor, Tensor]:
    idx = Tensor.randint(0, len(xtr), (args.batch,), device=device)[rank * part:(rank + 1) * part]
    xb, yb = X[idx], Y[idx]
    opt.zero_grad()
    out = model(xb)
    loss = out.sparse_categorical_crossentropy(yb)
    loss.backward()
    acc = (out.argmax(-1) == yb).float().mean()
    if args.distributed: loss, acc = dist.all_reduce(loss, "mean"), dist.all_reduce(acc, "mean")
    Tensor.realize_all(loss, acc, *opt.schedule_step())  # forward shared with the update: one run
    return loss, acc
  step_fn = train_step if args.no_jit else TinyJit(train_step)  # replays from the third step on

  t0 = time.perf_counter()
  with Tensor.train():
    for step in range(1, args.steps + 1):
      loss, acc = step_fn()
      if (step % 10 == 0 or step == args.steps) and rank == 0:
        progress(step, args.steps, loss.item(), acc.item(), t0)
  elapsed = time.perf_counter() - t0
  if rank != 0: return  # the ranks hold the same model: rank 0 evaluates and saves it
  sys.stderr.write("\n")
  print(f"{args.steps / elapsed:.1f} steps/s ({'eager' if args.no_jit else 'TinyJit'})")
  test_acc = evaluate(model, xte, yte, device)
  print(f"test accuracy {test_acc * 100:.2f}% after {time.perf_counter() - t0:.1f}s")
  safe_save(get_state_dict(model), args.out)
  print(f"saved {args.out}")


if __name__ == "__main__":
  main()
