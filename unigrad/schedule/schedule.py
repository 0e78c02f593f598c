"""Schedule: order the kernels of a function into the command buffer.

Consumes: the function body from callify (a SINK of STOREs over PARAMs 0..nargs-1).
Produces: `LINEAR(CALL(kernel, *params)...)` (kernels writing zero elements are left out, those
storing into an empty view of a non-empty buffer too; an empty reduction is its identity, so no
kernel has a zero-trip loop): each kernel's AST has its own PARAMs numbered from 0 in discovery
order and RANGE ids renumbered, so identical kernels on other buffers have identical ASTs; the
CALL's sources are the body's PARAMs (slots >= nargs are intermediates, allocated per run). Order:
a kernel runs after the kernels whose results it reads (read-after-write) and before any kernel
that overwrites a buffer state it reads (write-after-read). A collective between processes (not a
send or recv) is two CALLs, its start and its wait: the start as soon as its source is made, the
wait as late as its readers allow, the kernels between running while it transfers (one CALL
where no kernel falls between).
"""
from __future__ import annotations

import heapq
from dataclasses import replace

from unigrad.dtype import dtypes
from unigrad.knobs import SPEC
from unigrad.uop import KernelInfo, Ops, ParamArg, RangeArg, UOp, spec_tensor
from unigrad.uop.spec_kernel import spec_kernel
from unigrad.schedule.indexing import Kernel
from unigrad.schedule.rangeify import rangeify


class ScheduleError(RuntimeError):
  """The kernels cannot be ordered (an assign cycle)."""


def _ancestors(kernels: list[Kernel]) -> list[set[int]]:
  """For each kernel, every kernel it transitively reads results from."""
  out: dict[int, set[int]] = {}
  for start in range(len(kernels)):
    stack = [(start, False)]
    while stack:
      i, ready = stack.pop()
      if i in out: continue
      if ready:
        out[i] = set().union(*({d} | out[d] for d in kernels[i].deps)) if kernels[i].deps else set()
        continue
      stack.append((i, True))
      stack.extend((d, False) for d in kernels[i].deps if d not in out)
  return [out[i] for i in range(len(kernels))]


def order_kernels(kernels: list[Kernel], split: frozenset[int] = frozenset()) -> list[int]:
  """Kernel indices in an order that respects RAW and WAR dependencies, depth first. A kernel in
  `split` (a collective between processes) has a second node, its wait, `len(kernels) + i`:
  the kernels that read its result or overwrite what it reads follow the wait, the kernel
  itself (its start) runs as soon as it is ready, and the wait as late as the others allow, so
  the kernels that need neither run while it transfers."""
  n, anc = len(kernels), _ancestors(kernels)

  def after(i: int) -> int: return n + i if i in split else i  # what i's readers follow

  # i runs after edges[i]
  edges: dict[int, set[int]] = {i: {after(d) for d in k.deps} for i, k in enumerate(kernels)}
  edges.update({n + i: {i} for i in split})
  writers: dict[UOp, list[int]] = {}
  for i, k in enumerate(kernels): writers.setdefault(k.writes, []).append(i)
  for i, k in enumerate(kernels):
    for p in k.reads:
      for w in writers.get(p, []):
        if w != i and w not in anc[i]: edges[w].add(after(i))  # the reader goes before the write
  indeg = {i: len(e) for i, e in edges.items()}
  users: dict[int, list[int]] = {i: [] for i in edges}
  for i, e in edges.items():
    for d in e: users[d].append(i)

  # a kernel feeding split collectives goes before one feeding none, and before one feeding
  # only those with more work before them (the all-reduce of the last layer's gradients starts
  # before the earlier layers' gradients are computed)
  feeds = dict.fromkeys(range(n), n)
  for c in sorted(split, key=lambda c: len(anc[c])):
    for a in anc[c]: feeds[a] = min(feeds[a], len(anc[c]))

  # among the kernels ready to run, a split collective's start goes first and a wait last; then
  # those feeding a collective (see above), those no kernel reads from (results), then the one
  # made ready last (then the lowest index): values are consumed soon after they are made, which
  # keeps lifetimes short for the memory plan
  def key(i: int) -> tuple[int, int, bool, int, int]:
    kind = 0 if i in split else 2 if i >= n else 1
    return (kind, feeds.get(i, n), bool(users[i]), -len(order), i)
  order: list[int] = []
  ready = [key(i) for i, d in indeg.items() if d == 0]
  heapq.heapify(ready)
  while ready:
    i = heapq.heappop(ready)[4]
    order.append(i)
    for u in users[i]:
      indeg[u] -= 1
      if indeg[u] == 0: heapq.heappush(ready, key(u))
  if len(order) != len(edges):
    raise ScheduleError("cycle detected in the assign graph: "
                        "a buffer is both read and written out of order")
  return order


def _splits(kernels: list[Kernel]) -> frozenset[int]:
  """The collectives run as a start and a wait: every group collective (a send or recv runs
  whole) whose result buffer no other kernel writes."""
  writes: dict[UOp, int] = {}
  for k in kernels: writes[k.writes] = writes.get(k.writes, 0) + 1
  return frozenset(i for i, k in enumerate(kernels) if k.ast.op is Ops.COLLECTIVE
                   and k.ast.arg.kind not in ("send", "recv") and writes[k.writes] == 1)


def finalize_kernel(ast: UOp) -> tuple[UOp, tuple[UOp, ...]]:
  """Renumber the kernel's PARAMs (0..) and RANGEs (0..) in discovery order and its variables
  (0..) in name order (the launch passes their values in that order); returns the kernel SINK
  and the body PARAMs its slots refer to."""
  topo = ast.toposort()
  params = [u for u in topo if u.op is Ops.PARAM and u.arg.name is None]
  ranges = [u for u in topo if u.op is Ops.RANGE]
  variables = sorted((u for u in topo if u.op is Ops.PARAM and u.arg.name is not None),
                     key=lambda v: v.arg.name)
  sub: dict[UOp, UOp] = {}
  for i, p in enumerate(params):
    sub[p] = p.replace(arg=ParamArg(i, p.arg.dtype, p.arg.device, p.arg.addrspace))
  for i, v in enumerate(variables): sub[v] = v.replace(arg=replace(v.arg, slot=i))
  for i, r in enumerate(ranges):
    sub[r] = r.replace(arg=RangeArg(i, r.arg.axis_type))
  new = _substitute_nodes(ast, sub)
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()  # e.g. a scatter's
  return new.replace(arg=replace(info, name=kernel_name(new))), tuple(params)


def _substitute_nodes(root: UOp, sub: dict[UOp, UOp]) -> UOp:
  """Substitute leaves (PARAM) and RANGEs, rebuilding RANGEs whose bounds may contain other
  nodes."""
  memo: dict[UOp, UOp] = {}
  for u in root.toposort():
    new_src = tuple(memo[s] for s in u.src)
    base = sub.get(u, u)
    memo[u] = base if all(a is b for a, b in zip(new_src, u.src)) else base.replace(src=new_src)
  return memo[root]


def kernel_name(ast: UOp) -> str:
  """`r_` for kernels with a reduction, `E_` otherwise, then each loop size by axis type."""
  ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg.id)
  is_reduce = any(r.arg.axis_type.name in ("REDUCE", "GROUP_REDUCE", "UNROLL") for r in ranges)
  prefix = "r" if is_reduce else "E"
  sizes = [f"{r.src[0].arg if r.src[0].op is Ops.CONST else 'n'}" for r in ranges]
  return "_".join([prefix, *sizes]) if sizes else prefix


def _is_empty_range(r: UOp) -> bool:
  return r.op is Ops.RANGE and r.src[0].op is Ops.CONST and r.src[0].arg == 0


def _stores_nothing(item: UOp) -> bool:
  """Whether a kernel's top-level item, `END(...END(STORE, r)..., r0)`, runs a zero-trip loop."""
  while item.op is Ops.END:
    if any(_is_empty_range(r) for r in item.src[1:]): return True
    item = item.src[0]
  return False


def _writes_nothing(kernel: Kernel) -> bool:
  """Whether a kernel stores no element: its buffer is empty, or every store is under a loop of
  size 0 (a write into an empty view of a non-empty buffer, `x[1:1:2] = 9`). Such a kernel must
  not run: a zero-trip range has no value, and codegen, folding an index that depends on it to a
  constant, would move the store out of its loop (a write outside the view, or the buffer)."""
  if kernel.writes.shape[0] == 0: return True
  if kernel.ast.op is not Ops.SINK: return False
  return all(_stores_nothing(item) for item in kernel.ast.src)


def create_schedule(body: UOp, nargs: int, device: str) -> UOp:
  """The LINEAR of kernel CALLs computing `body` (see the module docstring)."""
  if SPEC >= 1: spec_tensor.verify(body)
  ctx = rangeify(body, nargs, device)
  calls, n = [], len(ctx.kernels)
  split = _splits(ctx.kernels)
  order = [i for i in order_kernels(ctx.kernels, split) if not _writes_nothing(ctx.kernels[i % n])]
  # a collective with no kernel between its start and its wait overlaps nothing: one whole call
  place = {i: p for p, i in enumerate(order)}
  split = frozenset(c for c in split if c in place and any(
    j < n and j not in split for j in order[place[c] + 1:place[n + c]]))
  for i in order:
    if i >= n and i - n not in split: continue
    if i >= n or i in split:  # CALL(COLLECTIVE(dst, src), dst, src) as its start or its wait
      ast = ctx.kernels[i % n].ast
      ast = ast.replace(arg=replace(ast.arg, phase="wait" if i >= n else "start"))
      calls.append(UOp(Ops.CALL, dtypes.void, (ast, *ast.src)))
      continue
    if ctx.kernels[i].ast.op is Ops.COPY:  # CALL(COPY, dst, src): a buffer copy between devices
      ast = ctx.kernels[i].ast
      calls.append(UOp(Ops.CALL, dtypes.void, (ast.replace(src=()), *ast.src)))
      continue
    if ctx.kernels[i].ast.op is Ops.COLLECTIVE:  # CALL(COLLECTIVE(dst, src), dst, src): MPI
      calls.append(UOp(Ops.CALL, dtypes.void, (ctx.kernels[i].ast, *ctx.kernels[i].ast.src)))
      continue
    kernel, params = finalize_kernel(ctx.kernels[i].ast)
    if SPEC >= 1: spec_kernel.verify(kernel)
    calls.append(UOp(Ops.CALL, dtypes.void, (kernel, *params)))
  return UOp(Ops.LINEAR, dtypes.void, tuple(calls))
