"""Probes: a reduction rangeified alone, to answer the fusion policy's questions about it.

A probe rangeifies one tensor-graph REDUCE (or a view of one) at fresh LOOP ranges, the nodes
its kernel would read from buffers replaced by placeholder PARAMs, and simplifies the result:
its value per output element and the ranges. What it answers: whether the reduction has a
closed form (no loop left: an arange, cumsum windows), collapses (a gather), is a scatter (a
one-hot over one of its output positions, schedule/scatter.py), and how its loads walk the
output and reduce ranges (schedule/matmul.py). Each answer is a pure function of the node,
remembered per node (`per_node`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.schedule.callify import max_numel
from unigrad.schedule.indexing import VIEW_OPS, Kernel, RangeifyCtx, index, pm_rangeify, view
from unigrad.schedule.scatter import compares_position, scatter_plan
from unigrad.uop import AxisType, NodeMap, Ops, ParamArg, UOp, graph_rewrite, shape_uop
from unigrad.uop.symbolic import linear_terms


def per_node(fn: Callable[[UOp], bool]) -> Callable[[UOp], bool]:
  """A pure predicate of a tensor-graph node, remembered per node (weakly: the entry goes with
  the node). The fusion probes ask about the same node many times in one schedule."""
  seen: NodeMap[bool] = NodeMap(f"per_node_{fn.__qualname__}")

  @functools.wraps(fn)
  def remembered(u: UOp) -> bool:
    if (hit := seen.get(u)) is None: hit = seen[u] = fn(u)
    return hit
  return remembered


def _loaded(red: UOp, loaded: list[UOp]) -> UOp:
  """`red` reading each node of `loaded` from a buffer (a placeholder PARAM) of its own."""
  def buf(u: UOp, i: int) -> UOp:
    numel = max_numel(u.shape)
    return UOp(Ops.PARAM, u.dtype, (shape_uop((numel,)),), ParamArg(-1 - i, u.dtype, "NULL"))
  return red.substitute({u: view(buf(u, i), u.shape) for i, u in enumerate(loaded)})


def probe(red: UOp, loaded: list[UOp] | None = None,
          simplify: bool = True) -> tuple[UOp, tuple[UOp, ...]] | None:
  """Rangeify `red` alone at fresh LOOP ranges (the nodes in `loaded` read from buffers) and
  simplify: its value there and the ranges."""
  if loaded: red = _loaded(red, loaded)
  ctx = RangeifyCtx(0, "NULL", realize=set())
  ctx.current = Kernel(ast=red, key=red, writes=red)
  rngs = tuple(ctx.new_range(s, AxisType.LOOP) for s in red.shape)
  try:
    value = graph_rewrite(index(red, rngs), pm_rangeify, ctx=ctx, bottom_up=True, name="probe")
  except NotImplementedError: return None
  if not simplify: return value, rngs
  return graph_rewrite(value, pm_kernel_simplify, name="probe simplify"), rngs


def _probe_simplified(red: UOp, loaded: list[UOp] | None = None) -> bool:
  """Rangeify `red` alone at fresh ranges and simplify: True when no REDUCE is left."""
  found = probe(red, loaded)
  return found is not None and not found[0].op_in_backward_slice_with_self(Ops.REDUCE)


def reduce_body(red: UOp) -> tuple[bool, list[UOp]]:
  """What a REDUCE computes itself, down to buffers and other REDUCEs: whether it compares for
  equality (a one-hot does) and the outermost REDUCEs it reads."""
  compares, nested, seen, stack = False, [], set(), [red.src[0]]
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE: nested.append(u)
    elif u.op not in (Ops.PARAM, Ops.AFTER, Ops.BUFFER):
      compares = compares or u.op is Ops.CMPNE
      stack.extend(u.src)
  return compares, nested


@per_node
def has_closed_form(red: UOp) -> bool:
  """A REDUCE whose indexed form simplifies to no loop at all (arange, cumsum windows): recomputing
  it where it is read costs less than a buffer. Only reductions of constants qualify, so the probe
  never inlines a nested reduction over data."""
  if red.op_in_backward_slice_with_self(Ops.PARAM, Ops.AFTER, Ops.BUFFER): return False
  return _probe_simplified(red)


@per_node
def is_scatter(u: UOp) -> bool:
  """A REDUCE (or a view of one) that is a one-hot over one of its output positions (see
  scatter_plan): its kernel fills its buffer and then stores directly, instead of looping over
  every output position. A one-hot compares with an arange (a closed form) for equality; the
  probe reads the other reductions it contains from buffers, as its kernel will, so it stays as
  small as the reduction's own body."""
  red = u
  while red.op in VIEW_OPS: red = red.src[0]
  if red.op is not Ops.REDUCE or not all(isinstance(d, int) for d in u.shape): return False
  compares, nested = reduce_body(red)
  if not compares: return False  # no one-hot
  closed = [r for r in nested if has_closed_form(r)]
  if not closed: return False  # no arange to compare positions with
  found = probe(u, [r for r in nested if r not in closed], simplify=False)
  if found is None or not compares_position(found[0], found[1]): return False
  value = graph_rewrite(found[0], pm_kernel_simplify, name="probe simplify")
  return value.op is Ops.REDUCE and scatter_plan(value, found[1]) is not None


def collapses(red: UOp) -> bool:
  """The REDUCE's indexed form (loads allowed) simplifies to no loop: a gather, an arange. A
  reduction it reads must have a closed form (inlined) or be a scatter (realized, so read from
  its buffer, as a gather reads the position map of an overwrite); any other reduction of data is
  never inlined."""
  loaded = [u for u in reduce_body(red)[1] if not has_closed_form(u)]
  if not all(is_scatter(u) for u in loaded): return False
  return _probe_simplified(red, loaded)


def unit_loads(value: UOp, r: UOp) -> int:
  """How many loads of `value` (a probed kernel value) are contiguous along range r."""
  loads = [u for u in value.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM]
  return sum(linear_terms(u.src[1])[0].get(r) == 1 for u in loads if u.src[1].op is not Ops.WHERE)


def reads_contiguous_output(red: UOp, loaded: list[UOp]) -> tuple[bool, bool] | None:
  """Probe `red` (the nodes in `loaded` read from buffers): whether a load is contiguous along
  an output axis, and whether one is along the innermost reduce axis."""
  found = probe(red, loaded)
  if found is None or found[0].op is not Ops.REDUCE: return None
  value, loops = found
  return any(unit_loads(value, r) for r in loops), unit_loads(value, value.src[-1]) > 0
