"""The symbolic simplifier: named rule tables over ALU UOps.

Tables, applied together by `pm_simplify`:
- `pm_fold_constants`: ALU/CAST/BITCAST of constants is evaluated (uop/alu.py semantics);
- `pm_identities`: x+0, x*1, x//1, x^x, where(c,x,x), cast to the same dtype, ...;
- `pm_min_max`: an integer node whose min_max is a single value becomes that constant; MAX and
  WHERE decided by intervals;
- `pm_canonical`: commutative operands in a canonical order; integer sums in a linear normal form
  (like terms combined, sorted, constant last; (x//c)*c + x%c recombined), so equal expressions
  become the same node;
- `pm_divmod`: floor division and modulo by a positive constant split off the multiples of the
  divisor, fold bounded remainders (`(x*4+y)//4 -> x`, `(x*4+y)%4 -> y` for 0 <= y < 4), factor
  common divisors and merge nested div/mod;
- `pm_compare`: integer comparisons against constants normalized (constants moved, gcd divided);
- `pm_invalid`: ALU ops move inside `WHERE(valid, x, Invalid)` gates.
Rules build new nodes only through methods of the matched nodes, so this module never imports the
UOp class (uop.py imports it).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from unigrad.dtype import FLOATS, dtypes
from unigrad.uop.alu import exec_alu, exec_bitcast, exec_cast
from unigrad.uop.ops import GroupOp, Invalid, InvalidType, Ops
from unigrad.uop.upat import PatternMatcher, UPat

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

INT_LIKE = (*[dt for dt in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8,
                            dtypes.uint16, dtypes.uint32, dtypes.uint64)], dtypes.index)


# dtypes.is_float's tuple takes an __eq__ call per member it is not; a set takes one hash
_FLOAT_SET = frozenset(FLOATS)


def is_int(u: UOp) -> bool: return dtypes.is_int(u.dtype) and u.dtype.count == 1


def is_float_dtype(u: UOp) -> bool: return u.dtype.scalar() in _FLOAT_SET


def is_invalid(u: UOp) -> bool: return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


def int_const(u: UOp) -> int | None:
  """The value of an integer CONST, else None."""
  if u.op is Ops.CONST and type(u.arg) is int: return u.arg
  return None


def no_overflow(u: UOp) -> bool:
  """True when u's integer range is proven (index math, or a range narrower than its dtype)."""
  if u.dtype == dtypes.index: return True
  return (u.vmin, u.vmax) != (u.dtype.min, u.dtype.max)


# ---- canonical order ----

def order_key(u: UOp) -> tuple:
  """A deterministic structural sort key (constants sort last); cached per node."""
  if (k := u.__dict__.get("_okey")) is not None: return k
  stack: list[tuple[UOp, bool]] = [(u, False)]
  while stack:
    x, ready = stack.pop()
    if "_okey" in x.__dict__: continue
    if not ready:
      stack.append((x, True))
      stack.extend((s, False) for s in x.src if "_okey" not in s.__dict__)
      continue
    arg = x.arg if isinstance(x.arg, (int, float, str, bool)) else repr(x.arg)
    x.__dict__["_okey"] = (x.op is Ops.CONST, x.op.value, str(type(arg)), arg, x.dtype.priority,
                           tuple(s.__dict__["_okey"] for s in x.src))
  return u.__dict__["_okey"]


def _order_head(x: UOp) -> tuple:
  """order_key(x) without its last item (the sources' keys); cached per node."""
  if (h := x.__dict__.get("_ohead")) is not None: return h
  arg = x.arg if isinstance(x.arg, (int, float, str, bool)) else repr(x.arg)
  h = (x.op is Ops.CONST, x.op._value_, str(type(arg)), arg, x.dtype.priority)  # value, unwrapped
  x.__dict__["_ohead"] = h
  return h


def order_cmp(a: UOp, b: UOp) -> int:
  """-1 when order_key(a) < order_key(b), 0 when the keys are equal, else 1, without building
  the keys: both graphs are walked in step to their first difference. Comparing the nested key
  tuples re-tests equality at every level, O(depth^2) (most of the simplifier's time on the
  deep float sums of an unrolled kernel); this is O(depth) and needs no recursion."""
  stack: list[list] = []  # per open level: [a's sources, b's sources, next position]
  while True:
    if a is not b:
      ha = a.__dict__.get("_ohead") or _order_head(a)
      hb = b.__dict__.get("_ohead") or _order_head(b)
      if ha != hb: return -1 if ha < hb else 1
      stack.append([a.src, b.src, 0])
    while True:  # the next pair of sources that are not the same node
      if not stack: return 0
      top = stack[-1]
      sa, sb, i = top
      n = min(len(sa), len(sb))
      while i < n and sa[i] is sb[i]: i += 1
      if i < n:
        top[2] = i + 1
        a, b = sa[i], sb[i]
        break
      stack.pop()
      if len(sa) != len(sb): return -1 if len(sa) < len(sb) else 1


def sort_commutative(x: UOp) -> UOp | None:
  a, b = x.src
  if order_cmp(b, a) < 0: return x.replace(src=(b, a))
  return None


# ---- linear normal form of integer sums ----

def linear_terms(u: UOp) -> tuple[dict[UOp, int], int]:
  """u as sum(coeff * term) + const, looking through ADD and MUL-by-constant (cached per node;
  the caller owns the returned dict)."""
  if (got := u.__dict__.get("_linear_terms")) is not None: return dict(got[0]), got[1]
  terms: dict[UOp, int] = {}
  const = 0
  stack = [(u, 1)]
  while stack:
    x, c = stack.pop()
    if (v := int_const(x)) is not None: const += c * v
    elif (sub := x.__dict__.get("_linear_terms")) is not None:
      for t, a in sub[0].items(): terms[t] = terms.get(t, 0) + c * a
      const += c * sub[1]
    elif x.op is Ops.ADD: stack.extend((s, c) for s in x.src)
    elif x.op is Ops.MUL and (v := int_const(x.src[1])) is not None: stack.append((x.src[0], c * v))
    elif x.op is Ops.MUL and (v := int_const(x.src[0])) is not None: stack.append((x.src[1], c * v))
    elif x.op is Ops.MUL and (inner := _scaled_factor(x)) is not None:
      stack.append((inner[0], c * inner[1]))  # a*(b*k) -> (a*b)*k
    else: terms[x] = terms.get(x, 0) + c
  terms, const = _recombine_divmod(terms, const)
  if u.op is Ops.ADD or u.op is Ops.MUL: u.__dict__["_linear_terms"] = (terms, const)
  return dict(terms), const


def _scaled_factor(x: UOp) -> tuple[UOp, int] | None:
  """A product a*(b*k) or (b*k)*a of integers, with k constant, as (a*b, k); None otherwise (an
  index over a symbolic axis: ridx*(n*64) is the term ridx*n times 64)."""
  for i in (0, 1):
    f = x.src[i]
    if f.op is Ops.MUL and (k := int_const(f.src[1])) is not None and k != 0:
      return x.src[1 - i].alu(Ops.MUL, f.src[0]), k
  return None


def _recombine_divmod(terms: dict[UOp, int], const: int) -> tuple[dict[UOp, int], int]:
  """(x//c)*(a*c) + (x%c)*a -> x*a, repeatedly (x's own constant joins the sum's)."""
  while (pair := _divmod_pair(terms)) is not None:
    m, q, a = pair
    del terms[m], terms[q]
    sub, k = linear_terms(m.src[0])
    for s, b in sub.items(): terms[s] = terms.get(s, 0) + a * b
    const += a * k
  return {t: a for t, a in terms.items() if a != 0}, const


def _divmod_pair(terms: dict[UOp, int]) -> tuple[UOp, UOp, int] | None:
  """A term x%c with coefficient a whose x//c is also a term, with coefficient a*c."""
  divs = {(t.src[0], c): t for t in terms if t.op is Ops.IDIV and (c := int_const(t.src[1]))}
  if not divs: return None
  for t, a in terms.items():
    if t.op is not Ops.MOD or (c := int_const(t.src[1])) is None: continue
    if (q := divs.get((t.src[0], c))) is not None and terms[q] == a * c: return t, q, a
  return None


def build_linear(like: UOp, terms: dict[UOp, int], const: int) -> UOp:
  """sum(coeff * term) + const in canonical order, with `like`'s dtype. Every ADD it builds is
  marked canonical (each prefix of a canonical sum is one), so canonical_sum skips it in O(1)."""
  out: UOp | None = None
  for t, c in _sorted_terms(terms):
    e = t if c == 1 else t.alu(Ops.MUL, c)
    out = e if out is None else _mark_canonical(out.alu(Ops.ADD, e))
  if out is None: return like.const_like(const)
  return out if const == 0 else _mark_canonical(out.alu(Ops.ADD, const))


def _mark_canonical(u: UOp) -> UOp:
  u.__dict__["_canonical_sum"] = True
  return u


def _sorted_terms(terms: dict[UOp, int]) -> list[tuple[UOp, int]]:
  return sorted(((t, c) for t, c in terms.items() if c != 0), key=lambda tc: order_key(tc[0]))


def is_built_linear(x: UOp, items: list[tuple[UOp, int]], const: int) -> bool:
  """True when `x` is already what build_linear makes of `items` and `const` (no nodes built)."""
  if const != 0:
    if x.op is not Ops.ADD or int_const(x.src[1]) != const: return False
    x = x.src[0]
  for i in range(len(items) - 1, -1, -1):
    if i and x.op is not Ops.ADD: return False
    e, (t, c) = (x.src[1] if i else x), items[i]
    if not (e is t if c == 1 else e.op is Ops.MUL and e.src[0] is t and int_const(e.src[1]) == c):
      return False
    if i: x = x.src[0]
  return bool(items)


def canonical_sum(x: UOp) -> UOp | None:
  """An integer sum in linear normal form, when its range is proven (index math: see
  no_overflow). A wrapping sum (threefry's rounds) stays as it is: flattening each round's sum
  into the next copied every shared partial sum into each of its users (a 4-row tile of random
  numbers: 505 ADDs became 1434)."""
  if "_canonical_sum" in x.__dict__ or not no_overflow(x): return None
  terms, const = linear_terms(x)
  if is_built_linear(x, _sorted_terms(terms), const): return None
  return build_linear(x, terms, const)


def distribute_mul(x: UOp, c: UOp) -> UOp | None:
  """(a+b)*c -> a*c + b*c and (a*c1)*c2 -> a*(c1*c2) for integers."""
  terms, const = linear_terms(x.alu(Ops.MUL, c))
  return build_linear(x, terms, const)


# ---- div and mod by a constant ----

def negatable(x: UOp) -> bool:
  """True when -x cannot overflow x's dtype."""
  return x.dtype == dtypes.index or x.vmin > x.dtype.min


def fits(like: UOp, v: int) -> bool:
  """True when the constant v is held exactly by like's dtype."""
  return like.const_like(v).arg == v


def fold_idiv(x: UOp, d: UOp) -> UOp | None:
  """(a*c+y)//c -> a + y//c (y//c folded when bounded, common factors divided out);
  x//-c is (-x)//c."""
  c = int_const(d)
  if c is None or c == 0 or not no_overflow(x): return None
  if c == 1: return x
  terms, k = linear_terms(x)
  if c > 0: return _split_div(x, terms, k, c)
  if not negatable(x): return None
  return _split_div(x, {t: -a for t, a in terms.items()}, -k, -c)


def _split_div(x: UOp, terms: dict[UOp, int], k: int, c: int) -> UOp | None:
  """(sum(a*t) + k) // c for c > 0, or None when nothing folds."""
  quot = {t: a // c for t, a in terms.items() if a % c == 0}
  rem = {t: a for t, a in terms.items() if a % c != 0}
  qk, rk = divmod(k, c)
  g = math.gcd(c, rk, *rem.values())
  r = build_linear(x, rem, rk)
  if not no_overflow(r): return None
  if r.vmin // c == r.vmax // c: rdiv = x.const_like(r.vmin // c)
  elif g > 1: rdiv = build_linear(x, {t: a // g for t, a in rem.items()}, rk // g) // (c // g)
  elif not quot and not qk: return None
  else: rdiv = r.alu(Ops.IDIV, c)
  return build_linear(x, quot, qk).alu(Ops.ADD, rdiv)


def fold_mod(x: UOp, d: UOp) -> UOp | None:
  """(a*c+y)%c -> y%c (folded when y is bounded, common factors divided out);
  x%-c is -((-x)%c) when that folds."""
  c = int_const(d)
  if c is None or c == 0 or not no_overflow(x): return None
  if c in (1, -1): return x.const_like(0)
  terms, k = linear_terms(x)
  if c > 0: return _split_mod(x, terms, k, c)
  if not negatable(x): return None
  r = _split_mod(x, {t: -a for t, a in terms.items()}, -k, -c)
  if r is None or r.op in (Ops.MOD, Ops.MUL): return None
  rterms, rk = linear_terms(r)
  return build_linear(x, {t: -a for t, a in rterms.items()}, -rk)


def _split_mod(x: UOp, terms: dict[UOp, int], k: int, c: int) -> UOp | None:
  """(sum(a*t) + k) % c for c > 0: a bounded remainder folded, common factors divided out."""
  rem = {t: a % c for t, a in terms.items() if a % c != 0}
  r = build_linear(x, rem, k % c)
  if not no_overflow(r): return None
  if 0 <= r.vmin and r.vmax < c: return r
  if r.vmin // c == r.vmax // c: return r.alu(Ops.ADD, -(r.vmin // c) * c)
  g = math.gcd(c, k % c, *rem.values())
  if g == 1: return r.alu(Ops.MOD, c)
  inner = build_linear(x, {t: a // g for t, a in rem.items()}, (k % c) // g)
  return inner.alu(Ops.MOD, c // g).alu(Ops.MUL, g)


def fold_small_remainder(u: UOp, x: UOp, d: UOp) -> UOp | None:
  """(g*a + s) // c -> a // (c/g) and (g*a + s) % c -> (a % (c/g))*g + s, where g divides c and
  0 <= s < g: s is the terms whose coefficients g does not divide, plus part of the constant."""
  c = int_const(d)
  if c is None or c <= 1 or not no_overflow(x): return None
  terms, k = linear_terms(x)
  for g in sorted({math.gcd(c, a) for a in terms.values()} - {1, c}, reverse=True):
    big = {t: a // g for t, a in terms.items() if a % g == 0}
    small = build_linear(x, {t: a for t, a in terms.items() if a % g}, 0)
    if not big or not no_overflow(small): continue
    kq = (small.vmin + k) // g
    if small.vmax + k - kq * g >= g: continue
    a = build_linear(x, big, kq)
    if u.op is Ops.IDIV: return a.alu(Ops.IDIV, c // g)
    return a.alu(Ops.MOD, c // g).alu(Ops.MUL, g).alu(Ops.ADD, small.alu(Ops.ADD, k - kq * g))
  return None


MAX_AFFINE_VALUES = 64  # div/mod of a term with at most this many values is tried as affine


def fold_affine_divmod(u: UOp, x: UOp, d: UOp) -> UOp | None:
  """(a*t + k) // c or % c, where t takes few values and the result is affine in t on them:
  p*t + q (found by evaluating every value: `(2*t+2) % 3` is `2 - t` for t in [0, 2])."""
  c = int_const(d)
  if c is None or c == 0 or not no_overflow(x): return None
  terms, k = linear_terms(x)
  if len(terms) != 1: return None
  (t, a), = terms.items()
  lo, hi = t.min_max
  if not (isinstance(lo, int) and isinstance(hi, int)) or not 0 < hi - lo < MAX_AFFINE_VALUES:
    return None
  def at(v: int) -> int: return (a * v + k) // c if u.op is Ops.IDIV else (a * v + k) % c  # floor
  f0, p = at(lo), at(lo + 1) - at(lo)
  if any(at(v) != f0 + p * (v - lo) for v in range(lo + 2, hi + 1)): return None
  out = build_linear(u, {t: p}, f0 - p * lo)
  return out if no_overflow(out) else None


def fold_nested_div(x: UOp, a: UOp, b: UOp) -> UOp | None:
  """(x//a)//b -> x//(a*b) for positive a, b."""
  ca, cb = int_const(a), int_const(b)
  if ca is None or cb is None or ca <= 0 or cb <= 0 or not fits(x, ca * cb): return None
  return x.alu(Ops.IDIV, ca * cb)


def fold_div_of_mod(x: UOp, m: UOp, d: UOp) -> UOp | None:
  """(x%(k*c))//c -> (x//c)%k for positive constants."""
  cm, cd = int_const(m), int_const(d)
  if cm is None or cd is None or cd <= 0 or cm <= 0 or cm % cd: return None
  return x.alu(Ops.IDIV, cd).alu(Ops.MOD, cm // cd)


def fold_mod_of_mod(x: UOp, m: UOp, d: UOp) -> UOp | None:
  """(x%(k*c))%c -> x%c for positive constants."""
  cm, cd = int_const(m), int_const(d)
  if cm is None or cd is None or cd <= 0 or cm <= 0 or cm % cd: return None
  return x.alu(Ops.MOD, cd)


# ---- comparisons ----

def fold_cmplt(x: UOp, d: UOp) -> UOp | None:
  """sum(a*t) + k < c  ->  sum((a/g)*t) < ceil((c-k)/g), g the gcd of the coefficients."""
  c = int_const(d)
  if c is None or not no_overflow(x): return None
  if x.op is Ops.IDIV and (dv := int_const(x.src[1])) is not None and dv > 0 \
     and no_overflow(x.src[0]) and fits(x, c * dv):
    return x.src[0].alu(Ops.CMPLT, c * dv)  # x//d < c  <=>  x < c*d
  terms, k = linear_terms(x)
  if not terms: return None
  g = math.gcd(*terms.values())
  if k == 0 and g == 1: return None
  lhs = build_linear(x, {t: a // g for t, a in terms.items()}, 0)
  if not no_overflow(lhs): return None
  return lhs.alu(Ops.CMPLT, -((k - c) // g))


# ---- constant folding ----

def fold_alu(a: UOp) -> UOp | None:
  if a.op is Ops.WHERE: return a.src[1] if a.src[0].arg else a.src[2]
  if any(is_invalid(s) for s in a.src): return type(a).const(a.dtype, Invalid)
  vals = tuple(s.arg for s in a.src)
  return type(a).const(a.dtype, exec_alu(a.op, a.dtype, vals))


def fold_cast(c: UOp, x: UOp) -> UOp | None:
  if is_invalid(x): return None
  return type(c).const(c.dtype, exec_cast(x.arg, x.dtype, c.dtype))


def fold_bitcast(c: UOp, x: UOp) -> UOp | None:
  if is_invalid(x) or c.dtype.itemsize != x.dtype.itemsize or c.dtype.count > 1: return None
  return type(c).const(c.dtype, exec_bitcast(x.arg, x.dtype, c.dtype))


def fold_to_const(x: UOp) -> UOp | None:
  """An integer or bool node whose min_max is one value is that value."""
  if x.op is Ops.CONST or x.dtype.count > 1 or is_float_dtype(x): return None
  lo, hi = x.min_max
  return type(x).const(x.dtype, lo) if lo == hi else None


def fold_max(m: UOp, a: UOp, b: UOp) -> UOp | None:
  if not (is_int(m) or m.dtype == dtypes.bool): return None
  if a.vmin >= b.vmax: return a
  if b.vmin >= a.vmax: return b
  return None


def where_pick(c: UOp, a: UOp, b: UOp) -> UOp | None:
  if c.op is not Ops.CONST or is_invalid(c): return None
  return a if c.arg else b


_cond = UPat.var("c")

pm_fold_constants = PatternMatcher([
  (UPat(GroupOp.ALU, src=UPat(Ops.CONST), name="a"), fold_alu),  # op(c0, c1) -> c
  (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="x"),), name="c"), fold_cast),  # cast(c) -> c'
  (UPat(Ops.BITCAST, src=(UPat(Ops.CONST, name="x"),), name="c"), fold_bitcast),  # bitcast(c) -> c'
  (UPat(Ops.WHERE, src=(_cond, UPat.var("a"), UPat.var("b"))), where_pick),  # where(T,a,b) -> a
])

_x, _y, _c = UPat.var("x"), UPat.var("y"), UPat.cvar("c")
_a, _b, _d, _m = UPat.cvar("a"), UPat.cvar("b"), UPat.cvar("d"), UPat.cvar("m")
_int = INT_LIKE
_int_bool = (*INT_LIKE, dtypes.bool)
_xi, _xib, _xb = UPat.var("x", _int), UPat.var("x", _int_bool), UPat.var("x", dtypes.bool)
_zero, _one, _minus_one = UPat.const(None, 0), UPat.const(None, 1), UPat.const(None, -1)
_true, _false = UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False)
_not_x, _not_c = UPat(Ops.CMPNE, src=(_x, _true)), UPat(Ops.CMPNE, src=(_cond, _true))


def false_like(x: UOp) -> UOp: return type(x).const(dtypes.bool, False)
def add_zero(x: UOp) -> UOp | None: return None if is_float_dtype(x) else x  # -0.0+0 is 0.0


def swap_not_where(c: UOp, x: UOp, y: UOp) -> UOp | None:
  """where(!c, x, y) -> where(c, y, x), unless y is Invalid (the gate form stays as it is)."""
  return None if is_invalid(y) else c.where(y, x)


def drop_same_cast(c: UOp, x: UOp) -> UOp | None: return x if c.dtype == x.dtype else None


pm_identities = PatternMatcher([
  (UPat(Ops.ADD, src=[_x, _zero]), add_zero),  # x+0 -> x (integers)
  (UPat(Ops.MUL, src=[_x, _one]), lambda x: x),  # x*1 -> x
  (UPat(Ops.MUL, src=[_xi, _zero.named("z")]), lambda x, z: z),  # x*0 -> 0 (integers)
  (UPat(Ops.IDIV, src=(_xi, _one)), lambda x: x),  # x//1 -> x
  (UPat(Ops.IDIV, src=(_xi, _minus_one)), lambda x: x.alu(Ops.MUL, -1)),  # x//-1 -> -x
  (UPat(Ops.MOD, src=(_xi, _one)), lambda x: x.const_like(0)),  # x%1 -> 0
  (UPat((Ops.OR, Ops.XOR), src=[_xib, _zero]), lambda x: x),  # x|0, x^0 -> x
  (UPat(Ops.AND, src=[_xib, _zero.named("z")]), lambda x, z: z),  # x&0 -> 0
  (UPat(Ops.AND, src=[_xb, _true]), lambda x: x),  # x&True -> x
  (UPat(Ops.OR, src=[_xb, _true.named("t")]), lambda x, t: t),  # x|True -> True
  (UPat((Ops.MAX, Ops.AND, Ops.OR), src=(_x, _x)), lambda x: x),  # max(x,x), x&x, x|x -> x
  (UPat(Ops.XOR, src=(_xib, _x)), lambda x: x.const_like(0)),  # x^x -> 0
  (UPat(Ops.CMPLT, src=(_xib, _x)), false_like),  # x<x -> False
  (UPat(Ops.CMPNE, src=(_xib, _x)), false_like),  # x!=x -> False
  (UPat(Ops.CMPNE, src=(_not_x, _true)), lambda x: x),  # not(not(x)) -> x
  (UPat(Ops.CMPNE, src=(_xb, _false)), lambda x: x),  # x!=False -> x
  (UPat(Ops.WHERE, src=(UPat.var(), _x, _x)), lambda x: x),  # where(c,x,x) -> x
  (UPat(Ops.WHERE, src=(_not_c, _x, _y)), swap_not_where),  # where(!c,x,y) -> where(c,y,x)
  (UPat(Ops.WHERE, dtypes.bool, src=(_cond, _true, _false)), lambda c: c),  # where(c,T,F) -> c
  (UPat(Ops.CAST, name="c", src=(_x,)), drop_same_cast),  # cast to its own dtype -> x
  (UPat(Ops.TRUNC, src=(_xib,)), lambda x: x),  # trunc(int) -> x
  (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(_x, _minus_one)), _minus_one)), lambda x: x),  # -(-x) -> x
])

pm_min_max = PatternMatcher([
  (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), fold_to_const),  # [v,v] -> v (not RANGE: 0 trips)
  (UPat(Ops.MAX, name="m", src=(UPat.var("a"), UPat.var("b"))), fold_max),  # max by intervals
])

def fold_symbolic_divmod(u: UOp, x: UOp, d: UOp) -> UOp | None:
  """(d*q + n*b + r) // d -> q and (...) % d -> n*b + r, for a divisor d = c*n with a symbolic
  factor n (a variable sequence length), when the remainder n*b + r is provably in [0, d):
  0 <= b <= c-1 and r in [0, n) (a range that ends at n, or a small constant). This is what
  flattening then unflattening an index over a symbolic axis leaves (a reshape or a transpose
  of a KV cache read up to a bound position)."""
  if int_const(d) is not None: return None
  dterms, dk = linear_terms(d)
  c = math.gcd(dk, *dterms.values())  # d = c*n, n the symbolic size (e.g. a position + 1)
  if c <= 0: return None
  n = build_linear(d, {t: a // c for t, a in dterms.items()}, dk // c)
  if n.vmin < 1: return None
  quot: dict[UOp, int] = {}
  mult: dict[UOp, int] = {}
  rest: dict[UOp, int] = {}
  terms, k = linear_terms(x)
  qk = mk = 0
  for t, a in terms.items():
    if (other := _without_factor(t, n)) is None:
      rest[t] = a
      continue
    oterms, ok = linear_terms(other)
    for s, f in oterms.items():
      if (a * f) % c == 0: quot[s] = quot.get(s, 0) + a * f // c
      else: mult[s] = mult.get(s, 0) + a * f
    if (a * ok) % c == 0: qk += a * ok // c
    else: mk += a * ok
  r, b = build_linear(x, rest, k), build_linear(x, mult, mk)
  if b.vmin < 0 or not _below(rest, k, b.vmax, n, c): return None
  if u.op is Ops.IDIV: return build_linear(x, quot, qk)
  return r if not mult and not mk else b.alu(Ops.MUL, n).alu(Ops.ADD, r)


def _without_factor(t: UOp, n: UOp) -> UOp | None:
  """t / n for a product t that has n (or a constant multiple of it) as a factor, else None."""
  if (m := _multiple_of(t, n)) is not None: return t.const_like(m)
  if t.op is not Ops.MUL: return None
  for i in (0, 1):
    if (inner := _without_factor(t.src[i], n)) is not None:
      return t.src[1 - i] if int_const(inner) == 1 else t.src[1 - i].alu(Ops.MUL, inner)
  return None


def _multiple_of(f: UOp, n: UOp) -> int | None:
  """m when f == m*n as linear forms (64*v+64 is 64 times v+1), else None."""
  if f is n: return 1
  if f.op is not Ops.ADD and f.op is not Ops.MUL: return None
  fterms, fk = linear_terms(f)
  nterms, nk = linear_terms(n)
  if fterms.keys() != nterms.keys() or not nterms: return None
  t0 = next(iter(nterms))
  m, rem = divmod(fterms[t0], nterms[t0])
  if rem or m == 0: return None
  return m if fk == m * nk and all(fterms[t] == m * a for t, a in nterms.items()) else None


def _below(rest: dict[UOp, int], k: int, bmax: int, n: UOp, c: int) -> bool:
  """Whether 0 <= n*b + sum(rest) + k < c*n for every value, with b <= bmax: the sum is bounded
  by alpha*n + beta, a range that ends at n counting as at most n-1."""
  alpha, beta, low = bmax, k, k
  for t, e in rest.items():
    if t.op is Ops.RANGE and t.src[0] is n and e > 0: alpha, beta = alpha + e, beta - e
    else: beta += max(e * t.vmin, e * t.vmax)
    low += min(e * t.vmin, e * t.vmax)
  if low < 0 or alpha > c: return False
  return beta <= -1 if alpha == c else (c - alpha) * n.vmin >= beta + 1


_pair = (UPat.var(), UPat.var())

pm_canonical = PatternMatcher([
  (UPat(Ops.ADD, _int, name="x"), canonical_sum),  # integer sums in linear normal form
  (UPat(Ops.MUL, _int, src=[UPat(Ops.ADD, name="x"), _c]), distribute_mul),  # (a+b)*c -> a*c+b*c
  (UPat(Ops.MUL, _int, src=(UPat(Ops.MUL, name="x"), _c)), distribute_mul),  # (a*c1)*c2 -> a*c3
  (UPat(GroupOp.Commutative - {Ops.ADD}, name="x", src=_pair), sort_commutative),  # y*x -> x*y
  (UPat(Ops.ADD, tuple(FLOATS), name="x", src=_pair), sort_commutative),  # y+x -> x+y (floats)
])

pm_divmod = PatternMatcher([
  (UPat(Ops.IDIV, _int, src=(UPat(Ops.IDIV, src=(_x, _a)), _b)), fold_nested_div),  # (x//a)//b
  (UPat(Ops.IDIV, _int, src=(UPat(Ops.MOD, src=(_x, _m)), _d)), fold_div_of_mod),  # (x%kc)//c
  (UPat(Ops.MOD, _int, src=(UPat(Ops.MOD, src=(_x, _m)), _d)), fold_mod_of_mod),  # (x%kc)%c -> x%c
  (UPat(Ops.IDIV, _int, src=(_x, _d)), fold_idiv),  # (x*c+y)//c -> x + y//c
  (UPat(Ops.MOD, _int, src=(_x, _d)), fold_mod),  # (x*c+y)%c -> y%c
  (UPat((Ops.IDIV, Ops.MOD), _int, name="u", src=(_x, _d)), fold_small_remainder),  # (4a+s)//8
  (UPat((Ops.IDIV, Ops.MOD), _int, name="u", src=(_x, _d)), fold_affine_divmod),  # (2t+2)%3 -> 2-t
  # (n*q+r)//n -> q for a symbolic n
  (UPat((Ops.IDIV, Ops.MOD), _int, name="u", src=(_x, UPat.var("d"))), fold_symbolic_divmod),
])

pm_compare = PatternMatcher([
  (UPat(Ops.CMPLT, src=(_xi, _d)), fold_cmplt),  # a*x+k < c -> x < ceil((c-k)/a)
])


def push_into_gate(alu: UOp, w: UOp, v: UOp, x: UOp) -> UOp:
  """op(where(v, x, Invalid), y) -> where(v, op(x, y), Invalid)"""
  inner = alu.replace(src=tuple(x if s is w else s for s in alu.src))
  return v.where(inner, inner.const_like(w.src[2].arg))


_gated = UPat(Ops.WHERE, name="w", src=(UPat.var("v"), _x, UPat(Ops.CONST, name="inv")))
_gated2 = UPat(Ops.WHERE, src=(UPat.var("w"), _x, UPat(Ops.CONST, name="inv2")))
_inv = UPat(Ops.CONST, name="inv")


def _push_checked(alu: UOp, w: UOp, v: UOp, x: UOp, inv: UOp) -> UOp | None:
  return push_into_gate(alu, w, v, x) if is_invalid(inv) and alu.op is not Ops.WHERE else None


def merge_nested_where(v: UOp, w: UOp, x: UOp, y: UOp, y2: UOp) -> UOp | None:
  """where(v, where(w, x, y), y) -> where(v & w, x, y)"""
  return (v & w).where(x, y) if y is y2 else None


def merge_gates(v: UOp, w: UOp, x: UOp, inv: UOp, inv2: UOp) -> UOp | None:
  """where(v, where(w, x, Invalid), Invalid) -> where(v & w, x, Invalid)"""
  if not (is_invalid(inv) and is_invalid(inv2)): return None
  return (v & w).where(x, inv)


pm_invalid = PatternMatcher([
  (UPat(GroupOp.Binary, name="alu", src=[_gated, UPat.var()]), _push_checked),  # op(gated,y) inside
  (UPat(Ops.WHERE, src=(UPat.var("v"), _gated2, _inv)), merge_gates),  # nested gates -> v&w gate
  (UPat(Ops.WHERE, src=(UPat.var("v"), UPat(Ops.WHERE, src=(UPat.var("w"), _x, _y)),
                        UPat.var("y2"))), merge_nested_where),  # where(v,where(w,x,y),y)
])

pm_simplify = (pm_fold_constants + pm_invalid + pm_identities + pm_min_max + pm_divmod +
               pm_compare + pm_canonical)


def simplify(u: UOp) -> UOp:
  """`u.simplify()`: defined in uop.py as a graph_rewrite with `pm_simplify`."""
  return u.simplify()


def sym_infer(u: UOp, values: dict[UOp, Any]) -> Any:
  """The value of `u` with the variables in `values` bound (evaluated, not simplified)."""
  out: dict[UOp, Any] = dict(values)
  for x in u.toposort(lambda n: n not in values):
    if x.op is Ops.CONST: out[x] = x.arg
    elif x.op is Ops.CAST: out[x] = exec_cast(out[x.src[0]], x.src[0].dtype, x.dtype)
    elif x.op is Ops.BITCAST: out[x] = exec_bitcast(out[x.src[0]], x.src[0].dtype, x.dtype)
    elif x.op in GroupOp.ALU: out[x] = exec_alu(x.op, x.dtype, tuple(out[s] for s in x.src))
    else: raise ValueError(f"sym_infer: unbound {x.op!r} node {x.render(simplify=False)}")
  return out[u]
