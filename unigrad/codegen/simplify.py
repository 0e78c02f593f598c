"""Kernel-level simplification: the symbolic rules plus reduce collapse.

Consumes: a kernel AST from rangeify. Produces: the same kernel with index arithmetic simplified
and reductions with a closed form removed: a sum over a range r of `WHERE(lo <= r < hi, v, 0)`,
with v independent of r, is `clamp(min(hi, n) - max(lo, 0), 0) * v`. This turns the spec's
prefix-sum `arange` into the index itself instead of an O(n^2) reduction.
"""
from __future__ import annotations

from unigrad.dtype import DType, dtypes
from unigrad.uop import Invalid, Ops, PatternMatcher, UOp, UPat, pm_simplify
from unigrad.uop.symbolic import build_linear, linear_terms, no_overflow
from unigrad.uop.validity import pm_simplify_valid

Bound = tuple[UOp | None, UOp | None]  # (lowest allowed r, first disallowed r)


def conjuncts(cond: UOp) -> list[UOp]:
  """The terms of an AND chain of bool conditions."""
  if cond.op is Ops.AND and cond.dtype == dtypes.bool:
    return conjuncts(cond.src[0]) + conjuncts(cond.src[1])
  return [cond]


def _fits(x: UOp, dt: DType) -> bool:
  return dtypes.is_int(x.dtype) and dt.min <= x.vmin and x.vmax <= dt.max


def _split(lin: UOp, r: UOp) -> tuple[int, UOp] | None:
  """lin as coeff*r + rest, with coeff +-1 and rest free of r (a lossless cast of r counts as r)."""
  terms, const = linear_terms(lin)
  for t in [t for t in terms if t.op is Ops.CAST and t.src[0] is r and _fits(r, t.dtype)]:
    terms[r] = terms.get(r, 0) + terms.pop(t)
  coeff = terms.pop(r, 0)
  if coeff not in (1, -1) or any(r in t.toposort() for t in terms): return None
  return coeff, build_linear(lin, terms, const)


def _atom_bound(atom: UOp, r: UOp) -> Bound | None:
  """The bound one comparison puts on r, or None if it is not linear in r."""
  negate = atom.op is Ops.CMPNE and atom.src[1].op is Ops.CONST and atom.src[1].arg is True
  cmp = atom.src[0] if negate else atom
  if cmp.op is not Ops.CMPLT: return None
  a, b = cmp.src
  side = _split(a, r) if r in a.toposort() else None
  if side is None or r in b.toposort(): return None
  coeff, rest = side
  k = b - rest  # coeff*r < k
  if coeff == 1: return (k, None) if negate else (None, k)  # r >= k  |  r < k
  return (None, 1 - k) if negate else (1 - k, None)  # -r >= k -> r < 1-k  |  -r < k -> r >= 1-k


def solve_equality(atom: UOp, r: UOp) -> UOp | None:
  """For `r + rest == e` (NOT(r+rest != e)) the value of r it selects, e - rest."""
  negated = atom.op is Ops.CMPNE and atom.src[1].op is Ops.CONST and atom.src[1].arg is True
  if not negated: return None
  ne = atom.src[0]
  if ne.op is not Ops.CMPNE: return None
  for a, b in (ne.src, ne.src[::-1]):
    if r not in a.toposort() or r in b.toposort(): continue
    side = _split(a, r)
    if side is not None and side[0] == 1: return b - side[1]
  return None


def _gate_loads(v: UOp, e: UOp, valid: UOp) -> UOp:
  """Loads whose address uses `e` read only where `valid` holds (the value is gated anyway)."""
  invalid = UOp.const(dtypes.index, Invalid)
  sub = {u: u.replace(src=(u.src[0], valid.where(u.src[1], invalid), *u.src[2:]))
         for u in v.toposort() if u.op is Ops.INDEX and len(u.src) > 1 and e in u.src[1].toposort()}
  return v.substitute(sub) if sub else v


def collapse_gather(r: UOp, cond: UOp, v: UOp) -> UOp | None:
  """sum_r WHERE(r == e, v(r), 0) -> v(e) where 0 <= e < n, else 0: a one-hot reduce is a
  direct (bounds-gated) indexed load."""
  atoms = conjuncts(cond)
  for i, atom in enumerate(atoms):
    e = solve_equality(atom, r)
    if e is None: continue
    rest = atoms[:i] + atoms[i + 1:]
    if any(r in a.toposort() for a in rest): return None
    e = e.cast(dtypes.index)
    valid = (e < 0).logical_not() & (e < r.src[0])
    out = _gate_loads(v.substitute({r: e}), e, valid)
    for a in (valid, *rest): out = a.where(out, UOp.const(out.dtype, 0))
    return out
  return None


def _is_zero(u: UOp) -> bool:
  return u.op is Ops.CONST and u.arg == 0 and not isinstance(u.arg, bool)


def _masked_value(w: UOp) -> tuple[UOp | None, UOp]:
  """WHERE(c, v, 0) -> (c, v); WHERE(c, 0, v) -> (not c, v)."""
  c, a, b = w.src
  if _is_zero(b): return c, a
  if _is_zero(a): return c.logical_not(), b
  return None, a


def collapse_reduce(red: UOp) -> UOp | None:
  """sum_r WHERE(lo <= r < hi, v, 0) -> clamp(min(hi,n) - max(lo,0), 0) * v, and the one-hot
  gather form (see collapse_gather)."""
  if red.arg.op is not Ops.ADD or len(red.src) != 2 or red.src[1].op is not Ops.RANGE: return None
  val, r = red.src
  if val.op is not Ops.WHERE: return None
  cond, v = _masked_value(val)
  if cond is None: return None
  if r in v.toposort() or any(solve_equality(a, r) is not None for a in conjuncts(cond)):
    return collapse_gather(r, cond, v)
  n = r.src[0]
  lo, hi = UOp.const(dtypes.index, 0), n
  rest: list[UOp] = []
  for atom in conjuncts(cond):
    if r not in atom.toposort():
      rest.append(atom)
      continue
    b = _atom_bound(atom, r)
    if b is None: return None
    if b[0] is not None: lo = lo.maximum(b[0])
    if b[1] is not None: hi = hi.minimum(b[1])
  count = (hi - lo).maximum(0)
  out = count.cast(v.dtype) * v if v.dtype != dtypes.index else count * v
  for atom in rest: out = atom.where(out, UOp.const(out.dtype, 0))
  return out


def drop_const_ranges(x: UOp) -> UOp | None:
  """REDUCE/END over ranges that became constants (size 1) drop them; no range left -> the value."""
  keep = tuple(r for r in x.src[1:] if r.op is Ops.RANGE)
  if len(keep) == len(x.src) - 1: return None
  return x.replace(src=(x.src[0], *keep)) if keep else x.src[0]


pm_reduce_collapse = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), collapse_reduce),  # closed-form sums over a range
])

def distribute_cast(c: UOp, x: UOp) -> UOp | None:
  """(int)(a + b) -> (int)a + (int)b and (int)(a * b) likewise, when nothing can overflow: neither
  in x's own dtype (a uint8 200+100 wraps to 44 before a widening cast) nor in c's."""
  if not (dtypes.is_int(c.dtype) and dtypes.is_int(x.dtype)) or not no_overflow(x): return None
  if not all(_fits(u, c.dtype) for u in (x, *x.src)): return None
  return x.replace(dtype=c.dtype, src=tuple(s.cast(c.dtype) for s in x.src))


pm_kernel_simplify = pm_simplify + pm_simplify_valid + pm_reduce_collapse + PatternMatcher([
  # cast(a+b) -> cast(a)+cast(b)
  (UPat(Ops.CAST, name="c", src=(UPat((Ops.ADD, Ops.MUL), name="x"),)), distribute_cast),
  # range(1) -> 0
  (UPat(Ops.RANGE, src=(UPat.const(None, 1),)), lambda: UOp.const(dtypes.index, 0)),
  (UPat((Ops.REDUCE, Ops.END), name="x"), drop_const_ranges),  # loops over folded ranges vanish
])
