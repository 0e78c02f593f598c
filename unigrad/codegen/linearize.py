"""Linearize: order a kernel DAG into one instruction list with structured loops.

Consumes: a kernel after instruction selection (a DAG whose loop structure is implicit: a node's
`ranges` are the loops it lives in; END closes a loop).
Produces: `LINEAR(*nodes)` in execution order, with each loop as `RANGE ... END` and each gated
STORE as `IF(gate) STORE ENDIF`.
Invariants: a node comes after its sources; a node that depends on a range lies between that
RANGE and its END; loop-invariant nodes are hoisted out of the loops they do not depend on.
Each loop's parent is the block its END lives in, so loops nest as the kernel's ENDs say.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from unigrad.dtype import dtypes
from unigrad.uop import GroupOp, Ops, UOp

NOT_INSTRUCTIONS = frozenset({Ops.SINK, Ops.GROUP, Ops.VCONST, Ops.NOOP})


def _instructions(sink: UOp) -> list[UOp]:
  """Every node of the program, sources first; shapes and bounds of PARAM/BUFFER excluded."""
  out: dict[UOp, None] = {}
  stack: list[tuple[UOp, bool]] = [(sink, False)]
  while stack:
    u, ready = stack.pop()
    if u in out: continue
    if ready:
      out[u] = None
      continue
    stack.append((u, True))
    if u.op in (Ops.PARAM, Ops.BUFFER): continue
    stack.extend((s, False) for s in reversed(u.src) if s not in out)
  return [u for u in out if u.op not in NOT_INSTRUCTIONS]


@dataclass
class LoopTree:
  """parent[r] is the loop a RANGE r sits in (None at the top); depth orders nesting."""
  parent: dict[UOp, UOp | None] = field(default_factory=dict)
  ends: dict[UOp, list[UOp]] = field(default_factory=dict)

  def depth(self, r: UOp | None) -> int:
    d = 0
    while r is not None:
      d, r = d + 1, self.parent.get(r)
    return d

  def block(self, u: UOp) -> UOp | None:
    """The innermost loop `u` belongs to."""
    if u.op is Ops.RANGE: return u
    if u.op is Ops.END: return self.parent.get(u.src[1])
    rs = u.ranges
    return max(rs, key=self.depth) if rs else None


def _loop_tree(nodes: list[UOp]) -> LoopTree:
  tree = LoopTree()
  ends = [u for u in nodes if u.op is Ops.END]
  for e in ends: tree.ends.setdefault(e.src[1], []).append(e)
  # resolve parents outermost first: a loop's parent is the deepest range open at its END
  pending = {r: e for r, es in tree.ends.items() for e in es[:1]}
  for r in [u for u in nodes if u.op is Ops.RANGE]:
    if r not in pending: tree.parent[r] = None
  while pending:
    progressed = False
    for r, e in list(pending.items()):
      open_rs = [x for x in e.src[0].ranges if x is not r]
      if any(x in pending for x in open_rs): continue
      tree.parent[r] = max(open_rs, key=tree.depth) if open_rs else None
      del pending[r]
      progressed = True
    if not progressed: raise RuntimeError("linearize: loops do not nest (ranges close each other)")
  return tree


def _emit(block: UOp | None, members: dict[UOp | None, list[UOp]], tree: LoopTree,
          pos: dict[UOp, int], out: list[UOp]) -> None:
  """Emit the nodes and child loops of `block` in dependency order."""
  items = list(members.get(block, []))
  item_set = set(items)
  children = [r for r, p in tree.parent.items() if p is block]
  item_of: dict[UOp, UOp] = {u: u for u in items}
  for r in children:
    for u in _loop_nodes(r, members, tree): item_of[u] = r
  all_items = items + children
  deps: dict[UOp, set[UOp]] = {}
  owner_of = item_of.get
  for it in all_items:
    deps[it] = dep = set()
    for u in ([it] if it in item_set else _loop_nodes(it, members, tree)):
      for s in u.src:
        if (owner := owner_of(s)) is not None and owner is not it: dep.add(owner)
  users: dict[UOp, list[UOp]] = {it: [] for it in all_items}
  for it, ds in deps.items():
    for d in ds: users[d].append(it)
  indeg = {it: len(ds) for it, ds in deps.items()}
  order_of = {it: i for i, it in enumerate(all_items)}  # tie-break: never compares UOps
  ready = [(pos[it], i, it) for i, it in enumerate(all_items) if indeg[it] == 0]
  heapq.heapify(ready)
  emitted = 0
  while ready:
    _, _, it = heapq.heappop(ready)
    emitted += 1
    for u in users[it]:
      indeg[u] -= 1
      if indeg[u] == 0: heapq.heappush(ready, (pos[u], order_of[u], u))
    out.append(it)
    if it in item_set:
      continue
    _emit(it, members, tree, pos, out)  # `it` is a loop: its RANGE, its body, its END(s)
    out.extend(tree.ends.get(it, []))
  if emitted != len(all_items): raise RuntimeError("linearize: dependency cycle between loops")


def _loop_nodes(r: UOp, members: dict[UOp | None, list[UOp]], tree: LoopTree) -> list[UOp]:
  """Every node inside loop `r` (nested loops included), its RANGE and its ENDs."""
  out = [r, *tree.ends.get(r, [])]
  stack = [r]
  while stack:
    b = stack.pop()
    out.extend(members.get(b, []))
    for c, p in tree.parent.items():
      if p is b:
        out.extend([c, *tree.ends.get(c, [])])
        stack.append(c)
  return out


def _add_ifs(nodes: list[UOp]) -> list[UOp]:
  out: list[UOp] = []
  for i, u in enumerate(nodes):
    if u.op is Ops.STORE and len(u.src) == 3:
      # arg: its position, so each IF is its own node
      cond = UOp(Ops.IF, dtypes.void, (u.src[2],), i)
      out.extend([cond, u.replace(src=u.src[:2]), UOp(Ops.ENDIF, dtypes.void, (cond,))])
    else: out.append(u)
  return out


def linearize(sink: UOp) -> UOp:
  """The kernel as a LINEAR instruction list (see the module docstring)."""
  nodes = _instructions(sink)
  pos = {u: i for i, u in enumerate(nodes)}
  tree = _loop_tree(nodes)
  members: dict[UOp | None, list[UOp]] = {}
  for u in nodes:
    if u.op in (Ops.RANGE, Ops.END): continue
    members.setdefault(tree.block(u), []).append(u)
  out: list[UOp] = []
  _emit(None, members, tree, pos, out)
  return UOp(Ops.LINEAR, dtypes.void, tuple(_add_ifs(out)), sink.arg)


@dataclass(frozen=True)
class Estimates:
  """Work of one kernel launch: ALU ops on data and bytes moved to and from global memory."""
  flops: int
  mem_bytes: int


def estimate(linear: UOp) -> Estimates:
  """Count data ALU ops and global loads/stores, times the trip counts of their loops, times the
  number of launched chunks (each SPECIAL runs the whole body once per index): the work of the
  whole launch, every thread included, whatever THREAD/UPCAST opts shaped the kernel."""
  flops = mem = 0
  # a GPU kernel's body runs once per work item: its thread indices multiply every count
  trips = [math.prod(u.src[0].arg for u in linear.src if u.op is Ops.SPECIAL
                     and str(u.arg)[:4] in ("gidx", "lidx"))]
  data: set[UOp] = set()
  for u in linear.src:
    if u.op is Ops.RANGE:
      bound = u.src[0]
      trips.append(trips[-1] * (bound.arg if bound.op is Ops.CONST else max(bound.vmax, 1)))
    elif u.op is Ops.END: trips.pop()
    elif u.op in (Ops.LOAD, Ops.STORE):
      if u.op is Ops.LOAD: data.add(u)
      if u.src[0].src[0].op is Ops.PARAM:
        mem += trips[-1] * (u.dtype if u.op is Ops.LOAD else u.src[1].dtype).itemsize
    elif u.op in GroupOp.ALU and any(s in data for s in u.src):
      data.add(u)
      flops += trips[-1] * u.dtype.count * (2 if u.op is Ops.MULACC else 1)
    elif u.op in (Ops.CAST, Ops.BITCAST) and u.src[0] in data: data.add(u)
  chunks = math.prod(launch_size(linear))
  return Estimates(flops * chunks, mem * chunks)


def launch_size(linear: UOp) -> tuple[int, ...]:
  """(number of core_id chunks,) from the kernel's CPU thread SPECIAL, or (1,) (GPU work-item
  SPECIALs are counted by `estimate` itself)."""
  for u in linear.src:
    if u.op is Ops.SPECIAL and u.arg == "core_id": return (u.src[0].arg,)
  return (1,)
