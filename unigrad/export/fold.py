"""Fold: run, once at export time, the kernels that read only constants, and embed their results.

Consumes: the launches of an export plan, the category of each slot, the constants' bytes.
Produces: the launches left to run on every call, and the constants with the folded results
added (their slots become constants).
Invariants: a kernel is folded when every buffer it reads is a constant, it writes an
intermediate, and its result is no bigger than what it reads (a broadcast stays a kernel rather
than a bigger array); it runs on the CPU device, the same compiled kernel `Tensor.realize` uses,
so the embedded bits are the ones the exported code would compute; outputs are never folded
(the caller's arrays are written on every call).
"""
from __future__ import annotations

from dataclasses import replace

from unigrad.engine.commands import Entry
from unigrad.engine.programs import get_runner
from unigrad.export.buffers import Category, Slot
from unigrad.export.trace import EXPORT_DEVICE
from unigrad.runtime.device import Buffer
from unigrad.uop import Ops, UOp

__all__ = ["fold_constants"]


def written_param(kernel: UOp) -> int:
  """The kernel parameter (position) its STORE writes."""
  stores = [u for u in kernel.toposort() if u.op is Ops.STORE]
  slots = set()
  for st in stores:
    u = st.src[0]
    while u.op is not Ops.PARAM: u = u.src[0]
    slots.add(u.arg.slot)
  assert len(slots) == 1, f"a kernel writes {len(slots)} buffers"
  return slots.pop()


def _foldable(launch: Entry, slots: dict[int, Slot]) -> int | None:
  """The slot a launch would fold into, or None."""
  if launch.ast.op is Ops.COPY: return None
  out = launch.slots[written_param(launch.ast)]
  reads = [s for s in launch.slots if s != out]
  if slots[out].category is not Category.INTERMEDIATE: return None
  if not all(slots[s].category is Category.CONSTANT for s in reads): return None
  read_bytes = sum(slots[s].size * slots[s].dtype.itemsize for s in set(reads))
  return out if slots[out].size * slots[out].dtype.itemsize <= read_bytes else None


def fold_constants(launches: tuple[Entry, ...], slots: dict[int, Slot],
                   values: dict[int, bytes]) -> tuple[list[int], dict[int, Slot], dict[int, bytes]]:
  """(indices of the launches kept, slots, constant bytes by slot) after folding."""
  slots, values = dict(slots), dict(values)
  kept: list[int] = []
  for i, launch in enumerate(launches):
    out = _foldable(launch, slots)
    if out is None:
      kept.append(i)
      continue
    bufs = [_buffer(slots[s], values.get(s)) for s in launch.slots]
    runner = get_runner(launch.ast, EXPORT_DEVICE)
    runner.program(*bufs, global_size=runner.global_size, wait=True)
    values[out] = bytes(bufs[launch.slots.index(out)].copyout())
    slots[out] = replace(slots[out], category=Category.CONSTANT)
  return kept, slots, values


def _buffer(slot: Slot, data: bytes | None) -> Buffer:
  buf = Buffer(EXPORT_DEVICE, max(slot.size, 1), slot.dtype).ensure_allocated()
  if data: buf.copyin(memoryview(data))
  return buf
