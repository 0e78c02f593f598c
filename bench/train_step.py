"""One training step of the digits CNN (examples/train_digits.py): unigrad vs PyTorch CPU.

  python bench/train_step.py [--batch 64] [--repeat 20]

Same model, same batch, Adam; prints the best step time of each and the ratio (>1: unigrad is
faster). unigrad's step realizes loss, accuracy and the parameter update in one command buffer.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_digits import DigitsCNN, load_digits  # noqa: E402

from unigrad import Tensor, dtypes, nn  # noqa: E402
from unigrad.nn.state import get_parameters  # noqa: E402


def unigrad_step(batch: int) -> tuple:
  xs, ys = load_digits()
  x, y = Tensor(xs[:batch]), Tensor(ys[:batch], dtype=dtypes.int32)
  model = DigitsCNN()
  opt = nn.optim.Adam(get_parameters(model), lr=1e-3)

  def step() -> None:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      Tensor.realize_all(loss, *opt.schedule_step())
  return step, model


def torch_step(batch: int, model: DigitsCNN) -> tuple:
  import torch  # noqa: PLC0415 - optional dependency
  xs, ys = load_digits()
  x, y = torch.tensor(xs[:batch]).reshape(-1, 1, 8, 8), torch.tensor(ys[:batch])
  net = torch.nn.Sequential(
    torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
    torch.nn.Linear(256, 10))
  with torch.no_grad():  # same weights as the unigrad model
    ours = (model.c1.weight, model.c1.bias, model.c2.weight, model.c2.bias,
            model.fc.weight, model.fc.bias)
    for p, q in zip(net.parameters(), ours):
      p.copy_(torch.from_numpy(q.numpy()))
  opt = torch.optim.Adam(net.parameters(), lr=1e-3)

  def step() -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
  return (step,)


def best(fn, repeat: int) -> float:
  for _ in range(3): fn()
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.min(times))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--repeat", type=int, default=20)
  args = p.parse_args()
  step, model = unigrad_step(args.batch)
  ours = best(step, args.repeat)
  line = f"digits CNN train step (batch {args.batch}): unigrad {ours * 1e3:8.2f} ms"
  try:
    (tstep,) = torch_step(args.batch, model)
    theirs = best(tstep, args.repeat)
    line += f"  torch {theirs * 1e3:8.2f} ms  (x{theirs / ours:5.2f})"
  except ImportError:
    line += "  (torch not installed)"
  print(line)


if __name__ == "__main__":
  main()
