"""The meaning of every ALU op on Python scalars: constant folding and the PYTHON device use it.

`exec_alu(op, dtype, operands)` computes the op and wraps or rounds the result to `dtype`, so the
value is what a `dtype` register would hold. Integer IDIV/MOD use Python's floor semantics (the
spec's); CDIV/CMOD are C's truncating forms. Integer division by zero gives 0, like numpy.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

from unigrad.dtype import DType, dtypes, from_bytes, to_bytes, truncate
from unigrad.uop.ops import Ops


def _safe(fn: Callable[[float], float], nan_on: Callable[[float], bool] | None = None
          ) -> Callable[[float], float]:
  def wrapped(x: float) -> float:
    if nan_on is not None and nan_on(x): return math.nan
    try: return fn(x)
    except OverflowError: return math.inf
    except ValueError: return math.nan
  return wrapped


def _recip(x: Any) -> float:
  if x == 0: return math.copysign(math.inf, x) if isinstance(x, float) else math.inf
  return 1 / x


def _log2(x: float) -> float:
  if math.isnan(x) or x < 0: return math.nan
  if x == 0: return -math.inf
  return math.inf if math.isinf(x) else math.log2(x)


def _exp2(x: float) -> float:
  if math.isnan(x): return math.nan
  try: return 2.0 ** x
  except OverflowError: return math.inf


def _sqrt(x: float) -> float:
  if math.isnan(x) or x < 0: return math.nan
  return math.sqrt(x)


def _pow(a: Any, b: Any) -> Any:
  """a**b: IEEE pow for floats; exact (then wrapped) for integers, like PyTorch."""
  if not isinstance(a, float) and not isinstance(b, float): return _ipow(a, b)
  odd = float(b).is_integer() and b % 2 == 1
  if a == 0 and b < 0: return math.copysign(math.inf, a) if odd else math.inf
  try: return math.pow(a, b)
  except OverflowError: return -math.inf if a < 0 and odd else math.inf
  except ValueError: return math.nan


def _ipow(a: int, b: int) -> int:
  if b >= 0: return a ** b
  if a == 1 or a == -1: return a ** (-b % 2 + 2)  # 1 stays 1; -1 keeps its sign for odd b
  return 0  # |a| > 1 (or 0) to a negative power truncates to 0


def _idiv(a: Any, b: Any) -> Any:
  """Floor division; Python's float // is torch.floor_divide's (inf // 2 is nan, 1 // 0.1 is 9)."""
  if not isinstance(a, float) and not isinstance(b, float): return 0 if b == 0 else a // b
  return _fdiv(a, b) if b == 0 else a // b


def _mod(a: Any, b: Any) -> Any:
  """Floor modulo (the sign of b), like torch.remainder; integer x % 0 is 0."""
  if not isinstance(a, float) and not isinstance(b, float): return 0 if b == 0 else a % b
  if b == 0 or math.isnan(a) or math.isnan(b) or math.isinf(a): return math.nan
  m = math.fmod(a, b)  # exact; then moved to b's side, and a zero keeps a's sign (not b's)
  return m + b if m != 0 and (m < 0) != (b < 0) else m


def _cdiv(a: int, b: int) -> int:
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b >= 0) else -q


def _cmod(a: int, b: int) -> int: return 0 if b == 0 else a - _cdiv(a, b) * b


def _fdiv(a: Any, b: Any) -> float:
  if b == 0:
    if a == 0 or math.isnan(a): return math.nan
    sign = math.copysign(1, a) * (math.copysign(1, b) if isinstance(b, float) else 1)
    return math.copysign(math.inf, sign)
  return a / b


def _max(a: Any, b: Any) -> Any:
  """max propagating nan; of equal values (0.0 and -0.0) the first, like torch.maximum on CPU."""
  if isinstance(a, float) and math.isnan(a): return a
  return a if a >= b else b


def _trunc(x: Any) -> Any:
  if isinstance(x, float) and (math.isinf(x) or math.isnan(x)): return x
  return math.copysign(float(math.trunc(x)), x) if isinstance(x, float) else x


def _shl(a: int, b: int) -> int: return a << b if 0 <= b < 64 else 0


def _shr(a: int, b: int) -> int: return a >> b if 0 <= b < 64 else (0 if a >= 0 else -1)


THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def threefry2x32(x: int, key: int) -> int:
  """Threefry-2x32 with 20 rounds (5 groups of add-rotate-xor) on a 64-bit counter and key."""
  m = 0xFFFFFFFF
  x0, x1 = x & m, (x >> 32) & m
  k0, k1 = key & m, (key >> 32) & m
  ks = (k0, k1, 0x1BD11BDA ^ k0 ^ k1)
  x0, x1 = (x0 + ks[0]) & m, (x1 + ks[1]) & m
  for group in range(5):
    for r in THREEFRY_ROTATIONS[4 * (group % 2):4 * (group % 2) + 4]:
      x0 = (x0 + x1) & m
      x1 = ((x1 << r) | (x1 >> (32 - r))) & m
      x1 ^= x0
    x0 = (x0 + ks[(group + 1) % 3]) & m
    x1 = (x1 + ks[(group + 2) % 3] + group + 1) & m
  return (x1 << 32) | x0


def dot4(a: int, b: int, c: int) -> int:
  """DOT4: c plus the sum of the products of the 4 bytes of a (unsigned) and b (signed)."""
  for k in range(4):
    sb = (b >> (8 * k)) & 0xFF
    c += ((a >> (8 * k)) & 0xFF) * (sb - 256 if sb & 0x80 else sb)
  return c


PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.RECIP: _recip, Ops.TRUNC: _trunc, Ops.NEG: lambda x: -x,
  Ops.NOT: lambda x: not x if isinstance(x, bool) else ~x,
  Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _safe(math.sin, math.isinf), Ops.SQRT: _sqrt,
  Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
  Ops.DIV: _fdiv, Ops.MAX: _max, Ops.MOD: _mod, Ops.IDIV: _idiv, Ops.CDIV: _cdiv, Ops.CMOD: _cmod,
  Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPGT: lambda a, b: a > b,
  Ops.CMPGE: lambda a, b: a >= b, Ops.CMPLE: lambda a, b: a <= b, Ops.CMPEQ: lambda a, b: a == b,
  Ops.XOR: lambda a, b: a ^ b, Ops.OR: lambda a, b: a | b, Ops.AND: lambda a, b: a & b,
  Ops.SHR: _shr, Ops.SHL: _shl, Ops.POW: _pow, Ops.THREEFRY: threefry2x32,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
  Ops.DOT4: dot4,
}


def exec_alu(op: Ops, dtype: DType, operands: tuple[Any, ...]) -> Any:
  """The result of `op` on Python scalars, held in `dtype`."""
  if dtype.count > 1:
    lanes = [tuple(x[i] if isinstance(x, tuple) else x for x in operands)
             for i in range(dtype.count)]
    return tuple(exec_alu(op, dtype.scalar(), xs) for xs in lanes)
  if dtypes.is_float(dtype) and op is not Ops.WHERE: operands = tuple(map(float, operands))
  return truncate(dtype, PYTHON_ALU[op](*operands))


def exec_cast(value: Any, src: DType, dst: DType) -> Any:
  """CAST of a scalar: floats to ints truncate toward zero and saturate nan/inf to 0/limits."""
  if dst == dtypes.bool: return bool(value)
  if dtypes.is_float(dst): return truncate(dst, float(value))
  if isinstance(value, float):
    if math.isnan(value): return 0
    if math.isinf(value): return truncate(dst, dst.min if value < 0 else dst.max)
    return truncate(dst, math.trunc(value))
  return truncate(dst, int(value))


def exec_bitcast(value: Any, src: DType, dst: DType) -> Any:
  """BITCAST of a scalar between same-sized dtypes."""
  if src.itemsize != dst.itemsize: raise TypeError(f"bitcast {src!r} -> {dst!r} changes the size")
  return from_bytes(dst, to_bytes(src, [value]))[0]


def float_bits(x: float) -> bytes:
  """A hash key for a float that tells -0.0 from 0.0 and makes every nan equal."""
  return struct.pack("<d", math.nan if math.isnan(x) else x)
