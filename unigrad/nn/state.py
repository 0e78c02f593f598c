"""Model state: parameters, state dicts, safetensors files and PyTorch checkpoints.

`get_state_dict(model)` walks attributes, lists, tuples and dicts and names every Tensor by its
dotted path (`layers.0.weight`), as PyTorch and tinygrad do. `safe_save`/`safe_load` write and read
the safetensors format byte for byte as the `safetensors` library does, and validate every offset
before touching the data. `torch_load` reads `torch.save` files (zip and legacy formats) without
importing torch: its unpickler knows only tensors, storages and plain containers.
"""
from __future__ import annotations

import codecs
import io
import json
import math
import os
import pickle
import struct
import types
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from unigrad.dtype import DType, dtypes
from unigrad.engine import realize as engine
from unigrad.frontend.tensor import Tensor
from unigrad.runtime.device import Device

__all__ = ["get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load",
           "safe_load_metadata", "torch_load", "StateDictError", "IncompatibleKeys"]

FileLike = str | os.PathLike | bytes | bytearray | memoryview


def _check_file_like(fn: Any, caller: str) -> None:
  """A path or bytes; anything else (an int would open a file descriptor) is a TypeError."""
  if not isinstance(fn, (str, os.PathLike, bytes, bytearray, memoryview)):
    raise TypeError(f"{caller}: expected a path (str or os.PathLike) or the file's bytes, "
                    f"got {type(fn).__name__}")


def _read_bytes(fn: FileLike, caller: str) -> memoryview:
  """The contents of a file (a path), or the bytes themselves."""
  _check_file_like(fn, caller)
  if isinstance(fn, (bytes, bytearray, memoryview)): return memoryview(fn).cast("B")
  with open(fn, "rb") as f: return memoryview(f.read())


def _raw_bytes(t: Tensor) -> memoryview:
  """The row-major bytes of a tensor (realizing it)."""
  return t._bytes()


# ---- state dicts ----

_LEAF_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
               types.MethodType, str, bytes)


def _children(obj: Any) -> Iterable[tuple[str, Any]]:
  """Named sub-objects: dict items, namedtuple fields, list/tuple items, attributes."""
  if isinstance(obj, dict): return ((str(k), v) for k, v in obj.items())
  if isinstance(obj, tuple) and hasattr(obj, "_asdict"): return obj._asdict().items()
  if isinstance(obj, (list, tuple)): return ((str(i), v) for i, v in enumerate(obj))
  if isinstance(obj, _LEAF_TYPES): return ()
  attrs = getattr(obj, "__dict__", None)
  return attrs.items() if isinstance(attrs, dict) else ()


def _walk(obj: Any, prefix: str, tensor_type: type, out: dict[str, Any], active: set[int]) -> None:
  if isinstance(obj, tensor_type):
    out[prefix.rstrip(".")] = obj
    return
  if id(obj) in active: return  # a cycle (a child that refers back to its parent)
  active.add(id(obj))
  for name, child in _children(obj): _walk(child, f"{prefix}{name}.", tensor_type, out, active)
  active.discard(id(obj))


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every Tensor reachable from `obj` through attributes, lists, tuples and dicts, by dotted name
  in attribute order. A tensor shared by two attributes appears under both names (as in PyTorch).
  `get_state_dict(model)` -> `{"l1.weight": ..., "layers.0.bias": ...}`"""
  out: dict[str, Tensor] = {}
  _walk(obj, prefix, tensor_type, out, set())
  return out


def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct Tensors of `get_state_dict(obj)` (deduplicated by identity), in its order."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())


class StateDictError(RuntimeError):
  """A state dict does not fit a model: missing, unexpected or mis-shaped keys."""


class IncompatibleKeys(NamedTuple):
  missing_keys: list[str]
  unexpected_keys: list[str]


def _key_list(keys: list[str]) -> str: return ", ".join(f'"{k}"' for k in keys)


def _mismatch_errors(model_sd: dict[str, Tensor], state_dict: dict[str, Tensor]) -> list[str]:
  return [f"size mismatch for {k}: copying a param with shape {tuple(state_dict[k].shape)} from "
          f"checkpoint, the shape in current model is {tuple(t.shape)}."
          for k, t in model_sd.items() if k in state_dict and
          tuple(state_dict[k].shape) != tuple(t.shape)]


def _converted(v: Tensor, like: Tensor) -> Tensor:
  """`v` in the dtype and on the device of `like`."""
  if v.device != like.device: v = Tensor(_raw_bytes(v), like.device, v.dtype).reshape(v.shape)
  return v if v.dtype == like.dtype else v.cast(like.dtype)


def _write(t: Tensor, v: Tensor, adopted: set[int] | None) -> Tensor:
  """Give model tensor `t` the value of checkpoint tensor `v` (converted). A realized `t` keeps
  its buffer and is written through `assign` (views of it see the new values); an unrealized one
  (a parameter whose initializer never ran) takes the value instead, so its initializer is never
  computed: `v`'s own buffer when `adopted` is a set (consume=True) not yet holding it, else a
  buffer-to-buffer copy when `v` is realized, else a lazy copy."""
  if engine.is_buffer_view(t.uop) or not isinstance(t.device, str):  # (multi-device: sharding)
    return t.assign(_converted(v, t))
  if v.dtype != t.dtype or v.device != t.device or not _is_single_buffer(v):
    return t.replace(_converted(v, t).contiguous())
  src = engine.buffer_of(v.uop)
  if adopted is not None and id(src) not in adopted:  # no two model tensors share one buffer
    adopted.add(id(src))
    return t.replace(Tensor._from_uop(v.uop, t.device))
  copy = engine.new_buffer(t.device, t.dtype, tuple(t.shape))
  engine.buffer_of(copy).copy_from(src)
  return t.replace(Tensor._from_uop(copy, t.device))


def _is_single_buffer(t: Tensor) -> bool:
  """Whether `t` is realized in a buffer of its own on one device (row-major, whole)."""
  return isinstance(t.device, str) and engine.is_realized(t.uop)


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True,
                    consume: bool = False, realize: bool = True) -> IncompatibleKeys:
  """Write `state_dict`'s values into the tensors of `model` (in place: realized tensors through
  `assign`, unrealized ones by taking a copy of the value, never computing their initializer),
  converting dtypes and devices. Shape mismatches always raise; missing and unexpected keys raise
  when `strict`. `consume` deletes loaded entries from `state_dict` and lets an unrealized model
  tensor take over a realized value's buffer instead of copying it (the value given away must not
  be written through another handle). Returns the key lists like PyTorch.
  `load_state_dict(model, safe_load("model.safetensors"), consume=True)`"""
  state_dict_t = {k: v if isinstance(v, Tensor) else Tensor(v) for k, v in state_dict.items()}
  model_sd = get_state_dict(model)
  missing = [k for k in model_sd if k not in state_dict_t]
  unexpected = [k for k in state_dict_t if k not in model_sd]
  errors = _mismatch_errors(model_sd, state_dict_t)
  if strict and unexpected:
    errors.insert(0, f"Unexpected key(s) in state_dict: {_key_list(unexpected)}.")
  if strict and missing: errors.insert(0, f"Missing key(s) in state_dict: {_key_list(missing)}.")
  if errors:
    raise StateDictError(f"Error(s) in loading state_dict for {type(model).__name__}:\n\t"
                         + "\n\t".join(errors))
  written: dict[int, Tensor] = {}
  adopted: set[int] | None = set() if consume else None
  for k, t in model_sd.items():
    if k not in state_dict_t or id(t) in written: continue
    v = state_dict_t[k]
    if v is not t: written[id(t)] = _write(t, v, adopted)
    if consume: del state_dict[k]
  if realize: Tensor.realize_all(*written.values())
  return IncompatibleKeys(missing, unexpected)


# ---- safetensors ----

class SafetensorsError(ValueError):
  """A safetensors file is malformed: truncated, corrupted or inconsistent."""


# in the `safetensors` library's dtype order: it writes tensors by it (last first), then by name
SAFE_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "I16": dtypes.int16,
  "U16": dtypes.uint16, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "I32": dtypes.int32,
  "U32": dtypes.uint32, "F32": dtypes.float32, "F64": dtypes.float64, "I64": dtypes.int64,
  "U64": dtypes.uint64}
SAFE_NAMES: dict[DType, str] = {v: k for k, v in SAFE_DTYPES.items()}
SAFE_ORDER: dict[str, int] = {name: i for i, name in enumerate(SAFE_DTYPES)}
MAX_HEADER_SIZE = 100_000_000  # the library's limit


@dataclass(frozen=True)
class SafeEntry:
  """One tensor of a safetensors header; offsets are relative to the data section."""
  name: str
  dtype: DType
  shape: tuple[int, ...]
  begin: int
  end: int


def _bad(msg: str) -> SafetensorsError: return SafetensorsError(f"safetensors: {msg}")


def _is_int(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(name: str, info: Any) -> SafeEntry:
  if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
    raise _bad(f"tensor {name!r}: expected {{dtype, shape, data_offsets}}, got {info!r}")
  dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
  if dt not in SAFE_DTYPES: raise _bad(f"tensor {name!r}: unsupported dtype {dt!r}")
  if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
    raise _bad(f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}")
  if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
    raise _bad(f"tensor {name!r}: data_offsets must be two ints, got {offs!r}")
  begin, end = offs
  nbytes = math.prod(shape) * SAFE_DTYPES[dt].itemsize
  if not 0 <= begin <= end or end - begin != nbytes:
    raise _bad(f"tensor {name!r}: data_offsets {offs} do not hold {dt}{shape} ({nbytes} bytes)")
  return SafeEntry(name, SAFE_DTYPES[dt], tuple(shape), begin, end)


def _check_layout(entries: list[SafeEntry], data_size: int) -> None:
  """The tensors tile the data section exactly: no overlap, no hole, nothing past its end."""
  pos, prev = 0, None
  for e in sorted(entries, key=lambda e: (e.begin, e.end)):
    if e.end > data_size:
      raise _bad(f"tensor {e.name!r} ends at byte {e.end} of a data section of {data_size} bytes "
                 "(truncated file?)")
    if e.begin < pos: raise _bad(f"tensors {prev!r} and {e.name!r} overlap")
    if e.begin > pos: raise _bad(f"bytes {pos}..{e.begin} of the data section belong to no tensor")
    pos, prev = e.end, e.name
  if pos != data_size:
    raise _bad(f"the data section has {data_size} bytes but the tensors cover {pos} (extra data)")


def _parse_header(head: bytes) -> tuple[list[SafeEntry], dict[str, str]]:
  try: header = json.loads(head.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise _bad(f"header is not JSON: {e}") from e
  if not isinstance(header, dict):
    raise _bad(f"header must be a JSON object, got {type(header).__name__}")
  meta = header.pop("__metadata__", {})
  if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
    raise _bad(f"__metadata__ must map strings to strings, got {meta!r}")
  return [_parse_entry(k, v) for k, v in header.items()], meta


def _header(size_field: bytes, read: Callable[[int], bytes],
            file_size: int) -> tuple[list[SafeEntry], dict[str, str], int]:
  """Parse and validate a safetensors header against the file size; `read(n)` gives the n header
  bytes after the size field. Returns the entries, the metadata and where the data starts."""
  if file_size < 8: raise _bad(f"file of {file_size} bytes is too short for the 8-byte header size")
  n = int.from_bytes(size_field, "little")
  if n > MAX_HEADER_SIZE: raise _bad(f"header size {n} exceeds the limit of {MAX_HEADER_SIZE}")
  if n > file_size - 8:
    raise _bad(f"header size {n} exceeds the {file_size - 8} bytes after it (truncated file?)")
  entries, meta = _parse_header(read(n))
  _check_layout(entries, file_size - 8 - n)
  return entries, meta, 8 + n


def _open_safetensors(fn: FileLike, with_data: bool,
                      caller: str) -> tuple[list[SafeEntry], dict[str, str], memoryview]:
  """The validated header of a file (a path, or its bytes) and, if `with_data`, its data section.
  Errors about a file name it."""
  _check_file_like(fn, caller)
  if isinstance(fn, (bytes, bytearray, memoryview)):
    data = memoryview(fn).cast("B")
    entries, meta, start = _header(bytes(data[:8]), lambda n: bytes(data[8:8 + n]), len(data))
    return entries, meta, data[start:]
  with open(fn, "rb") as f:
    try: entries, meta, _ = _header(f.read(8), f.read, os.fstat(f.fileno()).st_size)
    except SafetensorsError as e:
      raise SafetensorsError(f"{e} (in {os.fspath(fn)!r})") from None
    return entries, meta, memoryview(f.read() if with_data else b"")


def safe_load(fn: FileLike, device: str | None = None) -> dict[str, Tensor]:
  """Read a safetensors file (a path, or its bytes) into Tensors, in file order.
  Raises SafetensorsError (a ValueError) on any malformed or truncated file."""
  entries, _, body = _open_safetensors(fn, True, "safe_load")
  dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
  Device[dev]  # an unknown device fails here, before any buffer
  return {e.name: _tensor_from(body[e.begin:e.end], dev, e.dtype, e.shape) for e in entries}


def _tensor_from(data: memoryview, device: str, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """A Tensor holding a copy of `data` (copied once, straight into its buffer)."""
  if not data.nbytes: return Tensor(b"", device, dtype).reshape(shape)
  return Tensor._from_uop(engine.buffer_with_data(device, dtype, data, shape), device)


def safe_load_metadata(fn: FileLike) -> dict[str, str]:
  """The `__metadata__` strings of a safetensors file ({} when absent), after validating its
  header (the data itself is not read)."""
  return _open_safetensors(fn, False, "safe_load_metadata")[1]


def _check_save_args(tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> None:
  for k, t in tensors.items():
    if not isinstance(k, str) or k == "__metadata__":
      raise ValueError(f"safe_save: invalid tensor name {k!r}")
    if t.dtype not in SAFE_NAMES:
      raise TypeError(f"safe_save: {k!r} has dtype {t.dtype!r}, which safetensors lacks")
  if metadata is None: return
  if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise TypeError("safe_save: metadata must map strings to strings")


def _safe_header(tensors: dict[str, Tensor],
                 metadata: dict[str, str] | None) -> tuple[bytes, list[str]]:
  _check_save_args(tensors, metadata)
  order = sorted(tensors, key=lambda k: (-SAFE_ORDER[SAFE_NAMES[tensors[k].dtype]], k))
  header: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
  pos = 0
  for k in order:
    t = tensors[k]
    size = math.prod(t.shape) * t.dtype.itemsize
    header[k] = {"dtype": SAFE_NAMES[t.dtype], "shape": list(t.shape),
                 "data_offsets": [pos, pos + size]}
    pos += size
  text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
  return text + b" " * (-len(text) % 8), order


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
  """Write tensors as a safetensors file, byte-identical to `safetensors.*.save_file` (header JSON
  without spaces, padded with spaces to 8 bytes, tensors ordered by dtype then name)."""
  if not isinstance(fn, (str, os.PathLike)):
    raise TypeError(f"safe_save: expected a path (str or os.PathLike), got {type(fn).__name__}")
  header, order = _safe_header(tensors, metadata)
  Tensor.realize_all(*tensors.values())
  with open(fn, "wb") as f:
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    for k in order: f.write(_raw_bytes(tensors[k]))


# ---- PyTorch checkpoints ----

TORCH_DTYPES: dict[str, DType] = {
  "float64": dtypes.float64, "double": dtypes.float64, "float32": dtypes.float32,
  "float": dtypes.float32, "float16": dtypes.float16, "half": dtypes.float16,
  "bfloat16": dtypes.bfloat16, "int64": dtypes.int64, "long": dtypes.int64, "int32": dtypes.int32,
  "int": dtypes.int32, "int16": dtypes.int16, "short": dtypes.int16, "int8": dtypes.int8,
  "uint8": dtypes.uint8, "uint16": dtypes.uint16, "uint32": dtypes.uint32,
  "uint64": dtypes.uint64, "bool": dtypes.bool}
TORCH_STORAGES: dict[str, DType | None] = {
  "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8,
  "BoolStorage": dtypes.bool, "UntypedStorage": None}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


@dataclass(frozen=True)
class StorageType:
  """What a torch storage class unpickles to: the element dtype (None for UntypedStorage)."""
  dtype: DType | None


@dataclass
class Storage:
  """A torch storage: little-endian bytes of `dtype` elements (uint8 when untyped)."""
  data: memoryview | None
  dtype: DType
  flat: dict[DType, Tensor]  # the storage as a 1-D Tensor, per element dtype it is read as


def _byteswapped(data: memoryview, itemsize: int) -> memoryview:
  out = bytearray(len(data))
  for j in range(itemsize): out[j::itemsize] = data[itemsize - 1 - j::itemsize]
  return memoryview(bytes(out))


def _gather(flat: Tensor, offset: int, size: tuple, stride: tuple) -> Tensor:
  """An arbitrary (overlapping) strided view as one indexed read of the flat storage: the index
  offset + sum(i_k * stride_k) built from broadcast aranges, computed on the device."""
  idx = Tensor.full((1,) * len(size), offset, device=flat.device, dtype=dtypes.int64)
  for k, (s, t) in enumerate(zip(size, stride)):
    axis = Tensor.arange(s, device=flat.device, dtype=dtypes.int64) * t
    idx = idx + axis.reshape([s if j == k else 1 for j in range(len(size))])
  return flat[idx.expand(size)]


def _block_shape(sizes: list[int], strides: list[int]) -> list[int] | None:
  """For axes sorted by decreasing stride, the shape that lays them out as nested blocks
  (each stride a multiple of the next, no overlap), or None when they do not nest."""
  shape = [sizes[0]]
  for k in range(1, len(sizes)):
    if strides[k - 1] % strides[k] or strides[k - 1] < sizes[k] * strides[k]: return None
    shape.append(strides[k - 1] // strides[k])
  return shape + ([strides[-1]] if strides[-1] != 1 else [])


def _strided_view(flat: Tensor, offset: int, size: tuple, stride: tuple) -> Tensor | None:
  """A torch view (size, stride, storage offset) of a 1-D tensor as movement ops: slice the span,
  reshape it into nested blocks, shrink each block, permute, expand the stride-0 axes. None when
  the strides do not nest (an overlapping or irregular view)."""
  axes = [i for i, s in enumerate(size) if s > 1 and stride[i] != 0]
  axes.sort(key=lambda i: -stride[i])
  if not axes: return flat.shrink(((offset, offset + 1),)).reshape([1] * len(size)).expand(size)
  sizes, strides = [size[i] for i in axes], [stride[i] for i in axes]
  block = _block_shape(sizes, strides)
  if block is None: return None
  span = math.prod(block)
  end = min(flat.shape[0], offset + span)
  x = flat.shrink(((offset, end),)).pad(((0, offset + span - end),)).reshape(block)
  x = x.shrink(tuple((0, s) for s in sizes) + ((0, 1),) * (len(block) - len(sizes))).reshape(sizes)
  x = x.permute(sorted(range(len(axes)), key=lambda j: axes[j]))
  return x.reshape([s if i in axes else 1 for i, s in enumerate(size)]).expand(size)


def _check_view(n: int, offset: int, size: tuple, stride: tuple) -> None:
  if len(size) != len(stride) or not all(_is_int(v) and v >= 0 for v in (offset, *size, *stride)):
    raise ValueError(f"torch_load: invalid tensor view size={size} stride={stride} offset={offset}")
  last = offset + sum((s - 1) * t for s, t in zip(size, stride))
  if 0 not in size and last >= n:
    raise ValueError(f"torch_load: a view of size {size}, stride {stride} at offset {offset} reads "
                     f"past its storage of {n} elements (corrupted file?)")


def _rebuild(st: Storage, offset: int, size: tuple, stride: tuple, dtype: DType,
             device: str | None) -> Tensor:
  if st.data is None: return Tensor([])  # the first pass over a legacy file: no data yet
  n = len(st.data) // dtype.itemsize
  _check_view(n, offset, tuple(size), tuple(stride))
  if 0 in size: return Tensor(b"", device, dtype).reshape(size)
  if dtype not in st.flat: st.flat[dtype] = Tensor(st.data[:n * dtype.itemsize], device, dtype)
  view = _strided_view(st.flat[dtype], offset, tuple(size), tuple(stride))
  return view if view is not None else _gather(st.flat[dtype], offset, tuple(size), tuple(stride))


def _rebuild_parameter(data: Tensor, requires_grad: bool = True, *_: Any) -> Tensor:
  data.requires_grad = requires_grad
  return data


def _rebuild_from_type(fn: Callable, _cls: Any, args: tuple, _state: Any) -> Any: return fn(*args)


def _tensor_class(*_: Any) -> Any:
  """What torch.Tensor and nn.Parameter unpickle to: only an argument of _rebuild_from_type_v2."""
  raise ValueError("torch_load: a tensor class is called directly: unsupported pickle")


class _TorchUnpickler(pickle.Unpickler):
  """Unpickles torch.save data: tensors, storages, dtypes and plain containers, nothing else."""

  def __init__(self, f: io.BytesIO, storage_for: Callable[[tuple], Storage],
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
    if module == "torch" and name in TORCH_DTYPES: return TORCH_DTYPES[name]
    found = self.allowed.get((module, name))
    if found is not None: return found
    raise ValueError(f"torch_load: refusing to unpickle {module}.{name}: only tensors, state dicts "
                     "and plain containers are supported (save model.state_dict(), not the model)")

  def persistent_load(self, pid: Any) -> Storage:
    if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
      raise ValueError(f"torch_load: unsupported persistent id {str(pid)[:80]}")
    return self.storage_for(pid)


def _storage_type(pid: tuple) -> DType:
  if len(pid) < 5: raise ValueError(f"torch_load: malformed storage id {str(pid)[:80]}")
  kind = pid[1]
  if not isinstance(kind, StorageType): raise ValueError(f"torch_load: bad storage type {kind!r}")
  return kind.dtype or dtypes.uint8


def _load_zip(data: memoryview, device: str | None) -> Any:
  with zipfile.ZipFile(io.BytesIO(data)) as zf:
    names = zf.namelist()
    pkl = min((n for n in names if n.endswith("data.pkl")), key=len, default=None)
    if pkl is None: raise ValueError("torch_load: the zip archive has no data.pkl")
    root = pkl[:-len("data.pkl")]
    big_endian = root + "byteorder" in names and zf.read(root + "byteorder") == b"big"
    storages: dict[str, Storage] = {}

    def storage_for(pid: tuple) -> Storage:
      key, dt = str(pid[2]), _storage_type(pid)
      if key not in storages:
        raw = memoryview(zf.read(f"{root}data/{key}"))
        storages[key] = Storage(_byteswapped(raw, dt.itemsize) if big_endian else raw, dt, {})
      return storages[key]
    return _TorchUnpickler(io.BytesIO(zf.read(pkl)), storage_for, device).load()


def _legacy_storages(f: io.BytesIO, pids: dict[str, tuple], little: bool) -> dict[str, Storage]:
  """Read the storage data that follows the pickles of a legacy file: per key, a little-endian
  int64 element count, then the elements."""
  out: dict[str, Storage] = {}
  for key in _plain_load(f):
    if str(key) not in pids: raise ValueError(f"torch_load: unknown storage {key!r}")
    dt = _storage_type(pids[str(key)])
    head = f.read(8)
    if len(head) != 8: raise ValueError("torch_load: legacy file truncated in the storage section")
    numel = int.from_bytes(head, "little" if little else "big")
    raw = f.read(numel * dt.itemsize)
    if len(raw) != numel * dt.itemsize: raise ValueError(f"torch_load: storage {key!r} truncated")
    data = memoryview(raw) if little else _byteswapped(memoryview(raw), dt.itemsize)
    out[str(key)] = Storage(data, dt, {})
  return out


def _plain_load(f: io.BytesIO) -> Any:
  def no_storage(pid: tuple) -> Storage: raise ValueError("torch_load: unexpected storage")
  return _TorchUnpickler(f, no_storage, None).load()


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
    raise ValueError("torch_load: not a PyTorch file (neither zip nor legacy format)") from e
  if magic != LEGACY_MAGIC: raise ValueError("torch_load: invalid magic number: not a PyTorch file")
  if _plain_load(f) != LEGACY_PROTOCOL: raise ValueError("torch_load: unknown legacy protocol")
  sys_info = _plain_load(f)
  start, pids = f.tell(), {}

  def record(pid: tuple) -> Storage:  # first pass: learn the storages; tensors are not built yet
    pids[str(pid[2])] = pid
    return Storage(None, _storage_type(pid), {})
  _TorchUnpickler(f, record, device).load()
  little = not isinstance(sys_info, dict) or sys_info.get("little_endian", True)
  roots, views = _legacy_storages(f, pids, little), {}

  def storage_for(pid: tuple) -> Storage:
    root = roots[str(pid[2])]
    if len(pid) < 6 or pid[5] is None: return root
    return views.setdefault(str(pid[5][0]), _legacy_view(root, pid))
  return _TorchUnpickler(io.BytesIO(data[start:]), storage_for, device).load()


def torch_load(fn: FileLike, device: str | None = None) -> Any:
  """Load a `torch.save` file (a path, or its bytes) without torch: tensors become Tensors (views
  of one buffer per storage, keeping strides and offsets), containers stay containers.
  `load_state_dict(model, torch_load("model.pth"))`"""
  data = _read_bytes(fn, "torch_load")
  try:
    if zipfile.is_zipfile(io.BytesIO(data)): return _load_zip(data, device)
    return _load_legacy(data, device)
  except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, KeyError, IndexError, TypeError,
          AttributeError, OverflowError, MemoryError, NotImplementedError) as e:
    raise ValueError(f"torch_load: corrupted or unsupported file ({type(e).__name__}: {e})") from e
