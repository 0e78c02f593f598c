"""Transcendental functions as branch-free UOp graphs: EXP2, LOG2, SIN, and POW and SQRT over them,
and exp (EXP2 of x*log2(e), matched as a whole).

Consumes: a float UOp (float16, bfloat16, float32 or float64, any shape).
Produces: a UOp of the same dtype and shape computing the function from primitive ops only: ADD,
MUL, MULACC, CMPLT, CMPNE, WHERE, CAST, BITCAST, TRUNC, RECIP and integer AND/OR/XOR/SHL/SHR
(xpow and xsqrt emit EXP2/LOG2 nodes, as the spec's decompositions of POW and SQRT say).
Invariants: no branches (special cases are WHEREs); float16/bfloat16 are computed in float32 and
cast back; no float-to-int CAST sees a value out of its integer range.

Methods (SLEEF-like ideas, own coefficients: weighted minimax fits rounded to the dtype):
- exp2: q = round(x), 2**(x-q) by a polynomial, times 2**q built from exponent bits in two halves
  (so 2**q never overflows before the product rounds to inf, 0 or a denormal).
- exp: e**x = e**r * 2**n with n = round(x/ln2) (adding 1.5*2**mbits rounds; its low bits are n)
  and r = x - n*ln2 in two exact Cody-Waite pieces, e**r = 1 + r*P(r) with MULACC (one rounding
  per step where the target fuses): one range reduction, not exp2's second one of x*log2(e),
  whose rounded product would cost up to 2**-24*|x|/ln2 relative (~60 ulp near the overflow).
- log2: x = m * 2**e with m in [sqrt(1/2), sqrt(2)) (denormals scaled by 2**64 first),
  log(m) = f - f*f/2 + s*(f*f/2 + R(s*s)) with f = m-1, s = f/(2+f), multiplied by 1/ln(2) in
  two parts and added to e with an exact two-sum.
- sin: |x| = q*pi/2 + r with |r| <= pi/4 as a double-word r_hi + r_lo: Cody-Waite (pi/2 in exact
  pieces) below SIN_REDUCTION[dt].limit (2**13, float64 2**27), else Payne-Hanek (a window of the
  bits of 2/pi picked by the exponent, multiplied in 32-bit limbs); then the sin or the cos
  polynomial by the quadrant, and the sign of x and of the quadrant put back as a sign-bit XOR.
Accuracy against the correctly rounded result: at most 1 ulp for float32 (every one of the 2**32
inputs checked) and float16; at most 1 ulp for float64 over millions of samples.
Relies on IEEE arithmetic as written (no reassociation, as under -ffast-math; FMA contraction is
harmless) and on denormals not being flushed.
"""
from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from unigrad.dtype import LOW_FLOATS, DType, dtypes
from unigrad.uop import UOp


@dataclass(frozen=True)
class FloatFormat:
  """The bit layout of an IEEE binary float and the integer types that view it."""
  dtype: DType
  uint: DType  # same-size unsigned integer (bit manipulation)
  sint: DType  # same-size signed integer (exponent arithmetic)
  mbits: int  # stored mantissa bits
  bias: int

  @property
  def nbits(self) -> int: return 8 * self.dtype.itemsize

  @property
  def sign_mask(self) -> int: return 1 << (self.nbits - 1)

  @property
  def mant_mask(self) -> int: return (1 << self.mbits) - 1


FORMATS: dict[DType, FloatFormat] = {
  dtypes.float32: FloatFormat(dtypes.float32, dtypes.uint32, dtypes.int32, 23, 127),
  dtypes.float64: FloatFormat(dtypes.float64, dtypes.uint64, dtypes.int64, 52, 1023),
}

# 2**s - 1 = s*P(s) on |s| <= 1/2 (relative error 2**-27.2 / 2**-56.7 after rounding)
EXP2_POLY: dict[DType, tuple[float, ...]] = {
  dtypes.float32: (0.6931472420692444, 0.24022655189037323, 0.055502619594335556,
                   0.009617451578378677, 0.0013423210475593805, 0.0001565868005855009),
  dtypes.float64: (0.6931471805599454, 0.2402265069591009, 0.055504108664816594,
                   0.009618129107608887, 0.0013333558147353482, 0.00015403530440826046,
                   1.525273306034613e-05, 1.3215442542101427e-06, 1.0178349703094163e-07,
                   7.072649764101742e-09, 4.415109419554961e-10),
}

@dataclass(frozen=True)
class ExpReduction:
  """Constants of exp in one float dtype. ln2 = ln2_hi + ln2_lo where ln2_hi has so few bits that
  n*ln2_hi is exact for every n the clamp [lo, hi] allows; below lo exp rounds to 0, above hi it
  overflows. `poly`: (e**r - 1)/r on |r| <= ln2/2 + 2**-10, minimax."""
  ln2_hi: float
  ln2_lo: float
  lo: float
  hi: float
  poly: tuple[float, ...]


EXP_REDUCTION: dict[DType, ExpReduction] = {  # poly relative error 2**-26.8 / 2**-56.6
  dtypes.float32: ExpReduction(float.fromhex("0x1.62e4p-1"), float.fromhex("0x1.7f7d1cp-20"),
                               -104.0, 89.0,
                               (1.0, 0.4999999701976776, 0.16666504740715027, 0.04166725277900696,
                                0.008369247429072857, 0.0013881382765248418)),
  dtypes.float64: ExpReduction(float.fromhex("0x1.62e42fee00000p-1"),
                               float.fromhex("0x1.a39ef35793c76p-33"), -746.0, 710.0,
                               (1.0, 0.5000000000000006, 0.16666666666666552, 0.04166666666657192,
                                0.008333333333405931, 0.0013888888932960637,
                                0.00019841269689775112, 2.480150370635886e-05,
                                2.755743048855986e-06, 2.7626637226838625e-07,
                                2.5047247418845006e-08)),
}
LOG2E = 1 / math.log(2)
# 2*atanh(s)/s - 2 = z*R(z), z = s*s <= (3-2*sqrt(2))**2 (absolute error 2**-34 / 2**-58)
LOG_POLY: dict[DType, tuple[float, ...]] = {
  dtypes.float32: (0.6666666865348816, 0.39999663829803467, 0.2857791483402252,
                   0.22853094339370728),
  dtypes.float64: (0.666666666666671, 0.39999999999540936, 0.2857142871909913, 0.2222220064283504,
                   0.1818346860698363, 0.15316270532541218, 0.14775544345615504),
}
# 1/ln(2) = hi + lo; hi has 12 (float32) / 32 (float64) significant bits, so hi*y is exact for a y
# with the other half of the bits
INV_LN2: dict[DType, tuple[float, float]] = {
  dtypes.float32: (1.4423828125, 0.00031222839606925845),
  dtypes.float64: (1.4426950407214463, 1.6751713164886512e-10),
}
# bits of the mantissa field cleared to make the `hi` part of log(m) (see INV_LN2)
LOG_HI_CLEAR: dict[DType, int] = {dtypes.float32: 12, dtypes.float64: 32}
# sin(r) = r + r*s*S(s) and cos(r) = 1 - s/2 + s*s*C(s), s = r*r, |r| <= pi/4 + 2**-10
# (relative error 2**-32 / 2**-62 and 2**-33 / 2**-64)
SIN_POLY: dict[DType, tuple[float, ...]] = {
  dtypes.float32: (-0.1666666716337204, 0.00833338312804699, -0.00019854650599882007,
                   2.8487177132774377e-06),
  dtypes.float64: (-0.16666666666666666, 0.008333333333332969, -0.00019841269840846243,
                   2.7557319006311304e-06, -2.505205254214639e-08, 1.605194756033961e-10,
                   -7.273072356739502e-13),
}
COS_POLY: dict[DType, tuple[float, ...]] = {
  dtypes.float32: (0.04166664555668831, -0.0013887309469282627, 2.4432327336398885e-05),
  dtypes.float64: (0.041666666666666595, -0.0013888888888873299, 2.4801587288956048e-05,
                   -2.755731419961126e-07, 2.087570258037897e-09, -1.1358584310724932e-11),
}


# ---- constants of pi, computed with integers ----

def _atan_inv(n: int, bits: int) -> int:
  """atan(1/n) * 2**bits, to within a few units, by its Taylor series."""
  term = (1 << bits) // n
  total, k, sign = term, 3, -1
  while term:
    term //= n * n
    total += sign * (term // k)
    k, sign = k + 2, -sign
  return total


@functools.cache
def pi_fixed(bits: int) -> int:
  """floor(pi * 2**bits) (possibly 1 less), by Machin's formula 16*atan(1/5) - 4*atan(1/239)."""
  guard = bits + 32
  return (16 * _atan_inv(5, guard) - 4 * _atan_inv(239, guard)) >> 32


def split_pio2(npieces: int, piece_bits: int) -> tuple[float, ...]:
  """pi/2 as pieces of `piece_bits` significant bits each (truncated), then the rest rounded."""
  fbits = 400
  rest, out = pi_fixed(fbits) >> 1, []
  for _ in range(npieces):
    drop = rest.bit_length() - piece_bits
    piece = (rest >> drop) << drop
    out.append(math.ldexp(piece >> drop, drop - fbits))
    rest -= piece
  out.append(math.ldexp(rest >> (rest.bit_length() - 60), rest.bit_length() - 60 - fbits))
  return tuple(out)


@dataclass(frozen=True)
class SinReduction:
  """Constants of the argument reduction of sin for one float format.

  Cody-Waite below `limit`: q = round(a*2/pi) is short enough that q times each piece of
  `cw_pio2` but the last is exact. Payne-Hanek from `limit` on: `limbs` 32-bit limbs of the bits of
  2/pi (the integer `two_over_pi` = floor(2**table_bits * 2/pi)) give a*2/pi mod 4 with
  `frac_bits` fraction bits; `chunk` bits at a time of that fraction are exact in the dtype;
  `pio2_split` is pi/2 as two pieces of `half_bits` bits and the rest.
  """
  limit: float
  cw_pio2: tuple[float, ...]
  limbs: int
  table_bits: int
  chunk: int
  half_bits: int
  pio2_split: tuple[float, ...]

  @property
  def frac_bits(self) -> int: return 32 * self.limbs - 2

  @functools.cached_property
  def two_over_pi(self) -> int:
    pi = pi_fixed(self.table_bits + 64)
    return (1 << (2 * self.table_bits + 65)) // pi


# float32: q < 2**13 takes 11-bit pieces of pi/2, float64: q < 2**27 takes 26-bit pieces.
# table_bits: the largest exponent of the integer mantissa (127-23, 1023-52) plus frac_bits.
SIN_REDUCTION: dict[DType, SinReduction] = {
  dtypes.float32: SinReduction(limit=2.0 ** 13, cw_pio2=split_pio2(4, 11), limbs=3,
                               table_bits=104 + 94, chunk=16, half_bits=12,
                               pio2_split=split_pio2(2, 12)),
  dtypes.float64: SinReduction(limit=2.0 ** 27, cw_pio2=split_pio2(3, 26), limbs=6,
                               table_bits=971 + 190, chunk=32, half_bits=26,
                               pio2_split=split_pio2(2, 26)),
}


# ---- small builders ----

def _c(like: UOp, v: float | int) -> UOp: return UOp.const(like.dtype, v)


def _poly(x: UOp, coeffs: tuple[float, ...]) -> UOp:
  """c0 + x*(c1 + x*(c2 + ...)) by Horner's rule."""
  acc = _c(x, coeffs[-1])
  for c in reversed(coeffs[:-1]): acc = acc * x + c
  return acc


def _fma_poly(x: UOp, coeffs: tuple[float, ...]) -> UOp:
  """c0 + x*(c1 + x*(c2 + ...)) by Horner's rule, each step one MULACC."""
  acc = _c(x, coeffs[-1])
  for c in reversed(coeffs[:-1]): acc = acc.mulacc(x, _c(x, c))
  return acc


def _pow2i(q: UOp, f: FloatFormat) -> UOp:
  """2.0**q for an integer q of f.sint in [1-bias, bias], from its exponent bits."""
  return ((q + f.bias) << f.mbits).bitcast(f.dtype)


def _fast_two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """(s, e) with s = fl(a+b) and s+e = a+b exactly, given |a| >= |b| or a == 0."""
  s = a + b
  return s, b + (s + a * -1) * -1


def _two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """(s, e) with s = fl(a+b) and s+e = a+b exactly (Knuth's TwoSum, no ordering needed)."""
  s = a + b
  bb = s + a * -1
  return s, (a + (s + bb * -1) * -1) + (b + bb * -1)


def _abs_and_sign(x: UOp, f: FloatFormat) -> tuple[UOp, UOp]:
  """|x| and the sign bit of x (as f.uint), for every x including -0.0 and nan."""
  bits = x.bitcast(f.uint)
  return (bits & (f.sign_mask - 1)).bitcast(f.dtype), bits & f.sign_mask


# ---- exp2 ----

def _exp2(x: UOp, f: FloatFormat) -> UOp:
  lo, hi = -(f.bias + f.mbits + 2), f.bias + 1  # 2**lo rounds to 0, 2**hi overflows
  xc = (x < lo).where(_c(x, lo), (x < hi).where(x, _c(x, hi)))  # nan -> hi
  q = (xc + (xc < 0).where(_c(x, -0.5), _c(x, 0.5))).trunc()
  s = xc + q * -1
  qi = q.cast(f.sint)
  q1 = qi >> 1
  u = s * _poly(s, EXP2_POLY[f.dtype]) + 1.0
  r = u * _pow2i(q1, f) * _pow2i(qi + q1 * -1, f)
  return x.ne(x).where(x, r)


# ---- exp ----

def _exp(x: UOp, f: FloatFormat) -> UOp:
  red = EXP_REDUCTION[f.dtype]
  tiny = x < red.lo
  xc = tiny.where(_c(x, red.lo), (x < red.hi).where(x, _c(x, red.hi)))  # nan -> hi: only n sees it
  magic = 1.5 * 2.0 ** f.mbits
  big = xc * LOG2E + magic
  n = big + -magic
  r = n.mulacc(_c(x, -red.ln2_lo), n.mulacc(_c(x, -red.ln2_hi), x))  # from x: inf and nan pass
  p = _fma_poly(r, red.poly).mulacc(r, _c(x, 1.0))
  k = big.bitcast(f.sint) + -_float_bits(magic, f)
  half = k >> 1
  return tiny.where(_c(x, 0.0), p * _pow2i(half, f) * _pow2i(k + half * -1, f))


def _float_bits(v: float, f: FloatFormat) -> int:
  """The bit pattern of `v` in format f, as a signed integer."""
  return int.from_bytes(struct.pack("<f" if f.nbits == 32 else "<d", v), "little", signed=True)


# ---- log2 ----

def _log2(x: UOp, f: FloatFormat) -> UOp:
  tiny = x < 2.0 ** (1 - f.bias)
  bits = tiny.where(x * 2.0 ** 64, x).bitcast(f.uint)
  m = ((bits & f.mant_mask) | (f.bias << f.mbits)).bitcast(f.dtype)  # [1, 2)
  ebias = tiny.where(_c(x, -f.bias - 64), _c(x, -f.bias))
  e = ((bits >> f.mbits) & (2 * f.bias + 1)).cast(f.dtype) + ebias
  big = m > math.sqrt(2)
  m, e = big.where(m * 0.5, m), e + big.where(_c(x, 1.0), _c(x, 0.0))
  fr = m + -1.0  # exact: m in [sqrt(1/2), sqrt(2)]
  s = fr * (fr + 2.0).recip()
  hfsq = fr * fr * 0.5
  z = s * s
  rz = z * _poly(z, LOG_POLY[f.dtype])
  hi = ((fr + hfsq * -1).bitcast(f.uint) & ~((1 << LOG_HI_CLEAR[f.dtype]) - 1)).bitcast(f.dtype)
  lo = (fr + hi * -1) + hfsq * -1 + s * (hfsq + rz)
  ihi, ilo = INV_LN2[f.dtype]
  val_hi, val_lo = hi * ihi, (lo + hi) * ilo + lo * ihi
  w, err = _fast_two_sum(e, val_hi)  # exact: |e| >= 1 > |val_hi| or e == 0
  r = (val_lo + err) + w
  r = ((x < 0) | x.ne(x)).where(_c(x, math.nan), r)
  r = x.ne(0.0).where(r, _c(x, -math.inf))
  return x.ne(math.inf).where(r, x)


# ---- sin: argument reduction ----

def _reduce_cody_waite(a: UOp, f: FloatFormat) -> tuple[UOp, UOp, UOp]:
  """a = q*pi/2 + r_hi + r_lo for 0 <= a < limit; returns (r_hi, r_lo, q mod 4)."""
  first, *pieces = SIN_REDUCTION[f.dtype].cw_pio2
  q = (a * (2 / math.pi) + 0.5).trunc()
  r_hi, r_lo = a + q * -first, None  # exact: q*first is exact and a is within 2x of it (Sterbenz)
  for p in pieces:  # q*p is exact but for the last piece; the sums are kept as a double-word
    r_hi, err = _two_sum(r_hi, q * -p)
    r_lo = err if r_lo is None else r_lo + err
  assert r_lo is not None
  return r_hi, r_lo, q.cast(f.uint) & 3


def _select(j: UOp, first: int, values: list[int], dtype: DType) -> UOp:
  """values[j - first] for an integer j in [first, first + len(values))."""
  out = UOp.const(dtype, values[0])
  for i, v in enumerate(values[1:], start=first + 1): out = j.ne(i).where(out, UOp.const(dtype, v))
  return out


def _mul_limbs(m: list[UOp], w: list[UOp]) -> list[UOp]:
  """(m * w) mod 2**(32*len(w)) for numbers in little-endian 32-bit limbs held in uint64."""
  n, mask = len(w), 0xFFFFFFFF
  cols: list[UOp | None] = [None] * n
  for i, mi in enumerate(m):
    for k, wk in enumerate(w[:n - i]):
      p = mi * wk
      for pos, part in ((i + k, p & mask), (i + k + 1, p >> 32)):
        if pos < n: cols[pos] = part if cols[pos] is None else cols[pos] + part
  out, carry = [], None
  for col in cols:
    assert col is not None
    v = col if carry is None else col + carry
    out.append(v & mask)
    carry = v >> 32
  return out


def _fixed_to_float2(limbs: list[UOp], red: SinReduction, f: FloatFormat) -> tuple[UOp, UOp]:
  """The fixed-point number limbs * 2**-frac_bits as a double-word (hi, lo) of f.dtype."""
  parts = []
  for i in reversed(range(len(limbs))):
    for c in reversed(range(32 // red.chunk)):
      bits = (limbs[i] >> (c * red.chunk)) & ((1 << red.chunk) - 1)
      parts.append(bits.cast(f.dtype) * 2.0 ** (32 * i + c * red.chunk - red.frac_bits))
  hi, lo = parts[0], None
  for p in parts[1:]:
    hi, err = _fast_two_sum(hi, p)  # exact: every nonzero hi exceeds every later part
    lo = err if lo is None else lo + err
  assert lo is not None
  return hi, lo


def _mul_pio2(v_hi: UOp, v_lo: UOp, red: SinReduction, f: FloatFormat) -> tuple[UOp, UOp]:
  """(v_hi + v_lo) * pi/2 as a double-word, with the leading product split to be exact."""
  pa, pb, pc = red.pio2_split
  clear = f.mbits + 1 - red.half_bits
  va = (v_hi.bitcast(f.uint) & ~((1 << clear) - 1)).bitcast(f.dtype)
  vb = v_hi + va * -1
  u = (va * pb + vb * pa) + (vb * pb + (v_hi * pc + v_lo * (pa + pb)))
  return _fast_two_sum(va * pa, u)


def _reduce_payne_hanek(a: UOp, f: FloatFormat) -> tuple[UOp, UOp, UOp]:
  """a = q*pi/2 + r_hi + r_lo for finite a >= limit; returns (r_hi, r_lo, q mod 4)."""
  red, u64, mask = SIN_REDUCTION[f.dtype], dtypes.uint64, 0xFFFFFFFF
  bits = a.bitcast(f.uint)
  mant = ((bits & f.mant_mask) | (1 << f.mbits)).cast(u64)
  # a*2/pi = mant * 2**(bexp-bias-mbits) * two_over_pi * 2**-table_bits: the window of
  # two_over_pi starting at bit `shift` holds everything below 4 (mod 4) down to 2**-frac_bits
  base = red.table_bits + f.bias + f.mbits - red.frac_bits
  shift = UOp.const(u64, base) + (bits >> f.mbits).cast(u64) * -1
  j, t = shift >> 5, shift & 31
  lo_exp = math.frexp(red.limit)[1] - 1
  jmin, jmax = (base - 2 * f.bias) >> 5, (base - f.bias - lo_exp) >> 5
  words = [(red.two_over_pi >> (32 * i)) & (2 ** 64 - 1) for i in range(jmax + red.limbs + 1)]
  window = [(_select(j, jmin, words[jmin + k:jmax + k + 1], u64) >> t) & mask
            for k in range(red.limbs)]
  m = [mant] if f.mbits < 32 else [mant & mask, mant >> 32]
  prod = _mul_limbs(m, window)
  top = prod[-1]
  q, h = top >> 30, (top >> 29) & 1  # quadrant, and whether the fraction is >= 1/2
  flip = h * mask  # fraction >= 1/2: take 1 - fraction (ones' complement) and the next quadrant
  frac = [p ^ flip for p in prod[:-1]] + [(top ^ flip) & ((1 << 29) - 1)]
  r_hi, r_lo = _mul_pio2(*_fixed_to_float2(frac, red, f), red, f)
  neg = h.ne(0)
  return neg.where(r_hi * -1, r_hi), neg.where(r_lo * -1, r_lo), ((q + h) & 3).cast(f.uint)


# ---- sin ----

def _sin_cos_poly(r_hi: UOp, r_lo: UOp, f: FloatFormat) -> tuple[UOp, UOp]:
  """sin and cos of the double-word r_hi + r_lo, |r_hi| <= pi/4 (plus rounding slack)."""
  s = r_hi * r_hi
  sin = r_hi + (r_lo * (s * -0.5 + 1.0) + r_hi * (s * _poly(s, SIN_POLY[f.dtype])))
  hs = s * 0.5
  w = hs * -1 + 1.0
  tail = s * s * _poly(s, COS_POLY[f.dtype]) + r_hi * r_lo * -1
  cos = w + (((w * -1 + 1.0) + hs * -1) + tail)
  return sin, cos


def _sin(x: UOp, f: FloatFormat) -> UOp:
  red = SIN_REDUCTION[f.dtype]
  a, sign = _abs_and_sign(x, f)
  small, finite = a < red.limit, a < math.inf
  cw = _reduce_cody_waite(small.where(a, _c(a, 0.0)), f)
  ph = _reduce_payne_hanek(small.where(_c(a, red.limit), finite.where(a, _c(a, red.limit))), f)
  r_hi, r_lo, q = (small.where(c, p) for c, p in zip(cw, ph))
  sin, cos = _sin_cos_poly(r_hi, r_lo, f)
  y = (q & 1).ne(0).where(cos, sin)
  flip = ((q >> 1) << (f.nbits - 1)) ^ sign
  return finite.where((y.bitcast(f.uint) ^ flip).bitcast(f.dtype), _c(x, math.nan))


# ---- public builders ----

def _in_format(x: UOp, fn: Callable[[UOp, FloatFormat], UOp]) -> UOp:
  """fn(x, format), computing float16/bfloat16 and the 8-bit floats in float32."""
  dt = x.dtype
  if dt not in (*LOW_FLOATS, dtypes.float32, dtypes.float64):
    raise TypeError(f"transcendental functions take a scalar float dtype, got {dt!r}")
  if dt in FORMATS: return fn(x, FORMATS[dt])
  return fn(x.cast(dtypes.float32), FORMATS[dtypes.float32]).cast(dt)


def xexp(x: UOp) -> UOp:
  """e**x within 1 ulp, branch-free. Overflow gives inf, underflow 0 or a denormal, nan stays
  nan."""
  return _in_format(x, _exp)


def xexp2(x: UOp) -> UOp:
  """2**x, branch-free. Overflow gives inf, underflow 0 or a denormal, nan stays nan."""
  return _in_format(x, _exp2)


def xlog2(x: UOp) -> UOp:
  """log2(x), branch-free. log2(+-0) = -inf, log2(x<0) = nan, log2(inf) = inf, denormals exact."""
  return _in_format(x, _log2)


def xsin(x: UOp) -> UOp:
  """sin(x), branch-free, for every finite x (up to the largest float); sin(+-inf) = nan,
  sin(-0.0) = -0.0."""
  return _in_format(x, _sin)


def _pow(a: UOp, b: UOp) -> UOp:
  f = FORMATS[a.dtype]
  base, sign = _abs_and_sign(a, f)
  r = (base.log2() * b).exp2()
  is_int = b.trunc().eq(b)
  odd = is_int & ((b * 0.5).trunc() * 2.0).ne(b)
  r = (sign.ne(0) & odd).where(r * -1, r)  # a negative base (-0.0, -inf too) to an odd power
  r = ((a < 0) & (_c(a, -math.inf) < a) & is_int.logical_not()).where(_c(a, math.nan), r)
  one = _c(a, 1.0)
  r = (b.ne(0.0) & a.ne(1.0)).where(r, one)  # x**0 = 1, 1**y = 1 (also for nan)
  return (a.ne(-1.0) | _abs_and_sign(b, f)[0].ne(math.inf)).where(r, one)  # (-1)**(+-inf) = 1


def xpow(a: UOp, b: UOp) -> UOp:
  """a**b = EXP2(LOG2(|a|)*b) with C/PyTorch's special cases: a negative base with an integer
  exponent gives the signed result, with a non-integer one nan; x**0 = 1, 1**y = 1,
  (-1)**(+-inf) = 1, 0**(y<0) = inf (-inf for -0.0 and odd y). Accuracy is that of EXP2/LOG2 in
  the compute dtype: float64 for float16/bfloat16/float32, whose results are then within 1 ulp
  (|b*log2|a|| <= 160 where the result is a normal float32, so its float64 error is far below
  2**-24); float64 has relative error about |b*log2|a||*2**-52."""
  if a.dtype != b.dtype:
    raise TypeError(f"xpow needs equal dtypes, got {a.dtype!r} and {b.dtype!r}")
  if a.dtype in (*LOW_FLOATS, dtypes.float32):
    return _pow(a.cast(dtypes.float64), b.cast(dtypes.float64)).cast(a.dtype)
  if a.dtype not in FORMATS: raise TypeError(f"xpow takes a scalar float dtype, got {a.dtype!r}")
  return _pow(a, b)


def _sqrt(x: UOp) -> UOp:
  y = (x.log2() * 0.5).exp2()
  y = (y + x * y.recip()) * 0.5  # one Newton step: the error of EXP2/LOG2 squared
  y = x.ne(0.0).where(y, x)  # sqrt(+-0) = +-0
  return x.ne(math.inf).where(y, x)


def xsqrt(x: UOp) -> UOp:
  """sqrt(x) for targets without one: EXP2(0.5*LOG2(x)) refined by one Newton step;
  sqrt(+-0) = +-0, sqrt(x<0) = nan, sqrt(inf) = inf."""
  if x.dtype in LOW_FLOATS:
    return _sqrt(x.cast(dtypes.float32)).cast(x.dtype)
  if x.dtype not in FORMATS: raise TypeError(f"xsqrt takes a scalar float dtype, got {x.dtype!r}")
  return _sqrt(x)
