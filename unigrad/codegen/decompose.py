"""Decompositions: every op a target lacks, rewritten into ops it has.

Consumes: a kernel graph (instruction selection), and the set of ops the target renders natively.
Produces: the same graph in which every op of `pm_decompose_ops` that is missing from that set is
replaced, per the spec's table of decomposed ops: NEG, SUB, DIV, CMPGT/CMPGE/CMPLE/CMPEQ, NOT,
MULACC, EXP2/LOG2/SIN/SQRT/POW (codegen/transcendental.py), THREEFRY (32-bit add-rotate-xor), and
integer floor IDIV/MOD (C's truncating CDIV/CMOD plus a sign fix-up, or a shift and a mask for a
positive power-of-two divisor); and DOT4, our byte dot product (instruction selection forms it only
for targets that render it), into its 4 byte products. On every target, EXP2(x*log2(e)), the
frontend's exp, becomes `xexp(x)` (accurate for every x, unlike EXP2 of the rounded product).
Invariants: values are unchanged bit for bit (the transcendental ones up to their stated ulp
error); IDIV/MOD keep Python's floor semantics, x//0 = x%0 = 0 as in unigrad.uop.alu. Lowering
IDIV/MOD by a non-constant or non-power-of-two divisor needs CDIV/CMOD on the target.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable

from unigrad.dtype import FLOATS, INTS, dtypes, truncate
from unigrad.uop import Ops, PatternMatcher, UOp, UPat
from unigrad.uop.alu import THREEFRY_ROTATIONS
from unigrad.codegen.transcendental import LOG2E, xexp, xexp2, xlog2, xpow, xsin, xsqrt

M32 = 0xFFFFFFFF
THREEFRY_PARITY = 0x1BD11BDA  # the key-schedule constant of Threefry


def threefry2x32(x: UOp, key: UOp) -> UOp:
  """Threefry-2x32, 20 rounds, on a uint64 counter and key, from uint32 add/shift/or/xor.

  Equals `unigrad.uop.alu.threefry2x32` bit for bit: the low 32 bits of each operand are word 0.
  """
  u32 = dtypes.uint32
  x0, x1 = (x & M32).cast(u32), (x >> 32).cast(u32)
  k0, k1 = (key & M32).cast(u32), (key >> 32).cast(u32)
  ks = (k0, k1, k0 ^ k1 ^ THREEFRY_PARITY)
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for group in range(5):
    for r in THREEFRY_ROTATIONS[4 * (group % 2):4 * (group % 2) + 4]:
      x0 = x0 + x1
      x1 = ((x1 << r) | (x1 >> (32 - r))) ^ x0
    x0 = x0 + ks[(group + 1) % 3]
    x1 = x1 + ks[(group + 2) % 3] + (group + 1)
  return (x1.cast(dtypes.uint64) << 32) | x0.cast(dtypes.uint64)


# ---- floor division and modulo ----

def _int_const(d: UOp) -> int | None:
  return d.arg if d.op is Ops.CONST and type(d.arg) is int else None


def _pow2_shift(d: UOp) -> int | None:
  """k when d is the constant 2**k (k >= 0), else None."""
  c = _int_const(d)
  if c is None or c <= 0 or c & (c - 1): return None
  return c.bit_length() - 1


def _is_nonneg(x: UOp) -> bool: return dtypes.is_unsigned(x.dtype) or x.vmin >= 0


def _needs_floor_fix(r: UOp, d: UOp) -> UOp:
  """Whether the truncating remainder r of a division by d differs in sign from d (r != 0)."""
  if (c := _int_const(d)) is not None: return r < 0 if c > 0 else r.const_like(0) < r
  return r.ne(0) & (r < 0).ne(d < 0)


def floordiv(x: UOp, a: UOp, d: UOp) -> UOp:
  """a // d with floor semantics from CDIV (or a shift for d = 2**k)."""
  if (k := _pow2_shift(d)) is not None: return a >> k  # arithmetic shift floors
  q = UOp(Ops.CDIV, x.dtype, (a, d))
  if _is_nonneg(a) and _is_nonneg(d): return q
  return _needs_floor_fix(UOp(Ops.CMOD, x.dtype, (a, d)), d).where(q + -1, q)


def floormod(x: UOp, a: UOp, d: UOp) -> UOp:
  """a % d with floor semantics (the sign of d) from CMOD (or a mask for d = 2**k)."""
  if (k := _pow2_shift(d)) is not None: return a & ((1 << k) - 1)  # two's complement mask
  r = UOp(Ops.CMOD, x.dtype, (a, d))
  if _is_nonneg(a) and _is_nonneg(d): return r
  return _needs_floor_fix(r, d).where(r + d, r)


# ---- the table ----

def _not(x: UOp) -> UOp:
  return x.alu(Ops.CMPNE, True) if x.dtype == dtypes.bool else x.alu(Ops.XOR, -1)


def _neg(x: UOp) -> UOp: return x.alu(Ops.MUL, -1)
def _sub(a: UOp, b: UOp) -> UOp: return a.alu(Ops.ADD, b.alu(Ops.NEG))
def _div(a: UOp, b: UOp) -> UOp: return a.alu(Ops.MUL, b.alu(Ops.RECIP))
def _gt(a: UOp, b: UOp) -> UOp: return b.alu(Ops.CMPLT, a)
def _ge(a: UOp, b: UOp) -> UOp: return a.alu(Ops.CMPLT, b).alu(Ops.CMPNE, True)
def _le(a: UOp, b: UOp) -> UOp: return b.alu(Ops.CMPLT, a).alu(Ops.CMPNE, True)
def _eq(a: UOp, b: UOp) -> UOp: return a.alu(Ops.CMPNE, b).alu(Ops.CMPNE, True)
def _mulacc(a: UOp, b: UOp, c: UOp) -> UOp: return a.alu(Ops.MUL, b).alu(Ops.ADD, c)


def _dot4(a: UOp, b: UOp, c: UOp) -> UOp:
  """DOT4(a, b, c) on int32: c + sum over bytes k of (a >> 8k) & 255 (unsigned) times
  (b << 24-8k) >> 24 (signed: the arithmetic shift extends byte k's sign)."""
  for k in range(4):
    c = c.alu(Ops.ADD, a.alu(Ops.SHR, 8 * k).alu(Ops.AND, 255).alu(
      Ops.MUL, b.alu(Ops.SHL, 24 - 8 * k).alu(Ops.SHR, 24)))
  return c


_a, _b, _x, _d = UPat.var("a"), UPat.var("b"), UPat.var("x"), UPat.var("d")
_fx, _fa, _fb = UPat.var("x", FLOATS), UPat.var("a", FLOATS), UPat.var("b", FLOATS)
_u64 = UPat.var("x", dtypes.uint64)

pm_decompose_ops = PatternMatcher([
  (UPat(Ops.NEG, src=(_x,)), _neg),  # -x -> x*-1
  (UPat(Ops.SUB, src=(_a, _b)), _sub),  # a-b -> a+(-b)
  (UPat(Ops.DIV, src=(_fa, _b)), _div),  # a/b -> a*(1/b)
  (UPat(Ops.CMPGT, src=(_a, _b)), _gt),  # a>b -> b<a
  (UPat(Ops.CMPGE, src=(_a, _b)), _ge),  # a>=b -> (a<b) != True
  (UPat(Ops.CMPLE, src=(_a, _b)), _le),  # a<=b -> (b<a) != True
  (UPat(Ops.CMPEQ, src=(_a, _b)), _eq),  # a==b -> (a!=b) != True
  (UPat(Ops.NOT, src=(_x,)), _not),  # !x -> x != True (ints: x ^ -1)
  (UPat(Ops.MULACC, src=(_a, _b, UPat.var("c"))), _mulacc),  # mulacc(a,b,c) -> a*b+c
  (UPat(Ops.DOT4, src=(_a, _b, UPat.var("c"))), _dot4),  # dot4 -> 4 byte products + c
  (UPat(Ops.EXP2, src=(_fx,)), xexp2),  # 2**x -> polynomial * 2**round(x)
  (UPat(Ops.LOG2, src=(_fx,)), xlog2),  # log2(x) -> exponent + polynomial
  (UPat(Ops.SIN, src=(_fx,)), xsin),  # sin(x) -> reduction mod pi/2 + polynomials
  (UPat(Ops.SQRT, src=(_fx,)), xsqrt),  # sqrt(x) -> EXP2(0.5*LOG2(x)) + a Newton step
  (UPat(Ops.POW, src=(_fa, _fb)), xpow),  # a**b -> EXP2(LOG2(|a|)*b) + sign fix-ups
  (UPat(Ops.THREEFRY, src=(_u64, UPat.var("key"))), threefry2x32),  # 5x4 rounds of 32-bit ARX
  (UPat(Ops.IDIV, INTS, name="x", src=(_a, _d)), floordiv),  # a//d -> CDIV + floor fix-up
  (UPat(Ops.MOD, INTS, name="x", src=(_a, _d)), floormod),  # a%d -> CMOD + floor fix-up
])


def _exp(x: UOp, c: UOp) -> UOp | None:
  """EXP2(x*log2(e)) is e**x: lowered as a whole (one range reduction of x itself)."""
  return xexp(x) if c.arg == truncate(c.dtype, LOG2E) else None


# every target: exp, the frontend's EXP2(x*log2(e)), is more accurate lowered as one function
pm_exp = PatternMatcher([
  (UPat(Ops.EXP2, src=(UPat(Ops.MUL, src=[_fx, UPat(Ops.CONST, name="c")]),)), _exp),
])


@functools.cache
def _pm_decompose(supported: frozenset[Ops]) -> PatternMatcher:
  return pm_exp + PatternMatcher([(p, fn) for p, fn in pm_decompose_ops.patterns
                                  if p.op is not None and not p.op <= supported])


def pm_decompose(supported: Iterable[Ops]) -> PatternMatcher:
  """`pm_exp` and the rules of `pm_decompose_ops` for the ops not in `supported` (cached per
  set)."""
  return _pm_decompose(frozenset(supported))
