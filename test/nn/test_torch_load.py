"""nn/torch_load.py: the legacy tar archive (written here by hand in PyTorch's layout, and checked
by torch.load itself), big strided views as movement ops, fp8 checkpoints, error messages."""
import io
import pickle
import struct
import tarfile
import time
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.nn.state import FormatError, torch_load

torch = pytest.importorskip("torch")


class Ref:
  """A placeholder the main pickle refers to a tensor of the `tensors` member by."""

  def __init__(self, key: int) -> None: self.key = key


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def legacy_tar(obj, views: dict[int, tuple], storages: dict[int, torch.Tensor],
               storage_views: list[tuple] = (), cut: int = 0) -> bytes:
  """A PyTorch < 0.4 tar checkpoint: `storages` (count, per storage (key, location, class),
  int64 numel and the data; then the storage views), `tensors` (count, per tensor (key, storage
  key, class), int32 ndim, 4 bytes, sizes, strides, offset) and `pickle` (obj with persistent ids
  of tensor keys). `views`: tensor key -> (storage key, size, stride, offset)."""
  st = io.BytesIO()
  st.write(pickle.dumps(len(storages), protocol=2))
  for key, s in storages.items():
    st.write(pickle.dumps((key, "cpu", torch.FloatStorage if s.dtype == torch.float32
                           else torch.HalfStorage), protocol=2))
    st.write(struct.pack("<q", s.numel()) + s.numpy().tobytes())
  st.write(pickle.dumps(list(storage_views), protocol=2))
  te = io.BytesIO()
  te.write(pickle.dumps(len(views), protocol=2))
  for key, (skey, size, stride, offset) in views.items():
    te.write(pickle.dumps((key, skey, torch.FloatTensor), protocol=2))
    te.write(struct.pack("<i", len(size)) + b"\0" * 4)
    te.write(struct.pack(f"<{len(size)}q", *size) + struct.pack(f"<{len(size)}q", *stride))
    te.write(struct.pack("<q", offset))
  main = io.BytesIO()
  pickler = pickle.Pickler(main, protocol=2)
  pickler.persistent_id = lambda o: str(o.key) if isinstance(o, Ref) else None
  pickler.dump(obj)
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
    _member(tar, "storages", st.getvalue()[:len(st.getvalue()) - cut])
    _member(tar, "tensors", te.getvalue())
    _member(tar, "pickle", main.getvalue())
  return out.getvalue()


def sample_tar(**kw) -> bytes:
  base = torch.arange(24, dtype=torch.float32)
  views = {1: (10, (4, 6), (6, 1), 0), 2: (10, (6, 4), (1, 6), 0), 3: (10, (3, 3), (1, 1), 5),
           4: (11, (2, 2), (2, 1), 1)}
  obj = {"w": Ref(1), "wt": Ref(2), "overlap": Ref(3), "in_view": Ref(4), "n": 7,
         "list": [Ref(1), "x"]}
  return legacy_tar(obj, views, {10: base}, [(11, 10, 8, 6)], **kw)


def test_legacy_tar_checkpoint_matches_torch_load(tmp_path):
  path = tmp_path / "old.tar"
  path.write_bytes(sample_tar())
  ref = torch.load(path, weights_only=False)  # the hand-written archive is a valid checkpoint
  got = torch_load(path)
  assert got["n"] == 7 and got["list"][1] == "x"
  for k in ("w", "wt", "overlap", "in_view"):
    np.testing.assert_array_equal(got[k].numpy(), ref[k].numpy())
  np.testing.assert_array_equal(got["list"][0].numpy(), ref["w"].numpy())


def test_legacy_tar_from_a_tensor_of_its_bytes():
  data = sample_tar()
  got = torch_load(Tensor(data, dtype=dtypes.uint8))
  np.testing.assert_array_equal(got["in_view"].numpy(), [[9.0, 10.0], [11.0, 12.0]])


def test_legacy_tar_truncated_or_lying_raises_naming_file_and_field(tmp_path):
  path = tmp_path / "cut.tar"
  path.write_bytes(sample_tar(cut=60))  # the storage data is cut short
  with pytest.raises(FormatError, match=r"storage 10 \(numel=24\) is truncated.*cut\.tar"):
    torch_load(path)
  base = torch.arange(4, dtype=torch.float32)
  lying = legacy_tar({"w": Ref(1)}, {1: (10, (3, 3), (3, 1), 0)}, {10: base})
  (tmp_path / "lie.tar").write_bytes(lying)
  with pytest.raises(FormatError, match=r"reads past its storage of 4 elements.*lie\.tar"):
    torch_load(tmp_path / "lie.tar")
  bad_view = legacy_tar({"w": Ref(1)}, {1: (10, (2,), (1,), 0)}, {10: base}, [(11, 10, 3, 5)])
  with pytest.raises(FormatError, match="storage view 11"): torch_load(bad_view)


def test_legacy_tar_refuses_arbitrary_globals():
  class Evil:
    def __reduce__(self): return (print, ("pwned",))
  with pytest.raises(FormatError, match="refusing to unpickle builtins.print"):
    torch_load(legacy_tar({"e": Evil()}, {}, {}))


# ---- strided views over big storages ----

@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_big_overlapping_view_of_a_big_storage_is_fast(tmp_path, zipped):
  """Regression: a 2000x2000 view with strides (1, 1) of a 5M-element storage was a gather that
  did not finish in 10 minutes; it is a skew of movement ops (one kernel) now."""
  base = torch.arange(5_000_000, dtype=torch.float32)
  views = {"overlap": base.as_strided((2000, 2000), (1, 1), 7),
           "irregular": base.as_strided((2000, 2000), (3, 2), 11),
           "rows": base.as_strided((2000, 2000), (2400, 1), 100)}
  torch.save(views, tmp_path / "v.pt", _use_new_zipfile_serialization=zipped)
  t0 = time.perf_counter()
  got = torch_load(tmp_path / "v.pt", device="CPU")
  for k, v in views.items(): np.testing.assert_array_equal(got[k].numpy(), v.numpy())
  assert time.perf_counter() - t0 < 20.0


def test_skewed_views_of_every_shape_match_torch():
  rng = np.random.default_rng(0)
  base = torch.arange(400, dtype=torch.float32)
  for _ in range(40):
    nd = int(rng.integers(1, 4))
    size = tuple(int(s) for s in rng.integers(1, 6, nd))
    stride = tuple(int(s) for s in rng.integers(0, 7, nd))
    offset = int(rng.integers(0, 20))
    v = base.as_strided(size, stride, offset)
    buf = io.BytesIO()
    torch.save({"v": v}, buf)
    got = torch_load(buf.getvalue(), device="PYTHON")["v"]
    np.testing.assert_array_equal(got.numpy(), v.numpy(),
                                  err_msg=f"{size} {stride} {offset}")


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_fp8_checkpoint(zipped):
  x = torch.tensor([0.5, -2.0, 448.0, 1e-3]).to(torch.float8_e4m3fn)
  buf = io.BytesIO()
  torch.save({"x": x, "y": x.to(torch.float32).to(torch.float8_e5m2)[::2]}, buf,
             _use_new_zipfile_serialization=zipped)
  got = torch_load(buf.getvalue())
  assert got["x"].dtype == dtypes.fp8e4m3 and got["y"].dtype == dtypes.fp8e5m2
  assert got["x"].bitcast(dtypes.uint8).tolist() == x.view(torch.uint8).tolist()
  np.testing.assert_array_equal(got["y"].numpy(), [0.5, 448.0])


def test_errors_name_the_file(tmp_path):
  (tmp_path / "junk.pth").write_bytes(b"\x80\x02junk")
  with pytest.raises(FormatError, match=r"junk\.pth"): torch_load(tmp_path / "junk.pth")
  with pytest.raises(TypeError, match="expected a path"): torch_load(42)


# ---- compressed storages (zip bombs) ----

class FakeStorage:
  """A storage the pickle refers to by persistent id (key "0", `numel` float32 elements)."""

  def __init__(self, numel: int) -> None: self.numel = numel


class FakeTensor:
  def __init__(self, numel: int) -> None: self.numel = numel

  def __reduce__(self):
    return (torch._utils._rebuild_tensor_v2,
            (FakeStorage(self.numel), 0, (self.numel,), (1,), False, OrderedDict()))


class StoragePickler(pickle.Pickler):
  def persistent_id(self, obj):
    if isinstance(obj, FakeStorage): return ("storage", torch.FloatStorage, "0", "cpu", obj.numel)
    return None


def zip_checkpoint(numel: int, member: bytes, declared: int | None = None) -> bytes:
  """A torch.save-like archive: a pickle of one float32 tensor of `numel` elements and its
  storage member compressed with deflate (its declared size forged to `declared` if given)."""
  pkl = io.BytesIO()
  StoragePickler(pkl, protocol=2).dump({"w": FakeTensor(numel)})
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as zf:
    zf.writestr("archive/data.pkl", pkl.getvalue())
    zf.writestr("archive/data/0", member, compress_type=zipfile.ZIP_DEFLATED)
  data = bytearray(buf.getvalue())
  if declared is not None:  # the uncompressed size in data/0's central directory entry
    at = data.index(b"PK\x01\x02archive/data/0"[:4], data.index(b"PK\x01\x02") + 4)
    assert data[at + 46:at + 60] == b"archive/data/0"
    data[at + 24:at + 28] = struct.pack("<I", declared)
  return bytes(data)


def refuse_storage_reads(monkeypatch) -> None:
  """Fail the test if a storage member is decompressed (the pickle may be)."""
  read = zipfile.ZipFile.read

  def checked(self, name, *args):
    if "/data/" in str(name): pytest.fail(f"{name} was decompressed")
    return read(self, name, *args)
  monkeypatch.setattr(zipfile.ZipFile, "read", checked)


def test_compressed_storage_loads():
  data = zip_checkpoint(4, np.arange(4, dtype=np.float32).tobytes())
  np.testing.assert_array_equal(torch_load(data)["w"].numpy(), [0, 1, 2, 3])


def test_zip_member_bigger_than_its_storage_is_refused_before_decompressing(monkeypatch):
  """A small archive whose storage inflates to far more than the pickle reads (a zip bomb):
  refused from the declared sizes, before anything is decompressed."""
  data = zip_checkpoint(4, bytes(16 << 20))
  assert len(data) < 100_000
  refuse_storage_reads(monkeypatch)
  with pytest.raises(FormatError, match="declares 16777216 bytes, but its storage needs 16"):
    torch_load(data)


def test_zip_member_that_inflates_beyond_deflate_limit_is_refused(monkeypatch):
  """The pickle and the member both claim 2**31 bytes from a few compressed ones."""
  data = zip_checkpoint(2 ** 29, bytes(4096), declared=2 ** 31)
  refuse_storage_reads(monkeypatch)
  with pytest.raises(FormatError, match="would inflate .* to 2147483648, more than 1100 times"):
    torch_load(data)
