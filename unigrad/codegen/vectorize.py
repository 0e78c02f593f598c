"""Vectorize: the vector range that expand kept becomes vector values, one lane per iteration.

Consumes: a lowered kernel (loads, gates and integer index types committed) in which at most one
UPCAST/UNROLL/GROUP_REDUCE range is left: the one its KernelInfo records as the vector (chosen
once, by `choose_vector_range`: by the heuristics' tile when optimize picks the kernel's opts,
else by expand; expand kept it and recorded the range it became); reductions over it were
already split into per-lane accumulators read lane by lane with GEP(x, range).
Produces: a kernel without that range. Every node that depends on it gets the `k`-lane vector of
its dtype; values that do not are broadcast (a STACK of k copies) where a vector needs them;
  * a load or store whose address is `base + lane` (unit stride) is one vector access at `base`
    (the LOAD/STORE value is the vector; the INDEX stays scalar);
  * any other access (strided, or gated per lane) is k scalar accesses, one per lane;
  * an accumulator register whose scope depends on the range holds a vector;
  * GEP(x, i) reads lane i of the vector that x became.
Invariants: no node keeps the range; the result computes exactly what the loop over it did.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.uop import AxisType, GroupOp, KernelInfo, Ops, ParamArg, UOp
from unigrad.uop.rewrite import rebuild
from unigrad.uop.symbolic import is_invalid, linear_terms

VECTOR_AXES = (AxisType.UPCAST, AxisType.UNROLL, AxisType.GROUP_REDUCE)
REDUCING = (AxisType.REDUCE, AxisType.UNROLL, AxisType.GROUP_REDUCE)
# scalar types a vector may hold (the renderers' vector types); others stay unrolled
VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32,
                           dtypes.int64, dtypes.uint64, dtypes.bool, dtypes.index})
# bytes are vector lanes only on their way in or out of memory: loaded and widened (a quantized
# weight's packed integers), or narrowed and stored; no arithmetic runs on byte vectors
BYTE_DTYPES, BYTE_OPS = frozenset({dtypes.int8, dtypes.uint8}), (Ops.INDEX, Ops.LOAD, Ops.CAST)


def depends_on(root: UOp, r: UOp, nodes: Iterable[UOp] | None = None) -> set[UOp]:
  """The nodes below `root` (its toposort `nodes`, when the caller has it) whose value changes
  with range `r` (a GEP reads fixed lanes, so nothing above it depends on r through it)."""
  dep: set[UOp] = set()
  for u in root.toposort() if nodes is None else nodes:
    if u is r or (u.op is not Ops.GEP and not dep.isdisjoint(u.src)): dep.add(u)
  return dep


def _address(ix: UOp) -> UOp:
  """The index of an INDEX, looking through its validity gate WHERE(valid, i, Invalid). A
  clamped index WHERE(i < n, i, n-1) (a padded axis's reads kept in bounds) stays whole: over
  the vector range it is no `base + lane`, and one vector load at lane 0's clamp would read past
  the buffer (a 3-element buffer padded to 4 read [2, 3])."""
  i = ix.src[1]
  return i.src[1] if i.op is Ops.WHERE and is_invalid(i.src[2]) else i


def is_unit_stride(ix: UOp, r: UOp, dep: set[UOp]) -> bool:
  """The INDEX's address is `base + r` with base independent of r."""
  terms, _ = linear_terms(_address(ix))
  return terms.get(r) == 1 and not any(t in dep for t in terms if t is not r)


def _is_global_index(u: UOp) -> bool:
  return u.op is Ops.INDEX and u.src[0].addrspace is AddrSpace.GLOBAL


def _is_memory_index(u: UOp) -> bool:
  """An access to memory: a global buffer or a kernel-local one (a PACK panel, shared memory),
  not a register."""
  return u.op is Ops.INDEX and u.src[0].addrspace in (AddrSpace.GLOBAL, AddrSpace.LOCAL)


def vector_score(ast: UOp, r: UOp, vector_bytes: int) -> int:
  """How much vectorizing range r pays: unit-stride memory accesses (global buffers, PACK panels
  and shared memory; not registers) count for it, strided ones against, each weighted by how
  often it runs, times the lanes; 0 when r cannot be a vector (size, or a dtype no vector
  holds)."""
  k = r.src[0].arg
  if not isinstance(k, int) or k < 2 or k & (k - 1): return 0
  dep = depends_on(ast, r)
  widest = lane_bytes(dep)[1]
  if widest == 0 or k * widest > 2 * vector_bytes: return 0
  accesses = [u for u in dep if _is_memory_index(u)]
  return k * sum((1 if is_unit_stride(u, r, dep) else -1) * _trips(u, r) for u in accesses)


def lane_bytes(dep: set[UOp]) -> tuple[int, int]:
  """The narrowest and widest element of the values that depend on a range (its nodes `dep`):
  the bytes one lane takes in a vector register (bools and indices, masks and addresses, count
  only as the widest); (0, 0) when a value cannot be a vector lane."""
  widest, narrowest = 1, 1 << 30
  for u in dep:
    dt = u.dtype.scalar()
    if dt == dtypes.void: continue
    if dt in BYTE_DTYPES and u.op in BYTE_OPS and not _is_byte_widening_of_bytes(u): pass
    elif dt not in VECTOR_DTYPES: return 0, 0
    if dt == dtypes.bool and _is_global_index(u): return 0, 0  # bools are bytes in memory
    widest = max(widest, 4 if dt == dtypes.index else dt.itemsize)
    if dt not in (dtypes.bool, dtypes.index): narrowest = min(narrowest, dt.itemsize)
  return min(narrowest, widest), widest


def _is_byte_widening_of_bytes(u: UOp) -> bool:
  """A CAST between two byte dtypes (C would compute it as int: kept scalar)."""
  return u.op is Ops.CAST and u.src[0].dtype.scalar() in BYTE_DTYPES


def _trips(ix: UOp, r: UOp) -> int:
  """How often an access runs per output element: the sizes of the reduce loops around it (a
  load inside a reduction outweighs the store after it)."""
  n = 1
  for x in ix.ranges:
    if x is not r and x.arg.axis_type in REDUCING and isinstance(x.src[0].arg, int):
      n *= x.src[0].arg
  return n


def choose_vector_range(ast: UOp, vector_bytes: int) -> UOp | None:
  """The UPCAST/UNROLL/GROUP_REDUCE range that gains most as vector lanes, or None: the one place
  the vector is chosen (the choice is recorded in the kernel's KernelInfo.vector)."""
  if vector_bytes <= 0: return None
  cands = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg.axis_type in VECTOR_AXES]
  scored = [(vector_score(ast, r, vector_bytes), -r.arg.id, r) for r in cands]
  best = max(scored, default=None, key=lambda t: t[:2])
  return best[2] if best is not None and best[0] > 0 else None


def recorded_vector_range(ast: UOp) -> UOp | None:
  """The vector range the kernel's KernelInfo records (None: none recorded, or no vector)."""
  info = ast.arg
  if not isinstance(info, KernelInfo) or not info.vector: return None
  return next((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg.id in info.vector
               and u.arg.axis_type in VECTOR_AXES), None)


def kernel_vector_range(ast: UOp, vector_bytes: int) -> UOp | None:
  """The kernel's vector range: the one its KernelInfo records, else (nothing chose: no tile,
  opts given by the kernel, NOOPT, a BEAM candidate) the one choose_vector_range chooses now."""
  info = ast.arg
  if isinstance(info, KernelInfo) and info.vector is not None: return recorded_vector_range(ast)
  return choose_vector_range(ast, vector_bytes)


def with_vector(ast: UOp, r: UOp | None) -> UOp:
  """The kernel with `r` recorded as its vector range (in its SINK's KernelInfo)."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  return ast.replace(arg=replace(info, vector=() if r is None else (r.arg.id,)))


# ---- the rewrite ----

@functools.cache
def vec_dtype(dt: DType, k: int) -> DType:
  """`dt.vec(k)`, made once: each call of `vec` builds and hashes a new DType (a tenth of the
  stage on a kernel of wide vectors)."""
  return dt.vec(k)


@dataclass
class VectorizeCtx:
  r: UOp
  k: int
  dep: set[UOp]
  memo: dict[UOp, UOp] = field(default_factory=dict)

  def lane(self, u: UOp, i: int) -> UOp:
    """The scalar value of u in lane i."""
    return u.substitute({self.r: UOp.const(self.r.dtype, i)})

  def broadcast(self, u: UOp) -> UOp:
    """u as a vector: its vector form if it depends on the range, else k copies."""
    v = self.memo.get(u, u)
    return v if u in self.dep else UOp(Ops.STACK, vec_dtype(u.dtype, self.k), (v,) * self.k)


def _vec_buffer(ctx: VectorizeCtx, buf: UOp) -> UOp:
  """A register accumulator widened to hold a vector."""
  dt = vec_dtype(buf.dtype, ctx.k)
  a = buf.arg
  return buf.replace(dtype=dt, arg=ParamArg(a.slot, dt, a.device, a.addrspace, a.name))


def _vec_load(ctx: VectorizeCtx, u: UOp) -> UOp:
  ix = u.src[0]
  gate_per_lane = len(u.src) == 3 and u.src[2] in ctx.dep
  if ix.src[0] in ctx.dep:  # a vector register: read it whole
    return u.replace(dtype=ctx.memo[ix].dtype, src=(ctx.memo[ix], *u.src[1:]))
  if not gate_per_lane and is_unit_stride(ix, ctx.r, ctx.dep):
    base = ctx.lane(ix, 0)
    alt = (ctx.broadcast(u.src[1]),) if len(u.src) == 3 else ()
    gate = (u.src[2],) if len(u.src) == 3 else ()
    return UOp(Ops.LOAD, vec_dtype(u.dtype, ctx.k), (base, *alt, *gate))
  return UOp(Ops.STACK, vec_dtype(u.dtype, ctx.k), tuple(ctx.lane(u, i) for i in range(ctx.k)))


def _vec_store(ctx: VectorizeCtx, u: UOp) -> UOp:
  ix, val = u.src[0], u.src[1]
  gate = u.src[2:]
  if ix.src[0] in ctx.dep:  # a vector register
    return u.replace(src=(ctx.memo[ix], ctx.broadcast(val), *gate))
  if ix.src[0].addrspace is AddrSpace.REG:
    raise RuntimeError("vectorize: a scalar register updated across vector lanes (a reduction "
                       "over the vector range that expand did not split)")
  if ix.src[1] not in ctx.dep and (not gate or gate[0] not in ctx.dep):
    # every lane stores the same value to one address: the loop's last lane wins
    v = UOp(Ops.GEP, val.dtype, (ctx.memo[val],), (ctx.k - 1,)) if val in ctx.dep else val
    return u.replace(src=(ix, v, *gate))
  if (not gate or gate[0] not in ctx.dep) and is_unit_stride(ix, ctx.r, ctx.dep):
    return u.replace(src=(ctx.lane(ix, 0), ctx.broadcast(val), *gate))
  vec = ctx.broadcast(val)
  lanes = []
  for i in range(ctx.k):
    lane_val = UOp(Ops.GEP, val.dtype, (vec,), (i,))
    lanes.append(u.replace(src=(ctx.lane(ix, i), lane_val, *(ctx.lane(g, i) for g in gate))))
  return UOp(Ops.GROUP, dtypes.void, tuple(lanes))


def _vec_node(ctx: VectorizeCtx, u: UOp) -> UOp:
  """The vector form of a node that depends on the range."""
  op = u.op
  if u is ctx.r:
    lanes = tuple(UOp.const(u.dtype, i) for i in range(ctx.k))
    return UOp(Ops.STACK, vec_dtype(u.dtype, ctx.k), lanes)
  if op is Ops.END and u.src[1] is ctx.r: return ctx.memo[u.src[0]]
  if op is Ops.LOAD: return _vec_load(ctx, u)
  if op is Ops.STORE: return _vec_store(ctx, u)
  if op is Ops.INDEX:
    if u.src[0] not in ctx.dep: return u  # into memory: its LOAD or STORE decides the access
    buf = ctx.memo[u.src[0]]  # into a vector register
    return u.replace(dtype=buf.dtype, src=(buf, *u.src[1:]))
  if op is Ops.AFTER:
    buf = u.src[0]
    vbuf = _vec_buffer(ctx, buf) if buf.op is Ops.BUFFER else ctx.memo[buf]
    rest = tuple(ctx.memo.get(s, s) for s in u.src[1:] if s is not ctx.r)
    return u.replace(dtype=vbuf.dtype, src=(vbuf, *rest))
  if op in GroupOp.Elementwise:
    dt = vec_dtype(u.dtype, ctx.k)
    arg = vec_dtype(u.arg, ctx.k) if isinstance(u.arg, DType) else u.arg
    return u.replace(dtype=dt, arg=arg, src=tuple(ctx.broadcast(s) for s in u.src))
  if op in (Ops.END, Ops.GROUP, Ops.SINK):
    return u.replace(src=tuple(ctx.memo.get(s, s) for s in u.src))
  raise RuntimeError(f"vectorize: no vector form for {op.name} ({u.dtype!r})")


def vectorize(ast: UOp) -> UOp:
  """Turn the kernel's remaining vector range (the one its KernelInfo records) into vector
  values."""
  nodes = ast.toposort()
  rs = [u for u in nodes if u.op is Ops.RANGE and u.arg.axis_type in VECTOR_AXES]
  if not rs: return ast
  if len(rs) > 1: raise RuntimeError(f"vectorize: expected one vector range, got {len(rs)}")
  r = rs[0]
  if (kept := recorded_vector_range(ast)) is not None and kept is not r:
    raise RuntimeError(f"vectorize: the kernel records range {kept.arg.id} as its vector, but "
                       f"range {r.arg.id} is left")
  ctx = VectorizeCtx(r, r.src[0].arg, depends_on(ast, r, nodes))
  memo, dep = ctx.memo, ctx.dep
  for u in nodes:
    if u in dep: memo[u] = _vec_node(ctx, u)
    elif u.op is Ops.GEP and u.src[0] in dep:  # GEP(x, r): lane of x's vector
      memo[u] = u.replace(src=(memo[u.src[0]],))
    elif u.op is Ops.GEP and u.src[1:] == (r,):  # x does not vary with r: every lane is x
      memo[u] = memo.get(u.src[0], u.src[0])
    elif (new_src := tuple([memo.get(s, s) for s in u.src])) != u.src:
      memo[u] = rebuild(u, new_src)
  return memo.get(ast, ast)
