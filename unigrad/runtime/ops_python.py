"""The PYTHON device: the reference interpreter of LINEAR programs, the meaning of every op.

Its "source" is the LINEAR's evaluable repr; a program evaluates it back and steps through the
instructions: RANGE/END loop, IF/ENDIF branch, LOAD/STORE move values in and out of buffers (held
as bytearrays), and ALU ops compute with `unigrad.uop.alu` (the same table constant folding
uses). Every result is rounded to its dtype, so it is the oracle other devices are tested against.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import unigrad.uop as uop_module
from unigrad.dtype import DType, dtypes, from_bytes, to_bytes
from unigrad.renderer import PythonRenderer
from unigrad.runtime.device import Compiled, Compiler, LRUAllocator, OutOfBoundsError
from unigrad.uop import GroupOp, Ops, UOp
from unigrad.uop.alu import exec_alu, exec_bitcast, exec_cast


class PythonAllocator(LRUAllocator):
  """Memory as bytearrays."""

  def _alloc(self, nbytes: int) -> bytearray: return bytearray(nbytes)

  def copyin(self, handle: Any, src: memoryview) -> None: handle[:len(src)] = src

  def copyout(self, dst: memoryview, handle: Any) -> None: dst[:] = memoryview(handle)[:len(dst)]

  def as_memoryview(self, handle: Any, nbytes: int) -> memoryview:
    return memoryview(handle)[:nbytes]

  def offset(self, handle: Any, byte_offset: int, nbytes: int) -> Any:
    return memoryview(handle)[byte_offset:byte_offset + nbytes]

  def address(self, handle: Any) -> int:
    mv = memoryview(handle)
    return ctypes.addressof((ctypes.c_char * mv.nbytes).from_buffer(mv)) if mv.nbytes else 0

  def from_address(self, address: int, nbytes: int) -> Any:
    return memoryview((ctypes.c_uint8 * nbytes).from_address(address)).cast("B")


class PythonCompiler(Compiler):
  """The program text is the binary."""

  def compile(self, src: str) -> bytes: return src.encode()


class _Memory:
  """A buffer viewed as elements of one dtype; `kernel` and `slot` name it in bounds errors."""

  def __init__(self, mv: memoryview, dt: DType, kernel: str = "", slot: int = -1) -> None:
    self.mv, self.dt, self.kernel, self.slot = mv, dt, kernel, slot
    self.size = len(mv) // dt.itemsize

  def load(self, i: int) -> Any:
    if not 0 <= i < self.size: raise OutOfBoundsError(self.kernel, self.slot, i, self.size, False)
    it = self.dt.itemsize
    return from_bytes(self.dt, self.mv[i * it:(i + 1) * it])[0]

  def store(self, i: int, v: Any) -> None:
    if not 0 <= i < self.size: raise OutOfBoundsError(self.kernel, self.slot, i, self.size, True)
    it = self.dt.itemsize
    self.mv[i * it:(i + 1) * it] = to_bytes(self.dt, [v])


class PythonProgram:
  """Interprets a LINEAR program (see the module docstring)."""

  def __init__(self, name: str, lib: bytes) -> None:
    self.name = name
    self.linear: UOp = eval(lib.decode(), vars(uop_module))  # noqa: S307 (our own printer's output)
    self.jumps = _jump_table(self.linear.src)

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    for core_id in range(global_size[0]): self._run(bufs, vals, core_id)
    return 0.0 if wait else None

  def _run(self, bufs: Sequence[Any], vals: Sequence[int], core_id: int) -> None:
    prog = self.linear.src
    env: dict[UOp, Any] = {}
    pc = 0
    while pc < len(prog):
      u = prog[pc]
      op = u.op
      if op is Ops.PARAM:
        if u.arg.name is not None: env[u] = vals[u.arg.slot]  # slots: see finalize_kernel
        else: env[u] = _Memory(_mv(bufs[u.arg.slot]), u.dtype, self.name, u.arg.slot)
      elif op is Ops.BUFFER:
        env[u] = _Memory(memoryview(bytearray(u.dtype.itemsize * u.shape[0])), u.dtype)
      elif op is Ops.RANGE:
        env[u] = 0
        if env[u.src[0]] <= 0:
          pc = self.jumps[pc] + 1
          continue
      elif op is Ops.END:
        r = u.src[1]
        env[r] += 1
        if env[r] < env[r.src[0]]:
          pc = self.jumps[pc] + 1
          continue
      elif op is Ops.IF:
        if not env[u.src[0]]:
          pc = self.jumps[pc] + 1
          continue
      elif op is Ops.ENDIF: pass
      else: env[u] = _eval(u, env, core_id)
      pc += 1


def _mv(b: Any) -> memoryview:
  return b.as_memoryview() if hasattr(b, "as_memoryview") else memoryview(b)


def _jump_table(prog: tuple[UOp, ...]) -> dict[int, int]:
  """RANGE <-> its END, IF -> its ENDIF (indices into the program)."""
  jumps: dict[int, int] = {}
  pos = {u: i for i, u in enumerate(prog)}
  for i, u in enumerate(prog):
    if u.op is Ops.END:
      start = pos[u.src[1]]
      jumps[i], jumps[start] = start, i
    elif u.op is Ops.ENDIF: jumps[pos[u.src[0]]] = i
  return jumps


def _eval(u: UOp, env: dict[UOp, Any], core_id: int) -> Any:
  op = u.op
  if op is Ops.CONST: return u.arg
  if op is Ops.AFTER: return env[u.src[0]]
  if op is Ops.INDEX: return (env[u.src[0]], env[u.src[1]])
  if op is Ops.LOAD:
    mem, i = env[u.src[0]]
    if len(u.src) == 3 and not env[u.src[2]]: return env[u.src[1]]
    return mem.load(i)
  if op is Ops.STORE:
    if len(u.src) == 3 and not env[u.src[2]]: return None
    mem, i = env[u.src[0]]
    mem.store(i, env[u.src[1]])
    return None
  if op is Ops.CAST: return exec_cast(env[u.src[0]], u.src[0].dtype, u.dtype)
  if op is Ops.BITCAST: return exec_bitcast(env[u.src[0]], u.src[0].dtype, u.dtype)
  if op in GroupOp.ALU: return exec_alu(op, u.dtype, tuple(env[s] for s in u.src))
  if op is Ops.SPECIAL: return core_id
  raise RuntimeError(f"PYTHON device: cannot execute {op.name}")


class PythonDevice(Compiled):
  """The reference interpreter device."""

  def __init__(self, name: str = "PYTHON") -> None:
    super().__init__(name, PythonAllocator(), PythonCompiler(), PythonProgram, PythonRenderer())


__all__ = ["PythonDevice", "PythonProgram", "struct", "dtypes"]
