"""The engine: runs what the schedule and codegen produce.

Modules, each one job (the state each owns, one object per concern, is named in its docstring):
  entry       realize / schedule: graph nodes -> callify -> schedule cache -> command buffer
  buffers     BUFFER node -> device Buffer; the lock every entry point holds
  history     the graphs that computed realized values, stale after a write (autograd)
  commands    the command buffer: the LINEAR of CALLs with its memory plan (the one form of work)
  programs    the program cache: kernel AST -> PROGRAM(LINEAR, SOURCE, BINARY), loaded
  execute     runs a command buffer (native batches, copies, timing, capture recording)
  capture     what a TinyJit capture records; jit: a capture joined and replayed
  compcache   schedules and rendered kernels kept on disk across processes
  recompiles  why a graph missed the schedule cache; a warning when one keeps missing it
  interrupts  Ctrl-C deferred across a run; profile: the profiler's records
This package's namespace is the engine's interface for the layers above (frontend, nn, export).
"""
from unigrad.engine.buffers import (buffer_from, buffer_of, buffer_with_data, buffers,
                                    is_buffer_view, is_realized, new_buffer, realize_lock)
from unigrad.engine.capture import CaptureError, capturing
from unigrad.engine.entry import copyout, realize, schedule, schedule_with_vars
from unigrad.engine.history import history
from unigrad.engine.programs import get_runner, renderer_for

mark_written = history.mark_written
with_history = history.with_history

__all__ = ["buffer_from", "buffer_of", "buffer_with_data", "buffers", "is_buffer_view",
           "is_realized", "new_buffer", "realize_lock", "CaptureError", "capturing", "copyout",
           "realize", "schedule", "schedule_with_vars", "history", "mark_written", "with_history",
           "get_runner", "renderer_for"]
