"""Scatter: a kernel that stores a one-hot reduction over one of its output positions becomes a
fill and a loop of direct stores (part of rangeify).

Consumes: a kernel from rangeify, `SINK(END(STORE(INDEX(PARAM, addr), REDUCE(body, *rs))))` over
output ranges, whose body is the spec's one-hot, `WHERE(k == idx(rs), v(rs), identity)` for an
output range k (scatter, scatter_add, scatter_reduce, the gradient of a gather).
Produces: two kernels, `SINK(END(STORE(INDEX(PARAM, addr), identity), outputs))` (the fill) and
`SINK(END(STORE(out, op(out, v)), rs and the other outputs))` with
`out = INDEX(PARAM, WHERE(0 <= idx < K, addr[k := idx], Invalid))`: a gated read-modify-write of
the selected output (the scatter), O(N) instead of O(N*K).
Invariants: the scatter runs after the fill, as one sequential loop in the reduce's order (its
SINK says so, `KernelInfo(opts_to_apply=(), parallel=False)`: no optimization, so no THREAD or
vector split can race on repeated indices, and no GPU thread index either); the
result is the sequential reduction's, bit for bit: the terms skipped are the identity (for MAX,
a constant below every term).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from unigrad.codegen.expand import identity_element
from unigrad.codegen.simplify import conjuncts, pm_kernel_simplify, solve_equality
from unigrad.dtype import dtypes
from unigrad.uop import AxisType, Invalid, KernelInfo, Ops, UOp, graph_rewrite


@dataclass(frozen=True)
class ScatterPlan:
  """A one-hot REDUCE computed by direct stores: every output starts at `fill`; then, for each
  point of `loops` (the source elements), the output at the store address with `solved` applied
  (each solved output range replaced by the position the one-hot selects) becomes
  `op(output, value)`, where `gate` holds (the position is in bounds, other conditions hold)."""
  op: Ops
  fill: UOp
  value: UOp
  solved: dict[UOp, UOp]
  gate: UOp
  loops: tuple[UOp, ...]


def _one_hot_forms(body: UOp) -> list[tuple[UOp, UOp, UOp]]:
  """(condition, value, otherwise) readings of a reduce's body: WHERE either way round, a bool
  cast (c ? 1 : 0), and an integer times a bool cast (exact for integers; a float times 0 is not
  0 when it is inf or nan, so that form stays a reduce)."""
  dt = body.dtype
  if body.op is Ops.WHERE:
    c, a, b = body.src
    return [(c, a, b), (c.logical_not(), b, a)]
  if body.op is Ops.CAST and body.src[0].dtype == dtypes.bool:
    return [(body.src[0], UOp.const(dt, 1), UOp.const(dt, 0))]
  if body.op is not Ops.MUL or not dtypes.is_int(dt): return []
  return [(m.src[0], v, UOp.const(dt, 0)) for m, v in (body.src, body.src[::-1])
          if m.op is Ops.CAST and m.src[0].dtype == dtypes.bool]


def _start_value(op: Ops, otherwise: UOp, value: UOp) -> UOp | None:
  """What every output starts at: the identity when unselected terms are the identity; for MAX
  also a constant no larger than any selected value can be (max(c, max v) = max v)."""
  if otherwise.op is not Ops.CONST: return None
  ident = identity_element(op, otherwise.dtype)
  if otherwise.arg == ident: return UOp.const(otherwise.dtype, ident)
  if op is Ops.MAX and value.vmin >= otherwise.arg: return otherwise
  return None


def _pinned(atoms: list[UOp], live: list[UOp]) -> tuple[int, UOp, UOp] | None:
  """The first condition `r == e` that pins a live range r: (its position, r, e)."""
  for i, atom in enumerate(atoms):
    for r in live:
      e = solve_equality(atom, r)
      if e is not None: return i, r, e.cast(dtypes.index)
  return None


def _solve(atoms: list[UOp],
           live: list[UOp]) -> tuple[dict[UOp, UOp], list[UOp], list[UOp]]:
  """Eliminate the ranges the conditions pin (r == e -> r := e, with 0 <= e < n added to the
  conditions): (solved ranges, the conditions left, the ranges left)."""
  solved: dict[UOp, UOp] = {}
  while (pin := _pinned(atoms, live)) is not None:
    i, r, e = pin
    sub = {r: e}
    in_bounds = (e < 0).logical_not() & (e < r.src[0])
    atoms = [a.substitute(sub) for a in atoms[:i] + atoms[i + 1:]] + [in_bounds]
    solved = {k: v.substitute(sub) for k, v in solved.items()} | sub
    live = [x for x in live if x is not r]
  return solved, atoms, live


def scatter_plan(red: UOp, out_rngs: tuple[UOp, ...]) -> ScatterPlan | None:
  """How to compute a (simplified) REDUCE stored over `out_rngs` by direct stores, or None.

  It qualifies when its body selects, for each output, the terms whose index equals the output's
  position along an output range: `sum_n WHERE(k == idx[n], v[n], 0)` is `out[idx[n]] += v[n]`
  over n, with k solved instead of looped over: O(N) plus the fill, not O(N*K). The terms left
  out must be the identity (any constant below every value for MAX), so skipping them is exact."""
  if red.op is not Ops.REDUCE: return None
  live = [r for r in out_rngs if r.op is Ops.RANGE]
  for cond, value, otherwise in _one_hot_forms(red.src[0]):
    fill = _start_value(red.arg.op, otherwise, value)
    if fill is None: continue
    solved, atoms, left = _solve(conjuncts(cond), live)
    if not solved: continue
    gate = atoms[0]
    for a in atoms[1:]: gate = gate & a
    loops = (*left, *red.src[1:])
    return ScatterPlan(red.arg.op, fill, value.substitute(solved), solved, gate, loops)
  return None


def _loop(st: UOp, rngs: tuple[UOp, ...]) -> UOp:
  """`st` inside loops over `rngs` (the first outermost)."""
  for r in reversed(rngs): st = UOp(Ops.END, dtypes.void, (st, r))
  return st


def _is_position(x: UOp, outs: Collection[UOp]) -> bool:
  """x is computed from output ranges only, reading no memory (an arange along one)."""
  rs = x.ranges
  if not rs or not all(r in outs for r in rs): return False
  return not x.op_in_backward_slice_with_self(Ops.INDEX)


def compares_position(red: UOp, outs: Collection[UOp]) -> bool:
  """A cheap test, before simplifying, that a REDUCE may be a one-hot that pins an output range:
  it compares a position along output ranges with something that varies over its own ranges."""
  if red.op is not Ops.REDUCE: return False
  own = set(red.src[1:])
  for u in red.src[0].toposort():
    if u.op is not Ops.CMPNE: continue
    for a, b in (u.src, u.src[::-1]):
      if _is_position(a, outs) and any(r in own for r in b.ranges): return True
  return False


def _scatter_store(ast: UOp) -> UOp | None:
  """The kernel's single STORE when it stores a REDUCE that may be a one-hot."""
  stores = [u for u in ast.toposort() if u.op is Ops.STORE]
  if len(stores) != 1 or len(stores[0].src) != 2: return None
  target, value = stores[0].src
  if target.op is not Ops.INDEX or len(target.src) != 2 or value.op is not Ops.REDUCE: return None
  return stores[0] if compares_position(value, target.ranges) else None


def scatter_kernels(ast: UOp) -> tuple[UOp, UOp] | None:
  """A kernel storing a one-hot REDUCE (scatter_plan) -> (fill kernel, scatter kernel), or None.

  The fill writes every output's start value. The scatter loops over the source elements only
  and read-modify-writes the output each selects, `out[idx] = op(out[idx], v)`, gated by bounds.
  Its iterations run in order, so repeated indices combine deterministically and in the order
  the reduce would have used; its SINK asks for no optimizations (opts_to_apply=()) and says
  its iterations run in order (parallel=False), because a THREAD split or GPU threads would race
  on repeated indices and a vector (UPCAST) split would lose updates."""
  if _scatter_store(ast) is None: return None
  st = _scatter_store(graph_rewrite(ast, pm_kernel_simplify, name="scatter simplify"))
  if st is None: return None
  target, red = st.src
  buf, addr = target.src
  if any(u.op is Ops.INDEX and u.src[0] is buf for u in red.toposort()): return None  # own output
  out_rngs = tuple(sorted(addr.ranges, key=lambda r: r.arg.id))
  plan = scatter_plan(red, out_rngs)
  if plan is None: return None
  gated = plan.gate.where(addr.substitute(plan.solved), UOp.const(dtypes.index, Invalid))
  out = target.replace(src=(buf, gated))
  rmw = UOp(Ops.STORE, dtypes.void, (out, UOp(plan.op, red.dtype, (out, plan.value))))
  if any(r not in rmw.toposort() for r in plan.loops): return None  # a loop the store ignores
  loops = {r: UOp.range(r.src[0], r.arg.id, AxisType.LOOP) for r in plan.loops}
  scatter = _loop(rmw.substitute(loops), tuple(loops.values()))
  fill = _loop(st.replace(src=(target, plan.fill)), out_rngs)
  in_order = KernelInfo(opts_to_apply=(), parallel=False)
  return UOp(Ops.SINK, dtypes.void, (fill,)), UOp(Ops.SINK, dtypes.void, (scatter,), in_order)
