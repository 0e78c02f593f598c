"""Files as bytes for the readers of nn.state: paths, raw bytes and Tensors of bytes.

`TensorIO` is a read-only, seekable binary file over the bytes of a Tensor (realized once, read
without further copies), so that the standard library's readers (`tarfile`, `zipfile`, `pickle`)
can parse a file that was loaded onto a device. `tar_extract` lists a tar archive's regular files
as uint8 Tensors. `FormatError` is the error every reader raises for a malformed, truncated or
lying file; its message names the file (when it has a name) and the field that is wrong.
"""
from __future__ import annotations

import io
import os
import tarfile
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad import engine
from unigrad.frontend.tensor import Tensor
from unigrad.runtime.device import Device

__all__ = ["FileLike", "FormatError", "TensorIO", "tar_extract", "read_bytes", "source_name",
           "tensor_from_bytes"]

FileLike = str | os.PathLike | bytes | bytearray | memoryview | Tensor


class FormatError(ValueError):
  """A file is malformed: truncated, corrupted, or its header lies about its contents."""


def source_name(fn: Any) -> str:
  """How errors name a file: its path, or what it was given as."""
  if isinstance(fn, (str, os.PathLike)): return repr(os.fspath(fn))
  if isinstance(fn, Tensor): return f"<Tensor of {fn.nbytes()} bytes>"
  return f"<{len(memoryview(fn).cast('B'))} bytes>"


def check_file_like(fn: Any, caller: str) -> None:
  """A path, bytes or a Tensor; anything else (an int would open a file descriptor) is a
  TypeError."""
  if not isinstance(fn, (str, os.PathLike, bytes, bytearray, memoryview, Tensor)):
    raise TypeError(f"{caller}: expected a path (str or os.PathLike), the file's bytes or a "
                    f"Tensor of them, got {type(fn).__name__}")


def read_bytes(fn: FileLike, caller: str) -> memoryview:
  """The contents of a file (a path), the bytes themselves, or a Tensor's bytes."""
  check_file_like(fn, caller)
  if isinstance(fn, Tensor): return fn._bytes().cast("B")
  if isinstance(fn, (bytes, bytearray, memoryview)): return memoryview(fn).cast("B")
  with open(fn, "rb") as f: return memoryview(f.read())


def tensor_from_bytes(data: memoryview, device: str | None, dtype: DType) -> Tensor:
  """A 1-D Tensor holding a copy of `data` as `dtype` elements, copied once straight into its
  buffer (a trailing partial element is dropped)."""
  dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
  n = len(data) // dtype.itemsize
  if n == 0: return Tensor(b"", dev, dtype)
  return Tensor._from_uop(engine.buffer_with_data(dev, dtype, data[:n * dtype.itemsize], (n,)), dev)


class TensorIO(io.RawIOBase):
  """A read-only binary file over a Tensor's bytes (any dtype, row-major):
  `tarfile.open(fileobj=TensorIO(t))`. The tensor is realized and copied out once."""

  def __init__(self, t: Tensor) -> None:
    if not isinstance(t, Tensor): raise TypeError(f"TensorIO: expected a Tensor, got {type(t)}")
    super().__init__()
    self._data = t._bytes().cast("B")
    self._pos = 0

  def readable(self) -> bool: return True

  def seekable(self) -> bool: return True

  def readinto(self, buffer: Any) -> int:
    out = memoryview(buffer).cast("B")
    n = max(0, min(len(out), len(self._data) - self._pos))
    out[:n] = self._data[self._pos:self._pos + n]
    self._pos += n
    return n

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}.get(whence)
    if base is None: raise ValueError(f"TensorIO.seek: invalid whence {whence!r}")
    if base + offset < 0: raise ValueError(f"TensorIO.seek: negative position {base + offset}")
    self._pos = base + offset
    return self._pos

  def tell(self) -> int: return self._pos


def _tar_members(tar: tarfile.TarFile, size: int, fn: Any) -> list[tarfile.TarInfo]:
  """The archive's members, header by header: a member whose data runs past the end of the file
  is named with its size field."""
  members: list[tarfile.TarInfo] = []
  while True:
    try: m = tar.next()
    except tarfile.TarError as e:
      last = members[-1] if members else None
      if last is not None and last.offset_data + last.size > size:
        raise FormatError(f"tar_extract: member {last.name!r} (field size={last.size}) runs past "
                          f"the end of {source_name(fn)} (truncated file?)") from e
      raise FormatError(f"tar_extract: {source_name(fn)} is not a valid tar archive ({e})") from e
    if m is None: return members
    members.append(m)


def tar_extract(fn: FileLike) -> dict[str, Tensor]:
  """The regular files of a tar archive (a path, its bytes, or a uint8 Tensor of them) as uint8
  Tensors by member name, in archive order (tinygrad's `tar_extract`).
  Raises FormatError naming the file (and the member) when the archive is malformed or
  truncated."""
  data = read_bytes(fn, "tar_extract")
  try: tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
  except tarfile.TarError as e:
    raise FormatError(f"tar_extract: {source_name(fn)} is not a valid tar archive ({e})") from e
  with tar:
    out: dict[str, Tensor] = {}
    for m in _tar_members(tar, len(data), fn):
      if not m.isfile(): continue
      if m.offset_data + m.size > len(data):
        raise FormatError(f"tar_extract: member {m.name!r} (field size={m.size}) runs past the "
                          f"end of {source_name(fn)} (truncated file?)")
      out[m.name] = tensor_from_bytes(data[m.offset_data:m.offset_data + m.size], None,
                                      dtypes.uint8)
    return out
