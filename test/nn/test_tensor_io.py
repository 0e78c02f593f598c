"""nn/tensor_io.py: TensorIO behaves like io.BytesIO over a Tensor's bytes; tar_extract lists a
tar archive's files as uint8 Tensors and rejects truncated archives naming the file."""
import io
import tarfile

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.nn.state import FormatError, TensorIO, tar_extract


def make_tar(files: dict[str, bytes]) -> bytes:
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode="w") as tar:
    d = tarfile.TarInfo("subdir")
    d.type = tarfile.DIRTYPE
    tar.addfile(d)
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return out.getvalue()


def test_tensorio_reads_and_seeks_like_bytesio():
  data = bytes(range(256)) * 3
  t = Tensor(np.frombuffer(data, np.float32))  # any dtype: its bytes
  ours, ref = TensorIO(t), io.BytesIO(data)
  for op in (lambda f: f.read(10), lambda f: f.seek(5, io.SEEK_CUR), lambda f: f.read(7),
             lambda f: f.seek(-20, io.SEEK_END), lambda f: f.read(), lambda f: f.read(4),
             lambda f: f.seek(3), lambda f: f.tell(), lambda f: f.readinto(bytearray(9)),
             lambda f: f.seek(10_000), lambda f: f.read(3)):
    assert op(ours) == op(ref)
  assert ours.readable() and ours.seekable() and not ours.writable()
  with pytest.raises(ValueError, match="negative position"): ours.seek(-1)
  with pytest.raises(TypeError, match="expected a Tensor"): TensorIO(b"abc")


def test_tar_extract_from_path_bytes_and_tensor(tmp_path):
  files = {"a.txt": b"hello", "subdir/b.bin": bytes(range(200)), "empty": b""}
  data = make_tar(files)
  (tmp_path / "x.tar").write_bytes(data)
  for src in (tmp_path / "x.tar", data, Tensor(data, dtype=dtypes.uint8)):
    got = tar_extract(src)
    assert list(got) == list(files)
    for name, content in files.items():
      assert got[name].dtype == dtypes.uint8 and got[name].numpy().tobytes() == content
  with tarfile.open(fileobj=TensorIO(Tensor(data, dtype=dtypes.uint8))) as tar:
    assert tar.extractfile("a.txt").read() == b"hello"


def test_tar_extract_rejects_truncated_and_garbage(tmp_path):
  data = make_tar({"big.bin": bytes(5000)})
  (tmp_path / "cut.tar").write_bytes(data[:2000])
  with pytest.raises(FormatError, match=r"big\.bin.*size=5000.*cut\.tar"):
    tar_extract(tmp_path / "cut.tar")
  (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 40)
  with pytest.raises(FormatError, match=r"junk\.tar"): tar_extract(tmp_path / "junk.tar")
  with pytest.raises(TypeError, match="expected a path"): tar_extract(3)
