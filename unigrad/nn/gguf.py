"""GGUF (llama.cpp's model format): header, metadata and tensors, dequantized by tensor ops.

Layout (little endian, versions 2 and 3): magic `GGUF`, uint32 version, uint64 tensor count,
uint64 metadata count; metadata as (string key, uint32 type, value); tensor infos as (string
name, uint32 n_dims, uint64 dims innermost first, uint32 ggml type, uint64 offset into the data
section); the data section starts at the next multiple of `general.alignment` (default 32).
Every count, length, type and offset is checked against the file before use: a truncated or
lying file raises FormatError naming the file and the field.
The data section becomes one uint8 buffer; each tensor is a lazy view of it: float types are
bitcast, quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) are unpacked and
scaled with tensor ops into float32 (nn/quantized.py), computing what ggml's reference
`dequantize_row_*` computes; with `dequantize=False` they are repacked and stay packed, their
dequantization fused into the kernels that read them.
`gguf_metadata` reads the metadata alone (a tokenizer needs no weights): a path is mapped, not
read, so only the header's pages are touched.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.quantized import QUANT_FORMATS, QuantFormat, dequantize_blocks, pack_all
from unigrad.nn.tensor_io import FileLike, FormatError, read_bytes, source_name, tensor_from_bytes

__all__ = ["gguf_load", "gguf_metadata", "ggml_data_to_tensor", "ggml_type_name", "GGML_TYPES",
           "GGMLType"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# metadata value types: id -> struct format (8 is a string, 9 an array)
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGMLType:
  """A ggml tensor type: elements per block, bytes per block, and either the dtype it is stored
  as (unquantized) or its block format (nn/quantized.py: repacking and dequantization)."""
  name: str
  block: int
  block_bytes: int
  dtype: DType | None = None
  quant: QuantFormat | None = None


def _quant(name: str) -> GGMLType:
  f = QUANT_FORMATS[name]
  return GGMLType(name, f.block, f.block_bytes, None, f)


GGML_TYPES: dict[int, GGMLType] = {
  0: GGMLType("F32", 1, 4, dtypes.float32), 1: GGMLType("F16", 1, 2, dtypes.float16),
  2: _quant("Q4_0"), 3: _quant("Q4_1"), 6: _quant("Q5_0"), 7: _quant("Q5_1"), 8: _quant("Q8_0"),
  12: _quant("Q4_K"), 13: _quant("Q5_K"), 14: _quant("Q6_K"),
  24: GGMLType("I8", 1, 1, dtypes.int8), 25: GGMLType("I16", 1, 2, dtypes.int16),
  26: GGMLType("I32", 1, 4, dtypes.int32), 27: GGMLType("I64", 1, 8, dtypes.int64),
  28: GGMLType("F64", 1, 8, dtypes.float64), 30: GGMLType("BF16", 1, 2, dtypes.bfloat16)}
# the names of the ggml types not read here, for the error that refuses them
UNSUPPORTED_NAMES = {4: "Q4_2", 5: "Q4_3", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K",
                     16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
                     21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0",
                     35: "TQ2_0", 39: "MXFP4"}


def ggml_type_name(type_id: int) -> str:
  """`Q4_K (12)`: a ggml type's name and id (the id alone where ggml gives it no name here)."""
  ty = GGML_TYPES.get(type_id)
  name = ty.name if ty is not None else UNSUPPORTED_NAMES.get(type_id)
  return f"{name} ({type_id})" if name else str(type_id)


def _unsupported(type_id: int) -> str:
  return (f"unsupported ggml type {ggml_type_name(type_id)} (supported: "
          f"{', '.join(t.name for t in GGML_TYPES.values())})")


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
  """`n` elements of ggml type `ggml_type` from the uint8 Tensor `t` (its first bytes), as a 1-D
  Tensor: unquantized types in their own dtype, quantized ones dequantized to float32."""
  if ggml_type not in GGML_TYPES:
    raise ValueError(f"ggml_data_to_tensor: {_unsupported(ggml_type)}")
  ty = GGML_TYPES[ggml_type]
  if n % ty.block: raise ValueError(f"ggml_data_to_tensor: {n} elements of {ty.name} are not "
                                    f"whole blocks of {ty.block}")
  nbytes = n // ty.block * ty.block_bytes
  if t.dtype != dtypes.uint8 or t.ndim != 1 or t.shape[0] < nbytes:
    raise ValueError(f"ggml_data_to_tensor: expected a 1-D uint8 Tensor of at least {nbytes} "
                     f"bytes, got {t.dtype!r} of shape {tuple(t.shape)}")
  raw = t[:nbytes]
  if ty.dtype is not None: return raw.bitcast(ty.dtype)
  assert ty.quant is not None
  return dequantize_blocks(raw, ty.quant, (n,))


# ---- the header ----

class _Reader:
  """Checked little-endian reads over the file's bytes; errors name the file and the field."""

  def __init__(self, data: memoryview, name: str, caller: str = "gguf_load") -> None:
    self.data, self.name, self.caller, self.pos = data, name, caller, 0

  def fail(self, field: str, msg: str) -> FormatError:
    return FormatError(f"{self.caller}: {self.name}: field {field}: {msg}")

  def take(self, n: int, field: str) -> memoryview:
    if n < 0 or self.pos + n > len(self.data):
      raise self.fail(field, f"needs {n} bytes at offset {self.pos}, but the file has "
                             f"{len(self.data)} (truncated file?)")
    out = self.data[self.pos:self.pos + n]
    self.pos += n
    return out

  def scalar(self, fmt: str, field: str) -> Any:
    return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), field))[0]

  def string(self, field: str) -> str:
    n = self.scalar("Q", field + " (length)")
    try: return bytes(self.take(n, field)).decode("utf-8")
    except UnicodeDecodeError as e: raise self.fail(field, f"not UTF-8 ({e})") from None

  def value(self, vtype: int, field: str) -> Any:
    if vtype in SCALAR_FORMATS: return self.scalar(SCALAR_FORMATS[vtype], field)
    if vtype == STRING: return self.string(field)
    if vtype != ARRAY: raise self.fail(field, f"unknown value type {vtype}")
    etype, count = self.scalar("I", field + " (array type)"), self.scalar("Q", field + " (count)")
    if etype == ARRAY: raise self.fail(field, "nested arrays are not supported")
    if etype in SCALAR_FORMATS:  # one read for the whole array (token scores, ...)
      fmt = SCALAR_FORMATS[etype]
      return list(struct.unpack(f"<{count}{fmt}", self.take(count * struct.calcsize(fmt), field)))
    if count > len(self.data) - self.pos: raise self.fail(field, f"count {count} is too big")
    if etype == STRING: return self.strings(count, field)
    return [self.value(etype, f"{field}[{i}]") for i in range(count)]

  def strings(self, count: int, field: str) -> list[str]:
    """`count` strings in a row (a vocabulary holds 100k) in one tight loop; the first one that
    is cut short or not UTF-8 is read again by `string`, whose error names it."""
    data, pos, size = self.data, self.pos, len(self.data)
    out: list[str] = []
    for _ in range(count):
      if pos + 8 > size: break
      end = pos + 8 + _U64.unpack_from(data, pos)[0]
      if end > size: break
      try: out.append(str(data[pos + 8:end], "utf-8"))
      except UnicodeDecodeError: break
      pos = end
    self.pos = pos
    while len(out) < count: out.append(self.string(f"{field}[{len(out)}]"))
    return out


@dataclass(frozen=True)
class _TensorInfo:
  name: str
  shape: tuple[int, ...]  # numpy order (outermost first)
  ggml_type: GGMLType
  type_id: int
  offset: int
  nbytes: int


def _tensor_info(r: _Reader, i: int) -> _TensorInfo:
  name = r.string(f"tensor[{i}].name")
  where = f"tensor {name!r}"
  n_dims = r.scalar("I", f"{where}.n_dims")
  if not 1 <= n_dims <= MAX_DIMS: raise r.fail(f"{where}.n_dims", f"{n_dims} is not in 1..4")
  dims = [r.scalar("Q", f"{where}.dims[{d}]") for d in range(n_dims)]
  type_id = r.scalar("I", f"{where}.type")
  if type_id not in GGML_TYPES: raise r.fail(f"{where}.type", _unsupported(type_id))
  ty = GGML_TYPES[type_id]
  if dims[0] % ty.block:
    raise r.fail(f"{where}.dims[0]", f"{dims[0]} is not a multiple of the {ty.name} block size "
                                     f"{ty.block}")
  numel = 1
  for d in dims: numel *= d
  offset = r.scalar("Q", f"{where}.offset")
  return _TensorInfo(name, tuple(reversed(dims)), ty, type_id, offset,
                     numel // ty.block * ty.block_bytes)


def _metadata(r: _Reader) -> tuple[dict[str, Any], int]:
  """The magic, the version, the counts and the metadata: (key -> value, tensor count)."""
  if bytes(r.take(4, "magic")) != MAGIC: raise r.fail("magic", "not a GGUF file (no 'GGUF')")
  version = r.scalar("I", "version")
  if version not in (2, 3): raise r.fail("version", f"unsupported GGUF version {version}")
  n_tensors, n_kv = r.scalar("Q", "tensor_count"), r.scalar("Q", "metadata_kv_count")
  left = len(r.data) - r.pos
  if n_tensors > left // 24: raise r.fail("tensor_count", f"{n_tensors} cannot fit the file")
  if n_kv > left // 12: raise r.fail("metadata_kv_count", f"{n_kv} cannot fit the file")
  kv: dict[str, Any] = {}
  for i in range(n_kv):
    key = r.string(f"metadata[{i}].key")
    if key in kv: raise r.fail(f"metadata[{i}].key", f"duplicate key {key!r}")
    kv[key] = r.value(r.scalar("I", f"metadata {key!r}.type"), f"metadata {key!r}")
  return kv, n_tensors


def _header(r: _Reader) -> tuple[dict[str, Any], list[_TensorInfo], int]:
  """The metadata, the tensor infos and the alignment."""
  kv, n_tensors = _metadata(r)
  align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
  if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
    raise r.fail("general.alignment", f"{align!r} is not a power of two")
  infos = [_tensor_info(r, i) for i in range(n_tensors)]
  if len({t.name for t in infos}) != len(infos): raise r.fail("tensor names", "duplicates")
  return kv, infos, align


def _check_layout(r: _Reader, infos: list[_TensorInfo], align: int, data_size: int) -> None:
  for t in infos:
    if t.offset % align:
      raise r.fail(f"tensor {t.name!r}.offset", f"{t.offset} is not aligned to {align}")
    if t.offset + t.nbytes > data_size:
      raise r.fail(f"tensor {t.name!r}.offset", f"{t.ggml_type.name}{list(t.shape)} at "
                   f"{t.offset} needs {t.nbytes} bytes, the data section has {data_size} "
                   "(truncated file?)")


def gguf_load(fn: FileLike, device: str | None = None,
              dequantize: bool = True) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """Read a GGUF file (a path, its bytes, or a uint8 Tensor of them): its metadata (key ->
  value) and its tensors (name -> Tensor in numpy/PyTorch dim order).
  Quantized tensors are float32 Tensors either way, computed by tensor ops from their blocks:
  `dequantize=True` reads them from one buffer holding the file's data section;
  `dequantize=False` keeps them packed: each tensor's blocks are repacked at load into realized
  parts (nn/quantized.py, about the file's size) and the Tensor is their lazy dequantization,
  which a consuming matmul fuses (it reads the packed parts; no float32 copy is written unless
  the Tensor itself is realized). `kv, weights = gguf_load("model.Q4_0.gguf", dequantize=False)`"""
  packed = not dequantize and isinstance(fn, (str, os.PathLike))
  data = _mapped(fn) if packed else read_bytes(fn, "gguf_load")  # type: ignore[arg-type]
  r = _Reader(data, source_name(fn))
  kv, infos, align = _header(r)
  start = -(-r.pos // align) * align
  size = max(0, len(data) - start)
  _check_layout(r, infos, align, size)
  if not infos: return kv, {}
  if not dequantize: return kv, _packed_tensors(infos, data[start:], device)
  end = max(t.offset + t.nbytes for t in infos)
  body = tensor_from_bytes(data[start:start + end], device, dtypes.uint8) if end else None
  out: dict[str, Tensor] = {}
  for t in infos:
    ty = t.ggml_type
    if t.nbytes == 0 or body is None:
      out[t.name] = Tensor.empty(*t.shape, dtype=ty.dtype or dtypes.float32, device=device)
      continue
    raw = body[t.offset:t.offset + t.nbytes]
    if ty.quant is None: out[t.name] = raw.bitcast(ty.dtype or dtypes.uint8).reshape(t.shape)
    else: out[t.name] = dequantize_blocks(raw, ty.quant, t.shape, t.name)
  return kv, out


def _packed_tensors(infos: list[_TensorInfo], section: memoryview,
                    device: str | None) -> dict[str, Tensor]:
  """Each tensor of the data section in a buffer of its own (so every tensor of a shape repacks
  with the same kernels), the quantized ones' blocks repacked (`pack_all`: in one realize)."""
  out: dict[str, Tensor] = {}
  quantized = []
  for t in infos:
    ty = t.ggml_type
    if t.nbytes == 0:
      out[t.name] = Tensor.empty(*t.shape, dtype=ty.dtype or dtypes.float32, device=device)
      continue
    raw = tensor_from_bytes(section[t.offset:t.offset + t.nbytes], device, dtypes.uint8)
    if ty.quant is None: out[t.name] = raw.bitcast(ty.dtype or dtypes.uint8).reshape(t.shape)
    else:
      out[t.name] = raw  # its place in the file's order, replaced below
      quantized.append((raw, ty.quant, t.shape, t.name))
  for (_, _, _, name), w in zip(quantized, pack_all(quantized)): out[name] = w
  return out


def _mapped(path: str | os.PathLike) -> memoryview:
  """A read-only view of a file's pages (an empty file as empty bytes). The map closes when the
  last view of it is dropped, so no view outlives its file."""
  with open(path, "rb") as f:
    if os.fstat(f.fileno()).st_size == 0: return memoryview(b"")
    return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def gguf_metadata(fn: FileLike) -> dict[str, Any]:
  """The metadata of a GGUF file (a path, its bytes, or a uint8 Tensor of them), key -> value,
  without its tensors: a path is mapped, so a tokenizer reads a few MB of a large model file.
  Raises FormatError naming the file and the field, as `gguf_load` does.
  `gguf_metadata("model.gguf")["tokenizer.ggml.model"]`"""
  if isinstance(fn, (str, os.PathLike)): data = _mapped(fn)
  else: data = read_bytes(fn, "gguf_metadata")
  return _metadata(_Reader(data, source_name(fn), "gguf_metadata"))[0]
