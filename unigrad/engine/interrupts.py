"""Interrupts deferred across a realize: a Ctrl-C (SIGINT) that arrives while a realize writes its
buffers is delivered when the realize is done.

Why: a realize launches its kernels, then points the tensors at the buffers now holding their
values. A KeyboardInterrupt in between left the writes done and the tensors still holding their
pending `assign` graphs, so the next realize applied them again (an optimizer step twice); one
between two launches left some buffers written and others not. Inside `deferred_interrupts()` the
main thread's SIGINT handler only records the signal; leaving the outermost block restores the
previous handler and raises the signal again, so it acts (a KeyboardInterrupt by default) right
after the realize, which has either completed or, if it failed before, written nothing more.

The block covers the whole realize, scheduling and compiling included: an interrupt during a long
compile waits for the realize to finish. Only the main thread handles signals in Python: in other
threads the block does nothing. Blocks nest (a realize inside a realize): only the outermost
installs and restores the handler.
"""
from __future__ import annotations

import ctypes
import _signal  # signal's own C module: signal.signal and getsignal wrap it with enum conversions
import signal   # that cost 4-7 us a call (two swaps a realize), the C calls 0.1-0.8 us
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["deferred_interrupts"]


class InterruptDeferral:
  """The main thread's deferral: how deep the blocks are nested, whether a SIGINT arrived inside,
  and the handler to restore (None: none installed, the handler was not set from Python)."""

  def __init__(self) -> None:
    self.depth = 0
    self.pending = False
    self.previous: Any = None
    self.main = threading.main_thread().ident

  def record(self, signum: int, frame: FrameType | None) -> None: self.pending = True

  def __enter__(self) -> None:
    # the count goes up only once `record` handles SIGINT: a KeyboardInterrupt raised before
    # (the signal arriving as the block starts) leaves nothing changed, where a count raised
    # first stayed raised with no block to lower it, and no later block deferred anything
    if threading.get_ident() != self.main: return
    if self.depth == 0:
      if _signal.getsignal(_SIGINT) is None:  # installed outside Python: it cannot be restored
        self.depth += 1
        return
      self.previous = _signal.signal(_SIGINT, self.record)  # swapped in one call
    self.depth += 1

  def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
               tb: TracebackType | None) -> None:
    if threading.get_ident() != self.main: return
    self.depth -= 1
    if self.depth or self.previous is None: return
    # a SIGINT another thread took (a timer's os.kill, a pool worker's core) may be tripped and
    # not yet handled: CPython 3.11 rechecks signals only when the main thread's eval breaker is
    # recomputed, which can be long after. Handled now, `record` takes it; after the swap below,
    # the restored handler would raise it at some later, unrelated point (CI: inside pytest's
    # report hook, after the test had returned)
    _check_signals()
    # the state is cleared even if a new SIGINT raises as soon as the handler is back: a pending
    # flag left set raised a KeyboardInterrupt at some later, unrelated block's end
    try: _signal.signal(_SIGINT, self.previous)
    finally:
      self.previous = None
      pending, self.pending = self.pending, False
    if pending: signal.raise_signal(signal.SIGINT)  # the restored handler runs now


_SIGINT = int(signal.SIGINT)
_check_signals = ctypes.pythonapi.PyErr_CheckSignals  # runs tripped handlers (0.1 us)
_check_signals.argtypes, _check_signals.restype = [], ctypes.c_int
_deferral = InterruptDeferral()


def deferred_interrupts() -> InterruptDeferral:
  """A block in which the main thread's SIGINT is held back until the outermost block ends.
  `with deferred_interrupts(): run_kernels(); repoint_tensors()`"""
  return _deferral
