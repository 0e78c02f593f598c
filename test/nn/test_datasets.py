"""nn.datasets: MNIST's IDX files and CIFAR-10's python batches read from $UNIGRAD_DATA (written
here, small), and the shipped digits."""
import gzip
import pickle
import struct

import numpy as np
import pytest

from unigrad import dtypes
from unigrad.nn import datasets
from unigrad.knobs import UNIGRAD_DATA


def write_idx(path, arr: np.ndarray, gz: bool = True) -> None:
  head = struct.pack(">I", 0x800 + arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
  data = head + arr.astype(np.uint8).tobytes()
  path.write_bytes(gzip.compress(data) if gz else data)


def write_mnist(d, n_train: int = 6, n_test: int = 4, gz: bool = True) -> dict:
  rng = np.random.default_rng(0)
  arrs = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
          "train-labels-idx1-ubyte": rng.integers(0, 10, (n_train,)),
          "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
          "t10k-labels-idx1-ubyte": rng.integers(0, 10, (n_test,))}
  d.mkdir(parents=True)
  for name, a in arrs.items(): write_idx(d / (name + (".gz" if gz else "")), a, gz)
  return arrs


@pytest.mark.parametrize("fashion", [False, True])
def test_mnist_reads_the_idx_files(tmp_path, monkeypatch, fashion):
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path))
  arrs = write_mnist(tmp_path / ("fashion-mnist" if fashion else "mnist"), gz=not fashion)
  xtr, ytr, xte, yte = datasets.mnist(fashion=fashion)
  assert xtr.shape == (6, 1, 28, 28) and xte.shape == (4, 1, 28, 28)
  assert ytr.shape == (6,) and yte.shape == (4,)
  assert all(t.dtype == dtypes.uint8 for t in (xtr, ytr, xte, yte))
  np.testing.assert_array_equal(xtr.numpy()[:, 0], arrs["train-images-idx3-ubyte"])
  np.testing.assert_array_equal(yte.numpy(), arrs["t10k-labels-idx1-ubyte"])


def test_missing_file_names_the_file_and_directory(tmp_path, monkeypatch):
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte\.gz not found in .*mnist"):
    datasets.mnist()
  with pytest.raises(FileNotFoundError, match=r"data_batch_1 not found in .*cifar-10"):
    datasets.cifar()


def test_default_directory(monkeypatch, tmp_path):
  monkeypatch.setattr(UNIGRAD_DATA, "value", "")
  monkeypatch.setenv("HOME", str(tmp_path))
  assert datasets.data_dir() == tmp_path / ".cache" / "unigrad" / "datasets"


def test_bad_idx_file(tmp_path, monkeypatch):
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path))
  write_mnist(tmp_path / "mnist")
  (tmp_path / "mnist" / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x03xx"))
  with pytest.raises(ValueError, match="not an IDX file of 1-D"):
    datasets.mnist()


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_reads_python_batches_without_running_code(tmp_path, monkeypatch, protocol):
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path))
  d = tmp_path / "cifar-10" / "cifar-10-batches-py"
  d.mkdir(parents=True)
  rng = np.random.default_rng(1)
  batches = {}
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    x = rng.integers(0, 256, (2, 3072)).astype(np.uint8)
    y = [int(v) for v in rng.integers(0, 10, 2)]
    batches[name] = (x, y)
    (d / name).write_bytes(pickle.dumps({b"batch_label": b"x", b"labels": y, b"data": x},
                                        protocol=protocol))
  xtr, ytr, xte, yte = datasets.cifar()
  assert xtr.shape == (10, 3, 32, 32) and ytr.shape == (10,) and xte.shape == (2, 3, 32, 32)
  assert xtr.dtype == dtypes.uint8 and ytr.dtype == dtypes.uint8
  np.testing.assert_array_equal(xtr.numpy()[2:4].reshape(2, 3072), batches["data_batch_2"][0])
  assert ytr.tolist()[8:] == batches["data_batch_5"][1] and yte.tolist() == batches["test_batch"][1]
  # a pickle that would call anything else is refused
  (d / "test_batch").write_bytes(pickle.dumps({b"data": print, b"labels": []}))
  with pytest.raises(pickle.UnpicklingError, match="not allowed"):
    datasets.cifar()


def test_digits_in_mnist_layout():
  xtr, ytr, xte, yte = datasets.digits()
  assert xtr.shape == (1438, 1, 8, 8) and xte.shape == (359, 1, 8, 8)
  assert ytr.shape == (1438,) and yte.shape == (359,)
  assert all(t.dtype == dtypes.uint8 for t in (xtr, ytr, xte, yte))
  x, y = xtr.numpy(), ytr.numpy()
  assert x.max() == 255 and x.min() == 0 and set(np.unique(y)) == set(range(10))
