"""GGUF (llama.cpp's model format): header, metadata and tensors, dequantized by tensor ops.

Layout (little endian, versions 2 and 3): magic `GGUF`, uint32 version, uint64 tensor count,
uint64 metadata count; metadata as (string key, uint32 type, value); tensor infos as (string
name, uint32 n_dims, uint64 dims innermost first, uint32 ggml type, uint64 offset into the data
section); the data section starts at the next multiple of `general.alignment` (default 32).
Every count, length, type and offset is checked against the file before use: a truncated or
lying file raises FormatError naming the file and the field.
The data section becomes one uint8 buffer; each tensor is a lazy view of it: float types are
bitcast, quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K) are unpacked and scaled with
tensor ops into float32, computing what ggml's reference `dequantize_row_*` computes.
`gguf_metadata` reads the metadata alone (a tokenizer needs no weights): a path is mapped, not
read, so only the header's pages are touched.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.tensor_io import FileLike, FormatError, read_bytes, source_name, tensor_from_bytes

__all__ = ["gguf_load", "gguf_metadata", "ggml_data_to_tensor", "GGML_TYPES", "GGMLType"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# metadata value types: id -> struct format (8 is a string, 9 an array)
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")


def _f16_scale(b: Tensor, start: int) -> Tensor:
  """The float16 at bytes [start, start+2) of each block, as a float32 column."""
  return b[:, start:start + 2].bitcast(dtypes.float16).cast(dtypes.float32)


def _nibbles(qs: Tensor) -> Tensor:
  """Bytes (nb, k) -> their low nibbles then their high nibbles (nb, 2k), as int32."""
  q = qs.cast(dtypes.int32)
  return (q & 0xF).cat(q >> 4, dim=1)


def _high_bits(qh: Tensor) -> Tensor:
  """A uint32 column of fifth bits (nb, 1) -> bit j of it at column j (nb, 32), as 0 or 16."""
  shifts = Tensor([1 << j for j in range(32)], device=qh.device, dtype=dtypes.uint32)
  return ((qh // shifts) & 1).cast(dtypes.int32) * 16


def _q4_0(b: Tensor) -> Tensor:  # d, 16 bytes of nibbles: (q - 8) * d
  return (_nibbles(b[:, 2:18]) - 8).cast(dtypes.float32) * _f16_scale(b, 0)


def _q4_1(b: Tensor) -> Tensor:  # d, m, 16 bytes of nibbles: q * d + m
  return _nibbles(b[:, 4:20]).cast(dtypes.float32) * _f16_scale(b, 0) + _f16_scale(b, 2)


def _q5_0(b: Tensor) -> Tensor:  # d, 32 fifth bits, 16 bytes of nibbles: (q | h - 16) * d
  q = _nibbles(b[:, 6:22]) + _high_bits(b[:, 2:6].bitcast(dtypes.uint32))
  return (q - 16).cast(dtypes.float32) * _f16_scale(b, 0)


def _q5_1(b: Tensor) -> Tensor:  # d, m, 32 fifth bits, 16 bytes of nibbles: (q | h) * d + m
  q = _nibbles(b[:, 8:24]) + _high_bits(b[:, 4:8].bitcast(dtypes.uint32))
  return q.cast(dtypes.float32) * _f16_scale(b, 0) + _f16_scale(b, 2)


def _q8_0(b: Tensor) -> Tensor:  # d, 32 int8: q * d
  return b[:, 2:34].bitcast(dtypes.int8).cast(dtypes.float32) * _f16_scale(b, 0)


def _q6_k(b: Tensor) -> Tensor:
  """256 values: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales, d. In each
  half of 128, value l + 32k takes nibble (k odd: ql[l+32], else ql[l]; k >= 2: high nibble)
  and bits 2k..2k+1 of qh[l]; scale 16 values at a time: d * scale * (q - 32)."""
  ql, qh = b[:, 0:128].cast(dtypes.int32), b[:, 128:192].cast(dtypes.int32)
  parts = []
  for n in range(2):
    lo, hi, h = ql[:, 64 * n:64 * n + 32], ql[:, 64 * n + 32:64 * n + 64], qh[:, 32 * n:32 * n + 32]
    nib = ((lo & 0xF), (hi & 0xF), (lo >> 4), (hi >> 4))
    parts += [nib[k] | (((h >> (2 * k)) & 3) << 4) for k in range(4)]
  q = parts[0].cat(*parts[1:], dim=1) - 32
  scales = b[:, 192:208].bitcast(dtypes.int8).cast(dtypes.float32)
  nb = b.shape[0]
  scales = scales.reshape(nb, 16, 1).expand(nb, 16, 16).reshape(nb, 256)
  return (_f16_scale(b, 208) * scales) * q.cast(dtypes.float32)


@dataclass(frozen=True)
class GGMLType:
  """A ggml tensor type: elements per block, bytes per block, and either the dtype it is stored
  as (unquantized) or its dequantization (uint8 blocks (nb, block_bytes) -> float32 (nb, n))."""
  name: str
  block: int
  block_bytes: int
  dtype: DType | None = None
  dequantize: Callable[[Tensor], Tensor] | None = None


GGML_TYPES: dict[int, GGMLType] = {
  0: GGMLType("F32", 1, 4, dtypes.float32), 1: GGMLType("F16", 1, 2, dtypes.float16),
  2: GGMLType("Q4_0", 32, 18, None, _q4_0), 3: GGMLType("Q4_1", 32, 20, None, _q4_1),
  6: GGMLType("Q5_0", 32, 22, None, _q5_0), 7: GGMLType("Q5_1", 32, 24, None, _q5_1),
  8: GGMLType("Q8_0", 32, 34, None, _q8_0), 14: GGMLType("Q6_K", 256, 210, None, _q6_k),
  24: GGMLType("I8", 1, 1, dtypes.int8), 25: GGMLType("I16", 1, 2, dtypes.int16),
  26: GGMLType("I32", 1, 4, dtypes.int32), 27: GGMLType("I64", 1, 8, dtypes.int64),
  28: GGMLType("F64", 1, 8, dtypes.float64), 30: GGMLType("BF16", 1, 2, dtypes.bfloat16)}


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
  """`n` elements of ggml type `ggml_type` from the uint8 Tensor `t` (its first bytes), as a 1-D
  Tensor: unquantized types in their own dtype, quantized ones dequantized to float32."""
  if ggml_type not in GGML_TYPES:
    raise ValueError(f"ggml_data_to_tensor: unsupported ggml type {ggml_type} (supported: "
                     f"{', '.join(f'{k} {v.name}' for k, v in GGML_TYPES.items())})")
  ty = GGML_TYPES[ggml_type]
  if n % ty.block: raise ValueError(f"ggml_data_to_tensor: {n} elements of {ty.name} are not "
                                    f"whole blocks of {ty.block}")
  nbytes = n // ty.block * ty.block_bytes
  if t.dtype != dtypes.uint8 or t.ndim != 1 or t.shape[0] < nbytes:
    raise ValueError(f"ggml_data_to_tensor: expected a 1-D uint8 Tensor of at least {nbytes} "
                     f"bytes, got {t.dtype!r} of shape {tuple(t.shape)}")
  raw = t[:nbytes]
  if ty.dtype is not None: return raw.bitcast(ty.dtype)
  assert ty.dequantize is not None
  if n == 0: return Tensor.empty(0, dtype=dtypes.float32, device=t.device)
  return ty.dequantize(raw.reshape(n // ty.block, ty.block_bytes)).reshape(n)


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
  if type_id not in GGML_TYPES:
    raise r.fail(f"{where}.type", f"unsupported ggml type {type_id} (supported: "
                                  f"{', '.join(t.name for t in GGML_TYPES.values())})")
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


def gguf_load(fn: FileLike, device: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """Read a GGUF file (a path, its bytes, or a uint8 Tensor of them): its metadata (key ->
  value) and its tensors (name -> Tensor in numpy/PyTorch dim order; quantized types dequantized
  to float32 on use). `kv, weights = gguf_load("model.Q4_0.gguf")`"""
  data = read_bytes(fn, "gguf_load")
  r = _Reader(data, source_name(fn))
  kv, infos, align = _header(r)
  start = -(-r.pos // align) * align
  size = max(0, len(data) - start)
  _check_layout(r, infos, align, size)
  if not infos: return kv, {}
  end = max(t.offset + t.nbytes for t in infos)
  body = tensor_from_bytes(data[start:start + end], device, dtypes.uint8) if end else None
  out: dict[str, Tensor] = {}
  for t in infos:
    numel = t.nbytes // t.ggml_type.block_bytes * t.ggml_type.block
    if numel == 0 or body is None:
      out[t.name] = Tensor.empty(*t.shape, dtype=t.ggml_type.dtype or dtypes.float32,
                                 device=device)
      continue
    raw = body[t.offset:t.offset + t.nbytes]
    out[t.name] = ggml_data_to_tensor(raw, numel, t.type_id).reshape(t.shape)
  return kv, out


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
