"""Instruction selection: from values over memory to loads, gates and target-supported ops.

Consumes: an expanded kernel (no REDUCE), where INDEX(buffer, i) nodes are values.
Produces: a kernel in which every read of memory is a LOAD (gated where the index may be
Invalid: `LOAD(INDEX(buf, i), alt, gate)`), gated STOREs carry their gate, floor div/mod of
provably non-negative operands are C's truncating CDIV/CMOD, `x*RECIP(y)` is DIV where the target
has it, ops the target lacks are decomposed (codegen/decompose.py), and `index` arithmetic is
committed to int32 (or int64 when a value may not fit).
Invariants: no Invalid constant and no index dtype remain; LOAD/STORE addresses are INDEX nodes.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from unigrad.dtype import LOW_FLOATS, AddrSpace, DType, dtypes
from unigrad.uop.rewrite import rebuild
from unigrad.uop import GroupOp, Ops, PatternMatcher, UOp, UPat
from unigrad.uop.ops import InvalidType

MEMORY = (Ops.PARAM, Ops.BUFFER, Ops.AFTER)


def is_memory_ref(u: UOp) -> bool:
  """An INDEX into a buffer (as opposed to a loaded value)."""
  if u.op is not Ops.INDEX: return False
  return u.src[0].op in MEMORY and u.src[0].addrspace in (AddrSpace.GLOBAL, AddrSpace.REG,
                                                          AddrSpace.LOCAL)


def _is_invalid(u: UOp) -> bool: return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


def _load(ix: UOp) -> UOp:
  """LOAD of an INDEX; a gated index WHERE(g, i, Invalid) makes a gated load reading 0 when off."""
  buf, i = ix.src[0], ix.src[1]
  zero = UOp.const(ix.dtype, 0)
  if i.op is Ops.WHERE and _is_invalid(i.src[2]):
    return UOp(Ops.LOAD, ix.dtype, (ix.replace(src=(buf, i.src[1])), zero, i.src[0]))
  if _is_invalid(i): return zero
  return UOp(Ops.LOAD, ix.dtype, (ix,))


def add_loads(x: UOp) -> UOp | None:
  """Wrap every memory-reference source in value position in a LOAD."""
  for s in x.src:  # most nodes read no memory: out before building anything
    if s.op is Ops.INDEX: break
  else: return None
  start = 1 if x.op is Ops.STORE else 0
  stop = 2 if x.op is Ops.STORE else len(x.src)
  new = tuple(_load(s) if start <= i < stop and is_memory_ref(s) else s
              for i, s in enumerate(x.src))
  return x.replace(src=new) if any(a is not b for a, b in zip(new, x.src)) else None


def gate_store(st: UOp, buf: UOp, g: UOp, i: UOp, val: UOp, ix: UOp, inv: UOp) -> UOp | None:
  """STORE(INDEX(buf, WHERE(g, i, Invalid)), val) -> STORE(INDEX(buf, i), val, g)"""
  if not _is_invalid(inv): return None
  return UOp(Ops.STORE, dtypes.void, (ix.replace(src=(buf, i)), val, g))


pm_add_loads = PatternMatcher([
  # value reads of memory -> LOAD
  (UPat(GroupOp.Elementwise | {Ops.STORE, Ops.GEP, Ops.STACK}, name="x"), add_loads),
  (UPat(Ops.STORE, name="st", src=(
    UPat(Ops.INDEX, name="ix", src=(UPat.var("buf"), UPat(Ops.WHERE, src=(
      UPat.var("g"), UPat.var("i"), UPat(Ops.CONST, name="inv"))))),
    UPat.var("val"))), gate_store),
])


def nonneg_divmod(x: UOp, a: UOp, c: UOp) -> UOp | None:
  """Floor and truncating division agree when both operands are non-negative."""
  if not dtypes.is_int(x.dtype) or a.vmin < 0 or c.vmin <= 0: return None
  return UOp(Ops.CDIV if x.op is Ops.IDIV else Ops.CMOD, x.dtype, (a, c))


def mul_recip_to_div(a: UOp, r: UOp) -> UOp:
  """a * RECIP(b) -> a / b (exact IEEE division)"""
  return UOp(Ops.DIV, a.dtype, (a, r.src[0]))


pm_divmod_nonneg = PatternMatcher([
  # x//c -> x/c
  (UPat((Ops.IDIV, Ops.MOD), name="x", src=(UPat.var("a"), UPat.var("c"))), nonneg_divmod),
])

pm_mul_recip = PatternMatcher([
  # a*(1/b) -> a/b
  (UPat(Ops.MUL, src=[UPat.var("a"), UPat(Ops.RECIP, name="r")]), mul_recip_to_div),
])


def fuse_accumulate(st: UOp, ix: UOp, ld: UOp, m: UOp) -> UOp | None:
  """acc = acc + a*b -> acc = MULACC(a, b, acc): one rounding per step, as BLAS accumulates."""
  if ld.src[0] is not ix or ix.src[0].addrspace is not AddrSpace.REG: return None
  if not dtypes.is_float(m.dtype.scalar()) or m.dtype.scalar() in LOW_FLOATS:
    return None
  fma = UOp(Ops.MULACC, m.dtype, (m.src[0], m.src[1], ld))
  return st.replace(src=(ix, fma, *st.src[2:]))


# for targets with MULACC: register accumulator updates only (elementwise a*b+c keeps PyTorch's
# two roundings)
pm_fma_accumulate = PatternMatcher([
  (UPat(Ops.STORE, name="st", src=(UPat(Ops.INDEX, name="ix"), UPat(Ops.ADD, src=[
    UPat(Ops.LOAD, name="ld"), UPat(Ops.MUL, name="m")]))), fuse_accumulate),
])


def is_const_like(u: UOp) -> bool:
  """A constant: CONST, VCONST, or a STACK of CONSTs (a broadcast constant after expand)."""
  if u.op in (Ops.CONST, Ops.VCONST): return True
  return u.op is Ops.STACK and all(s.op is Ops.CONST for s in u.src)


def _horner_step(u: UOp) -> UOp | None:
  """u = a*b + c with c a constant, as MULACC(a, b, c); a MULACC as is; else None."""
  if u.op is Ops.MULACC: return u
  if u.op is not Ops.ADD: return None
  for m, c in (u.src, u.src[::-1]):
    if m.op is Ops.MUL and is_const_like(c): return UOp(Ops.MULACC, u.dtype, (*m.src, c))
  return None


def fuse_horner(h: UOp, m: UOp, c: UOp) -> UOp | None:
  """(p*x + c) with p itself a step p = a*b + c' (c, c' constants): both become MULACC. A chain
  of such steps is a polynomial by Horner's rule (the series of erf, expm1, log1p, atan): one
  rounding per step, like the decompositions of exp2/log2, half the instructions and the
  latency. A lone a*b + c is left to PyTorch's two roundings."""
  if not is_const_like(c) or not dtypes.is_float(h.dtype.scalar()): return None
  if h.dtype.scalar() in LOW_FLOATS: return None
  for p, x in (m.src, m.src[::-1]):
    if (step := _horner_step(p)) is not None: return UOp(Ops.MULACC, h.dtype, (step, x, c))
  return None


# for targets with MULACC: polynomial steps by Horner's rule (a chain of at least two steps)
pm_fma_horner = PatternMatcher([
  # (a*b + c1)*x + c2 -> MULACC(MULACC(a, b, c1), x, c2)
  (UPat(Ops.ADD, name="h", src=[UPat(Ops.MUL, name="m"), UPat.var("c")]), fuse_horner),
])


# ---- byte dot products (DOT4) ----

def _const_is(u: UOp, value: int) -> bool: return u.op is Ops.CONST and u.arg == value


def _shift_of(u: UOp, op: Ops) -> tuple[UOp, int]:
  """(x, c) for u = x op c with c a byte shift (0, 8, 16 or 24); (u, 0) otherwise."""
  if u.op is op and u.src[1].op is Ops.CONST and u.src[1].arg in (0, 8, 16, 24):
    return u.src[0], u.src[1].arg
  return u, 0


def unsigned_byte(u: UOp) -> tuple[UOp, int, int] | None:
  """(X, k, mask) when u is byte k of the uint32 word X masked by `mask`, as an int32:
  `CAST((X >> 8k) & mask)` or `CAST(((X & M) >> 8k) & 255)` (mask: byte k of M), with the mask at
  most 127 (a 4-bit nibble of a quantized weight): the bound keeps AVX2's byte products
  (vpmaddubsw's pairs saturate at int16) exact."""
  if u.op is not Ops.CAST or u.dtype != dtypes.int32: return None
  x = u.src[0]
  if x.op is not Ops.AND or x.dtype != dtypes.uint32 or x.src[1].op is not Ops.CONST: return None
  word, shift = _shift_of(x.src[0], Ops.SHR)
  mask = x.src[1].arg & 255
  if word.op is Ops.AND and word.src[1].op is Ops.CONST:
    word, mask = word.src[0], mask & (word.src[1].arg >> shift)
  return (word, shift // 8, mask) if mask <= 127 else None


def signed_byte(u: UOp) -> tuple[UOp, int] | None:
  """(B, k) when u is byte k of the uint32 word B sign-extended to int32:
  `BITCAST(int32, B << 24-8k) >> 24` (an arithmetic shift)."""
  if u.op is not Ops.SHR or u.dtype != dtypes.int32 or not _const_is(u.src[1], 24): return None
  x = u.src[0]
  if x.op is not Ops.BITCAST or x.src[0].dtype != dtypes.uint32: return None
  word, shift = _shift_of(x.src[0], Ops.SHL)
  return word, 3 - shift // 8


def _sum_terms(u: UOp, dots: list[tuple[UOp, UOp, int | None]]) -> list[UOp]:
  """The terms of an int32 sum (its tree of ADDs flattened); the DOT4s in it go to `dots` as
  their (a, b, bound), their accumulators' terms join the sum."""
  if u.dtype != dtypes.int32: return [u]
  if u.op is Ops.DOT4:
    dots.append((u.src[0], u.src[1], u.arg))
    return _sum_terms(u.src[2], dots)
  if u.op is not Ops.ADD: return [u]
  return [t for s in u.src for t in _sum_terms(s, dots)]


def form_dot4(x: UOp) -> UOp | None:
  """An int32 sum holding, for some words A and B, the 4 products of byte k of A (unsigned, at
  most 127) and byte k of B (signed), k = 0..3, as DOT4(A, B, the other terms): one VNNI
  `vpdpbusd` (or AVX2 `vpmaddubsw` + `vpmaddwd`) per vector for 4 multiplies, 4 extractions and
  4 adds per lane. The DOT4s of a sum chain through their accumulators (one instruction each, no
  adds between). A quantized weight's nibbles times int8 activations (nn/quantized.py) are
  written so. Each DOT4's arg is the largest value a byte of its `a` can hold (its mask): the
  renderer may then sum several byte products in 16 bits (renderer/cstyle.py, AVX2)."""
  dots: list[tuple[UOp, UOp, int | None]] = []
  terms = _sum_terms(x, dots)
  groups: dict[tuple[UOp, UOp], dict[int, tuple[UOp, int]]] = {}  # (X, B) -> k -> (term, mask)
  for t in terms:
    if t.op is not Ops.MUL: continue
    for a, b in (t.src, t.src[::-1]):
      if (ua := unsigned_byte(a)) is not None and (sb := signed_byte(b)) is not None \
         and ua[1] == sb[1]:
        groups.setdefault((ua[0], sb[0]), {}).setdefault(ua[1], (t, ua[2]))
        break
  complete = [(ab, g) for ab, g in groups.items() if len(g) == 4]
  if not complete and (len(dots) < 2 or x.src[0].op is not Ops.DOT4 and x.src[1].op is not
                       Ops.DOT4 or x.tag == _TWO_CHAINS):
    return None
  rest = list(terms)
  for _, g in complete:
    for t, _ in g.values(): rest.remove(t)
  pairs = list(dots)
  for (x_word, b), g in complete:
    a = x_word.alu(Ops.AND, UOp.const(dtypes.uint32, sum(g[k][1] << 8 * k for k in range(4))))
    pairs.append((a.bitcast(dtypes.int32), b.bitcast(dtypes.int32), max(g[k][1] for k in g)))
  acc = rest[0] if rest else UOp.const(dtypes.int32, 0)
  for t in rest[1:]: acc = acc.alu(Ops.ADD, t)
  if len(pairs) < 2 * DOT4_CHAIN:
    for a, b, bound in pairs: acc = UOp(Ops.DOT4, dtypes.int32, (a, b, acc), bound)
    return acc
  # two chains, added at the end: each DOT4 waits for its accumulator (vpdpbusd: 5 cycles)
  other = UOp.const(dtypes.int32, 0)
  for i, (a, b, bound) in enumerate(pairs):
    if i % 2: other = UOp(Ops.DOT4, dtypes.int32, (a, b, other), bound)
    else: acc = UOp(Ops.DOT4, dtypes.int32, (a, b, acc), bound)
  return UOp(Ops.ADD, dtypes.int32, (acc, other), tag=_TWO_CHAINS)


DOT4_CHAIN = 4  # a sum of at least twice this many byte dot products runs as two chains
_TWO_CHAINS = "two dot4 chains"


# for targets with DOT4
pm_dot4 = PatternMatcher([(UPat(Ops.ADD, dtypes.int32, name="x"), form_dot4)])


def index_dtype_for(nodes: Iterable[UOp]) -> DType:
  """int32 when every index value of the kernel (its `nodes`) fits, else int64."""
  lo, hi = -(2 ** 31), 2 ** 31 - 1
  for u in nodes:
    if u.dtype == dtypes.index and not (lo <= u.vmin and u.vmax <= hi): return dtypes.int64
  return dtypes.int32


def lower_index_dtype(sink: UOp) -> UOp:
  """Commit every `index` node to one concrete integer dtype."""
  nodes = sink.toposort()
  dt = index_dtype_for(nodes)
  memo: dict[UOp, UOp] = {}
  for u in nodes:
    new_src = tuple([memo[s] for s in u.src])
    if u.op is Ops.VCONST: memo[u] = u  # shapes stay index-typed
    elif u.dtype != dtypes.index: memo[u] = rebuild(u, new_src)
    elif u.op is Ops.CONST: memo[u] = UOp.const(dt, u.arg)
    elif u.op is Ops.PARAM:  # a variable: its arg names the dtype
      memo[u] = u.replace(dtype=dt, src=new_src, arg=replace(u.arg, dtype=dt))
    else: memo[u] = u.replace(dtype=dt, src=new_src)
  return memo[sink]
