"""Validity-aware simplification: an index used only where its gate holds is simplified as if
the gate held.

A gate (`valid`) is a conjunction of clauses; a clause that compares an integer expression with a
constant (`x < c`, `!(x < c)`, `x == c`) bounds the expression, and, through it, each of its linear
terms. `uop_given_valid(valid, x)` replaces every bounded expression in x by a variable with the
tighter bounds, simplifies (so div/mod fold by the narrower ranges), and puts the expressions
back. `simplify_valid(valid)` simplifies each clause given the others (dropping implied and
repeated ones). `pm_simplify_valid` applies both to `WHERE(valid, idx, Invalid)` gates and to
WHERE conditions. The reference's names for the same ideas are `uop_given_valid` and
`simplify_valid`.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from unigrad.dtype import dtypes
from unigrad.uop.ops import Ops
from unigrad.uop.symbolic import (build_linear, int_const, is_int, is_invalid, linear_terms,
                                  no_overflow)
from unigrad.uop.upat import PatternMatcher, UPat

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

Interval = tuple[int, int]
MAX_VALID_CLAUSES = 16  # gates with more clauses are left as they are (each costs a simplify)


def _and_atoms(valid: UOp) -> list[UOp]:
  out, stack = [], [valid]
  while stack:
    u = stack.pop()
    if u.op is Ops.AND and u.dtype == dtypes.bool: stack.extend(reversed(u.src))
    else: out.append(u)
  return out


def valid_clauses(valid: UOp) -> list[UOp]:
  """The clauses of a conjunction `a & b & ...` (a bool AND tree), each once, in order."""
  return list(dict.fromkeys(_and_atoms(valid)))


def _is_true(u: UOp) -> bool: return u.op is Ops.CONST and u.arg is True


def clause_interval(clause: UOp) -> tuple[UOp, int | None, int | None] | None:
  """`x < c`, `!(x < c)` or `x == c` as (x, lo, hi): lo <= x <= hi (None: unbounded)."""
  negated = clause.op is Ops.CMPNE and _is_true(clause.src[1])
  cmp = clause.src[0] if negated else clause
  if cmp.op not in (Ops.CMPLT, Ops.CMPNE) or not is_int(cmp.src[0]): return None
  if (c := int_const(cmp.src[1])) is None: return None
  if cmp.op is Ops.CMPLT: return (cmp.src[0], c, None) if negated else (cmp.src[0], None, c - 1)
  return (cmp.src[0], c, c) if negated else None


def _narrow(bounds: dict[UOp, Interval], x: UOp, lo: int | None, hi: int | None) -> None:
  old = bounds.get(x, x.min_max)
  bounds[x] = (old[0] if lo is None else max(old[0], lo), old[1] if hi is None else min(old[1], hi))


def _term_interval(a: int, lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
  """The interval of t given lo <= a*t <= hi (a != 0)."""
  if a < 0: lo, hi, a = (None if hi is None else -hi), (None if lo is None else -lo), -a
  return (None if lo is None else -(-lo // a)), (None if hi is None else hi // a)


def clause_bounds(clause: UOp) -> dict[UOp, Interval]:
  """What one clause `lo <= sum(a*t) + k <= hi` says: the interval of the sum and of each term t
  (the other terms at their extremes). Cached per node."""
  if (got := clause.__dict__.get("_clause_bounds")) is not None: return got
  bounds: dict[UOp, Interval] = {}
  if (parsed := clause_interval(clause)) is not None:
    x, lo, hi = parsed
    terms, k = linear_terms(x)
    if terms and no_overflow(x):
      lo, hi = (None if lo is None else lo - k), (None if hi is None else hi - k)
      if len(terms) > 1: _narrow(bounds, build_linear(x, terms, 0), lo, hi)
      for t, a in terms.items():
        rest = [(b * s.vmin, b * s.vmax) for s, b in terms.items() if s is not t]
        rlo, rhi = sum(min(p) for p in rest), sum(max(p) for p in rest)
        _narrow(bounds, t, *_term_interval(a, None if lo is None else lo - rhi,
                                           None if hi is None else hi - rlo))
  clause.__dict__["_clause_bounds"] = bounds
  return bounds


def valid_bounds(valid: UOp) -> dict[UOp, Interval] | None:
  """What the clauses of `valid` say about integer expressions (see clause_bounds), only the
  intervals narrower than the expressions' own; None when the clauses contradict each other."""
  bounds: dict[UOp, Interval] = {}
  for clause in valid_clauses(valid):
    for x, (lo, hi) in clause_bounds(clause).items(): _narrow(bounds, x, lo, hi)
  if any(lo > hi for lo, hi in bounds.values()): return None
  return {x: b for x, b in bounds.items() if b != x.min_max}


def uop_given_valid(valid: UOp, x: UOp) -> UOp | None:
  """`x` simplified for the values where `valid` holds: each expression a clause bounds is
  replaced by a variable with those bounds, the result simplified, the expressions put back.
  None when the clauses contradict each other (then x is never used)."""
  if (bounds := valid_bounds(valid)) is None: return None
  present = set(x.toposort())
  subs = {e: e.const_like(lo) if lo == hi else type(x).variable(f"__valid{i}", lo, hi, e.dtype)
          for i, (e, (lo, hi)) in enumerate(bounds.items()) if e in present}
  if not subs: return x
  back = {v: e for e, v in subs.items() if v.op is Ops.PARAM}  # constants stay constants
  return x.substitute({**reads_kept(present, subs), **subs}).simplify().substitute(back)


def reads_kept(nodes: set[UOp], subs: dict[UOp, UOp]) -> dict[UOp, UOp]:
  """Each memory read (INDEX) among `nodes` mapped to itself, so a substitution leaves its
  index alone. A read is done wherever its value is computed, and the operands of an AND or a
  WHERE are all computed, also where the gate that the simplification assumes fails: the read's
  own gate (its `where(v, i, Invalid)` index) is what keeps it inside its buffer there."""
  return {u: u for u in nodes if u.op is Ops.INDEX and u not in subs}


def _all_of(clauses: list[UOp]) -> UOp: return functools.reduce(lambda a, b: a & b, clauses)


def _divmod_count(u: UOp) -> tuple[int, int]:
  nodes = u.toposort()
  return sum(1 for n in nodes if n.op in (Ops.IDIV, Ops.MOD)), len(nodes)


def simplify_valid(valid: UOp) -> UOp | None:
  """`valid` with each clause simplified given the others: repeated and implied clauses dropped,
  a clause kept in a simpler form when that removes a div/mod or nodes; False when the clauses
  contradict each other; None when nothing changes. Cached per node."""
  if "_simplified_valid" not in valid.__dict__:
    valid.__dict__["_simplified_valid"] = _simplify_valid(valid)
  return valid.__dict__["_simplified_valid"]


def _simplify_valid(valid: UOp) -> UOp | None:
  atoms = _and_atoms(valid)
  clauses = list(dict.fromkeys(atoms))
  if len(clauses) > MAX_VALID_CLAUSES: return None
  keep: list[UOp] = []
  for i, c in enumerate(clauses):
    others = keep + clauses[i + 1:]
    given = uop_given_valid(_all_of(others), c) if others and _is_bounded(c) else c
    if given is None or (given.op is Ops.CONST and given.arg is False): return c.const_like(False)
    if _is_true(given): continue
    keep.append(given if _divmod_count(given) < _divmod_count(c) else c)
  if len(keep) == len(atoms) and all(a is b for a, b in zip(keep, atoms)): return None
  return _all_of(keep) if keep else valid.const_like(True)


def _is_bounded(clause: UOp) -> bool:
  """True when the clause could be implied by bounds (it compares an integer with a constant)."""
  return clause_interval(clause) is not None


def simplify_gated(w: UOp, v: UOp, x: UOp, inv: UOp) -> UOp | None:
  """where(v, x, Invalid): x simplified given v, when that removes a div/mod or nodes; v without
  its redundant clauses. Cached per node."""
  if not is_invalid(inv) or not is_int(x): return None
  if "_given_valid" not in w.__dict__: w.__dict__["_given_valid"] = _simplify_gated(v, x, inv)
  return w.__dict__["_given_valid"]


def _simplify_gated(v: UOp, x: UOp, inv: UOp) -> UOp | None:
  nv = simplify_valid(v)
  if nv is not None and nv.op is Ops.CONST: return x if nv.arg else inv
  nv = v if nv is None else nv
  if (bounds := valid_bounds(nv)) is None: return inv
  nodes = set(x.toposort())
  nx = x
  if any(n.op in (Ops.IDIV, Ops.MOD) for n in nodes) or any(
      lo == hi and e in nodes for e, (lo, hi) in bounds.items()):  # else nothing can fold
    given = uop_given_valid(nv, x)
    if given is not None and _divmod_count(given) < _divmod_count(x): nx = given
  return None if nx is x and nv is v else nv.where(nx, inv)


def drop_implied_clauses(v: UOp, a: UOp, b: UOp) -> UOp | None:
  """where(c1 & c2 & ..., a, b) without the clauses the others imply."""
  if is_invalid(b): return None  # the gated form: simplify_gated's
  nv = simplify_valid(v)
  return None if nv is None else nv.where(a, b)


pm_simplify_valid = PatternMatcher([
  (UPat(Ops.WHERE, name="w", src=(UPat.var("v"), UPat.var("x"), UPat(Ops.CONST, name="inv"))),
   simplify_gated),  # where(v, x, Invalid): x given v
  (UPat(Ops.WHERE, src=(UPat(Ops.AND, name="v"), UPat.var("a"), UPat.var("b"))),
   drop_implied_clauses),  # a&b, b=>a -> b
])
