"""C helpers for the 8-bit floats: decode (fp8 bits -> float), encode (float -> fp8 bits, round
to nearest even) and round (float -> nearest fp8 value), in integer code only.

The C-family renderers hold fp8 values as float in registers and as one byte in memory; these
helpers are emitted into a kernel's source only when it uses that format. Each equals
`unigrad.dtype.fp8_to_float` / `float_to_fp8` of a float32 bit for bit (test/test_dtype_fp8.py runs
them over every code and random floats on each device against PyTorch).
"""
from __future__ import annotations

import math
import struct

from unigrad.dtype import FP8_FORMATS, FP8S, DType, FP8Format

__all__ = ["FP8_HELPER_NAMES", "fp8_helpers"]

# per format: the (decode, encode, round) helper names
FP8_HELPER_NAMES = {dt: (f"__{dt.name}_to_f", f"__f_to_{dt.name}", f"__r_{dt.name}")
                    for dt in FP8S}


def _f32_bits(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]


def _overflow_bits(f: FP8Format) -> int:
  """The float32 bits from which a value rounds (to nearest even) past the largest finite one."""
  top = f.max
  tie = _f32_bits(top + 2.0 ** (math.frexp(top)[1] - 2 - f.man))  # halfway to the next step
  return tie if f.max_code & 1 else tie + 1


def _specifiers(attr: str) -> str:
  """`static inline`, or `static` and `attr` (a helper kept out of line: gcc warns about a
  function both `inline` and `noinline`)."""
  return f"static {attr}" if attr else "static inline "


def _fp8_decode_fn(name: str, f: FP8Format, attr: str) -> str:
  """fp8 bits -> float: NaN/inf codes, normals by placing the fields, subnormals as m * 2**k."""
  if f.fnuz: nan = "b == 0x80"
  elif f.inf: nan = f"(b & 0x7f) > {f.max_code + 1}"
  else: nan = "(b & 0x7f) == 0x7f"
  inf = f"  else if ((b & 0x7f) == {f.max_code + 1}) r.u = s | 0x7f800000;\n" if f.inf else ""
  sub = repr(math.ldexp(1.0, f.emin - f.man))
  return (f"{_specifiers(attr)}float {name}(unsigned char b) {{\n"
          f"  uint32_t s = (uint32_t)(b & 0x80) << 24, e = (b >> {f.man}) & {(1 << f.exp) - 1}, "
          f"m = b & {(1 << f.man) - 1}; __fu r;\n"
          f"  if ({nan}) r.u = 0x7fc00000 | s;\n{inf}"
          f"  else if (e) r.u = s | ((e + {127 - f.bias}) << 23) | (m << {23 - f.man});\n"
          f"  else {{ r.f = (float)m * {sub}f; r.u |= s; }}\n"
          "  return r.f; }")


def _fp8_encode_fn(name: str, f: FP8Format, attr: str) -> str:
  """float -> fp8 bits in integer ops, rounding to nearest even: NaN, overflow (saturation, inf
  or NaN by format), subnormal results by a shift with a sticky compare, normal ones by adding
  the rounding bias to the float's bits (a mantissa carry moves into the exponent)."""
  shift = 23 - f.man
  zero = "0" if f.fnuz else "s"
  sub_shift = 150 + f.emin - f.man  # a subnormal's count of steps is mant >> (this - e)
  nan = f.nan_code(0) if f.fnuz else "s | 0x7f"
  over = f.overflow_code(0) if f.fnuz else f"s | {f.overflow_code(0)}"
  return (f"{_specifiers(attr)}unsigned char {name}(float x) {{\n"
          "  __fu v; v.f = x; uint32_t s = (v.u >> 24) & 0x80, a = v.u & 0x7fffffff;\n"
          f"  if (a > 0x7f800000) return {nan};\n"
          f"  if (a >= {_overflow_bits(f)}u) return {over};\n"
          f"  if (a < {_f32_bits(math.ldexp(1.0, f.emin))}u) {{\n"
          f"    uint32_t sh = {sub_shift}u - (a >> 23);\n"
          f"    if ((a >> 23) == 0 || sh > 24u) return {zero};\n"
          "    uint32_t m = (a & 0x7fffff) | 0x800000, n = m >> sh, rem = m & ((1u << sh) - 1), "
          "hw = 1u << (sh - 1);\n"
          "    n += (rem > hw) | ((rem == hw) & (n & 1));\n"
          f"    return n ? (unsigned char)(s | n) : {zero}; }}\n"
          f"  uint32_t r = a + {((f.bias - 127) << 23) % 2 ** 32}u + {(1 << (shift - 1)) - 1}u "
          f"+ ((a >> {shift}) & 1);\n"
          f"  return (unsigned char)(s | (r >> {shift})); }}")


def fp8_helpers(dt: DType, attr: str = "") -> dict[str, str]:
  """The C helpers of an 8-bit float: decode, encode and round (float -> nearest fp8 -> float);
  `attr` goes on the conversions in place of `inline` (the CPU's `noinline`)."""
  dec, enc, rnd = FP8_HELPER_NAMES[dt]
  f = FP8_FORMATS[dt]
  return {dec: _fp8_decode_fn(dec, f, attr), enc: _fp8_encode_fn(enc, f, attr),
          rnd: f"static inline float {rnd}(float x) {{ return {dec}({enc}(x)); }}"}
