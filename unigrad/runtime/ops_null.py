"""The NULL device: the whole pipeline up to launch, with no memory and no execution.

Its allocator hands out size-only handles and counts live and peak bytes (for memory-planning
tests); its compiler returns the source bytes; its programs do nothing when called.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Allocator, Compiled, Compiler

__all__ = ["NullDevice", "NullAllocator", "NullCompiler", "NullProgram", "NullHandle"]


@dataclass(frozen=True, eq=False)
class NullHandle:
  """A pretend allocation: only its size (and offset into its base) are real."""
  nbytes: int
  offset: int = 0


class NullAllocator(Allocator):
  """Allocates nothing; `live_bytes` and `peak_bytes` count what real memory would be in use.
  Copies do nothing: `copyout` leaves the destination unchanged."""

  def __init__(self) -> None:
    self.live_bytes = self.peak_bytes = 0

  def _alloc(self, nbytes: int) -> NullHandle:
    self.live_bytes += nbytes
    self.peak_bytes = max(self.peak_bytes, self.live_bytes)
    return NullHandle(nbytes)

  def _free(self, handle: Any, nbytes: int) -> None: self.live_bytes -= nbytes

  def copyin(self, handle: Any, src: memoryview) -> None: pass

  def copyout(self, dst: memoryview, handle: Any) -> None: pass

  def offset(self, handle: Any, byte_offset: int, nbytes: int) -> NullHandle:
    return NullHandle(nbytes, handle.offset + byte_offset)


class NullCompiler(Compiler):
  """The identity compiler: the "binary" is the UTF-8 source."""

  def compile(self, src: str) -> bytes: return src.encode()


class NullProgram:
  """A kernel that does nothing; timed launches take 0 seconds."""

  def __init__(self, name: str, lib: bytes) -> None:
    self.name, self.lib = name, lib

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    return 0.0 if wait else None


class NullDevice(Compiled):
  """Runs the pipeline, not the kernels."""

  def __init__(self, name: str = "NULL") -> None:
    super().__init__(name, NullAllocator(), NullCompiler(), NullProgram, CRenderer("NULL"))
