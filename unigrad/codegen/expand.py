"""Expand: reductions become register accumulators (and, with optimizations, vector values).

Consumes: a kernel AST with `REDUCE(value, *ranges)` nodes.
Produces: the same kernel where each REDUCE is an accumulator: a REG BUFFER initialised with the
op's identity inside the enclosing loops, updated `acc = acc op value` inside the reduce loops, and
read after the loops close:
  acc0 = AFTER(BUFFER(REG), *outer_ranges); init = STORE(INDEX(acc0, 0), identity)
  upd  = STORE(INDEX(AFTER(acc, init, *rngs), 0), INDEX(AFTER(acc, init, *rngs), 0) op value)
  REDUCE(...) -> INDEX(AFTER(acc, END(upd, *rngs)), 0)
Invariants: no REDUCE remains; every accumulator read inside a loop depends on that loop's range.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.uop import Ops, ParamArg, PatternMatcher, UOp, UPat, shape_uop

ACC_SLOTS_START = 1 << 20  # accumulator BUFFER slots, apart from the kernel's PARAM slots


def identity_element(op: Ops, dt: DType) -> float | int | bool:
  """The value a reduction starts from: 0 for ADD, 1 for MUL, the dtype's minimum for MAX."""
  if op is Ops.ADD: return False if dt == dtypes.bool else 0
  if op is Ops.MUL: return True if dt == dtypes.bool else 1
  return dt.min


@dataclass
class ExpandCtx:
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


pm_expand_reduce = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), lower_reduce),  # REDUCE -> accumulator loop
])
