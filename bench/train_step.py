"""Training steps against PyTorch CPU eager: the digits CNN (examples/train_digits.py, Adam) and
an MLP (784-256-10, SGD), each eager and with TinyJit.

  python bench/train_step.py [--repeat 30] [--cpu-time]

Same model, same weights, same batch; prints the median step time of each and the ratio against
torch (>1: unigrad is faster). unigrad's step realizes loss and the parameter update in one
command buffer; with TinyJit the step replays its captured kernels (one native call on CPU).
--cpu-time times each step by the process's CPU time, one thread on each side (THREADS=1,
torch.set_num_threads(1)): a loaded machine's preemption inflates wall times, and a 2-thread
torch step waits for its second thread whenever that one is descheduled.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_digits import DigitsCNN, load_digits  # noqa: E402

from common import CLOCK, median_of, try_torch  # noqa: E402
from unigrad import Tensor, TinyJit, dtypes, nn  # noqa: E402
from unigrad.knobs import THREADS  # noqa: E402
from unigrad.nn.state import get_parameters  # noqa: E402


def unigrad_step(model: object, opt: nn.optim.Optimizer, x: Tensor, y: Tensor) -> Callable:
  def step() -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      Tensor.realize_all(loss, *opt.schedule_step())
    return loss
  return step


class MLP:
  def __init__(self) -> None: self.l1, self.l2 = nn.Linear(784, 256), nn.Linear(256, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).relu())


def cnn_case(torch) -> tuple:
  xs, ys = load_digits()
  x, y = Tensor(xs[:64]), Tensor(ys[:64], dtype=dtypes.int32)
  model = DigitsCNN()
  ours = (model.c1.weight, model.c1.bias, model.c2.weight, model.c2.bias, model.fc.weight,
          model.fc.bias)
  net = torch.nn.Sequential(
    torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
    torch.nn.Linear(256, 10))
  tx, ty = torch.tensor(xs[:64]).reshape(-1, 1, 8, 8), torch.tensor(ys[:64])
  return model, ours, nn.optim.Adam(get_parameters(model), lr=1e-3), x, y, net, \
    lambda ps: torch.optim.Adam(ps, lr=1e-3), tx, ty


def mlp_case(torch) -> tuple:
  rng = np.random.default_rng(0)
  xs, ys = rng.random((128, 784), dtype=np.float32), rng.integers(0, 10, 128)
  model = MLP()
  ours = (model.l1.weight, model.l1.bias, model.l2.weight, model.l2.bias)
  net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
  return model, ours, nn.optim.SGD(get_parameters(model), lr=1e-2), Tensor(xs), \
    Tensor(ys.astype(np.int32)), net, lambda ps: torch.optim.SGD(ps, lr=1e-2), \
    torch.tensor(xs), torch.tensor(ys)


def both_steps(case: Callable, torch) -> tuple[Callable, Callable]:
  """(unigrad's step, torch's step) of `case` on the same weights and batch."""
  model, ours, opt, x, y, net, topt, tx, ty = case(torch)
  with torch.no_grad():  # same weights as the unigrad model
    for p, q in zip(net.parameters(), ours): p.copy_(torch.from_numpy(q.numpy()))
  topt = topt(net.parameters())

  def tstep() -> None:
    topt.zero_grad()
    torch.nn.functional.cross_entropy(net(tx), ty).backward()
    topt.step()
  return unigrad_step(model, opt, x, y), tstep


def run_case(name: str, case: Callable, torch, repeat: int) -> None:
  step, tstep = both_steps(case, torch)
  eager = median_of(step, repeat)
  jit = median_of(TinyJit(step), repeat)
  theirs = median_of(tstep, repeat)
  print(f"{name:34s} unigrad eager {eager * 1e3:7.2f} ms (x{theirs / eager:5.2f})  "
        f"TinyJit {jit * 1e3:7.2f} ms (x{theirs / jit:5.2f})  torch {theirs * 1e3:7.2f} ms")


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--repeat", type=int, default=30)
  p.add_argument("--cpu-time", action="store_true",
                 help="time steps by the process's CPU time, one thread each (needs "
                      "THREADS=1)")
  args = p.parse_args()
  torch = try_torch()
  if torch is None: raise SystemExit("this benchmark compares against torch: pip install torch")
  if args.cpu_time:
    if THREADS.value != 1: raise SystemExit("--cpu-time needs THREADS=1 (one thread each)")
    torch.set_num_threads(1)
    CLOCK[0] = time.process_time
  print("ratios: torch time / unigrad time (>1: unigrad faster), median step")
  run_case("digits CNN step (batch 64, Adam)", cnn_case, torch, args.repeat)
  run_case("MLP 784-256-10 step (batch 128, SGD)", mlp_case, torch, args.repeat)


if __name__ == "__main__":
  main()
