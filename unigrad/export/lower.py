"""Lower: a traced FUNCTION to the kernels of an exported function, each buffer categorized.

Consumes: a `Trace` (trace.py).
Produces: an `ExportPlan`: the schedule (`LINEAR` of kernel CALLs over PARAM slots, from the
same callify, schedule cache and command buffer (engine/commands.py) as `Tensor.realize`, less
the kernels fold.py ran at export time), the category of every slot used (seed 003's four:
input, output, constant, intermediate),
the constants' bytes, each intermediate's place in a per-dtype scratch array (the memory plan,
schedule/memory.py), the launches, and the copies that fill an output holding the same value as
an earlier one (a Tensor returned twice: each output is written).
Invariants: constants are the captured values realized once, row-major, and the results of
folded kernels, their bytes read here (embedded later as `static const` arrays with these exact
bits), numbered in order of first use; the scheduling works on the
inlined copy of the FUNCTION, so the Trace itself is never changed; an intermediate's offset is
a multiple of 64 bytes and two intermediates used by overlapping launches never share an element.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from unigrad.dtype import DType
from unigrad.engine.commands import Entry, command_buffer
from unigrad.engine.entry import copyout, schedule_for
from unigrad.export.buffers import Category, Slot
from unigrad.export.fold import fold_constants
from unigrad.export.trace import EXPORT_DEVICE, ExportError, Trace
from unigrad.frontend.tensor import Tensor
from unigrad.schedule.callify import buffer_base, callify, is_plain_buffer
from unigrad.schedule.function import inline_functions
from unigrad.schedule.memory import Lifetime, plan_memory
from unigrad.uop import Ops, UOp

__all__ = ["Category", "Slot", "ExportPlan", "lower"]  # Category, Slot: buffers.py


@dataclass(frozen=True)
class ExportPlan:
  """What the C source is assembled from (see the module docstring)."""
  schedule: UOp
  slots: dict[int, Slot]
  constants: tuple[bytes, ...]
  constant_dtypes: tuple[DType, ...]
  scratch: dict[DType, int]  # dtype -> elements of its static scratch array
  launches: tuple[Entry, ...]
  copies: tuple[tuple[int, int], ...] = ()  # (output, earlier output of the same value), in order


def lower(tr: Trace) -> ExportPlan:
  """The schedule and buffer categories of a traced function (see the module docstring)."""
  consts = [_realized(u) for u in tr.captured]
  args = (*(h.uop for h in tr.placeholders), *consts)
  f = tr.function.replace(src=(tr.function.src[0], *args))
  targets = [UOp(Ops.GETTUPLE, None, (f,), i) for i in range(len(tr.function.src[0].src))]
  inlined = inline_functions(targets)
  res = callify(inlined, [EXPORT_DEVICE] * len(inlined))
  known: dict[UOp, tuple[Category, int]] = {}
  for i, h in enumerate(tr.placeholders): known[_base(h.uop)] = (Category.INPUT, i)
  for i, c in enumerate(consts): known.setdefault(_base(c), (Category.CONSTANT, i))
  copies, written = _output_copies([_base(res.becomes[inlined[r]]) for r in tr.results])
  for b, i in written.items(): known[b] = (Category.OUTPUT, i)
  made = {_base(v) for v in res.becomes.values()}  # buffers callify made for the graph's values
  slots: dict[int, Slot] = {}
  for s, b in enumerate(res.bufs):
    if b in known: slots[s] = Slot(*known[b], b.shape[0], b.dtype)
    elif b in made: slots[s] = Slot(Category.INTERMEDIATE, s, b.shape[0], b.dtype)
    else: raise ExportError(f"buffer {b.arg} is read by the function but is neither an input "
                            "nor a captured value")
  linear = schedule_for(res.body, len(res.bufs), EXPORT_DEVICE)
  plan = command_buffer(linear, len(res.bufs))
  for s, p in plan.inter.items(): slots[s] = Slot(Category.INTERMEDIATE, s, p.size, p.dtype)
  views = {_base(c): c for c in consts}
  values = {s: bytes(copyout(views[b])) for s, b in enumerate(res.bufs)
            if b in views and slots[s].category is Category.CONSTANT}
  kept, slots, values = fold_constants(plan.entries, slots, values)
  launches = tuple(plan.entries[i] for i in kept)
  slots = {s: slots[s] for s in dict.fromkeys(s for launch in launches for s in launch.slots)}
  const_slots = [s for s, v in slots.items() if v.category is Category.CONSTANT]
  for i, s in enumerate(const_slots): slots[s] = replace(slots[s], index=i)
  scratch = _place_intermediates(launches, slots)
  schedule = UOp(Ops.LINEAR, linear.dtype, tuple(linear.src[i] for i in kept))
  return ExportPlan(schedule, slots, tuple(values[s] for s in const_slots),
                    tuple(slots[s].dtype for s in const_slots), scratch, launches, copies)


def _output_copies(bases: list[UOp]) -> tuple[tuple[tuple[int, int], ...], dict[UOp, int]]:
  """Given the buffer each output's value lands in: the kernels write each buffer into its first
  output, and every later output of the same buffer is copied from that one. Returns the
  copies (output, source output) and buffer -> the output the kernels write."""
  written: dict[UOp, int] = {}
  copies = []
  for i, b in enumerate(bases):
    if b in written: copies.append((i, written[b]))
    else: written[b] = i
  return tuple(copies), written


def _realized(u: UOp) -> UOp:
  """A captured value as a realized, row-major CPU buffer (a view of one)."""
  if isinstance(u.device, tuple):
    raise ExportError(f"a captured tensor lives on several devices {u.device}; export a "
                      "function whose weights are on one device")
  if u.device == EXPORT_DEVICE and is_plain_buffer(u): return u  # a realized weight: as it is
  t = Tensor._from_uop(u, u.device or EXPORT_DEVICE).to(EXPORT_DEVICE).contiguous()
  return t.realize().uop


def _base(u: UOp) -> UOp:
  b = buffer_base(u)
  assert b is not None, f"expected a buffer view, got {u.op}"
  return b


def _place_intermediates(launches: tuple[Entry, ...], slots: dict[int, Slot]) -> dict[DType, int]:
  """Give every intermediate slot its offset in a scratch array of its dtype (one memory plan
  per dtype, so each array is only ever accessed through its own type); updates `slots`."""
  uses: dict[int, list[int]] = {}
  for i, launch in enumerate(launches):
    for s in launch.slots:
      if slots[s].category is Category.INTERMEDIATE: uses.setdefault(s, [i, i])[1] = i
  scratch: dict[DType, int] = {}
  for dt in dict.fromkeys(slots[s].dtype for s in uses):
    group = [s for s in uses if slots[s].dtype == dt]
    mem = plan_memory([Lifetime(*uses[s], slots[s].size * dt.itemsize) for s in group])
    for s, off in zip(group, mem.offsets): slots[s] = replace(slots[s], offset=off // dt.itemsize)
    scratch[dt] = mem.size // dt.itemsize
  return scratch
