"""Rangeify: split the function body into kernels over scalar-shaped values indexed by RANGEs.

Consumes: the body `SINK(STORE(buf, value)...)` made by callify (PARAMs, movement ops, ALU,
tensor-graph REDUCE(axes), AFTER(buf, STORE) for earlier writes).
Produces: a list of `Kernel`s, each `SINK(END(STORE(INDEX(PARAM, flat), value), ranges...))`, where
every value is scalar-shaped: movement ops became index arithmetic on RANGEs, PAD became a
validity `WHERE(valid, idx, Invalid)` on the index (gated loads) and `WHERE(valid, x, 0)` on the
value, and REDUCE is `REDUCE(value, *ranges)`. A symbolic variable (a named PARAM) is a scalar
value, never indexed; loops and views over symbolic sizes keep the variable in their bounds, and
intermediate buffers are sized for the variables' largest values (read as row-major prefixes).
Which values get a kernel and a buffer of their own is the fusion policy (schedule/fusion.py);
the index arithmetic is schedule/indexing.py's; this module builds the kernels, sources first,
so that building one never needs another built (in a deep graph, one nested build per kernel
boundary went past Python's recursion limit: a 30-layer model in one realize). A scatter's
kernel becomes a fill and a sequential loop of direct stores (schedule/scatter.py), O(N)
instead of O(N*K); a COPY to another device (a COLLECTIVE between processes) is a call of its own,
not a kernel.
"""
from __future__ import annotations

from unigrad.dtype import dtypes
from unigrad.schedule.callify import max_numel
from unigrad.schedule.fusion import (base_param, find_realizes, fix_store_hazards,
                                     pm_split_reduce, read_stored_values)
from unigrad.schedule.indexing import Kernel, RangeifyCtx, index, pm_rangeify, view
from unigrad.schedule.scatter import scatter_kernels
from unigrad.uop import AxisType, Ops, ParamArg, UOp, graph_rewrite, shape_uop

__all__ = ["Kernel", "RangeifyCtx", "rangeify"]


def _intermediate(ctx: RangeifyCtx, x: UOp) -> UOp:
  slot = ctx.nargs + len(ctx.buffers)
  numel = max_numel(x.shape)  # symbolic: sized for the variables' largest values
  dev = x.device or ctx.device
  buf = UOp(Ops.PARAM, x.dtype, (shape_uop((numel,)),), ParamArg(slot, x.dtype, dev))
  ctx.buffers[x] = buf
  return buf


def _source_buffer(ctx: RangeifyCtx, x: UOp) -> tuple[UOp, int | None]:
  """A PARAM holding x contiguously (x itself, or x realized by its own kernel)."""
  if x.op is Ops.PARAM: return x, None
  if x.op is Ops.RESHAPE and x.src[0].op is Ops.PARAM: return x.src[0], None
  if x.op is Ops.AFTER:
    base, dep = _source_buffer(ctx, x.src[0])
    return base, next((ctx.producer[d] for d in x.src[1:] if d in ctx.producer), dep)
  if x not in ctx.buffers:
    ctx.realize.add(x)
    _build_kernel(ctx, UOp(Ops.STORE, dtypes.void, (view(_intermediate(ctx, x), x.shape), x)), x)
  return ctx.buffers[x], ctx.producer[x]


def _build_copy(ctx: RangeifyCtx, target: UOp, copy: UOp, key: UOp) -> None:
  """A COPY to another device (or a COLLECTIVE between processes) is a call of its own in the
  command buffer, not a kernel."""
  src, dep = _source_buffer(ctx, copy.src[0])
  dst = base_param(target)
  ast = UOp(copy.op, copy.dtype, (dst, src), copy.arg)
  kernel = Kernel(ast=ast, key=key, writes=dst, reads={src})
  if dep is not None: kernel.deps.add(dep)
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(kernel)


def _is_whole_buffer(target: UOp) -> bool:
  """Whether a store target is all of its buffer (a copy call writes a buffer from its start)."""
  while target.op is Ops.RESHAPE: target = target.src[0]
  return target.op is Ops.PARAM


def _build_kernel(ctx: RangeifyCtx, store: UOp, key: UOp) -> None:
  """Make the kernel computing `store` (a STORE into a buffer view) and register it."""
  target, value = store.src[0], store.src[1]
  if value.op in (Ops.COPY, Ops.COLLECTIVE):
    if _is_whole_buffer(target): return _build_copy(ctx, target, value, key)
    _source_buffer(ctx, value)  # copied whole into an intermediate, stored into the view below
  kernel = Kernel(ast=value, key=key, writes=base_param(target))
  saved = ctx.current
  ctx.current = kernel
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(kernel)
  rngs = tuple(ctx.new_range(s, AxisType.LOOP) for s in target.shape)
  st = UOp(Ops.STORE, dtypes.void, (index(target, rngs), index(value, rngs)))
  for r in reversed(rngs): st = UOp(Ops.END, dtypes.void, (st, r))
  sink = UOp(Ops.SINK, dtypes.void, (st,))
  ast = graph_rewrite(sink, pm_rangeify, ctx=ctx, bottom_up=True, name="rangeify")
  kernel.ast, kernel.reads = ast, _reads(ast)
  ctx.current = saved
  split = scatter_kernels(ast)
  if split is not None: _split_scatter(ctx, key, kernel, *split)


def _reads(ast: UOp) -> set[UOp]:
  """The PARAMs a kernel reads (an address it stores to is no read)."""
  topo = ast.toposort()
  addrs = {u.src[0] for u in topo if u.op is Ops.STORE}
  return {u.src[0] for u in topo
          if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and u not in addrs}


def _split_scatter(ctx: RangeifyCtx, key: UOp, kernel: Kernel, fill: UOp, scatter: UOp) -> None:
  """`kernel` becomes the fill; the scatter kernel runs after it, reads what `kernel` read, and is
  the one later readers of `key` wait for."""
  after = Kernel(ast=scatter, key=key, writes=kernel.writes, reads=_reads(scatter),
                 deps=kernel.deps | {ctx.producer[key]})
  kernel.ast, kernel.reads, kernel.deps = fill, set(), set()
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(after)


def rangeify(body: UOp, nargs: int, device: str) -> RangeifyCtx:
  """All kernels of the function `body` (a SINK of STOREs over PARAM slots 0..nargs-1)."""
  body = fix_store_hazards(read_stored_values(graph_rewrite(body, pm_split_reduce,
                                                           name="split reduce")))
  ctx = RangeifyCtx(nargs, device, realize=find_realizes(body))
  for st in _stores_in_order(body.src):
    _build_realized_below(ctx, st.src[1])
    _build_kernel(ctx, st, st)
  return ctx


def _earlier_writes(st: UOp) -> list[UOp]:
  """The STOREs that the value of `st` must see done (the AFTERs it reads order them)."""
  return [dep for u in st.src[1].toposort() if u.op is Ops.AFTER
          for dep in u.src[1:] if dep.op is Ops.STORE]


def _stores_in_order(stores: tuple[UOp, ...]) -> list[UOp]:
  """`stores` and the earlier writes they read, each after the writes it reads."""
  order: list[UOp] = []
  done: set[UOp] = set()
  stack = [(st, False) for st in reversed(stores)]
  while stack:
    st, ready = stack.pop()
    if st in done: continue
    if ready:
      done.add(st)
      order.append(st)
      continue
    stack.append((st, True))
    stack.extend((dep, False) for dep in reversed(_earlier_writes(st)))
  return order


def _build_realized_below(ctx: RangeifyCtx, root: UOp) -> None:
  """The kernels of the realized nodes below `root` and of `root` itself (a stored value that
  is realized, a COPY aside, is copied from its buffer), sources first (an AFTER's buffer
  included: a realized value written over), so that building a kernel finds every realized
  input built."""
  for u in _below(root):
    if u not in ctx.realize or u in ctx.buffers: continue
    if u is root and u.op in (Ops.COPY, Ops.COLLECTIVE): continue
    buf = _intermediate(ctx, u)
    _build_kernel(ctx, UOp(Ops.STORE, dtypes.void, (view(buf, u.shape), u)), u)


def _below(root: UOp) -> list[UOp]:
  """The nodes a kernel of `root` may read, sources first: down to PARAMs, and through an AFTER
  only to the buffer it orders (its STOREs are other kernels, built before)."""
  order: list[UOp] = []
  seen: set[UOp] = set()
  stack: list[tuple[UOp, bool]] = [(root, False)]
  while stack:
    u, expanded = stack.pop()
    if expanded:
      order.append(u)
      continue
    if u in seen: continue
    seen.add(u)
    stack.append((u, True))
    if u.op is Ops.PARAM: continue
    srcs = u.src[:1] if u.op is Ops.AFTER else u.src
    stack.extend((s, False) for s in reversed(srcs) if s not in seen)
  return order
