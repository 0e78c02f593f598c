"""The PYTHON device: the reference interpreter of LINEAR programs, the meaning of every op.

Its "source" is the LINEAR's evaluable repr; a program evaluates it back and steps through the
instructions: RANGE/END loop, IF/ENDIF branch, LOAD/STORE move values in and out of buffers (held
as bytearrays), and ALU ops compute with `unigrad.uop.alu` (the same table constant folding
uses). Every result is rounded to its dtype, so it is the oracle other devices are tested against.

GPU-shaped programs (SPECIAL gidx/lidx, from a renderer that `has_local`) run one work group at a
time with its work items in lockstep: every value is a list over the group's items, IF masks
items off, a LOCAL buffer is one memory the group shares (so BARRIER needs no action), and WMMA
runs per warp of 32 consecutive items: it gathers the fragments of the warp's lanes into tiles at
the positions the PTX ISA gives for `mma.m16n8k16` (transcribed here on their own, so a test of
the TC lowering checks its index math against them), multiplies and scatters the result.
With the EMULATE knob (`EMULATE=CUDA`), the device's renderer has the CUDA renderer's launch
limits and tensor cores, so whole programs run through the GPU lowering here.
"""
from __future__ import annotations

import ctypes
import itertools
import math
import struct
from collections.abc import Sequence
from typing import Any

import unigrad.uop as uop_module
from unigrad.dtype import AddrSpace, DType, dtypes, from_bytes, to_bytes, truncate
from unigrad.knobs import EMULATE
from unigrad.renderer import PythonRenderer
from unigrad.renderer.gpu import CUDARenderer, OpenCLRenderer
from unigrad.renderer.tensor_core import TensorCore
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
    # our own printer's output; a WMMA's arg prints as its TensorCore
    self.linear: UOp = eval(lib.decode(), {**vars(uop_module), "TensorCore": TensorCore})  # noqa: S307
    self.jumps = _jump_table(self.linear.src)
    self.is_gpu = any(u.op is Ops.SPECIAL and str(u.arg)[:4] in ("gidx", "lidx")
                      for u in self.linear.src)

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    if self.is_gpu:
      local = tuple(local_size) if local_size is not None else (1,) * len(global_size)
      for gid in itertools.product(*(range(g) for g in reversed(tuple(global_size)))):
        _Group(self, bufs, vals, gid[::-1], local).run()
      return 0.0 if wait else None
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


class _Lane:
  """One work item's view of a lockstep environment (what `_eval` reads)."""

  def __init__(self, env: dict[UOp, list[Any]], j: int) -> None: self.env, self.j = env, j

  def __getitem__(self, u: UOp) -> Any: return self.env[u][self.j]


class _Group:
  """One work group of a GPU-shaped program, its work items in lockstep (module docstring)."""

  def __init__(self, prog: PythonProgram, bufs: Sequence[Any], vals: Sequence[int],
               gid: tuple[int, ...], local: tuple[int, ...]) -> None:
    self.prog, self.bufs, self.vals, self.gid = prog, bufs, vals, gid
    # work items x fastest: item j has local id (j % lx, j // lx % ly, ...)
    self.items = [lid[::-1] for lid in itertools.product(*(range(n) for n in reversed(local)))]
    self.n = len(self.items)
    self.env: dict[UOp, list[Any]] = {}

  def _uniform(self, u: UOp, active: list[bool], what: str) -> Any:
    vals = {v for v, on in zip(self.env[u], active) if on}
    if len(vals) != 1: raise RuntimeError(f"PYTHON device: {what} differs between work items")
    return vals.pop()

  def _special(self, name: str) -> list[int]:
    d = int(name[4:])
    if name.startswith("gidx"): return [self.gid[d] if d < len(self.gid) else 0] * self.n
    return [lid[d] if d < len(lid) else 0 for lid in self.items]

  def _alloc(self, u: UOp) -> list[Any]:
    if u.op is Ops.PARAM and u.arg.name is not None: return [self.vals[u.arg.slot]] * self.n
    if u.op is Ops.PARAM:
      return [_Memory(_mv(self.bufs[u.arg.slot]), u.dtype, self.prog.name, u.arg.slot)] * self.n
    def fresh() -> _Memory: return _Memory(memoryview(bytearray(u.dtype.itemsize * u.shape[0])),
                                           u.dtype)
    if u.addrspace is AddrSpace.LOCAL: return [fresh()] * self.n  # shared by the group
    return [fresh() for _ in range(self.n)]

  def run(self) -> None:
    prog, jumps, env = self.prog.linear.src, self.prog.jumps, self.env
    active, masks, pc = [True] * self.n, [], 0
    while pc < len(prog):
      u = prog[pc]
      op = u.op
      if op in (Ops.PARAM, Ops.BUFFER): env[u] = self._alloc(u)
      elif op is Ops.RANGE:
        env[u] = [0] * self.n
        if self._uniform(u.src[0], active, "a loop bound") <= 0:
          pc = jumps[pc] + 1
          continue
      elif op is Ops.END:
        r = u.src[1]
        env[r] = [env[r][0] + 1] * self.n
        if env[r][0] < self._uniform(r.src[0], active, "a loop bound"):
          pc = jumps[pc] + 1
          continue
      elif op is Ops.IF:
        now = [a and bool(c) for a, c in zip(active, env[u.src[0]])]
        if not any(now):
          pc = jumps[pc] + 1
          continue
        masks.append(active)
        active = now
      elif op is Ops.ENDIF: active = masks.pop()
      elif op is Ops.SPECIAL: env[u] = self._special(u.arg)
      elif op is Ops.BARRIER: pass  # lockstep: every item is here
      elif op is Ops.WMMA:
        if not all(active): raise RuntimeError("PYTHON device: WMMA with work items masked off")
        env[u] = wmma(u, env)
      else: env[u] = [_eval(u, _Lane(env, j), 0) if active[j] else None  # type: ignore[arg-type]
                      for j in range(self.n)]
      pc += 1


# The PTX ISA's fragment layouts of mma.m16n8k16 (.f16/.bf16 inputs, .f32 accumulators), per
# lane (groupID = lane >> 2, threadID_in_group = lane % 4) and element i: (row, column).
def _ptx_a(lane: int, i: int) -> tuple[int, int]:
  row = (lane >> 2) + (8 if i in (2, 3, 6, 7) else 0)
  return row, (lane % 4) * 2 + (i & 1) + (8 if i >= 4 else 0)


def _ptx_b(lane: int, i: int) -> tuple[int, int]:
  return (lane % 4) * 2 + (i & 1) + (8 if i >= 2 else 0), lane >> 2


def _ptx_c(lane: int, i: int) -> tuple[int, int]:
  return (lane >> 2) + (8 if i >= 2 else 0), (lane % 4) * 2 + (i & 1)


WARP = 32
MMA_SHAPES = {(16, 8, 16): (_ptx_a, _ptx_b, _ptx_c)}


def wmma(u: UOp, env: dict[UOp, list[Any]]) -> list[tuple[float, ...]]:
  """D = A @ B + C for each warp of the group (see the module docstring)."""
  tc = u.arg
  if (layout := MMA_SHAPES.get((tc.m, tc.n, tc.k))) is None:
    raise RuntimeError(f"PYTHON device: no emulation of tensor core {tc.name}")
  pos_a, pos_b, pos_c = layout
  fa, fb, fc = (env[s] for s in u.src)
  out: list[tuple[float, ...]] = [()] * len(fa)
  for w in range(0, len(fa), WARP):
    a = [[0.0] * tc.k for _ in range(tc.m)]
    b = [[0.0] * tc.n for _ in range(tc.k)]
    c = [[0.0] * tc.n for _ in range(tc.m)]
    for lane in range(WARP):
      for i, v in enumerate(fa[w + lane]): a[pos_a(lane, i)[0]][pos_a(lane, i)[1]] = v
      for i, v in enumerate(fb[w + lane]): b[pos_b(lane, i)[0]][pos_b(lane, i)[1]] = v
      for i, v in enumerate(fc[w + lane]): c[pos_c(lane, i)[0]][pos_c(lane, i)[1]] = v
    for lane in range(WARP):
      d = [math.fsum([c[r][col]] + [a[r][j] * b[j][col] for j in range(tc.k)])
           for r, col in (pos_c(lane, i) for i in range(tc.c_elems))]
      out[w + lane] = tuple(truncate(tc.dtype_out, x) for x in d)
  return out


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
  if op is Ops.STACK: return tuple(env[s] for s in u.src)
  if op is Ops.GEP: return env[u.src[0]][u.arg[0]]
  raise RuntimeError(f"PYTHON device: cannot execute {op.name}")


class PythonDevice(Compiled):
  """The reference interpreter device."""

  def __init__(self, name: str = "PYTHON") -> None:
    target = {"CUDA": CUDARenderer, "CL": OpenCLRenderer}.get(str(EMULATE.value).upper())
    renderer = PythonRenderer(target() if target is not None else None)
    super().__init__(name, PythonAllocator(), PythonCompiler(), PythonProgram, renderer)


__all__ = ["PythonDevice", "PythonProgram", "struct", "dtypes"]
