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
import threading
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

  def record(self, commands: CommandBuffer, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
    self.runs.append(CapturedRun(commands, bufs))
    self.intermediates.update(dict.fromkeys(bufs[s] for s in commands.inter))
    self.var_vals.update(var_vals)


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
