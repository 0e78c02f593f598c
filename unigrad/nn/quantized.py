"""Quantized weights that stay packed: ggml's block formats as tensor operations on their blocks.

A ggml block format stores `block` values in `block_bytes` bytes: small integers and a scale (and
a minimum) per block. Each format here is two functions over Tensors:
- `repack`: the raw blocks (nb, block_bytes) uint8 -> the parts a kernel reads, each (nb, k): the
  quantized integers as they are stored (nibbles stay two to a byte), the float16 scales widened
  to float32 (exactly: every float16 is a float32), sub-block scales kept as their bytes;
- `dequantize`: the parts -> the values (nb, block) float32, computing what ggml's reference
  `dequantize_row_*` computes, in its order of float operations (so the result is bit-exact).
Unpacking is written with broadcasts (a byte against the shifts 0 and 4) rather than
concatenations, so the index arithmetic of a consuming kernel stays affine.

`pack(raw, fmt, shape)` realizes the parts (resident: about the file's size) and returns the
lazy dequantization as an ordinary float32 Tensor of `shape`: nothing computes it on its own. A
consumer fuses it: `x @ w.T` is one kernel that reads the packed parts and dequantizes them in
registers, and no kernel writes a float32 copy of the weight (as long as nobody realizes `w`
itself). Every device runs it, because it is ordinary tensor code.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from unigrad.dtype import dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.tensor_io import FormatError
from unigrad.uop import Ops, UOp

__all__ = ["QuantFormat", "QUANT_FORMATS", "pack", "dequantize_blocks", "packed_nbytes",
           "is_packed", "linear", "QuantizedLinear", "DEQUANTIZE_ROWS", "PackedWeight",
           "packed_weight", "as_tensor", "Weight"]

Parts = tuple[Tensor, ...]
# the buffers `pack` made (held weakly: a part lives as long as a weight reads it)
_PACKED_PARTS: weakref.WeakSet[UOp] = weakref.WeakSet()


def _f16(b: Tensor, start: int) -> Tensor:
  """The float16 at bytes [start, start+2) of each block, as a float32 column (nb, 1)."""
  return b[:, start:start + 2].bitcast(dtypes.float16).cast(dtypes.float32)


def _shifts(n: int, step: int, shape: tuple[int, ...], device: str) -> Tensor:
  """The int32 shifts 0, step, ..., (n-1)*step laid along a broadcast `shape` (computed from the
  index in the kernel, never loaded)."""
  return (Tensor.arange(n, device=device, dtype=dtypes.int32) * step).reshape(shape)


def _nibbles(qs: Tensor, groups: int = 1) -> Tensor:
  """Bytes (nb, g*k) holding two 4-bit values each -> (nb, g, 2, k): the low nibbles of each
  group of k bytes, then its high nibbles (ggml's order), as int32."""
  nb, n = qs.shape
  q = qs.cast(dtypes.int32).reshape(nb, groups, 1, n // groups)
  return (q >> _shifts(2, 4, (1, 1, 2, 1), qs.device)) & 0xF


def _bits(qh: Tensor, n: int) -> Tensor:
  """A uint32 column (nb, 1) -> its bits 0..n-1 (nb, n) as int32 0 or 1."""
  return ((qh.cast(dtypes.int32).reshape(-1, 1) >> _shifts(n, 1, (1, n), qh.device)) & 1)


# ---- the formats: repack (raw -> parts) and dequantize (parts -> float32) ----


def _repack_q4_0(b: Tensor) -> Parts: return _f16(b, 0), b[:, 2:18]

def _q4_0(p: Parts) -> Tensor:  # (q - 8) * d
  d, qs = p
  return (_nibbles(qs).reshape(-1, 32) - 8).cast(dtypes.float32) * d


def _repack_q4_1(b: Tensor) -> Parts: return _f16(b, 0), _f16(b, 2), b[:, 4:20]

def _q4_1(p: Parts) -> Tensor:  # q * d + m
  d, m, qs = p
  return _nibbles(qs).reshape(-1, 32).cast(dtypes.float32) * d + m


def _repack_q5_0(b: Tensor) -> Parts:
  return _f16(b, 0), b[:, 2:6].bitcast(dtypes.uint32), b[:, 6:22]

def _q5_0(p: Parts) -> Tensor:  # ((q | h << 4) - 16) * d
  d, qh, qs = p
  q = _nibbles(qs).reshape(-1, 32) + _bits(qh, 32) * 16
  return (q - 16).cast(dtypes.float32) * d


def _repack_q5_1(b: Tensor) -> Parts:
  return _f16(b, 0), _f16(b, 2), b[:, 4:8].bitcast(dtypes.uint32), b[:, 8:24]

def _q5_1(p: Parts) -> Tensor:  # (q | h << 4) * d + m
  d, m, qh, qs = p
  q = _nibbles(qs).reshape(-1, 32) + _bits(qh, 32) * 16
  return q.cast(dtypes.float32) * d + m


def _repack_q8_0(b: Tensor) -> Parts: return _f16(b, 0), b[:, 2:34].bitcast(dtypes.int8)

def _q8_0(p: Parts) -> Tensor:  # q * d
  d, qs = p
  return qs.cast(dtypes.float32) * d


def _k_scales(s: Tensor) -> tuple[Tensor, Tensor]:
  """ggml's 12 bytes of 6-bit scales and mins of 8 sub-blocks (get_scale_min_k4) -> (nb, 8) each,
  as uint8: sub-blocks 0-3 from the low 6 bits of bytes 0-3 (4-7), sub-blocks 4-7 from the
  nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 (4-7)."""
  q = s.cast(dtypes.int32)
  lo, mid, hi = q[:, 0:4], q[:, 4:8], q[:, 8:12]
  sc = (lo & 63).cat((hi & 0xF) | ((lo >> 6) << 4), dim=1)
  mn = (mid & 63).cat((hi >> 4) | ((mid >> 6) << 4), dim=1)
  return sc.cast(dtypes.uint8), mn.cast(dtypes.uint8)


def _k_value(d: Tensor, dmin: Tensor, sc: Tensor, mn: Tensor, q: Tensor) -> Tensor:
  """(d * sc) * q - dmin * m over 8 sub-blocks of 32: q (nb, 8, 32) int32 -> (nb, 256)."""
  nb = q.shape[0]
  scale = (d * sc.cast(dtypes.float32)).reshape(nb, 8, 1)
  low = (dmin * mn.cast(dtypes.float32)).reshape(nb, 8, 1)
  return (scale * q.cast(dtypes.float32) - low).reshape(nb, 256)


def _repack_q4_k(b: Tensor) -> Parts: return (_f16(b, 0), _f16(b, 2), *_k_scales(b[:, 4:16]),
                                              b[:, 16:144])

def _q4_k(p: Parts) -> Tensor:
  """Four chunks of 32 bytes, each the low nibbles of one sub-block then the high of the next."""
  d, dmin, sc, mn, qs = p
  return _k_value(d, dmin, sc, mn, _nibbles(qs, 4).reshape(-1, 8, 32))


def _repack_q5_k(b: Tensor) -> Parts: return (_f16(b, 0), _f16(b, 2), *_k_scales(b[:, 4:16]),
                                              b[:, 16:48], b[:, 48:176])

def _q5_k(p: Parts) -> Tensor:
  """As Q4_K, and sub-block j's fifth bits are bit j of the 32 bytes qh."""
  d, dmin, sc, mn, qh, qs = p
  nb = qs.shape[0]
  high = (qh.cast(dtypes.int32).reshape(nb, 1, 32) >> _shifts(8, 1, (1, 8, 1), qs.device)) & 1
  return _k_value(d, dmin, sc, mn, _nibbles(qs, 4).reshape(nb, 8, 32) + high * 16)


def _repack_q6_k(b: Tensor) -> Parts:
  return _f16(b, 208), b[:, 192:208].bitcast(dtypes.int8), b[:, 128:192], b[:, 0:128]

def _q6_k(p: Parts) -> Tensor:
  """256 values in two halves of 128: value 32k + l of a half (k < 4, l < 32) takes nibble k >> 1
  of ql[32 (k & 1) + l] and bits 2k, 2k+1 of qh[l]; d * scale (one per 16 values) * (q - 32)."""
  d, scales, qh, ql = p
  nb, dev = ql.shape[0], ql.device
  low = (ql.cast(dtypes.int32).reshape(nb, 2, 1, 2, 32) >> _shifts(2, 4, (1, 1, 2, 1, 1), dev)) & 15
  high = (qh.cast(dtypes.int32).reshape(nb, 2, 1, 1, 32) >> _shifts(4, 2, (1, 1, 2, 2, 1), dev)) & 3
  q = ((low | (high << 4)) - 32).cast(dtypes.float32).reshape(nb, 16, 16)
  return ((d * scales.cast(dtypes.float32)).reshape(nb, 16, 1) * q).reshape(nb, 256)


@dataclass(frozen=True)
class QuantFormat:
  """A ggml block format: `block` values in `block_bytes` bytes; `repack` the raw blocks (nb,
  block_bytes) uint8 into the parts a kernel reads, `dequantize` the parts into (nb, block)."""
  name: str
  block: int
  block_bytes: int
  repack: Callable[[Tensor], Parts]
  dequantize: Callable[[Parts], Tensor]


QUANT_FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
  QuantFormat("Q4_0", 32, 18, _repack_q4_0, _q4_0),
  QuantFormat("Q4_1", 32, 20, _repack_q4_1, _q4_1),
  QuantFormat("Q5_0", 32, 22, _repack_q5_0, _q5_0),
  QuantFormat("Q5_1", 32, 24, _repack_q5_1, _q5_1),
  QuantFormat("Q8_0", 32, 34, _repack_q8_0, _q8_0),
  QuantFormat("Q4_K", 256, 144, _repack_q4_k, _q4_k),
  QuantFormat("Q5_K", 256, 176, _repack_q5_k, _q5_k),
  QuantFormat("Q6_K", 256, 210, _repack_q6_k, _q6_k))}


def _blocks(raw: Tensor, fmt: QuantFormat, shape: tuple[int, ...], name: str) -> Tensor:
  """The raw bytes as blocks (nb, block_bytes), checked against `shape`."""
  numel = 1
  for s in shape: numel *= s
  if not shape or shape[-1] % fmt.block:
    raise FormatError(f"tensor {name!r}: shape {list(shape)} is not whole {fmt.name} blocks of "
                      f"{fmt.block} along its last dim")
  nb = numel // fmt.block
  if raw.dtype != dtypes.uint8 or raw.ndim != 1 or raw.shape[0] != nb * fmt.block_bytes:
    raise FormatError(f"tensor {name!r}: {fmt.name}{list(shape)} is {nb} blocks of "
                      f"{fmt.block_bytes} bytes ({nb * fmt.block_bytes}), got {raw.dtype!r} of "
                      f"shape {tuple(raw.shape)}")
  return raw.reshape(nb, fmt.block_bytes)


def dequantize_blocks(raw: Tensor, fmt: QuantFormat, shape: tuple[int, ...],
                      name: str = "tensor") -> Tensor:
  """The float32 values (lazy) of the blocks in the 1-D uint8 Tensor `raw`, as `shape`."""
  if 0 in shape: return Tensor.empty(*shape, dtype=dtypes.float32, device=raw.device)
  return fmt.dequantize(fmt.repack(_blocks(raw, fmt, shape, name))).reshape(shape)


@dataclass(frozen=True)
class PackedWeight:
  """A packed weight held by its realized parts: `tensor()` builds its lazy dequantization (the
  same UOps each time: hash-consed). A model keeps weights this way, not as the lazy Tensor:
  every realize walks the live lazy Tensors, and 200 weights' graphs made a prompt's 90 realizes
  take seconds."""
  fmt: QuantFormat
  parts: Parts
  shape: tuple[int, ...]

  def tensor(self) -> Tensor: return self.fmt.dequantize(self.parts).reshape(self.shape)

  def nbytes(self) -> int: return sum(p.nbytes() for p in self.parts)


# the lazy Tensors `pack` returned (by their UOp, held weakly) -> their PackedWeight
_PACKED: weakref.WeakKeyDictionary[UOp, PackedWeight] = weakref.WeakKeyDictionary()


def pack(raw: Tensor, fmt: QuantFormat | str, shape: tuple[int, ...],
         name: str = "tensor") -> Tensor:
  """The blocks in `raw` (1-D uint8) repacked into realized parts, and their dequantization as a
  lazy float32 Tensor of `shape`: a matmul over it reads the parts, never a float32 copy
  (`packed_weight` gives back its parts). `w = pack(raw, "Q4_1", (out, in)); y = x @ w.T`"""
  if isinstance(fmt, str):
    if fmt not in QUANT_FORMATS:
      raise ValueError(f"pack: unsupported format {fmt!r} for {name!r} (supported: "
                       f"{', '.join(QUANT_FORMATS)})")
    fmt = QUANT_FORMATS[fmt]
  if 0 in shape: return Tensor.empty(*shape, dtype=dtypes.float32, device=raw.device)
  parts = tuple(p.contiguous() for p in fmt.repack(_blocks(raw, fmt, shape, name)))
  Tensor.realize_all(*parts)
  _PACKED_PARTS.update(u for p in parts for u in p.uop.toposort() if u.op is Ops.BUFFER)
  pw = PackedWeight(fmt, parts, tuple(shape))
  out = pw.tensor()
  _PACKED[out.uop] = pw
  return out


def packed_weight(t: Tensor) -> PackedWeight | None:
  """The PackedWeight behind a Tensor `pack` returned (None for any other Tensor)."""
  return _PACKED.get(t.uop)


def packed_nbytes(t: Tensor) -> int:
  """The bytes of the realized buffers a (lazy) Tensor reads: a packed weight's resident size."""
  buffers = {u for u in t.uop.toposort() if u.op is Ops.BUFFER}
  return sum(math.prod(int(s) for s in u.shape) * u.dtype.itemsize for u in buffers)



def is_packed(t: Tensor) -> bool:
  """Whether `t` is a packed weight: a lazy computation whose buffers are all parts made by
  `pack` (realizing it would write the float32 copy it exists to avoid)."""
  if t.uop.op is Ops.BUFFER: return False
  buffers = [u for u in t.uop.toposort() if u.op is Ops.BUFFER]
  return bool(buffers) and all(b in _PACKED_PARTS for b in buffers)


# a packed weight times at least this many rows (a prompt's tokens) is dequantized once into a
# transient float32 buffer: fused, each tile of rows dequantizes it again (SmolLM2's 128-token
# prefill: 4x slower fused than from float32)
DEQUANTIZE_ROWS = 16


Weight = Tensor | PackedWeight


def linear(x: Tensor, w: Weight, bias: Tensor | None = None) -> Tensor:
  """`x @ w.T (+ bias)` for a weight `w` (out, in): a Tensor, packed or not, or a PackedWeight.
  A packed weight times fewer than DEQUANTIZE_ROWS rows of x (decoding) is one kernel reading
  its blocks; times more rows it is first dequantized into a transient float32 buffer (a kernel
  of its own), freed after."""
  # a symbolic row count (a prompt's length as a bound Variable) counts at its largest value
  rows = math.prod(s if isinstance(s, int) else int(s.vmax) for s in x.shape[:-1])
  if isinstance(w, PackedWeight): w = w.tensor()
  if rows >= DEQUANTIZE_ROWS and is_packed(w): w = w.contiguous()
  out = x @ w.T
  return out if bias is None else out + bias


def as_tensor(w: Weight) -> Tensor:
  """A weight as a Tensor (a PackedWeight as its lazy dequantization)."""
  return w.tensor() if isinstance(w, PackedWeight) else w


class QuantizedLinear:
  """A Linear layer over a packed weight: `QuantizedLinear(pack(raw, "Q4_0", (out, in)))(x)`."""

  def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
    if weight.ndim != 2: raise ValueError(f"QuantizedLinear: weight must be 2-D, got "
                                          f"{tuple(weight.shape)}")
    pw = packed_weight(weight)
    self.weight: Weight = weight if pw is None else pw
    self.bias = bias

  def __call__(self, x: Tensor) -> Tensor: return linear(x, self.weight, self.bias)
