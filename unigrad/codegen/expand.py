"""Expand: UPCAST/UNROLL ranges are unrolled, reductions become register accumulators, and
THREAD ranges become the launch's core id.

Consumes: an optimized kernel AST (typed RANGEs, `REDUCE(value, *ranges)` nodes).
Produces: a kernel without UPCAST/UNROLL ranges (their iterations side by side: a register tile),
with one loop per remaining range, where each REDUCE is an accumulator: a REG BUFFER initialised
with the op's identity inside the enclosing loops, updated `acc = acc op value` inside the reduce
loops, and read after the loops close:
  acc0 = AFTER(BUFFER(REG), *outer_ranges); init = STORE(INDEX(acc0, 0), identity)
  upd  = STORE(INDEX(AFTER(acc, init, *rngs), 0), INDEX(AFTER(acc, init, *rngs), 0) op value)
  REDUCE(...) -> INDEX(AFTER(acc, END(upd, *rngs)), 0)
Invariants: no REDUCE remains; every accumulator read inside a loop depends on that loop's range.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.codegen.vectorize import depends_on, kernel_vector_range, lane_bytes, with_vector
from unigrad.uop.rewrite import rebuild, substitute_each
from unigrad.uop import AxisType, KernelInfo, Ops, ParamArg, PatternMatcher, UOp, UPat
from unigrad.uop import graph_rewrite, shape_uop

ACC_SLOTS_START = 1 << 20  # accumulator BUFFER slots, apart from the kernel's PARAM slots
UNROLLED = (AxisType.UPCAST, AxisType.UNROLL, AxisType.GROUP_REDUCE)  # become side-by-side values


def identity_element(op: Ops, dt: DType) -> float | int | bool:
  """The value a reduction starts from: 0 for ADD, 1 for MUL, the dtype's minimum for MAX."""
  if op is Ops.ADD: return False if dt == dtypes.bool else 0
  if op is Ops.MUL: return True if dt == dtypes.bool else 1
  return dt.min


@dataclass
class ExpandCtx:
  keep: UOp | None = None  # the range left for the vectorize stage
  slots: itertools.count = field(default_factory=lambda: itertools.count(ACC_SLOTS_START))


def _index0(buf: UOp) -> UOp: return UOp(Ops.INDEX, buf.dtype, (buf, UOp.const(dtypes.index, 0)))


def lower_reduce(ctx: ExpandCtx, red: UOp) -> UOp:
  """REDUCE(value, *rngs) -> an accumulator loop (see the module docstring)."""
  value, rngs, op, dt = red.src[0], red.src[1:], red.arg.op, red.dtype
  acc = UOp(Ops.BUFFER, dt, (shape_uop((1,)),), ParamArg(next(ctx.slots), dt, None, AddrSpace.REG))
  outer = tuple(red.ranges)
  scoped = UOp(Ops.AFTER, dt, (acc, *outer)) if outer else acc
  init = UOp(Ops.STORE, dtypes.void, (_index0(scoped), UOp.const(dt, identity_element(op, dt))))
  inside = _index0(UOp(Ops.AFTER, dt, (acc, init, *rngs)))
  upd = UOp(Ops.STORE, dtypes.void, (inside, inside.alu(op, value)))
  for r in reversed(rngs): upd = UOp(Ops.END, dtypes.void, (upd, r))
  if not rngs: upd = UOp(Ops.GROUP, dtypes.void, (upd,))
  return _index0(UOp(Ops.AFTER, dt, (acc, upd)))


def split_vector_reduce(ctx: ExpandCtx, red: UOp) -> UOp | None:
  """A REDUCE over the kept vector range: per-lane accumulators, their lanes combined after."""
  if ctx.keep is None or ctx.keep not in red.src[1:]: return None
  return split_lane_reduce(red, ctx.keep)


def invariant_reduce(red: UOp) -> UOp | None:
  """A REDUCE over ranges its value does not depend on drops them: a sum multiplies by their
  sizes, a max is the value. After unrolling, the prefix sum of an arange whose index
  became a constant (a nibble's shift) sums a constant 1: a loop per use, and a shift whose
  amount is no constant renders one scalar guarded shift per lane."""
  if red.arg.op not in (Ops.ADD, Ops.MAX): return None
  value, rngs = red.src[0], red.src[1:]
  free = [r for r in rngs if r.op is Ops.RANGE and r not in value.toposort()]
  # (a max over a range that may be empty is the identity, not the value)
  if red.arg.op is not Ops.ADD: free = [r for r in free if r.src[0].vmin > 0]
  if not free: return None
  if red.arg.op is Ops.ADD:
    for r in free: value = value * r.src[0].cast(value.dtype)
  kept = tuple(r for r in rngs if not any(r is f for f in free))
  return red.replace(src=(value, *kept)) if kept else value


pm_expand_reduce = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), invariant_reduce),  # a value free of the ranges: no loop
  (UPat(Ops.REDUCE, name="red"), split_vector_reduce),  # REDUCE over lanes -> per-lane REDUCE
  (UPat(Ops.REDUCE, name="red"), lower_reduce),  # REDUCE -> accumulator loop
])


# ---- UPCAST / UNROLL ranges are unrolled; THREAD ranges become the core id ----

def _unroll_one(ast: UOp, r: UOp) -> UOp:
  """Replace loop `r` by its iterations side by side: END(x, r) becomes a GROUP of x for each
  value of r, and a REDUCE over r combines the values of its body for each value of r."""
  k = r.src[0].arg
  lanes = [UOp.const(r.dtype, i) for i in range(k)]
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():
    if u.op is Ops.END and u.src[1] is r:
      memo[u] = UOp(Ops.GROUP, dtypes.void, tuple(substitute_each(memo[u.src[0]], r, lanes)))
      continue
    if u.op is Ops.REDUCE and r in u.src[1:]:
      body, rest = memo[u.src[0]], tuple(s for s in u.src[1:] if s is not r)
      vals = substitute_each(body, r, lanes)
      is_group = r.arg.axis_type is AxisType.GROUP_REDUCE
      if is_group and rest:  # k partial accumulators, combined after
        vals = [u.replace(src=(v, *rest)) for v in vals]
      acc = vals[0]
      for v in vals[1:]: acc = acc.alu(u.arg.op, v)
      memo[u] = u.replace(src=(acc, *rest)) if rest and not is_group else acc
      continue
    new_src = tuple([memo[s] for s in u.src])
    memo[u] = rebuild(u, new_src)
  return memo[ast]


def unroll_ranges(ast: UOp, keep: UOp | None = None) -> UOp:
  """Unroll every UPCAST, UNROLL and GROUP_REDUCE range but `keep` (innermost first). On the CPU
  a GROUP_REDUCE axis means k partial accumulators, combined after their loop."""
  targets = [u for u in ast.toposort()
             if u.op is Ops.RANGE and u.arg.axis_type in UNROLLED and u is not keep]
  for r in sorted(targets, key=lambda x: -x.arg.id): ast = _unroll_one(ast, r)
  return ast


def split_lane_reduce(red: UOp, r: UOp) -> UOp:
  """A REDUCE over vector range r (and others): a per-lane REDUCE over the others (a vector
  accumulator once vectorized), then its lanes combined: GEP(x, 0) op GEP(x, 1) op ..."""
  rest = tuple(s for s in red.src[1:] if s is not r)
  per_lane = red.replace(src=(red.src[0], *rest)) if rest else red.src[0]
  lanes = [UOp(Ops.GEP, red.dtype, (per_lane, r), (i,)) for i in range(r.src[0].arg)]
  while len(lanes) > 1:  # a balanced tree: log2(k) dependent ops
    pairs = zip(lanes[0::2], lanes[1::2])
    lanes = [a.alu(red.arg.op, b) for a, b in pairs] + lanes[len(lanes) & ~1:]
  return lanes[0]


def thread_to_core_id(ast: UOp) -> UOp:
  """A THREAD range is the launch's chunk index: SPECIAL("core_id"), with no loop."""
  threads = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg.axis_type is AxisType.THREAD]
  for r in threads:
    special = UOp(Ops.SPECIAL, r.dtype, r.src, "core_id")
    memo: dict[UOp, UOp] = {}
    for u in ast.toposort():
      if u is r: memo[u] = special
      elif u.op is Ops.END and u.src[1] is r: memo[u] = memo[u.src[0]]
      else:
        new_src = tuple([memo[s] for s in u.src])
        memo[u] = rebuild(u, new_src)
    ast = memo[ast]
  return ast


def merge_ends(ast: UOp) -> UOp:
  """Loops closed by several ENDs (accumulators of unrolled reductions) become one loop whose END
  closes all their bodies; nested loops are merged the same way, innermost first."""
  bodies: dict[UOp, list[UOp]] = {}
  for u in ast.toposort():
    if u.op is Ops.END: bodies.setdefault(u.src[1], []).append(u.src[0])
  shared = {r for r, b in bodies.items() if len(b) > 1}
  if not shared: return ast
  memo: dict[UOp, UOp] = {}
  merged: dict[UOp, UOp] = {}

  def build(root: UOp) -> UOp:
    for x in root.toposort(lambda n: n not in memo):
      if x in memo: continue
      if x.op is Ops.END and x.src[1] in shared:
        r = x.src[1]
        if r not in merged:
          body = tuple(dict.fromkeys(build(b) for b in bodies[r]))
          merged[r] = UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, body), r))
        memo[x] = merged[r]
        continue
      new_src = tuple([memo[s] for s in x.src])
      memo[x] = rebuild(x, new_src)
    return memo[root]
  return build(ast)


def split_range(ast: UOp, r: UOp, inner_size: int) -> tuple[UOp, UOp]:
  """Range r (size n) as two of its axis type: an outer one of n/inner_size (r's id) and an inner
  one of inner_size (a new id); returns the kernel and the inner range."""
  n, axis_type = r.src[0].arg, r.arg.axis_type
  new_id = max(u.arg.id for u in ast.toposort() if u.op is Ops.RANGE) + 1
  outer = UOp.range(n // inner_size, r.arg.id, axis_type)
  inner = UOp.range(inner_size, new_id, axis_type)
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():
    if u is r: memo[u] = outer * inner_size + inner
    elif u.op is Ops.END and u.src[1] is r:
      inner_end = UOp(Ops.END, dtypes.void, (memo[u.src[0]], inner))
      memo[u] = UOp(Ops.END, dtypes.void, (inner_end, outer))
    elif u.op is Ops.REDUCE and r in u.src[1:]:
      rs = tuple(p for s in u.src[1:] for p in ((outer, inner) if s is r else (s,)))
      memo[u] = u.replace(src=(memo[u.src[0]], *rs))
    else:
      new_src = tuple([memo[s] for s in u.src])
      memo[u] = rebuild(u, new_src)
  return memo[ast], inner


def split_to_registers(ast: UOp, r: UOp, vector_bytes: int) -> tuple[UOp, UOp]:
  """A vector range wider than one register, even for its narrowest values, becomes one
  register's lanes (kept as the vector) inside an unrolled range over the registers: gcc 12
  keeps a C vector wider than a register in memory and runs a lane builtin (the fma helper's
  loop) lane by lane (a 32-lane float matmul tile: scalar vfmadd231ss). Wider values beside
  narrower ones (threefry's uint64 next to the floats it makes) stay as they are."""
  k, width = r.src[0].arg, lane_bytes(depends_on(ast, r))[0]
  lanes = vector_bytes // width if width else k
  if lanes < 2 or k <= lanes or k % lanes: return ast, r
  return split_range(ast, r, lanes)


def expand(ast: UOp, vector_bytes: int = 0) -> UOp:
  """The expand stage: keep the kernel's vector range (the one its KernelInfo records, see
  codegen/vectorize.py's kernel_vector_range; targets with vectors of `vector_bytes`), unroll the
  other UPCAST/UNROLL ranges, lower reductions, bind THREAD ranges; the range kept (one register
  of it, split_to_registers) is recorded for vectorize."""
  ast = thread_to_core_id(ast)  # first: the graph is smallest before unrolling
  keep = kernel_vector_range(ast, vector_bytes)
  if keep is not None: ast, keep = split_to_registers(ast, keep, vector_bytes)
  ast = unroll_ranges(ast, keep)
  # reductions over the kept range become per-lane ones as they are lowered (one rebuild)
  ast = graph_rewrite(ast, pm_expand_reduce, ctx=ExpandCtx(keep), name="expand reduce")
  ast = merge_ends(ast)
  return with_vector(ast, keep) if isinstance(ast.arg, KernelInfo) else ast
