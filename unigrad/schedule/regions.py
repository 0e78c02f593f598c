"""Regions: what a kernel reading a tensor-graph node would compute for it, and what that costs.

The fusion policy (schedule/fusion.py) decides per read whether a node is recomputed inline
where it is read or realized in a buffer of its own. A node's *region* is what recomputing it
means: the nodes down to buffers, realized nodes and REDUCEs (a REDUCE read where a value is
read, under a broadcast or inside a reduction, is realized or has a closed form, so its body is
never part of the reader's loop). The predicates here measure a region: a transcendental in it,
a reduction of data below it, the loads it makes.
"""
from __future__ import annotations

from unigrad.schedule.indexing import VIEW_OPS
from unigrad.schedule.probe import has_closed_form
from unigrad.uop import GroupOp, NodeMap, Ops, UOp

EXPENSIVE = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW, Ops.THREEFRY})
MAX_RECOMPUTED_LOADS = 2  # an elementwise value reading more is realized before a reduction
                         # recomputes it under a broadcast
_REGION_STOPS = (Ops.REDUCE, Ops.PARAM, Ops.AFTER, Ops.BUFFER)
# node -> whether its elementwise region reads a reduction of data (see needs_reduction)
_over_data: NodeMap[bool] = NodeMap("over_data")


def grows(u: UOp) -> bool:
  """An EXPAND that repeats data (some axis goes from 1 to more than 1)."""
  return any(a == 1 and b != 1 for a, b in zip(u.src[0].shape, u.shape))


def region(u: UOp, realized: set[UOp]) -> list[UOp]:
  """The nodes a kernel reading `u` would compute for it (see the module docstring)."""
  stack, seen, out = [u], {u}, []
  while stack:
    x = stack.pop()
    out.append(x)
    if x.op is Ops.REDUCE and x is not u: continue
    for s in x.src:
      if s not in seen and s not in realized and s.op not in (Ops.PARAM, Ops.AFTER):
        seen.add(s)
        stack.append(s)
  return out


def is_expensive(u: UOp, realized: set[UOp]) -> bool:
  """`u` computes a transcendental (not counting what a REDUCE it reads computes)."""
  return any(x.op in EXPENSIVE for x in region(u, realized))


def needs_reduction(u: UOp) -> bool:
  """`u` is elementwise over the result of a reduction of data (a normalization's output, a
  matmul plus its bias): recomputing it in another reduction's loop would re-read every input of
  its region there, and a model's next layer reads this layer's output the same way, so the
  reader's inputs would grow with depth. Whether that reduction is itself realized does not
  matter (the value over it would still be recomputed once per iteration of the reader's loop),
  so the answer does not depend on the order in which the walk meets the nodes."""
  if u.op is Ops.REDUCE: return False
  for x in u.toposort(lambda n: n not in _over_data and n.op not in _REGION_STOPS):
    _over_data[x] = any(_is_reduction_of_data(s) for s in x.src)
  return _over_data[u]


def _is_reduction_of_data(u: UOp) -> bool:
  if u.op is Ops.REDUCE: return not has_closed_form(u)
  return u.op not in _REGION_STOPS and _over_data[u]


def recomputes_reduction(u: UOp, realized: set[UOp]) -> bool:
  """Reading `u` inside another reduction's loop would recompute a reduction of data that is not
  realized. A value over realized reductions only reloads them: whether that costs too much is
  `reads_many`'s question (a LayerNorm's output over its realized statistics reads five buffers
  and is realized; a scatter's `index == last writer` reads one and stays inline)."""
  return any(x.op is Ops.REDUCE and x is not u and not has_closed_form(x)
             for x in region(u, realized))


def reads_many(u: UOp, realized: set[UOp]) -> bool:
  """`u` is elementwise over more than MAX_RECOMPUTED_LOADS loads (distinct views of buffers or
  of realized nodes): a reduction reading it under a broadcast would redo all of them for every
  element it broadcasts to: the digits CNN's ReLU gradient (the output, the bias, the incoming
  gradient) read by the next convolution's input gradient once per input channel and kernel
  position, 72 times. A one-hot (a comparison with an arange) is left to collapse into a gather."""
  def is_load(s: UOp) -> bool:
    while s.op in VIEW_OPS and s not in realized: s = s.src[0]
    return s in realized or s.op in (Ops.PARAM, Ops.AFTER, Ops.BUFFER)
  nodes = region(u, realized)
  if any(x.op is Ops.REDUCE and x is not u and has_closed_form(x) for x in nodes): return False
  loads = {s for x in nodes if x.op in GroupOp.ALU for s in x.src
           if (s.op in VIEW_OPS or s in realized or s.op in (Ops.PARAM, Ops.AFTER)) and is_load(s)}
  return len(loads) > MAX_RECOMPUTED_LOADS
