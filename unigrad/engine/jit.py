"""JIT: the runs of a capture joined into one command buffer, replayed with new input buffers.

A capture (engine/capture.py) records every command buffer the captured function ran, with the
Buffer of each slot, and the buffers whose contents must be refilled before each replay (the
random number streams' (key, counter) pairs). `CapturedProgram.from_capture` joins the runs into
one command buffer (engine/commands.py `join_runs`): every distinct buffer is a slot, the runs'
intermediates, and the buffers a run wrote that no node references after the call (Capture
.dead_buffers), are placed again as one arena per device over the whole capture, and the result
runs on the same executor as an eager run (engine/execute.py: consecutive kernels on a device with
native command buffers run as one native call). A replay puts the new input buffers in their
slots and runs it: no graph building, no scheduling, no compiling, no Python code of the captured
function. The Tensor-facing `TinyJit` is in frontend/jit.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from unigrad.engine.capture import (Capture, capture, is_capturing,  # noqa: F401 (re-exported)
                                    outside_capture)
from unigrad.engine.commands import CommandBuffer, Entry, join_runs
from unigrad.engine.entry import realizer
from unigrad.engine.execute import Executor
from unigrad.runtime.device import Buffer, Device

__all__ = ["capture", "CapturedProgram", "is_capturing", "outside_capture"]


@dataclass
class CapturedProgram:
  """A capture ready to replay (see the module docstring). `inputs` are the buffers the capture
  saw for each input; `replay(new_inputs, var_vals)` runs the same launches on the new buffers
  with new values of the symbolic variables (no kernel is compiled again: one program serves
  every value in a variable's range)."""
  commands: CommandBuffer
  executor: Executor
  args: list[Buffer]  # the Buffer of each argument slot of `commands`
  inputs: list[Buffer]
  input_slots: list[int]  # each input's slot (-1: no launch reads it)
  refills: list[tuple[Buffer, Callable[[], bytes]]]
  arenas: dict[str | None, Buffer] = field(default_factory=dict)
  var_vals: dict[str, int] = field(default_factory=dict)

  @classmethod
  def from_capture(cls, cap: Capture, inputs: list[Buffer]) -> CapturedProgram:
    realizer.release()  # the last realize's graph, pinned for an eager loop, may read them
    keep = {*inputs, *(b for b, _ in cap.refills)}
    cb, args = join_runs([(r.commands, r.bufs) for r in cap.runs],
                         {**cap.intermediates, **cap.dead_buffers(keep)})
    fallback = Device.canonicalize(args[0].device if args else Device.DEFAULT)
    ex = Executor(cb, fallback, replay=True)
    slot = {b: i for i, b in enumerate(args)}
    prog = cls(cb, ex, args, list(inputs), [slot.get(b, -1) for b in inputs], list(cap.refills),
               ex.arenas(), dict(cap.var_vals))
    return prog

  @property
  def launches(self) -> tuple[Entry, ...]: return self.commands.entries

  @property
  def kernel_count(self) -> int: return self.executor.kernels

  @property
  def arena_bytes(self) -> int: return sum(self.commands.arenas.values())

  @property
  def inter_bytes(self) -> int: return self.commands.inter_bytes

  def replay(self, inputs: list[Buffer], var_vals: dict[str, int] | None = None) -> None:
    """Run the captured launches with `inputs[i]` in place of the capture's input i and the
    variables at `var_vals` (name -> value; those not given keep their last values)."""
    if var_vals: self.var_vals = {**self.var_vals, **var_vals}
    for i, new in enumerate(inputs):
      if new is self.inputs[i]: continue
      self.inputs[i] = new
      if (s := self.input_slots[i]) >= 0: self.args[s] = new
    for buf, fill in self.refills: buf.copyin(fill())
    self.executor.run(self.args, self.var_vals, self.arenas)
