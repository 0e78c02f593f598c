"""Collectives: how the engine runs a COLLECTIVE call of the command buffer.

A COLLECTIVE (a collective between processes: all_reduce, all_gather, ...) is scheduled like a
COPY, as a call of its own, `CALL(COLLECTIVE(dst, src), dst, src)`, and launched like a kernel:
the engine asks this module for the call's `Program` once (it keeps it as the call's runner) and
launches it on the buffers' memory, so a TinyJit capture records it and a replay (or a native
command buffer of the device, `Compiled.batch`) runs it with no Python between kernels. A
captured program asks for its collectives' replay programs once (`replay_programs`): a backend
may check once per replay what it checks per collective in an eager run.

The programs come from a registered `CollectiveBackend`: `unigrad.distributed` registers its MPI
backend when `init()` runs. The engine never imports that package (it is a client tier above
it); this registry is the one place they meet.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

__all__ = ["CollectiveBackend", "CollectiveError", "register_backend", "collective_program",
           "replay_programs"]


class CollectiveError(RuntimeError):
  """A collective that cannot run: no backend initialized, a device or dtype it does not
  serve, or ranks that disagree about it."""


class CollectiveBackend(Protocol):
  """Makes the program of one COLLECTIVE call: `kernel` is `COLLECTIVE(dst, src)` over the
  call's PARAMs (their shapes are the buffers' sizes), `device` the buffers' device. The
  program is launched with (dst, src) like a one-chunk kernel, and may also be put in the
  device's native command buffer (for the CPU: a `CPUProgram` with a trampoline of its own)."""

  def program(self, kernel: UOp, device: str) -> Any: ...

  def replay_programs(self, programs: Sequence[Any]) -> list[Any]:
    """The programs a TinyJit replay runs in place of its collectives' programs (in launch
    order): a replay may check once what an eager run checks per collective."""
    ...


_backend: CollectiveBackend | None = None


def register_backend(backend: CollectiveBackend | None) -> None:
  """Make `backend` the one that runs collectives (None: none, as after shutdown)."""
  global _backend
  _backend = backend


def collective_program(kernel: UOp, device: str) -> Any:
  """The program that runs the COLLECTIVE `kernel` on `device`'s buffers."""
  if _backend is None:
    raise CollectiveError(f"a {kernel.arg.kind} collective ran before unigrad.distributed.init(): "
                          "call init() first (under mpiexec), and not after shutdown()")
  return _backend.program(kernel, device)


def replay_programs(programs: Sequence[Any]) -> list[Any]:
  """The programs a TinyJit replay runs for its collectives' `programs` (launch order)."""
  if _backend is None or not programs: return list(programs)
  return _backend.replay_programs(programs)
