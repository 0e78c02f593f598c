"""Small image data sets as Tensors, in tinygrad's signatures: `mnist(device=None, fashion=False)`
and `cifar(device=None)` return `(X_train, Y_train, X_test, Y_test)`, images uint8 (N, C, H, W),
labels uint8 (N,).

There is no download: the standard files are read from the directory named by the
`UNIGRAD_DATA` environment variable (default `~/.cache/unigrad/datasets`):
- `mnist/` and `fashion-mnist/`: `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
  `t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz` (the IDX files, gzipped or not);
- `cifar-10/`: the python batches `data_batch_1` .. `data_batch_5` and `test_batch`, directly or
  in `cifar-10-batches-py/` (as `cifar-10-python.tar.gz` unpacks). They are pickles of numpy
  arrays; a restricted unpickler reads them without numpy and runs no code from the file.
A missing file raises FileNotFoundError naming the file and the directory.

`digits(device=None)` needs no file: the UCI 8x8 handwritten digits shipped with the package
(unigrad/nn/data/README.md), in MNIST's layout and value range.
"""
from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path
from typing import Any

from unigrad.frontend.tensor import Tensor
from unigrad.knobs import UNIGRAD_DATA

__all__ = ["mnist", "cifar", "digits", "data_dir", "DIGITS_PATH"]

DIGITS_PATH = Path(__file__).resolve().parent / "data" / "digits.csv.gz"
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
Dataset = tuple[Tensor, Tensor, Tensor, Tensor]


def data_dir() -> Path:
  """`$UNIGRAD_DATA`, or `~/.cache/unigrad/datasets`."""
  return Path(UNIGRAD_DATA.value or "~/.cache/unigrad/datasets").expanduser()


def _find(directory: Path, name: str, what: str, *alternatives: Path) -> Path:
  for p in (directory / name, *alternatives):
    if p.is_file(): return p
  raise FileNotFoundError(f"{what}: {name} not found in {directory} (there is no download: put the "
                          f"file there, or point UNIGRAD_DATA at the directory holding "
                          f"{directory.name}/)")


# ---- MNIST (IDX files) ----

def _read_idx(path: Path, ndim: int) -> tuple[tuple[int, ...], bytes]:
  """An IDX file of unsigned bytes with `ndim` dims (gzipped or not): its shape and data."""
  raw = path.read_bytes()
  if raw[:2] == b"\x1f\x8b": raw = gzip.decompress(raw)
  if len(raw) < 4 + 4 * ndim or raw[:4] != bytes((0, 0, 8, ndim)):
    raise ValueError(f"{path}: not an IDX file of {ndim}-D unsigned bytes (magic "
                     f"{raw[:4].hex()}, expected {bytes((0, 0, 8, ndim)).hex()})")
  shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
  data = raw[4 + 4 * ndim:]
  n = 1
  for s in shape: n *= s
  if len(data) != n:
    raise ValueError(f"{path}: header says {shape} ({n} bytes) but the file holds {len(data)}")
  return shape, data


def _mnist_file(directory: Path, name: str, ndim: int, device: str | None) -> Tensor:
  path = _find(directory, name, "mnist", directory / name.removesuffix(".gz"))
  shape, data = _read_idx(path, ndim)
  t = Tensor(data, device=device)
  return t.reshape(shape[0], 1, *shape[1:]) if ndim == 3 else t


def mnist(device: str | None = None, fashion: bool = False) -> Dataset:
  """MNIST (or Fashion-MNIST) from `data_dir()/mnist` (`fashion-mnist`): X_train (60000, 1, 28,
  28) uint8, Y_train (60000,) uint8, X_test (10000, 1, 28, 28), Y_test (10000,)."""
  d = data_dir() / ("fashion-mnist" if fashion else "mnist")
  xtr, ytr, xte, yte = (_mnist_file(d, f, 1 if "labels" in f else 3, device) for f in MNIST_FILES)
  return xtr, ytr, xte, yte


# ---- CIFAR-10 (pickled numpy arrays, read without numpy) ----

class _DType:
  def __init__(self, name: Any, *_: Any) -> None:
    self.name = name.decode() if isinstance(name, bytes) else str(name)

  def __setstate__(self, state: Any) -> None: pass


class _Array:
  """What a pickled ndarray holds: shape, dtype and the raw bytes."""

  def __init__(self, shape: tuple[int, ...] = (), dtype: _DType | None = None,
               data: bytes = b"") -> None:
    self.shape, self.dtype, self.data = shape, dtype, data

  def __setstate__(self, state: Any) -> None:
    _, self.shape, self.dtype, _fortran, raw = state
    self.data = raw.encode("latin1") if isinstance(raw, str) else bytes(raw)


def _reconstruct(*_: Any) -> _Array: return _Array()


def _frombuffer(buf: Any, dtype: _DType, shape: tuple[int, ...], order: str = "C") -> _Array:
  return _Array(tuple(shape), dtype, bytes(buf))


def _encode(text: str, encoding: str = "utf-8") -> bytes:
  """`_codecs.encode`, as Python 3 pickles bytes at protocol 2 (a str only)."""
  if not isinstance(text, str): raise pickle.UnpicklingError("_codecs.encode of a non-str")
  return text.encode(encoding)


class _NumpyFreeUnpickler(pickle.Unpickler):
  """Reads pickled numpy arrays as `_Array`s; any other class in the file is refused."""
  ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
             ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
             ("numpy.core.numeric", "_frombuffer"): _frombuffer,
             ("numpy._core.numeric", "_frombuffer"): _frombuffer,
             ("numpy", "ndarray"): _Array, ("numpy", "dtype"): _DType,
             ("_codecs", "encode"): _encode}

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in self.ALLOWED: return self.ALLOWED[(module, name)]
    raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")


def _cifar_batch(path: Path) -> tuple[bytes, bytes]:
  """One python batch: (images as 3072 bytes a row, labels as one byte each)."""
  with path.open("rb") as f: batch = _NumpyFreeUnpickler(f, encoding="bytes").load()
  if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
    raise ValueError(f"{path}: not a CIFAR-10 python batch (a dict with b'data' and b'labels')")
  data, labels = batch[b"data"], batch[b"labels"]
  if not isinstance(data, _Array) or data.dtype is None or data.dtype.name not in ("u1", "uint8") \
      or len(data.shape) != 2 or data.shape[1] != 3072 or len(data.data) != data.shape[0] * 3072:
    raise ValueError(f"{path}: b'data' must be a uint8 array of shape (N, 3072)")
  if len(labels) != data.shape[0]:
    raise ValueError(f"{path}: {len(labels)} labels for {data.shape[0]} images")
  return data.data, bytes(int(y) for y in labels)


def cifar(device: str | None = None) -> Dataset:
  """CIFAR-10 from `data_dir()/cifar-10`: X_train (50000, 3, 32, 32) uint8, Y_train (50000,)
  uint8, X_test (10000, 3, 32, 32), Y_test (10000,)."""
  d = data_dir() / "cifar-10"

  def load(names: list[str]) -> tuple[Tensor, Tensor]:
    parts = [_cifar_batch(_find(d, n, "cifar", d / "cifar-10-batches-py" / n)) for n in names]
    x, y = b"".join(p[0] for p in parts), b"".join(p[1] for p in parts)
    return Tensor(x, device=device).reshape(-1, 3, 32, 32), Tensor(y, device=device)
  return (*load([f"data_batch_{i}" for i in range(1, 6)]), *load(["test_batch"]))


# ---- the shipped UCI digits ----

def _shuffled(n: int, seed: int) -> list[int]:
  """A fixed permutation of range(n) (Fisher-Yates with a 64-bit LCG: no numpy needed), the split
  examples/train_digits.py uses."""
  order, state = list(range(n)), seed + 1
  for i in range(n - 1, 0, -1):
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    j = state % (i + 1)
    order[i], order[j] = order[j], order[i]
  return order


def digits(device: str | None = None, seed: int = 0) -> Dataset:
  """The 1797 UCI 8x8 digits, a fixed shuffled 80/20 split: X_train (1438, 1, 8, 8) uint8 with
  MNIST's range (the 0..16 pixel values scaled to 0..255), Y_train (1438,) uint8, X_test (359, 1,
  8, 8), Y_test (359,)."""
  rows = [[int(v) for v in line.split(b",")] for line in gzip.decompress(
          DIGITS_PATH.read_bytes()).splitlines() if line.strip()]
  order = _shuffled(len(rows), seed)
  n_test = len(rows) // 5

  def pack(idx: list[int]) -> tuple[Tensor, Tensor]:
    x = bytes((v * 255 + 8) // 16 for i in idx for v in rows[i][:64])
    y = bytes(rows[i][64] for i in idx)
    return Tensor(x, device=device).reshape(-1, 1, 8, 8), Tensor(y, device=device)
  return (*pack(order[n_test:]), *pack(order[:n_test]))

