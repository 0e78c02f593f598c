"""JIT: capture the command buffer a function runs, then replay it with new input buffers.

`capture()` records every launch that `run_linear` makes while it is active (engine/realize.py:
`Capture`), and the buffers whose contents must be refilled before each replay (the random
number streams' (key, counter) pairs). `CapturedProgram` turns a capture into a replayable
command buffer:
- its intermediates (the arena views of each run inside the capture) are planned again as one
  arena per device over the whole capture (schedule/memory.py);
- the positions where each input buffer is used are recorded, so a replay swaps in new buffers;
- consecutive kernel launches on a device that has native command buffers (`Compiled.batch`)
  become one batch: a replay of a CPU program is one native call however many kernels it has.
A replay runs no Python code of the captured function: no graph building, no scheduling, no
compiling. The Tensor-facing `TinyJit` is in frontend/jit.py.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from unigrad.dtype import dtypes
from unigrad.helpers import GlobalCounters
from unigrad.knobs import DEBUG, PROFILE
from unigrad.runtime.device import Batch, Buffer, Device
from unigrad.schedule.memory import Lifetime, plan_memory
from unigrad.engine.realize import (Capture, Runner, capturing, count_launch, launch_values,
                                    record_copy, record_launch)

__all__ = ["capture", "CapturedProgram", "is_capturing", "outside_capture"]


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
  """Record the launches made inside the block (no nesting: an inner capture is an error)."""
  if capturing: raise RuntimeError("a TinyJit capture is already active")
  cap = Capture()
  capturing.append(cap)
  try: yield cap
  finally: capturing.pop()


def is_capturing() -> bool: return bool(capturing)


@contextlib.contextmanager
def outside_capture() -> Iterator[None]:
  """A block whose launches the active capture (if any) does not record."""
  cap = capturing.pop() if capturing else None
  try: yield
  finally:
    if cap is not None: capturing.append(cap)


@dataclass
class ReplayLaunch:
  """One launch of a replay: a compiled kernel (None: a COPY from bufs[1] into bufs[0]), its
  buffers, device, symbolic variables (names) and their current values."""
  runner: Runner | None
  bufs: list[Buffer]
  device: str
  variables: tuple[str, ...] = ()
  vals: list[int] = field(default_factory=list)


@dataclass
class Segment:
  """Launches `start..stop` of a replay, run by one native batch (or one by one if None)."""
  start: int
  stop: int
  batch: Batch | None = None


@dataclass
class CapturedProgram:
  """A capture ready to replay (see the module docstring). `inputs` are the buffers the capture
  saw for each input; `replay(new_inputs, var_vals)` runs the same launches on the new buffers
  with new values of the symbolic variables (no kernel is compiled again: one program serves
  every value in a variable's range)."""
  launches: list[ReplayLaunch]
  inputs: list[Buffer]
  refills: list[tuple[Buffer, Callable[[], bytes]]]
  arena_bytes: int = 0
  inter_bytes: int = 0  # what the intermediates would take without sharing
  positions: list[list[tuple[int, int]]] = field(default_factory=list)
  var_vals: dict[str, int] = field(default_factory=dict)
  segments: list[Segment] = field(default_factory=list)

  @classmethod
  def from_capture(cls, cap: Capture, inputs: list[Buffer]) -> CapturedProgram:
    launches = [ReplayLaunch(c.runner, list(c.bufs), c.device, c.variables,
                             launch_values(c.variables, cap.var_vals, c.runner.name)
                             if c.runner is not None and c.variables else [])
                for c in cap.launches]
    prog = cls(launches, list(inputs), list(cap.refills))
    prog.var_vals = dict(cap.var_vals)
    prog.arena_bytes = _replan(launches, cap.intermediates)
    prog.inter_bytes = sum(b.nbytes for b in cap.intermediates)
    for b in inputs:
      prog.positions.append([(i, j) for i, lau in enumerate(launches)
                             for j, x in enumerate(lau.bufs) if x is b])
    prog.segments = _segments(launches)
    return prog

  @property
  def kernel_count(self) -> int: return sum(1 for lau in self.launches if lau.runner is not None)

  def replay(self, inputs: list[Buffer], var_vals: dict[str, int] | None = None) -> None:
    """Run the captured launches with `inputs[i]` in place of the capture's input i and the
    variables at `var_vals` (name -> value; those not given keep their last values)."""
    if var_vals and var_vals != self.var_vals: self._set_values(var_vals)
    for i, new in enumerate(inputs):
      if new is self.inputs[i]: continue
      for li, j in self.positions[i]: self._set(li, j, new.ensure_allocated())
      self.inputs[i] = new
    for buf, fill in self.refills: buf.copyin(fill())
    if DEBUG >= 2 or PROFILE: return self._run_timed()
    for seg in self.segments:
      if seg.batch is not None: seg.batch()
      else:
        for lau in self.launches[seg.start:seg.stop]: _launch(lau, False)
    GlobalCounters.kernel_count += self.kernel_count
    for lau in self.launches:
      if lau.runner is None: continue
      GlobalCounters.global_ops += lau.runner.estimates.flops
      GlobalCounters.global_mem += lau.runner.estimates.mem_bytes

  def _set(self, li: int, j: int, buf: Buffer) -> None:
    self.launches[li].bufs[j] = buf
    for seg in self.segments:
      if seg.batch is not None and seg.start <= li < seg.stop:
        seg.batch.set_arg(li - seg.start, j, buf)

  def _set_values(self, var_vals: dict[str, int]) -> None:
    self.var_vals = {**self.var_vals, **var_vals}
    for li, lau in enumerate(self.launches):
      if not lau.variables or lau.runner is None: continue
      lau.vals = launch_values(lau.variables, self.var_vals, lau.runner.name)
      seg = next(s for s in self.segments if s.start <= li < s.stop)
      if seg.batch is None: continue
      for k, v in enumerate(lau.vals): seg.batch.set_arg(li - seg.start, len(lau.bufs) + k, v)

  def _run_timed(self) -> None:
    """DEBUG >= 2 or PROFILE: each launch on its own, timed, printed and profiled like an eager
    run."""
    prof = bool(PROFILE)
    for lau in self.launches:
      st = time.perf_counter()
      t = _launch(lau, True)
      if lau.runner is None:
        if prof: record_copy(lau.bufs[1], lau.bufs[0], st)
        continue
      count_launch(lau.runner, lau.device, t)
      if prof: record_launch(lau.runner, lau.device, st, t)


def _launch(lau: ReplayLaunch, wait: bool) -> float | None:
  if lau.runner is None:
    st = time.perf_counter()
    lau.bufs[0].copyin(lau.bufs[1].copyout())
    return time.perf_counter() - st
  r = lau.runner
  return r.program(*lau.bufs, global_size=r.global_size, local_size=r.local_size, vals=lau.vals,
                   wait=wait)


def _replan(launches: list[ReplayLaunch], inter: dict[Buffer, None]) -> int:
  """Place the capture's intermediates in one arena per device by their lifetimes over the
  whole capture; rewrites the launches' buffers; returns the arena bytes."""
  uses: dict[Buffer, list[int]] = {}
  for i, lau in enumerate(launches):
    for b in lau.bufs:
      if b in inter: uses.setdefault(b, [i, i])[1] = i
  total = 0
  for dev in dict.fromkeys(b.device for b in uses):
    bufs = [b for b in uses if b.device == dev]
    plan = plan_memory([Lifetime(uses[b][0], uses[b][1], b.nbytes) for b in bufs])
    arena = Buffer(dev, max(plan.size, 1), dtypes.uint8)
    new = {b: arena.view(off, b.size, b.dtype) for b, off in zip(bufs, plan.offsets)}
    for lau in launches: lau.bufs = [new.get(b, b) for b in lau.bufs]
    total += plan.size
  return total


def _segments(launches: list[ReplayLaunch]) -> list[Segment]:
  """Runs of consecutive kernel launches on one device, each made a native batch if the device
  has them; COPYs and launches on devices without batches are segments of their own."""
  segs: list[Segment] = []
  i = 0
  while i < len(launches):
    j = i + 1
    if launches[i].runner is not None:
      while j < len(launches) and launches[j].runner is not None and \
          launches[j].device == launches[i].device: j += 1
    segs.append(_segment(launches, i, j))
    i = j
  return segs


def _segment(launches: list[ReplayLaunch], start: int, stop: int) -> Segment:
  if launches[start].runner is None: return Segment(start, stop)
  for lau in launches[start:stop]:
    for b in lau.bufs: b.ensure_allocated()
  items = [(lau.runner.program, lau.bufs, lau.runner.global_size, lau.vals)
           for lau in launches[start:stop] if lau.runner is not None]
  return Segment(start, stop, Device[launches[start].device].batch(items))
