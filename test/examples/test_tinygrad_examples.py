"""tinygrad's example programs run on unigrad with only their import lines changed.

BEAUTIFUL_MNIST is tinygrad's `examples/beautiful_mnist.py` (tinygrad/tinygrad, MIT licence), its
`from tinygrad...` lines changed to `from unigrad...`; written out here so the test needs no
checkout. It trains on MNIST-format files that the test writes from the shipped UCI digits (each
8x8 digit scaled 3x and padded to 28x28), through `unigrad.nn.datasets.mnist` and `$UNIGRAD_DATA`.
"""
import gzip
import math
import runpy
import struct

import pytest

from unigrad.nn.datasets import digits

BEAUTIFUL_MNIST = '''
from typing import Callable
from unigrad import Tensor, TinyJit, nn, GlobalCounters, function, Context
from unigrad.helpers import getenv, colored, trange
from unigrad.nn.datasets import mnist

class Model:
  def __init__(self):
    self.layers: list[Callable[[Tensor], Tensor]] = [
      nn.Conv2d(1, 32, 5), Tensor.relu,
      nn.Conv2d(32, 32, 5), Tensor.relu,
      nn.BatchNorm(32), Tensor.max_pool2d,
      nn.Conv2d(32, 64, 3), Tensor.relu,
      nn.Conv2d(64, 64, 3), Tensor.relu,
      nn.BatchNorm(64), Tensor.max_pool2d,
      lambda x: x.flatten(1), nn.Linear(576, 10)]

  @function
  def __call__(self, x:Tensor) -> Tensor: return x.sequential(self.layers)

  @TinyJit
  @Context(TRAINING=1)
  def train_step(self, X_train:Tensor, Y_train:Tensor) -> Tensor:
    opt.zero_grad()
    samples = Tensor.randint(getenv("BS", 512), high=X_train.shape[0])
    loss = self(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples]).backward()
    return loss.realize(*opt.schedule_step())

  @TinyJit
  def get_test_acc(self, X_test:Tensor, Y_test:Tensor) -> Tensor:
    return (self(X_test).argmax(axis=1) == Y_test).mean()*100

if __name__ == "__main__":
  X_train, Y_train, X_test, Y_test = mnist(fashion=getenv("FASHION"))

  model = Model()
  opt = (nn.optim.Muon if getenv("MUON") else nn.optim.SGD if getenv("SGD") else nn.optim.Adam)(
    nn.state.get_parameters(model))

  test_acc = float('nan')
  for i in (t:=trange(getenv("STEPS", 70))):
    GlobalCounters.reset()
    loss = model.train_step(X_train, Y_train)
    if i%10 == 9: test_acc = model.get_test_acc(X_test, Y_test).item()
    t.set_description(f"loss: {loss.item():6.2f} test_accuracy: {test_acc:5.2f}%")

  if target := getenv("TARGET_EVAL_ACC_PCT", 0.0):
    if test_acc >= target and test_acc != 100.0: print(colored(f"{test_acc=} >= {target}", "green"))
    else: raise ValueError(colored(f"{test_acc=} < {target}", "red"))
'''


def write_digits_as_mnist(directory, n_train: int = 256, n_test: int = 64) -> None:
  """MNIST's four gzipped IDX files from the digits: 8x8 scaled 3x (24x24), padded to 28x28."""
  xtr, ytr, xte, yte = digits()
  directory.mkdir(parents=True)
  for name, x, y, n in (("train", xtr, ytr, n_train), ("t10k", xte, yte, n_test)):
    small = x[:n].numpy().reshape(n, 8, 8)
    big = bytearray(n * 28 * 28)
    for k in range(n):
      for r in range(24):
        row = bytes(int(small[k, r // 3, c // 3]) for c in range(24))
        start = k * 784 + (r + 2) * 28 + 2
        big[start:start + 24] = row
    (directory / f"{name}-images-idx3-ubyte.gz").write_bytes(
      gzip.compress(struct.pack(">4I", 0x803, n, 28, 28) + bytes(big)))
    (directory / f"{name}-labels-idx1-ubyte.gz").write_bytes(
      gzip.compress(struct.pack(">2I", 0x801, n) + bytes(y[:n].tolist())))


def _run(tmp_path, monkeypatch, capsys, source: str) -> dict:
  """Run `source` as a script on the digits written as MNIST: ten steps of 16 (the test accuracy
  is read at step ten; TinyJit replays from step three). Checks the progress bar's last line."""
  write_digits_as_mnist(tmp_path / "data" / "mnist")
  program = tmp_path / "beautiful_mnist.py"
  program.write_text(source)
  for k, v in {"UNIGRAD_DATA": str(tmp_path / "data"), "STEPS": "10", "BS": "16"}.items():
    monkeypatch.setenv(k, v)
  env = runpy.run_path(str(program), run_name="__main__")
  last = capsys.readouterr().err.rstrip("\n").split("\r")[-1]
  assert "100%|" in last and " 10/10 [" in last, last
  loss = float(last.split("loss:")[1].split()[0])
  acc = float(last.split("test_accuracy:")[1].split("%")[0])
  assert math.isfinite(loss) and 0 <= acc <= 100
  bn = env["model"].layers[4]
  assert bn.num_batches_tracked.item() == 10  # the running statistics were written every step
  return env


@pytest.mark.slow
def test_beautiful_mnist_runs_with_only_its_imports_changed(tmp_path, monkeypatch, capsys):
  """The program as tinygrad ships it (about a minute from a cold compile cache here)."""
  _run(tmp_path, monkeypatch, capsys, BEAUTIFUL_MNIST)


def test_beautiful_mnist_narrow(tmp_path, monkeypatch, capsys):
  """The same program with its layers narrowed (4 and 8 channels instead of 32 and 64): every
  construct of it (@function on a method holding BatchNorm, TinyJit on methods, Context as a
  decorator, trange, nn.datasets.mnist) at a fraction of the compile and run time."""
  source = BEAUTIFUL_MNIST.replace("32", "4").replace("64", "8").replace("576", "72")
  _run(tmp_path, monkeypatch, capsys, source)
