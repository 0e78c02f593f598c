"""PyTorch checkpoints: `torch_load` reads every `torch.save` format without importing torch.

Formats: the zip archive (`data.pkl` + `data/<key>` storages, PyTorch >= 1.6), the legacy
pickle stream (`_use_new_zipfile_serialization=False`: magic, protocol, sys info, the pickle,
then the storages) and the legacy tar archive (PyTorch < 0.4: members `storages`, `tensors`,
`pickle`). Security: the unpickler resolves only tensors, storages, dtypes and plain containers;
any other global raises before anything is called, so a checkpoint cannot run code.
A tensor is a view (size, stride, offset) of its storage: one buffer per storage, and each view
is movement ops over it (a strided, even overlapping, view is a reshape/pad/shrink chain: one
kernel computing addresses, no gather), so loading a 2000x2000 view of a big storage is cheap.
"""
from __future__ import annotations

import codecs
import io
import math
import pickle
import struct
import tarfile
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.tensor_io import FileLike, FormatError, read_bytes, source_name, tensor_from_bytes

__all__ = ["torch_load"]

TORCH_DTYPES: dict[str, DType] = {
  "float64": dtypes.float64, "double": dtypes.float64, "float32": dtypes.float32,
  "float": dtypes.float32, "float16": dtypes.float16, "half": dtypes.float16,
  "bfloat16": dtypes.bfloat16, "int64": dtypes.int64, "long": dtypes.int64, "int32": dtypes.int32,
  "int": dtypes.int32, "int16": dtypes.int16, "short": dtypes.int16, "int8": dtypes.int8,
  "uint8": dtypes.uint8, "uint16": dtypes.uint16, "uint32": dtypes.uint32,
  "uint64": dtypes.uint64, "bool": dtypes.bool, "float8_e4m3fn": dtypes.fp8e4m3,
  "float8_e5m2": dtypes.fp8e5m2, "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
  "float8_e5m2fnuz": dtypes.fp8e5m2fnuz}
TORCH_STORAGES: dict[str, DType | None] = {
  "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8,
  "BoolStorage": dtypes.bool, "UntypedStorage": None}
# the legacy tensor classes a tar archive names beside each tensor (only recorded, never called)
TORCH_TENSOR_TYPES = frozenset(k.replace("Storage", "Tensor") for k in TORCH_STORAGES)
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_INFLATION = 1100  # the most a compressed storage may grow (deflate's limit is about 1032:1)


@dataclass(frozen=True)
class StorageType:
  """What a torch storage class unpickles to: the element dtype (None for UntypedStorage)."""
  dtype: DType | None


@dataclass(frozen=True)
class TensorType:
  """What a legacy tensor class (torch.FloatTensor) unpickles to."""
  name: str


@dataclass
class Storage:
  """A torch storage: little-endian bytes of `dtype` elements (uint8 when untyped)."""
  data: memoryview | None
  dtype: DType
  flat: dict[DType, Tensor]  # the storage as a 1-D Tensor, per element dtype it is read as


def _is_int(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)


def _byteswapped(data: memoryview, itemsize: int) -> memoryview:
  out = bytearray(len(data))
  for j in range(itemsize): out[j::itemsize] = data[itemsize - 1 - j::itemsize]
  return memoryview(bytes(out))


# ---- views of a storage as movement ops ----

def _block_shape(sizes: list[int], strides: list[int]) -> list[int] | None:
  """For axes sorted by decreasing stride, the shape that lays them out as nested blocks
  (each stride a multiple of the next, no overlap), or None when they do not nest."""
  shape = [sizes[0]]
  for k in range(1, len(sizes)):
    if strides[k - 1] % strides[k] or strides[k - 1] < sizes[k] * strides[k]: return None
    shape.append(strides[k - 1] // strides[k])
  return shape + ([strides[-1]] if strides[-1] != 1 else [])


def _nested_view(x: Tensor, sizes: list[int], strides: list[int]) -> Tensor | None:
  """The view of a 1-D span whose strides nest: reshape into blocks, shrink each block."""
  block = _block_shape(sizes, strides)
  if block is None: return None
  span = math.prod(block)
  x = x.pad(((0, span - x.shape[0]),)).reshape(block)
  return x.shrink(tuple((0, s) for s in sizes) + ((0, 1),) * (len(block) - len(sizes)))


def _skewed_view(x: Tensor, sizes: list[int], strides: list[int]) -> Tensor:
  """Any view of a 1-D span (overlapping or irregular strides), one axis at a time: with
  z[..., m] = span[base + m] (m < L), repeat z n times, flatten, pad to rows of L + s and shrink
  to L - (n-1)*s columns: row i, column k then holds z[..., i*s + k], the axis of stride s."""
  z, lead, width = x, [], x.shape[0]
  for n, s in zip(sizes, strides):
    keep = tuple((0, d) for d in lead)
    z = z.reshape(*lead, 1, width).expand(*lead, n, width).reshape(*lead, n * width)
    z = z.pad(((0, 0),) * len(lead) + ((0, n * s),)).reshape(*lead, n, width + s)
    width -= (n - 1) * s
    z = z.shrink(keep + ((0, n), (0, width)))
    lead.append(n)
  return z.reshape(lead)


def _strided_view(flat: Tensor, offset: int, size: tuple, stride: tuple) -> Tensor:
  """A torch view (size, stride, storage offset) of a 1-D tensor as movement ops over the span it
  reads: nested blocks when the strides nest, else the skew construction; then permute to the
  view's axis order and expand the stride-0 axes."""
  axes = [i for i, s in enumerate(size) if s > 1 and stride[i] != 0]
  axes.sort(key=lambda i: -stride[i])
  sizes, strides = [size[i] for i in axes], [stride[i] for i in axes]
  span = 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
  x = flat.shrink(((offset, offset + span),))
  if not axes: return x.reshape([1] * len(size)).expand(size)
  view = _nested_view(x, sizes, strides)
  if view is None: view = _skewed_view(x, sizes, strides)
  view = view.reshape(sizes).permute(sorted(range(len(axes)), key=lambda j: axes[j]))
  return view.reshape([s if i in axes else 1 for i, s in enumerate(size)]).expand(size)


def _check_view(n: int, offset: int, size: tuple, stride: tuple) -> None:
  if len(size) != len(stride) or not all(_is_int(v) and v >= 0 for v in (offset, *size, *stride)):
    raise FormatError(f"torch_load: invalid tensor view size={size} stride={stride} "
                      f"offset={offset}")
  last = offset + sum((s - 1) * t for s, t in zip(size, stride))
  if 0 not in size and last >= n:
    raise FormatError(f"torch_load: a view of size {size}, stride {stride} at offset {offset} "
                      f"reads past its storage of {n} elements (corrupted file?)")


def _rebuild(st: Storage, offset: int, size: tuple, stride: tuple, dtype: DType,
             device: str | None) -> Tensor:
  if st.data is None: return Tensor([])  # the first pass over a legacy file: no data yet
  n = len(st.data) // dtype.itemsize
  _check_view(n, offset, tuple(size), tuple(stride))
  if 0 in size: return Tensor(b"", device, dtype).reshape(size)
  if dtype not in st.flat: st.flat[dtype] = tensor_from_bytes(st.data, device, dtype)
  return _strided_view(st.flat[dtype], offset, tuple(size), tuple(stride))


def _rebuild_parameter(data: Tensor, requires_grad: bool = True, *_: Any) -> Tensor:
  data.requires_grad = requires_grad
  return data


def _rebuild_from_type(fn: Callable, _cls: Any, args: tuple, _state: Any) -> Any: return fn(*args)


def _tensor_class(*_: Any) -> Any:
  """What torch.Tensor and nn.Parameter unpickle to: only an argument of _rebuild_from_type_v2."""
  raise FormatError("torch_load: a tensor class is called directly: unsupported pickle")


# ---- the restricted unpickler ----

class _TorchUnpickler(pickle.Unpickler):
  """Unpickles torch.save data: tensors, storages, dtypes and plain containers, nothing else."""

  def __init__(self, f: io.BytesIO, storage_for: Callable[[Any], Any],
               device: str | None) -> None:
    super().__init__(f)
    self.storage_for, self.device = storage_for, device
    self.allowed: dict[tuple[str, str], Any] = {
      ("torch._utils", "_rebuild_tensor_v2"): self.rebuild_v2,
      ("torch._utils", "_rebuild_tensor"): self.rebuild_v2,
      ("torch._utils", "_rebuild_tensor_v3"): self.rebuild_v3,
      ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
      ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
      ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
      ("torch", "Tensor"): _tensor_class, ("torch.nn.parameter", "Parameter"): _tensor_class,
      ("torch", "Size"): tuple, ("collections", "OrderedDict"): OrderedDict,
      ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
      ("builtins", "slice"): slice, ("builtins", "complex"): complex,
      ("_codecs", "encode"): codecs.encode}

  def rebuild_v2(self, st: Storage, offset: int, size: tuple, stride: tuple,
                 requires_grad: bool = False, *_: Any) -> Tensor:
    t = _rebuild(st, offset, size, stride, st.dtype, self.device)
    return _rebuild_parameter(t, True) if requires_grad else t

  def rebuild_v3(self, st: Storage, offset: int, size: tuple, stride: tuple,
                 requires_grad: bool, hooks: Any, dtype: DType, *_: Any) -> Tensor:
    t = _rebuild(st, offset, size, stride, dtype, self.device)
    return _rebuild_parameter(t, True) if requires_grad else t

  def find_class(self, module: str, name: str) -> Any:
    if module == "__builtin__": module = "builtins"  # protocol 2 spells Python 2's name
    if module in ("torch", "torch.storage") and name in TORCH_STORAGES:
      return StorageType(TORCH_STORAGES[name])
    if module == "torch" and name in TORCH_TENSOR_TYPES: return TensorType(name)
    if module == "torch" and name in TORCH_DTYPES: return TORCH_DTYPES[name]
    found = self.allowed.get((module, name))
    if found is not None: return found
    raise FormatError(f"torch_load: refusing to unpickle {module}.{name}: only tensors, state "
                      "dicts and plain containers are supported (save model.state_dict(), not "
                      "the model)")

  def persistent_load(self, pid: Any) -> Any: return self.storage_for(pid)


def _storage_pid(pid: Any) -> tuple:
  if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
    raise FormatError(f"torch_load: unsupported persistent id {str(pid)[:80]}")
  if len(pid) < 5: raise FormatError(f"torch_load: malformed storage id {str(pid)[:80]}")
  return pid


def _storage_type(kind: Any) -> DType:
  if not isinstance(kind, StorageType):
    raise FormatError(f"torch_load: bad storage type {kind!r}")
  return kind.dtype or dtypes.uint8


def _plain_load(f: io.BytesIO) -> Any:
  def no_storage(pid: Any) -> Any: raise FormatError("torch_load: unexpected persistent id")
  return _TorchUnpickler(f, no_storage, None).load()


# ---- zip archives ----

def _check_inflation(info: zipfile.ZipInfo, needed: int) -> None:
  """Refuse, before anything is decompressed, a compressed member bigger than the storage the
  pickle reads from it, or bigger than its compressed bytes can inflate to (a zip bomb)."""
  if info.file_size > needed:
    raise FormatError(f"torch_load: member {info.filename!r} declares {info.file_size} bytes, "
                      f"but its storage needs {needed}: refusing to decompress it")
  if info.file_size > MAX_INFLATION * max(info.compress_size, 1):
    raise FormatError(f"torch_load: member {info.filename!r} would inflate "
                      f"{info.compress_size} compressed bytes to {info.file_size}, more than "
                      f"{MAX_INFLATION} times (deflate's limit is 1032): refusing to decompress it")


def _member_bytes(zf: zipfile.ZipFile, data: memoryview, name: str, needed: int) -> memoryview:
  """A zip member's bytes: a slice of the file when stored uncompressed (as torch.save writes
  them; no copy, no CRC pass over gigabytes), else the decompressed copy, at most `needed`
  bytes (the storage's size the pickle gives)."""
  info = zf.getinfo(name)
  if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:  # compressed or encrypted
    _check_inflation(info, needed)
    return memoryview(zf.read(name))
  head = bytes(data[info.header_offset:info.header_offset + 30])
  if len(head) != 30 or head[:4] != b"PK\x03\x04":
    raise FormatError(f"torch_load: member {name!r}: bad local header")
  start = info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(
    head[28:30], "little")
  if start + info.file_size > len(data):
    raise FormatError(f"torch_load: member {name!r} (file_size={info.file_size}) runs past the "
                      "end of the archive (truncated file?)")
  return data[start:start + info.file_size]


def _load_zip(data: memoryview, device: str | None) -> Any:
  with zipfile.ZipFile(io.BytesIO(data)) as zf:
    names = zf.namelist()
    pkl = min((n for n in names if n.endswith("data.pkl")), key=len, default=None)
    if pkl is None: raise FormatError("torch_load: the zip archive has no data.pkl")
    root = pkl[:-len("data.pkl")]
    big_endian = root + "byteorder" in names and zf.read(root + "byteorder") == b"big"
    storages: dict[str, Storage] = {}

    def storage_for(pid: Any) -> Storage:
      pid = _storage_pid(pid)
      key, dt = str(pid[2]), _storage_type(pid[1])
      if key not in storages:
        if not _is_int(pid[4]) or pid[4] < 0:
          raise FormatError(f"torch_load: storage {key!r}: bad element count {pid[4]!r}")
        raw = _member_bytes(zf, data, f"{root}data/{key}", pid[4] * dt.itemsize)
        storages[key] = Storage(_byteswapped(raw, dt.itemsize) if big_endian else raw, dt, {})
      return storages[key]
    return _TorchUnpickler(io.BytesIO(zf.read(pkl)), storage_for, device).load()


# ---- the legacy pickle stream ----

def _read_storage(f: io.BytesIO, dt: DType, key: Any, little: bool) -> Storage:
  """An int64 element count, then the elements."""
  head = f.read(8)
  if len(head) != 8:
    raise FormatError(f"torch_load: storage {key!r}: the element count is truncated")
  numel = int.from_bytes(head, "little" if little else "big")
  raw = f.read(numel * dt.itemsize)
  if len(raw) != numel * dt.itemsize:
    raise FormatError(f"torch_load: storage {key!r} (numel={numel}) is truncated")
  return Storage(memoryview(raw) if little else _byteswapped(memoryview(raw), dt.itemsize), dt, {})


def _legacy_storages(f: io.BytesIO, pids: dict[str, tuple], little: bool) -> dict[str, Storage]:
  """The storage data that follows the pickles of a legacy file, per key."""
  out: dict[str, Storage] = {}
  keys = _plain_load(f)
  if not isinstance(keys, list): raise FormatError("torch_load: the storage key list is missing")
  for key in keys:
    if str(key) not in pids: raise FormatError(f"torch_load: unknown storage {key!r}")
    out[str(key)] = _read_storage(f, _storage_type(pids[str(key)][1]), key, little)
  return out


def _legacy_view(root: Storage, pid: tuple) -> Storage:
  """A legacy storage view (`view_metadata` = (key, offset, size)) of a root storage."""
  _, offset, size = pid[5]
  sz = root.dtype.itemsize
  assert root.data is not None
  return Storage(root.data[offset * sz:(offset + size) * sz], root.dtype, {})


def _load_legacy(data: memoryview, device: str | None) -> Any:
  f = io.BytesIO(data)
  try: magic = _plain_load(f)
  except (pickle.UnpicklingError, EOFError, ValueError) as e:
    raise FormatError("torch_load: not a PyTorch file (neither zip, tar nor legacy format)") from e
  if magic != LEGACY_MAGIC:
    raise FormatError("torch_load: invalid magic number: not a PyTorch file")
  if _plain_load(f) != LEGACY_PROTOCOL: raise FormatError("torch_load: unknown legacy protocol")
  sys_info = _plain_load(f)
  start, pids = f.tell(), {}

  def record(pid: Any) -> Storage:  # first pass: learn the storages; tensors are not built yet
    pid = _storage_pid(pid)
    pids[str(pid[2])] = pid
    return Storage(None, _storage_type(pid[1]), {})
  _TorchUnpickler(f, record, device).load()
  little = not isinstance(sys_info, dict) or sys_info.get("little_endian", True)
  roots, views = _legacy_storages(f, pids, little), {}

  def storage_for(pid: Any) -> Storage:
    pid = _storage_pid(pid)
    root = roots[str(pid[2])]
    if len(pid) < 6 or pid[5] is None: return root
    return views.setdefault(str(pid[5][0]), _legacy_view(root, pid))
  return _TorchUnpickler(io.BytesIO(data[start:]), storage_for, device).load()


# ---- the legacy tar archive ----

def _tar_storages(f: io.BytesIO) -> dict[Any, Storage]:
  """Member `storages`: a count, per storage (key, location, type) and its data, then the views
  (target key, root key, offset, numel)."""
  out: dict[Any, Storage] = {}
  count = _plain_load(f)
  if not _is_int(count) or count < 0: raise FormatError(f"torch_load: bad storage count {count!r}")
  for _ in range(count):
    entry = _plain_load(f)
    if not isinstance(entry, tuple) or len(entry) != 3:
      raise FormatError(f"torch_load: bad storage record {str(entry)[:80]}")
    out[entry[0]] = _read_storage(f, _storage_type(entry[2]), entry[0], True)
  for view in _plain_load(f):
    target, root, offset, numel = view
    base = out[root]
    sz = base.dtype.itemsize
    assert base.data is not None
    if offset * sz + numel * sz > len(base.data):
      raise FormatError(f"torch_load: storage view {target!r} (offset={offset}, numel={numel}) "
                        f"reads past storage {root!r}")
    out[target] = Storage(base.data[offset * sz:(offset + numel) * sz], base.dtype, {})
  return out


def _tar_tensors(f: io.BytesIO, storages: dict[Any, Storage],
                 device: str | None) -> dict[Any, Tensor]:
  """Member `tensors`: a count, per tensor (key, storage key, class) then int32 ndim, 4 bytes of
  padding, int64 sizes, int64 strides and the int64 storage offset."""
  out: dict[Any, Tensor] = {}
  count = _plain_load(f)
  if not _is_int(count) or count < 0: raise FormatError(f"torch_load: bad tensor count {count!r}")
  for _ in range(count):
    key, storage_key, _cls = _plain_load(f)
    head = f.read(8)
    if len(head) != 8: raise FormatError(f"torch_load: tensor {key!r}: ndim is truncated")
    ndim = struct.unpack("<i", head[:4])[0]
    if not 0 <= ndim <= 64: raise FormatError(f"torch_load: tensor {key!r}: bad ndim {ndim}")
    meta = f.read(16 * ndim + 8)
    if len(meta) != 16 * ndim + 8:
      raise FormatError(f"torch_load: tensor {key!r}: sizes/strides are truncated")
    vals = struct.unpack(f"<{2 * ndim + 1}q", meta)
    st = storages[storage_key]
    out[int(key)] = _rebuild(st, vals[-1], vals[:ndim], vals[ndim:2 * ndim], st.dtype, device)
  return out


def _load_tar(data: memoryview, device: str | None) -> Any:
  with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
    def member(name: str) -> io.BytesIO:
      f = tar.extractfile(name) if name in tar.getnames() else None
      if f is None: raise FormatError(f"torch_load: the tar archive has no member {name!r}")
      return io.BytesIO(f.read())
    storages = _tar_storages(member("storages"))
    tensors = _tar_tensors(member("tensors"), storages, device)

    def tensor_for(pid: Any) -> Any:
      if isinstance(pid, tuple): return pid[0]  # a module's source record: its object
      return tensors[int(pid)]
    return _TorchUnpickler(member("pickle"), tensor_for, device).load()


def torch_load(fn: FileLike, device: str | None = None) -> Any:
  """Load a `torch.save` file (a path, its bytes, or a uint8 Tensor of them) without torch:
  tensors become Tensors (views of one buffer per storage, keeping strides and offsets),
  containers stay containers. Raises FormatError (a ValueError) naming the file on a malformed,
  truncated or unsupported file. `load_state_dict(model, torch_load("model.pth"))`"""
  data = read_bytes(fn, "torch_load")
  try:
    if zipfile.is_zipfile(io.BytesIO(data)): return _load_zip(data, device)
    if _is_tar(data): return _load_tar(data, device)
    return _load_legacy(data, device)
  except FormatError as e: raise FormatError(f"{e} (in {source_name(fn)})") from None
  except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, tarfile.TarError, KeyError,
          IndexError, TypeError, ValueError, AttributeError, OverflowError, MemoryError,
          NotImplementedError, struct.error) as e:
    raise FormatError(f"torch_load: corrupted or unsupported file {source_name(fn)} "
                      f"({type(e).__name__}: {e})") from e


def _is_tar(data: memoryview) -> bool: return bytes(data[257:262]) == b"ustar"
