"""Local reduce: on GPU targets a GROUP_REDUCE axis is reduced across the work items of a group
through LOCAL (shared) memory.

Consumes: an optimized kernel (REDUCE over RANGEs) for a renderer that `has_local`.
Produces: for each REDUCE over a GROUP_REDUCE axis g (of size G) that sits directly in the output
loops, the axis becomes a LOCAL axis (G work items), and the REDUCE becomes:
  partial = REDUCE(value, other reduce axes)         each work item's share
  STORE(smem[slot(l) * G + g], partial); BARRIER     smem: a LOCAL BUFFER of G per work item of
                                                     the group's other LOCAL axes l
  REDUCE(smem[slot(l) * G + r], r)                   r: a new REDUCE axis of size G
Every work item of the group then holds the whole result and stores the same value. The output
loops' END gains the new LOCAL axis (codegen/gpudims.py binds it to a work-item id).
Invariants: a REDUCE inside another loop (a nested reduce) keeps its GROUP_REDUCE axis, which
expand unrolls into per-item accumulators as on the CPU (still correct, no barrier in a loop).
"""
from __future__ import annotations

import itertools
import math

from unigrad.codegen.opt.kernel import normalize_ends
from unigrad.dtype import AddrSpace, dtypes
from unigrad.renderer import Renderer
from unigrad.uop import AxisType, Ops, ParamArg, RangeArg, UOp, shape_uop

__all__ = ["local_reduce"]

SMEM_SLOTS_START = 1 << 22  # slots of LOCAL buffers (apart from PARAMs' and accumulators')
OUTER = (AxisType.LOOP, AxisType.GLOBAL, AxisType.LOCAL)


def _linear(ranges: list[UOp]) -> tuple[UOp, int]:
  """The row-major linear index of `ranges` and their number of combinations."""
  idx, n = UOp.const(dtypes.index, 0), 1
  for r in reversed(ranges):
    idx, n = idx + r * n, n * r.src[0].arg
  return idx, n


def _lower(red: UOp, groups: list[UOp], new_id: int, slot: int) -> tuple[UOp, dict[UOp, UOp]]:
  """The shared-memory form of `red`; returns it and the GROUP_REDUCE -> LOCAL range map."""
  local = {g: g.replace(arg=RangeArg(g.arg.id, AxisType.LOCAL)) for g in groups}
  value = red.src[0].substitute(local)
  rest = tuple(r for r in red.src[1:] if r not in local)
  partial = red.replace(src=(value, *rest)) if rest else value
  others = sorted((r for r in red.ranges if r.arg.axis_type is AxisType.LOCAL),
                  key=lambda r: r.arg.id)
  items, n_items = _linear(others)
  lanes, size = _linear([local[g] for g in groups])
  smem = UOp(Ops.BUFFER, red.dtype, (shape_uop((size * n_items,)),),
             ParamArg(slot, red.dtype, None, AddrSpace.LOCAL))
  base = items * size
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, red.dtype, (smem, base + lanes)), partial))
  shared = UOp(Ops.AFTER, red.dtype, (smem, UOp(Ops.BARRIER, dtypes.void, (store,))))
  r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size),),
          RangeArg(new_id, AxisType.REDUCE))
  read = UOp(Ops.INDEX, red.dtype, (shared, base + r))
  return red.replace(src=(read, r)), local


def _is_top_level(red: UOp) -> bool:
  return all(r.arg.axis_type in OUTER for r in red.ranges)


def local_reduce(ast: UOp, ren: Renderer) -> UOp:
  """The kernel with its top-level GROUP_REDUCE axes reduced in LOCAL memory (see above)."""
  if not ren.has_local: return ast
  nodes = ast.toposort()
  reds = [u for u in nodes if u.op is Ops.REDUCE and _is_top_level(u)
          and any(r.arg.axis_type is AxisType.GROUP_REDUCE for r in u.src[1:])]
  if not reds: return ast
  ids = itertools.count(max(u.arg.id for u in nodes if u.op is Ops.RANGE) + 1)
  slots = itertools.count(SMEM_SLOTS_START)
  sub: dict[UOp, UOp] = {}
  new_locals: dict[UOp, UOp] = {}
  for red in reds:
    groups = [r for r in red.src[1:] if r.arg.axis_type is AxisType.GROUP_REDUCE]
    if math.prod(g.src[0].arg for g in groups) > ren.local_max: continue
    sub[red], local = _lower(red, groups, next(ids), next(slots))
    new_locals.update(local)
  if not sub: return ast
  out = ast.substitute({**sub, **new_locals})
  # the stores now run on every work item of the new LOCAL axes: close them with the output loops
  ends = tuple(_close(s, tuple(new_locals.values())) for s in out.src)
  return normalize_ends(out.replace(src=ends))


def _close(x: UOp, ranges: tuple[UOp, ...]) -> UOp:
  for r in ranges:
    if r in x.ranges: x = UOp(Ops.END, dtypes.void, (x, r))
  return x
