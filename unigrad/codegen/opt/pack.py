"""Packing: the PACK opt copies the part of one input that a loop's body reads into a contiguous
kernel-local buffer, once per iteration of that loop.

`Opt(OptOps.PACK, axis, slot)` applies to a kernel that reads the PARAM in `slot` through one
ungated INDEX(PARAM, idx) and never writes it. The *panel* is what idx reaches while the ranges
nested inside LOOP axis `axis` (the LOOP and REDUCE ranges after it, and UPCAST/UNROLL/
GROUP_REDUCE ranges) vary: with p_1..p_n those of them idx depends on, largest stride first,
  panel = BUFFER(LOCAL, size = |p_1| * ... * |p_n|)
  pidx(p) = row-major position of (p_1, ..., p_n)
  pack = END(STORE(INDEX(panel, pidx(q)), INDEX(PARAM, idx[p := q])), q_1, ..., q_n)
  INDEX(PARAM, idx) -> INDEX(AFTER(panel, pack), pidx(p))
where q_i are fresh LOOP ranges of the same sizes (the copy's own loops, nested inside `axis`).
The copy runs inside the loop of `axis`, before the body that reads it; the body then reads the
panel at unit-stride rows. A matmul's B panel (K rows of a few vectors, rows N floats apart)
becomes contiguous: power-of-two row strides no longer map the panel's rows to a few cache sets
(matmul 2048 on AVX-512, one thread: 71 -> 105 GFLOPS; AVX2 1024: 51 -> 94).

Invariants: the result computes the same values (each panel element is a copy of the element the
original index read); PACK is the last opt (the copy's LOOP ranges are no axes to split); the
panel fits PACK_MAX_BYTES (it lives on the stack of each calling thread).
"""
from __future__ import annotations

import math

from unigrad.codegen.opt import KernelOptError
from unigrad.dtype import AddrSpace, dtypes
from unigrad.uop import AxisType, Ops, ParamArg, UOp, shape_uop
from unigrad.uop.ops import AXIS_ORDER
from unigrad.uop.symbolic import is_invalid, linear_terms

__all__ = ["pack_ast", "packed_input", "is_contiguous_panel", "PACK_MAX_BYTES",
           "PACK_SLOTS_START"]

PACK_SLOTS_START = 1 << 21  # panel BUFFER slots (accumulators: 1 << 20, shared memory: 1 << 22)
PACK_MAX_BYTES = 1 << 20  # a panel is a stack array of every thread that runs the kernel


def _key(r: UOp) -> tuple[int, int]: return (AXIS_ORDER[r.arg.axis_type], r.arg.id)


def packed_input(ast: UOp, slot: int) -> UOp:
  """The one INDEX that reads the PARAM in `slot` (KernelOptError if there is none, several, a
  write, or a gated read)."""
  nodes = ast.toposort()
  stored = {u.src[0] for u in nodes if u.op is Ops.STORE}
  reads = [u for u in nodes if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM
           and u.src[0].arg.slot == slot and u.src[0].arg.name is None]
  if not reads: raise KernelOptError(f"PACK: the kernel reads no buffer in slot {slot}")
  if len(reads) > 1 or any(u in stored for u in reads):
    raise KernelOptError(f"PACK: slot {slot} is read at several indices or written")
  idx = reads[0].src[1]
  if len(reads[0].src) != 2 or is_invalid(idx) or (idx.op is Ops.WHERE and is_invalid(idx.src[2])):
    raise KernelOptError(f"PACK: slot {slot} is read through a gated (padded) index")
  return reads[0]


def _panel_ranges(read: UOp, r: UOp) -> list[UOp]:
  """The ranges nested inside `r` that the read's index depends on, in the order of the input's
  memory: the largest stride first (a range in a non-linear term before all), so the panel's
  rows keep the input's contiguous runs (a tile's vector lanes) contiguous."""
  inner = [x for x in read.src[1].ranges if _key(x) > _key(r)]
  if any(x.src[0].op is not Ops.CONST for x in inner):
    raise KernelOptError("PACK: the panel has a symbolic size")
  terms, _ = linear_terms(read.src[1])
  def stride(x: UOp) -> float: return abs(terms[x]) if x in terms else math.inf
  return sorted(inner, key=lambda x: (-stride(x), _key(x)))


def _row_major(ranges: list[UOp]) -> UOp:
  idx, n = UOp.const(dtypes.index, 0), 1
  for x in reversed(ranges):
    idx, n = idx + x * n, n * x.src[0].arg
  return idx


def is_contiguous_panel(ast: UOp, r: UOp, slot: int) -> bool:
  """Whether the panel of `slot` at `r` already lies contiguously in the input (its index is
  the panel's row-major position plus something the copy's ranges do not change): a copy would
  only add work."""
  read = packed_input(ast, slot)
  ranges = _panel_ranges(read, r)
  terms, _ = linear_terms(read.src[1])
  want, _ = linear_terms(_row_major(ranges))
  return all(terms.get(x) == want.get(x) for x in ranges if x.src[0].arg > 1)


def pack_ast(ast: UOp, r: UOp, slot: int, new_id: int, buf_slot: int) -> UOp:
  """The kernel with the input in `slot` read from a panel packed once per iteration of LOOP
  range `r` (see the module docstring); `new_id` is the first id of the copy's ranges."""
  if r.arg.axis_type not in (AxisType.LOOP, AxisType.GLOBAL):
    raise KernelOptError(f"PACK applies at a LOOP axis, not {r.arg.axis_type.name}")
  read = packed_input(ast, slot)
  ranges = _panel_ranges(read, r)
  if not ranges: raise KernelOptError("PACK: the read does not vary inside the loop")
  size, dt = math.prod(x.src[0].arg for x in ranges), read.dtype
  if size * dt.itemsize > PACK_MAX_BYTES:
    raise KernelOptError(f"PACK: a panel of {size} elements exceeds {PACK_MAX_BYTES} bytes")
  copy = {x: UOp.range(x.src[0].arg, new_id + i, AxisType.LOOP) for i, x in enumerate(ranges)}
  panel = UOp(Ops.BUFFER, dt, (shape_uop((size,)),), ParamArg(buf_slot, dt, None, AddrSpace.LOCAL))
  src = read.replace(src=(read.src[0], read.src[1].substitute(copy)))
  pack = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dt, (panel, _row_major(list(copy.values())))),
                                      src))
  for q in reversed(copy.values()): pack = UOp(Ops.END, dtypes.void, (pack, q))
  packed = UOp(Ops.INDEX, dt, (UOp(Ops.AFTER, dt, (panel, pack)), _row_major(ranges)))
  return ast.substitute({read: packed})
