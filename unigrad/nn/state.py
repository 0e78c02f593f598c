"""Model state: parameters, state dicts, safetensors files, and the checkpoint readers.

`get_state_dict(model)` walks attributes, lists, tuples and dicts and names every Tensor by its
dotted path (`layers.0.weight`), as PyTorch and tinygrad do. `safe_save`/`safe_load` write and read
the safetensors format byte for byte as the `safetensors` library does, and validate every offset
before touching the data. Other formats live in their own modules and are re-exported here:
`torch_load` (nn/torch_load.py: every `torch.save` format, without torch), `gguf_load`
(nn/gguf.py: llama.cpp's GGUF, quantized types dequantized by tensor ops), `tar_extract` and
`TensorIO` (nn/tensor_io.py).
"""
from __future__ import annotations

import json
import math
import os
import struct
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from unigrad.dtype import DType, dtypes
from unigrad import engine
from unigrad.frontend.tensor import Tensor
from unigrad.nn.gguf import GGML_TYPES, ggml_data_to_tensor, gguf_load, gguf_metadata
from unigrad.nn.tensor_io import (FileLike, FormatError, TensorIO, check_file_like, read_bytes,
                                  tar_extract)
from unigrad.nn.torch_load import torch_load
from unigrad.runtime.device import Device

__all__ = ["get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load",
           "safe_load_metadata", "torch_load", "gguf_load", "gguf_metadata", "ggml_data_to_tensor",
           "GGML_TYPES", "tar_extract", "TensorIO", "FormatError", "read_bytes", "StateDictError",
           "IncompatibleKeys", "SafetensorsError"]


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


def _is_batch_counter(key: str) -> bool:
  """A BatchNorm's `num_batches_tracked`: checkpoints from before PyTorch 0.4.1 lack it, and
  PyTorch then keeps the model's counter (as for a state dict without version metadata)."""
  return key.rsplit(".", 1)[-1] == "num_batches_tracked"


def _scalars_from_vectors(model_sd: dict[str, Tensor], state_dict: dict[str, Tensor]) -> None:
  """A shape (1,) value for a 0-d model tensor is its one element (PyTorch's rule for checkpoints
  from before 0-d tensors; tinygrad's BatchNorm counter has shape (1,))."""
  for k, t in model_sd.items():
    if k in state_dict and t.ndim == 0 and tuple(state_dict[k].shape) == (1,):
      state_dict[k] = state_dict[k].reshape(())


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
  _scalars_from_vectors(model_sd, state_dict_t)
  missing = [k for k in model_sd if k not in state_dict_t and not _is_batch_counter(k)]
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

class SafetensorsError(FormatError):
  """A safetensors file is malformed: truncated, corrupted or inconsistent."""


# in the `safetensors` library's dtype order: it writes tensors by it (last first), then by name
SAFE_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "F8_E5M2": dtypes.fp8e5m2,
  "F8_E4M3": dtypes.fp8e4m3, "I16": dtypes.int16,
  "U16": dtypes.uint16, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "I32": dtypes.int32,
  "U32": dtypes.uint32, "F32": dtypes.float32, "F64": dtypes.float64, "I64": dtypes.int64,
  "U64": dtypes.uint64}
SAFE_NAMES: dict[DType, str] = {v: k for k, v in SAFE_DTYPES.items()}
SAFE_ORDER: dict[str, int] = {name: i for i, name in enumerate(SAFE_DTYPES)}
MAX_HEADER_SIZE = 100_000_000  # the library's limit
MAX_NUMEL = 2 ** 63 - 1  # the largest element count (or dimension) a header may give


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


def _check_shape_product(name: str, shape: list[int]) -> None:
  """Each size and the element count, multiplied out left to right as the library does, stay
  64-bit sizes (a zero later on does not excuse an overflow before it: `[2**40, 2**40, 0]` is
  refused, as is `[0, 2**70]`)."""
  numel = 1
  for s in shape:
    numel *= s
    if s > MAX_NUMEL or numel > MAX_NUMEL:
      raise _bad(f"tensor {name!r}: the sizes of shape {shape} (or their product) overflow a "
                 "64-bit size")


def _parse_entry(name: str, info: Any) -> SafeEntry:
  if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
    raise _bad(f"tensor {name!r}: expected {{dtype, shape, data_offsets}}, got {info!r}")
  dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
  if dt not in SAFE_DTYPES: raise _bad(f"tensor {name!r}: unsupported dtype {dt!r}")
  if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
    raise _bad(f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}")
  _check_shape_product(name, shape)
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
  check_file_like(fn, caller)
  if isinstance(fn, (bytes, bytearray, memoryview, Tensor)):
    data = read_bytes(fn, caller)
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
  if not isinstance(tensors, dict):
    raise TypeError(f"safe_save: expected a dict of name -> Tensor, got {type(tensors).__name__}")
  for k, t in tensors.items():
    if not isinstance(k, str) or k == "__metadata__":
      raise ValueError(f"safe_save: invalid tensor name {k!r}")
    if not isinstance(t, Tensor):
      raise TypeError(f"safe_save: {k!r} is not a Tensor (got {type(t).__name__}); convert it "
                      "with Tensor(...) first")
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
