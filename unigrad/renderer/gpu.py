"""GPU dialects of the C renderer: OpenCL C and CUDA C from the same LINEAR.

Both share the C renderer's expressions (integer wrapping guards, float16/bfloat16 stored as 16
bits and computed in float, helpers for division and max) and differ in what a GPU adds:
- the thread indices: SPECIAL `gidx<d>` / `lidx<d>` (codegen/gpudims.py) are the work group and
  work item ids (`get_group_id(d)` / `blockIdx.x`, `get_local_id(d)` / `threadIdx.x`);
- LOCAL memory: a BUFFER in the LOCAL address space is declared once at kernel scope
  (`__local` / `__shared__`); BARRIER is `barrier(CLK_LOCAL_MEM_FENCE)` / `__syncthreads()`;
- the kernel signature, helper qualifiers, builtins, bit casts and infinities of each dialect.

ABI. OpenCL: `__kernel void name(__global uchar* data0_base, ulong data0_off, ..., int var0, ...)`:
each buffer is its memory object and a byte offset into it (sub-buffers need aligned offsets,
the memory planner's views do not have them). CUDA: `extern "C" __global__ void name(T* data0,
..., int var0, ...)` with raw device pointers.
Values are scalars: these renderers declare no vector registers (`vector_bytes=0`), so UPCAST
axes become unrolled scalar code.
"""
from __future__ import annotations

import math
import re

from unigrad.dtype import FP8S, AddrSpace, DType, dtypes
from unigrad.renderer.cstyle import C_TYPES, PRELUDE, STORAGE, CRenderer, _State
from unigrad.uop import Ops, UOp

__all__ = ["GPURenderer", "OpenCLRenderer", "CUDARenderer"]

# OpenCL C spells some C types differently (and reserves `long long`)
OPENCL_TYPES = ((r"\bunsigned long long\b", "ulong"), (r"\blong long\b", "long"),
                (r"\bunsigned char\b", "uchar"), (r"\bsigned char\b", "char"),
                (r"\bunsigned short\b", "ushort"), (r"\bunsigned int\b", "uint"),
                (r"\b_Bool\b", "bool"), (r"(\d)ULL\b", r"\1UL"), (r"(\d)LL\b", r"\1L"))
CUDA_TYPES = ((r"\b_Bool\b", "bool"),)
BITCAST_OPENCL = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int32: "int",
                  dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong",
                  dtypes.int16: "short", dtypes.uint16: "ushort", dtypes.float16: "ushort",
                  dtypes.bfloat16: "ushort", dtypes.int8: "char", dtypes.uint8: "uchar",
                  dtypes.bool: "uchar", **{dt: "uchar" for dt in FP8S}}
# the unsigned type of the same size, for bit patterns of special floats
BITS = {dtypes.float64: dtypes.uint64, dtypes.float32: dtypes.uint32}

UNSIGNED = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


def translate_types(src: str, table: tuple[tuple[str, str], ...]) -> str:
  """C type names (and integer literal suffixes) rewritten into a dialect's."""
  for pattern, repl in table: src = re.sub(pattern, repl, src)
  return src



def _variable_decl(p: UOp, st: _State) -> str:
  """A symbolic variable's kernel parameter: the runtimes pass integer variables as 32-bit int
  (as the CPU ABI does); the kernel widens them where used."""
  return f"{'int' if dtypes.is_int(p.dtype) else C_TYPES[p.dtype]} {st.names[p]}"

class GPURenderer(CRenderer):
  """The C renderer with GPU thread indices, LOCAL memory and barriers; dialects subclass it."""
  fn_qualifier = "static inline"
  conversion_attr = ""  # GPU compilers inline the fp8 conversions
  type_table: tuple[tuple[str, str], ...] = ()
  barrier = ""  # the statement that waits for every work item of the group
  local_fmt = ""  # the declaration of a LOCAL array: {ct} {name}[{size}]
  group_id = local_id = ""

  def __init__(self, device: str, global_max: tuple[int, ...], local_max: int,
               shared_bytes: int) -> None:
    super().__init__(device)
    object.__setattr__(self, "has_threads", False)
    for k, v in (("has_local", True), ("global_max", global_max), ("local_max", local_max),
                 ("shared_bytes", shared_bytes)):
      object.__setattr__(self, k, v)

  # ---- the whole kernel ----

  def render(self, name: str, linear: UOp) -> str:
    st = _State()
    uses: dict[UOp, int] = {}
    for u in linear.src:
      for s in u.src: uses[s] = uses.get(s, 0) + 1
    params = sorted((u for u in linear.src if u.op is Ops.PARAM),
                    key=lambda p: (p.arg.name is not None, p.arg.slot))
    for u in linear.src: self._node(st, u, uses)
    helpers = "\n".join(h.replace("static inline", self.fn_qualifier) for h in st.helpers.values())
    prelude = PRELUDE.replace("#include <stdint.h>", "typedef unsigned int uint32_t;")
    prelude = prelude.replace("static inline", self.fn_qualifier)
    src = self.kernel(name, [self._param_decl(p, st) for p in params], st.lines, params, st)
    return translate_types(f"{self.preamble()}{prelude}{helpers}\n{src}", self.type_table)

  def preamble(self) -> str: return ""

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: _State) -> str:
    body = "\n".join(lines)
    return f"void {name}({', '.join(args)}) {{\n{body}\n}}\n"

  # ---- nodes a GPU renders its own way ----

  def _node(self, st: _State, u: UOp, uses: dict[UOp, int]) -> None:
    if u.op is Ops.SPECIAL: self._special(st, u)
    elif u.op is Ops.BARRIER: st.emit(f"{self.barrier};")
    elif u.op is Ops.BUFFER and u.addrspace is AddrSpace.LOCAL:
      st.names[u] = st.fresh("smem")
      decl = self.local_fmt.format(ct=STORAGE[u.dtype], name=st.names[u], size=u.shape[0])
      st.lines.insert(0, f"  {decl};")
    elif u.op is Ops.CONST and dtypes.is_float(u.dtype) and not math.isfinite(float(u.arg)):
      st.names[u] = self.special_float(float(u.arg), u.dtype)
    else: super()._node(st, u, uses)

  def _special(self, st: _State, u: UOp) -> None:
    name, dim = u.arg[:4], int(u.arg[4:])
    fn = self.group_id if name == "gidx" else self.local_id
    st.names[u] = u.arg
    ct = C_TYPES[u.dtype]
    st.emit(f"{ct} {u.arg} = ({ct}){fn.format(dim=dim, xyz='xyz'[dim])};")

  def special_float(self, v: float, dt: DType) -> str:
    """An infinity or NaN of `dt` (C's __builtin_inff and __builtin_nanf are no GPU builtins)."""
    reg = dtypes.float64 if dt == dtypes.float64 else dtypes.float32  # halves compute in float
    bits = {dtypes.float64: ("0x7ff8000000000000", "0x7ff0000000000000")}.get(
      reg, ("0x7fc00000", "0x7f800000"))[0 if math.isnan(v) else 1]
    return f"{'-' if v < 0 else ''}{self._bitcast(_State(), BITS[reg], reg, bits)}"

  def _alu(self, st: _State, u: UOp, s: list[str]) -> str:
    op, dt = u.op, u.dtype
    f = "" if dt == dtypes.float64 else "f"
    if op is Ops.MULACC: return f"{self.math_fn('fma', f)}({s[0]}, {s[1]}, {s[2]})"
    if op is Ops.TRUNC: return f"{self.math_fn('trunc', f)}({s[0]})"
    if op is Ops.SQRT: return f"{self.math_fn('sqrt', f)}({s[0]})"
    return super()._alu(st, u, s)

  def math_fn(self, name: str, suffix: str) -> str: return name


class OpenCLRenderer(GPURenderer):
  """OpenCL C 1.2 (what PoCL and every GPU vendor compile)."""
  fn_qualifier = "static inline"
  type_table = OPENCL_TYPES
  barrier = "barrier(CLK_LOCAL_MEM_FENCE)"
  local_fmt = "__local {ct} {name}[{size}]"
  group_id, local_id = "get_group_id({dim})", "get_local_id({dim})"

  def __init__(self, device: str = "CL", global_max: tuple[int, ...] = (2 ** 31 - 1,) * 3,
               local_max: int = 256, shared_bytes: int = 32768) -> None:
    super().__init__(device, global_max, local_max, shared_bytes)

  def preamble(self) -> str: return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: _State) -> str:
    rebase = [f"  __global {STORAGE[p.dtype]}* restrict {st.names[p]} = "
              f"(__global {STORAGE[p.dtype]}*)({st.names[p]}_base + {st.names[p]}_off);"
              for p in params if p.arg.name is None]
    body = "\n".join(rebase + lines)
    return f"__kernel void {name}({', '.join(args)}) {{\n{body}\n}}\n"

  def _param_decl(self, p: UOp, st: _State) -> str:
    if p.arg.name is not None: return _variable_decl(p, st)
    return f"__global uchar* {st.names[p]}_base, ulong {st.names[p]}_off"


  def _bitcast(self, st: _State, src: DType, dst: DType, v: str) -> str:
    sv = self._to_storage(st, src, v)
    if dst == dtypes.bool: return f"((bool){sv})"
    # C promotes narrow operands to int: the value back in its own type first
    sv = f"(({BITCAST_OPENCL[src]}){sv})"
    if src.itemsize != dst.itemsize:  # the low bytes, as the C renderer's memcpy takes them
      sv = f"(({UNSIGNED[dst.itemsize]})as_{UNSIGNED[src.itemsize]}({sv}))"
    return self._from_storage(st, dst, f"as_{BITCAST_OPENCL[dst]}({sv})")


class CUDARenderer(GPURenderer):
  """CUDA C++ for NVRTC and nvcc."""
  fn_qualifier = "__device__ static inline"
  type_table = CUDA_TYPES
  barrier = "__syncthreads()"
  local_fmt = "__shared__ {ct} {name}[{size}]"
  group_id, local_id = "blockIdx.{xyz}", "threadIdx.{xyz}"

  def __init__(self, device: str = "CUDA",
               global_max: tuple[int, ...] = (2 ** 31 - 1, 65535, 65535), local_max: int = 1024,
               shared_bytes: int = 49152) -> None:
    super().__init__(device, global_max, local_max, shared_bytes)

  def preamble(self) -> str:
    return ("template <class T, class S> __device__ static inline T __bitcast(S s) {\n"
            "  T d; memcpy(&d, &s, sizeof(d)); return d; }\n")

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: _State) -> str:
    body = "\n".join(lines)
    return f'extern "C" __global__ void {name}({", ".join(args)}) {{\n{body}\n}}\n'

  def _param_decl(self, p: UOp, st: _State) -> str:
    if p.arg.name is not None: return _variable_decl(p, st)
    return f"{STORAGE[p.dtype]}* __restrict__ {st.names[p]}"


  def math_fn(self, name: str, suffix: str) -> str: return name + suffix

  def _bitcast(self, st: _State, src: DType, dst: DType, v: str) -> str:
    sv = self._to_storage(st, src, v)
    if dst == dtypes.bool: return f"((bool){sv})"
    return self._from_storage(st, dst, f"__bitcast<{STORAGE[dst]}>({sv})")
