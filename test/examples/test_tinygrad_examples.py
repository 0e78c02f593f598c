"""Programs written the way tinygrad's examples are (its `examples/beautiful_mnist.py` uses every
construct below) run on unigrad with tinygrad's import lines pointed at unigrad.

MNIST_PROGRAM is our own program in that style, not a copy of tinygrad's: a layer list run by
`Tensor.sequential` under `@function` on a method, convolutions with BatchNorm, a `@TinyJit` train
step under `@Context(TRAINING=1)` that samples its batch with `Tensor.randint` and returns
`loss.realize(*opt.schedule_step())`, a `@TinyJit` accuracy, `trange` with `set_description`,
`getenv`, and `nn.datasets.mnist` reading MNIST-format files that the test writes from the shipped
UCI digits (each 8x8 digit scaled 3x and padded to 28x28) under `$UNIGRAD_DATA`.
"""
import gzip
import math
import runpy
import struct

import pytest

from unigrad.nn.datasets import digits
from unigrad.knobs import UNIGRAD_DATA

MNIST_PROGRAM = '''
from unigrad import Context, GlobalCounters, Tensor, TinyJit, function, nn
from unigrad.helpers import getenv, trange
from unigrad.nn.datasets import mnist

WIDE, WIDER = 32, 64


def conv_block(cin, cout, k):
  return [nn.Conv2d(cin, cout, k), Tensor.relu]


class Net:
  def __init__(self):
    pool = [Tensor.max_pool2d]
    self.layers = (conv_block(1, WIDE, 5) + conv_block(WIDE, WIDE, 5) + [nn.BatchNorm(WIDE)]
                   + pool + conv_block(WIDE, WIDER, 3) + conv_block(WIDER, WIDER, 3)
                   + [nn.BatchNorm(WIDER)] + pool
                   + [lambda t: t.flatten(1), nn.Linear(WIDER * 9, 10)])

  @function
  def __call__(self, images):
    return images.sequential(self.layers)

  @TinyJit
  @Context(TRAINING=1)
  def step(self, images, labels):
    optim.zero_grad()
    pick = Tensor.randint(getenv("BS", 128), high=images.shape[0])
    loss = self(images[pick]).sparse_categorical_crossentropy(labels[pick]).backward()
    return loss.realize(*optim.schedule_step())

  @TinyJit
  def accuracy(self, images, labels):
    return (self(images).argmax(axis=1) == labels).mean() * 100


if __name__ == "__main__":
  train_x, train_y, test_x, test_y = mnist(fashion=getenv("FASHION"))
  net = Net()
  optim = nn.optim.Adam(nn.state.get_parameters(net))
  acc = float("nan")
  for i in (bar := trange(getenv("STEPS", 50))):
    GlobalCounters.reset()
    loss = net.step(train_x, train_y)
    if i % 10 == 9: acc = net.accuracy(test_x, test_y).item()
    bar.set_description(f"loss: {loss.item():6.2f} test_accuracy: {acc:5.2f}%")
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
  program = tmp_path / "mnist_program.py"
  program.write_text(source)
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path / "data"))
  for k, v in {"STEPS": "10", "BS": "16"}.items(): monkeypatch.setenv(k, v)
  env = runpy.run_path(str(program), run_name="__main__")
  last = capsys.readouterr().err.rstrip("\n").split("\r")[-1]
  assert "100%|" in last and " 10/10 [" in last, last
  loss = float(last.split("loss:")[1].split()[0])
  acc = float(last.split("test_accuracy:")[1].split("%")[0])
  assert math.isfinite(loss) and 0 <= acc <= 100
  bn = env["net"].layers[4]
  assert bn.num_batches_tracked.item() == 10  # the running statistics were written every step
  return env


@pytest.mark.slow
def test_a_tinygrad_style_mnist_program_runs(tmp_path, monkeypatch, capsys):
  """The program at its full width (about a minute from a cold compile cache here)."""
  _run(tmp_path, monkeypatch, capsys, MNIST_PROGRAM)


def test_a_tinygrad_style_mnist_program_runs_narrow(tmp_path, monkeypatch, capsys):
  """The same program with its layers narrowed (4 and 8 channels instead of 32 and 64): every
  construct of it at a fraction of the compile and run time."""
  narrow = MNIST_PROGRAM.replace("WIDE, WIDER = 32, 64", "WIDE, WIDER = 4, 8")
  _run(tmp_path, monkeypatch, capsys, narrow)
