"""What a TinyJit capture records of the runs inside it, and the calling thread's active capture.

While a capture is active, every command buffer the thread runs (engine/execute.py) is recorded
with the Buffer of each of its slots; engine/jit.py joins the runs into one command buffer that a
replay runs. A capture also keeps the buffers whose contents a replay must refill first (random
number streams), the variable values the runs used, the buffers its assigns write and the lazy
values made before it (the frontend's writes read these two). A capture lives from the start to
the end of one TinyJit capture call; each thread has its own stack (`capturing`).
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from unigrad.engine.commands import CommandBuffer
from unigrad.runtime.device import Buffer
from unigrad.uop import UOp

__all__ = ["CapturedRun", "Capture", "CaptureStack", "CaptureError", "capturing", "capture",
           "is_capturing", "outside_capture"]


@dataclass
class CapturedRun:
  """One run inside a capture: its command buffer and the Buffer of every slot (arguments, then
  the intermediates' arena views)."""
  commands: CommandBuffer
  bufs: list[Buffer]


class Capture:
  """See the module docstring."""

  def __init__(self) -> None:
    self.runs: list[CapturedRun] = []
    self.intermediates: dict[Buffer, None] = {}  # the runs' arena views (dead after their run)
    self.refills: list[tuple[Buffer, Callable[[], bytes]]] = []
    self.var_vals: dict[str, int] = {}
    self.written: dict[UOp, None] = {}  # the buffers the captured assigns write (frontend/writes)
    self.before: dict[UOp, None] = {}  # the lazy values that were live when the capture began
    self.fresh: dict[Buffer, None] = {}  # the Buffers made during the capture (engine/buffers.py)
    self.uploaded: dict[Buffer, None] = {}  # ... given contents from the host, not by a run
    self.uses: Counter[Buffer] = Counter()  # each Buffer's slots in the runs
    self.released: dict[Buffer, None] = {}  # fresh Buffers found dead, their memory given back

  def record(self, commands: CommandBuffer, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
    self.runs.append(CapturedRun(commands, bufs))
    self.intermediates.update(dict.fromkeys(bufs[s] for s in commands.inter))
    self.var_vals.update(var_vals)
    self.uses.update(bufs)
    # the memory of what no later run can read goes back now (the capture keeps the Buffers, to
    # know their sizes, to the end: a 1000-token prefill's per-layer buffers, 2 GB, were all
    # resident at once); the run's own arena goes back in Executor.run
    for buf in self._dead(skip=self.released):
      buf.deallocate()
      self.released[buf] = None

  def _dead(self, skip: dict[Buffer, None] | set[Buffer]) -> list[Buffer]:
    """The fresh Buffers not in `skip` and not uploaded that only the capture references."""
    dead = []
    for b in self.fresh:
      if b in skip or b in self.uploaded: continue
      # the references counted: each run's slot list, `uses`, `fresh`, `released` once released,
      # `b` and getrefcount's own argument
      if sys.getrefcount(b) == self.uses[b] + 4 + (b in self.released): dead.append(b)
    return dead

  def dead_buffers(self, keep: set[Buffer]) -> dict[Buffer, None]:
    """The Buffers made during the capture and written by its runs (not uploaded), not in `keep`,
    that nothing but the capture references any more: no graph node maps them, so no tensor can
    read them after the call. They are the captured program's own intermediates (a prefill's
    per-layer activations, realized one layer at a time), placed in its arena by lifetime instead
    of each kept for good. Told by reference counts: anything else holding a Buffer (a node, a
    cache) keeps it out, so an error can only keep a buffer, never free one still in use."""
    return dict.fromkeys([*self.released, *self._dead(skip={*keep, *self.released})])


class CaptureStack(threading.local):
  """The calling thread's active capture (at most one): a capture records only its own thread's
  runs, and another thread may realize and read values meanwhile."""

  def __init__(self) -> None: self.stack: list[Capture] = []
  def __bool__(self) -> bool: return bool(self.stack)
  def __getitem__(self, i: int) -> Capture: return self.stack[i]
  def append(self, cap: Capture) -> None: self.stack.append(cap)
  def pop(self) -> Capture: return self.stack.pop()


capturing = CaptureStack()


class CaptureError(RuntimeError):
  """Something happened inside a TinyJit capture that a replay could not repeat."""


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
  """Record the runs made inside the block (no nesting: an inner capture is an error)."""
  if capturing: raise RuntimeError("a TinyJit capture is already active")
  cap = Capture()
  capturing.append(cap)
  try: yield cap
  finally: capturing.pop()


def is_capturing() -> bool: return bool(capturing)


@contextlib.contextmanager
def outside_capture() -> Iterator[None]:
  """A block whose runs the active capture (if any) does not record."""
  cap = capturing.pop() if capturing else None
  try: yield
  finally:
    if cap is not None: capturing.append(cap)
