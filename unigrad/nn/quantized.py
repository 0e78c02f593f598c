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

import functools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unigrad.dtype import dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.knobs import INT8_MATVEC
from unigrad.nn.tensor_io import FormatError
from unigrad.runtime.device import Device
from unigrad.uop import Ops, UOp

__all__ = ["QuantFormat", "QUANT_FORMATS", "pack", "pack_all", "dequantize_blocks", "packed_nbytes",
           "is_packed", "linear", "QuantizedLinear", "DEQUANTIZE_ROWS", "PackedWeight",
           "packed_weight", "as_tensor", "Weight", "int8_linear", "quantize_rows", "fuse_rows",
           "INT8_FORMATS", "ROW_LANES"]

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
  take seconds. `lanes` > 1: the parts are row-interleaved (see `interleave`)."""
  fmt: QuantFormat
  parts: Parts
  shape: tuple[int, ...]
  lanes: int = 1

  def tensor(self) -> Tensor:
    parts = self.parts if self.lanes == 1 else _deinterleave(self.fmt, self.parts, self.shape,
                                                             self.lanes)
    return self.fmt.dequantize(parts).reshape(self.shape)

  def nbytes(self) -> int: return sum(p.nbytes() for p in self.parts)

  def rows(self, start: int, stop: int) -> PackedWeight:
    """Rows start..stop as a PackedWeight viewing these parts (no copy); each bound a multiple of
    `lanes` and of a block's rows."""
    n = self.shape[0]
    if not 0 <= start <= stop <= n or any(b * p.shape[0] % n for b in (start, stop)
                                          for p in self.parts):
      raise ValueError(f"PackedWeight.rows: rows {start}..{stop} of {n} do not fall on block "
                       f"boundaries ({self.lanes} rows interleaved)")
    return PackedWeight(self.fmt, tuple(p[start * p.shape[0] // n:stop * p.shape[0] // n]
                                        for p in self.parts), (stop - start, *self.shape[1:]),
                        self.lanes)


def fuse_rows(groups: Sequence[Sequence[Weight]]) -> list[PackedWeight | None]:
  """For each group of weights (out_i, in), the PackedWeight of them stacked along their rows
  (sum of out_i, in): one matvec, one kernel launch and one graph, computes all their outputs (a
  layer's q, k and v projections). None for a group unless its weights are all PackedWeights of
  one format, row layout and input size. Realized, every group in one realize; `rows` views each
  weight's rows back. `qkv, = fuse_rows([[wq, wk, wv]])`"""
  fused: list[PackedWeight | None] = []
  for ws in groups:
    pws = [w for w in ws if isinstance(w, PackedWeight)]
    first = pws[0] if pws else None
    if first is None or len(pws) != len(ws) or len(first.shape) != 2 or any(
        w.fmt is not first.fmt or w.lanes != first.lanes or w.shape[1:] != first.shape[1:] or
        len(w.parts) != len(first.parts) for w in pws):
      fused.append(None)
      continue
    parts = tuple(Tensor.cat(*(w.parts[i] for w in pws)).contiguous()
                  for i in range(len(first.parts)))
    fused.append(PackedWeight(first.fmt, parts, (sum(w.shape[0] for w in pws), first.shape[1]),
                              first.lanes))
  _realize_parts([pw for pw in fused if pw is not None])
  return fused


def _realize_parts(pws: list[PackedWeight]) -> None:
  """Realize the parts of `pws` in one realize, and record their buffers as packed parts."""
  Tensor.realize_all(*(p for pw in pws for p in pw.parts))
  _PACKED_PARTS.update(u for pw in pws for p in pw.parts for u in p.uop.toposort()
                       if u.op is Ops.BUFFER)


# ---- row-interleaved nibbles for int8 matvecs ----

# the formats whose matvecs quantize their rows to int8 and take byte dot products (see linear):
# 4-bit values with a float scale (and a minimum), and Q8_0's bytes with a scale
INT8_FORMATS = ("Q4_0", "Q4_1", "Q8_0")
# output rows interleaved word by word (one row per int32 lane of a 512-bit vector)
ROW_LANES = 16
NIBBLES = 0x0F0F0F0F
# Q8_0's bytes are stored offset by 128 (q + 128 = q ^ 0x80, unsigned): a byte dot product takes
# one unsigned operand, and the offset comes back as a minimum of -128 d (as Q4_0's -8 d)
Q8_OFFSET = 128


def interleave(parts: Parts, shape: tuple[int, ...], lanes: int) -> Parts:
  """A Q4_0/Q4_1/Q8_0 weight (out, in)'s parts laid out for a matvec whose vector lanes are
  `lanes` consecutive output rows: each scale (and minimum) as (out/lanes, blocks, lanes), the
  values as uint32 words (out/lanes, blocks, words, lanes), the word `l` of a block of each row
  side by side. A vector load then reads one word of `lanes` rows, every lane its own row: no sums
  across lanes. A Q4 word `l` holds values 4l..4l+3 in its low nibbles and 16+4l..16+4l+3 in its
  high ones; a Q8_0 word `l` holds values 4l..4l+3, each byte offset by Q8_OFFSET."""
  rows, g = shape[0] // lanes, shape[1] // 32
  *scales, qs = parts
  if qs.dtype == dtypes.int8: qs = qs.bitcast(dtypes.uint8) ^ Q8_OFFSET
  w = qs.shape[-1] // 4
  words = qs.reshape(rows, lanes, g, w, 4).permute(0, 2, 3, 1, 4).contiguous()
  return (*(p.reshape(rows, lanes, g).permute(0, 2, 1) for p in scales),
          words.bitcast(dtypes.uint32).reshape(rows, g, w, lanes))


def _deinterleave(fmt: QuantFormat, parts: Parts, shape: tuple[int, ...], lanes: int) -> Parts:
  """The parts in block order ((blocks, 1) scales, (blocks, bytes) values) of interleaved
  `parts`."""
  rows, g = shape[0] // lanes, shape[1] // 32
  *scales, words = parts
  w = words.shape[2]  # words per block: 4 of nibbles, Q8_0's 8 of bytes
  qs = words.bitcast(dtypes.uint8).reshape(rows, g, w, lanes, 4).permute(0, 3, 1, 2, 4)
  qs = qs.reshape(-1, 4 * w)
  if fmt.name == "Q8_0": qs = (qs ^ Q8_OFFSET).bitcast(dtypes.int8)
  return (*(p.permute(0, 2, 1).reshape(-1, 1) for p in scales), qs)


def byte_dot(device: str) -> bool:
  """Whether int8 matvecs pay on `device`: its renderer has a native byte dot product."""
  return bool(INT8_MATVEC) and getattr(Device[device].renderer, "byte_dot", False)


def _dot4(a: Tensor, b: Tensor) -> Tensor:
  """The sum of the products of the 4 bytes of the uint32 words `a` (unsigned) and `b`
  (signed), as int32: instruction selection makes it one byte dot product (codegen/isel.py
  form_dot4) where the target has one."""
  return functools.reduce(operator.add, [((a >> (8 * k)) & 255).cast(dtypes.int32) *
                                         ((b << (24 - 8 * k)).bitcast(dtypes.int32) >> 24)
                                         for k in range(4)])


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """Rows x (n, in) in int8 per block of 32 (llama.cpp's Q8 activations): the int8 values 4 to a
  uint32 word (n, in/32, 8), each block's largest magnitude amax (its scale is amax/127; n,
  in/32), the sum of its quantized values times the scale (n, in/32), and (lazy, read only by
  a second pass) the rounding error x - q * scale (n, in). Values round half away from zero.
  Three small kernels, none of them threaded."""
  n, g = x.shape[0], x.shape[1] // 32
  xb = x.reshape(n, g, 32)
  amax = xb.abs().max(-1)
  v = xb * (amax > 0).where(127 / amax, 0).reshape(n, g, 1)
  qi = (v + (v >= 0).where(0.5, -0.5)).cast(dtypes.int32)
  shifts = _shifts(4, 8, (1, 1, 1, 4), x.device).cast(dtypes.uint32)
  # the 4 bytes of a word are disjoint: their sum is their OR
  byte = (qi & 255).cast(dtypes.uint32).reshape(n, g, 8, 4)
  words = (byte << shifts).sum(-1, dtype=dtypes.uint32)
  error = (xb - qi.cast(dtypes.float32) * (amax / 127).reshape(n, g, 1)).reshape(n, g * 32)
  # the sum of the quantized values, not of x: a block's minimum times it then carries the same
  # rounding as the scale's term, and the two cancel as in dequantize-then-multiply (the exact
  # sum of x made SmolLM2's logits 4x further from float32's)
  # (amax, a reduction read by every consumer, gets its own buffer anyway: schedule/fusion.py)
  return _shared(words), amax, _shared(qi.sum(-1).cast(dtypes.float32) * (amax / 127)), error


def _shared(t: Tensor) -> Tensor:
  """`t` materialized in a buffer of its own that equal expressions share (an untagged
  CONTIGUOUS: the matvecs of q, k and v quantize their one input once; nothing writes to it)."""
  return t._wrap(UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,)))


def interleaved_linear(x: Tensor, w: PackedWeight) -> Tensor:
  """`x @ w.T` in float32 for a row-interleaved Q4_0/Q4_1/Q8_0 weight (no byte dot products):
  each lane of a vector one output row's sum, as over the interleaved words (the fused `x @ w.T`
  of its dequantization reads them strided and sums across lanes, 8x slower)."""
  out, cols = w.shape
  lead, g, lanes = x.shape[:-1], cols // 32, w.lanes
  xb = x.reshape(-1, cols).cast(dtypes.float32)
  n = xb.shape[0]
  *scales, words = w.parts
  d = scales[0].reshape(-1, g, 1, 1, 1, lanes)
  if w.fmt.name == "Q8_0":  # value 4l + k of a block: byte k of its word l
    q = (words.reshape(-1, g, 8, 1, 1, lanes).cast(dtypes.int32) >>
         _shifts(4, 8, (1, 1, 1, 1, 4, 1), x.device)) & 255
    v = (q - Q8_OFFSET).cast(dtypes.float32) * d
    xv = xb.reshape(n, 1, g, 8, 1, 4, 1)
    return (xv * v).sum((2, 3, 4, 5)).reshape(*lead, out)
  # value 16h + 4l + k of a block: bits 4h + 8k of its word l
  shifts = _shifts(2, 4, (1, 1, 2, 1), x.device) + _shifts(4, 8, (1, 1, 1, 4), x.device)
  q = ((words.reshape(-1, g, 4, 1, 1, lanes).cast(dtypes.int32) >> shifts.reshape(1, 1, 1, 2, 4, 1))
       & 15).cast(dtypes.float32)
  v = (q * d + scales[1].reshape(d.shape)) if len(scales) == 2 else (q - 8) * d
  xv = xb.reshape(n, 1, g, 2, 4, 4).permute(0, 1, 2, 4, 3, 5).reshape(n, 1, g, 4, 2, 4, 1)
  return (xv * v).sum((2, 3, 4, 5)).reshape(*lead, out)


def _word_sum(prods: Tensor, words: int) -> Tensor:
  """The sum of `prods` (n, rows, g, words, lanes) over its words axis, as adds, not a REDUCE: a
  reduction inside the block sum would be a kernel of its own."""
  return functools.reduce(operator.add, [prods.shrink((None, None, None, (i, i + 1), None))
                                         for i in range(words)])


def int8_linear(x: Tensor, w: PackedWeight, passes: int = 1) -> Tensor:
  """`x @ w.T` for a row-interleaved Q4_0/Q4_1/Q8_0 weight: x quantized per block
  (quantize_rows), per output row and block `d * dx * sum(q * xq) + min * sum(x)` (Q4_0: min =
  -8d; Q8_0: its offset bytes, min = -128d), the integer sums as byte dot products of the weight
  words and the activation words (sum(x): the quantized x's, see quantize_rows). `passes=2`:
  the rounding error of x's int8 quantization quantized again and multiplied too (x to about 15
  bits, where int8 holds 7), in the same kernel: each weight word loaded once for both."""
  if passes not in (1, 2): raise ValueError(f"int8_linear: passes is 1 or 2, got {passes}")
  out, cols = w.shape
  lead, g = x.shape[:-1], cols // 32
  rest = x.reshape(-1, cols).cast(dtypes.float32)
  n = rest.shape[0]
  *scales, words = w.parts
  rows, lanes = words.shape[0], words.shape[-1]
  shifts = _shifts(2, 4, (1, 1, 2, 1, 1), x.device).cast(dtypes.uint32)
  nib = (words.reshape(rows, g, 1, words.shape[2], lanes) >> shifts) & NIBBLES
  d = scales[0]
  low = scales[1] if len(scales) == 2 else d * -(Q8_OFFSET if w.fmt.name == "Q8_0" else 8)
  y = None
  for _ in range(passes):
    xw, amax, xs, rest = quantize_rows(rest)
    dx = (amax / 127).reshape(n, 1, g, 1)
    term = _block_dots(w.fmt, nib, xw) * (d * dx) + low * xs.reshape(n, 1, g, 1)
    y = term if y is None else y + term
  assert y is not None
  return y.sum(2).reshape(*lead, out)


def _block_dots(fmt: QuantFormat, nib: Tensor, xw: Tensor) -> Tensor:
  """Each block's integer dot product of weight nibbles `nib` (rows, g, 2, words, lanes) and
  activation words `xw` (n, g, 8), as float32 (n, rows, g, lanes)."""
  rows, g, _, _, lanes = nib.shape
  n = xw.shape[0]
  if fmt.name == "Q8_0":
    # activation word j pairs with weight word j, whose bytes (0..255) are taken as two nibbles
    # (byte = low + 16 high): a byte dot product's unsigned bytes stay within 127, where AVX2's
    # pairwise sums cannot saturate
    prods = _dot4(nib, xw.reshape(n, 1, g, 1, 8, 1))
    # (the high nibbles' factor 16 applied in float32: on the int32 sum, the simplifier would
    # distribute it over the byte products and no DOT4 would form)
    low_sum, high_sum = (_word_sum(prods[:, :, :, h], 8).cast(dtypes.float32) for h in (0, 1))
    return (low_sum + high_sum * 16).reshape(n, rows, g, lanes)
  # activation word 4h + j pairs with nibbles h (low 0, high 1) of weight word j: one _dot4 over
  # both axes (a graph of a few dozen nodes, where one _dot4 per word pair built 8x as many)
  prods = _dot4(nib, xw.reshape(n, 1, g, 2, 4, 1)).reshape(n, rows, g, 8, lanes)
  return _word_sum(prods, 8).reshape(n, rows, g, lanes).cast(dtypes.float32)


# the lazy Tensors `pack` returned (by their UOp, held weakly) -> their PackedWeight
_PACKED: weakref.WeakKeyDictionary[UOp, PackedWeight] = weakref.WeakKeyDictionary()


def pack(raw: Tensor, fmt: QuantFormat | str, shape: tuple[int, ...],
         name: str = "tensor") -> Tensor:
  """The blocks in `raw` (1-D uint8) repacked into realized parts, and their dequantization as a
  lazy float32 Tensor of `shape`: a matmul over it reads the parts, never a float32 copy
  (`packed_weight` gives back its parts). `w = pack(raw, "Q4_1", (out, in)); y = x @ w.T`"""
  return pack_all([(raw, fmt, shape, name)])[0]


PackItem = tuple[Tensor, "QuantFormat | str", tuple[int, ...], str]  # pack's arguments


def pack_all(items: Sequence[PackItem]) -> list[Tensor]:
  """`pack(raw, fmt, shape, name)` for each item, the parts of all of them realized at once: a
  realize walks every live lazy Tensor, and a model's 200 weights packed one at a time (each
  pack leaving its lazy dequantization alive) took seconds."""
  staged = [_staged(*item) for item in items]
  _realize_parts([pw for pw in staged if isinstance(pw, PackedWeight)])
  out = []
  for pw in staged:
    if isinstance(pw, PackedWeight):
      t = pw.tensor()
      _PACKED[t.uop] = pw
    else: t = pw  # an empty shape's empty Tensor
    out.append(t)
  return out


def _staged(raw: Tensor, fmt: QuantFormat | str, shape: tuple[int, ...],
            name: str) -> PackedWeight | Tensor:
  """The PackedWeight of `raw` with its parts still lazy (an empty Tensor for an empty shape)."""
  if isinstance(fmt, str):
    if fmt not in QUANT_FORMATS:
      raise ValueError(f"pack: unsupported format {fmt!r} for {name!r} (supported: "
                       f"{', '.join(QUANT_FORMATS)})")
    fmt = QUANT_FORMATS[fmt]
  if 0 in shape: return Tensor.empty(*shape, dtype=dtypes.float32, device=raw.device)
  parts = fmt.repack(_blocks(raw, fmt, shape, name))
  lanes = ROW_LANES if fmt.name in INT8_FORMATS and len(shape) == 2 and \
    shape[0] % ROW_LANES == 0 and byte_dot(raw.device) else 1
  if lanes > 1: parts = interleave(parts, tuple(shape), lanes)
  return PackedWeight(fmt, tuple(p.contiguous() for p in parts), tuple(shape), lanes)


def packed_weight(t: Tensor) -> PackedWeight | None:
  """The PackedWeight behind a Tensor `pack` returned (None for any other Tensor)."""
  return _PACKED.get(t.uop)


def packed_nbytes(*ts: Tensor) -> int:
  """The bytes of the realized buffers (lazy) Tensors read, each buffer once: packed weights'
  resident size (weights that view one stacked buffer, as `fuse_rows` leaves them, count it
  once)."""
  buffers = {u for t in ts for u in t.uop.toposort() if u.op is Ops.BUFFER}
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


def linear(x: Tensor, w: Weight, bias: Tensor | None = None, int8_passes: int = 1) -> Tensor:
  """`x @ w.T (+ bias)` for a weight `w` (out, in): a Tensor, packed or not, or a PackedWeight.
  A packed weight times fewer than DEQUANTIZE_ROWS rows of x (decoding) is one kernel reading
  its blocks (a row-interleaved Q4_0/Q4_1/Q8_0 PackedWeight on a CPU with byte dot products: x in
  int8 per block, `int8_linear` with `int8_passes`, unless the INT8_MATVEC knob is off); times
  more rows it is first dequantized into a transient float32 buffer (a kernel of its own), freed
  after."""
  # a symbolic row count (a prompt's length as a bound Variable) counts at its largest value
  rows = math.prod(s if isinstance(s, int) else int(s.vmax) for s in x.shape[:-1])
  if isinstance(w, PackedWeight) and w.lanes > 1 and rows < DEQUANTIZE_ROWS:
    out = int8_linear(x, w, int8_passes) if byte_dot(x.device) else interleaved_linear(x, w)
    return out if bias is None else out + bias
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
