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
axes become unrolled scalar code; memory moves up to 4 elements at once (`access_lanes`,
codegen/coalesce.py): `float4` loads and stores (OpenCL `vload4`/`vstore4`, which need only
element alignment; CUDA `*(float4*)`, which needs a 16-byte aligned address, so the CUDA renderer
declares `access_aligned` and checks the buffer's address, uniform over the threads), read lane
by lane (`v.s0` / `v.x`).
Half types: OpenCL keeps float16/bfloat16 as 16-bit integers in memory and float in registers
(arithmetic on `half` needs `cl_khr_fp16`, which PoCL does not report); float16 converts with the
core builtins vload_half/vstore_half_rte, bfloat16 in software (the C renderer's emulation).
CUDA stores them as `half` and `__nv_bfloat16` (cuda_fp16.h, cuda_bf16.h) and converts with the
hardware's instructions, computing in float with each op rounded back to 16 bits (as every other
device does); tensor cores read the 16-bit values directly (WMMA, below).
"""
from __future__ import annotations

import math
import re

from unigrad.dtype import FP8S, AddrSpace, DType, dtypes
from unigrad.renderer.cstyle import (C_TYPES, PORTABLE_PRELUDE, STORAGE, CRenderer, RenderState,
                                      uses_and_params)
from unigrad.renderer.tensor_core import MMA_M16N8K16, TensorCore
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
OPENCL_HALF = """\
static inline float __h2f(ushort h) { return vload_half(0, (const half*)&h); }
static inline ushort __f2h(float f) {
  ushort h; vstore_half_rte(f, 0, (half*)&h);
  return (h & 0x7fff) > 0x7c00 ? (ushort)((h & 0x8000) | 0x7e00) : h; }
"""  # NaNs as the canonical quiet NaN (as every other device writes them)
VECTOR_NAMES = {dtypes.float32: "float", dtypes.int32: "int", dtypes.uint32: "uint"}
HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)  # CUDA stores these natively
CUDA_STORAGE = {**STORAGE, dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}
CUDA_INCLUDES = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
CUDA_PRELUDE = """\
typedef unsigned int uint32_t;
typedef union { float f; uint32_t u; } __fu;
__device__ static inline float __h2f(half h) { return __half2float(h); }
__device__ static inline half __f2h(float f) { return __float2half_rn(f); }
__device__ static inline float __bf2f(__nv_bfloat16 b) { return __bfloat162float(b); }
__device__ static inline __nv_bfloat16 __f2bf(float f) { return __float2bfloat16_rn(f); }
__device__ static inline float __rh(float f) { return __half2float(__float2half_rn(f)); }
__device__ static inline float __rbf(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }
"""


def translate_types(src: str, table: tuple[tuple[str, str], ...]) -> str:
  """C type names (and integer literal suffixes) rewritten into a dialect's."""
  for pattern, repl in table: src = re.sub(pattern, repl, src)
  return src



def _variable_decl(p: UOp, st: RenderState) -> str:
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
  storage = STORAGE  # the C type of each dtype in memory

  def __init__(self, device: str, global_max: tuple[int, ...], local_max: int,
               shared_bytes: int) -> None:
    super().__init__(device)
    object.__setattr__(self, "has_threads", False)
    for k, v in (("has_local", True), ("global_max", global_max), ("local_max", local_max),
                 ("shared_bytes", shared_bytes)):
      object.__setattr__(self, k, v)

  # ---- the whole kernel ----

  def render(self, name: str, linear: UOp) -> str:
    st, (uses, params) = RenderState(), uses_and_params(linear)
    for u in linear.src: self._node(st, u, uses)
    helpers = "\n".join(h.replace("static inline", self.fn_qualifier) for h in st.helpers.values())
    src = self.kernel(name, [self._param_decl(p, st) for p in params], st.lines, params, st)
    head = f"{self.preamble(linear)}{self.prelude(linear)}"
    return translate_types(f"{head}{helpers}\n{src}", self.type_table)

  def preamble(self, linear: UOp) -> str: return ""

  def prelude(self, linear: UOp) -> str:
    """The C renderer's helpers (software float16/bfloat16 conversions) in this dialect."""
    prelude = PORTABLE_PRELUDE.replace("#include <stdint.h>", "typedef unsigned int uint32_t;")
    return prelude.replace("static inline", self.fn_qualifier)

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: RenderState) -> str:
    body = "\n".join(lines)
    return f"void {name}({', '.join(args)}) {{\n{body}\n}}\n"

  # ---- nodes a GPU renders its own way ----

  def _node(self, st: RenderState, u: UOp, uses: dict[UOp, int]) -> None:
    if u.op is Ops.SPECIAL: self._special(st, u)
    elif u.op is Ops.BARRIER: st.emit(f"{self.barrier};")
    elif u.op is Ops.BUFFER and u.addrspace is AddrSpace.LOCAL:
      st.names[u] = st.fresh("smem")
      decl = self.local_fmt.format(ct=self.storage[u.dtype], name=st.names[u], size=u.shape[0])
      st.lines.insert(0, f"  {decl};")
    elif u.op is Ops.BUFFER and u.dtype.count == 1:
      st.names[u] = st.fresh("acc")
      st.emit(f"{self.storage[u.dtype]} {st.names[u]}[{u.shape[0]}];")
    elif u.op is Ops.CONST and dtypes.is_float(u.dtype) and not math.isfinite(float(u.arg)):
      st.names[u] = self.special_float(float(u.arg), u.dtype)
    elif u.op is Ops.WMMA: self._wmma(st, u)
    elif u.op is Ops.GEP and u.src[0].dtype.count > 1:
      st.names[u] = self.lane(st.names[u.src[0]], u.arg[0])
    elif u.op is Ops.LOAD and u.dtype.count > 1: self._vector_load(st, u)
    elif u.op is Ops.STORE and u.src[1].dtype.count > 1:
      ix = u.src[0]
      st.emit(self.vector_store(u.src[1].dtype, st.names[ix], st.names[u.src[1]],
                                st.names[ix.src[0]]))
    elif u.op is Ops.STACK and u.src[0].dtype in HALF_FLOATS:
      st.names[u] = ""  # a WMMA operand: its WMMA packs the lanes into registers
    elif u.op is Ops.STACK and u.src[0].dtype in VECTOR_NAMES:
      name = st.fresh("vec")
      lanes = [st.names[x] for x in u.src]
      st.emit(f"{self.vector_type(u.dtype)} {name} = {self.vector_literal(u.dtype, lanes)};")
      st.names[u] = name
    else: super()._node(st, u, uses)

  # ---- vector memory accesses (codegen/coalesce.py) ----

  def vector_type(self, dt: DType) -> str: return f"{VECTOR_NAMES[dt.scalar()]}{dt.count}"

  def lane(self, v: str, i: int) -> str: raise NotImplementedError

  def vector_literal(self, dt: DType, lanes: list[str]) -> str: raise NotImplementedError

  def vector_load(self, dt: DType, ptr: str, base: str) -> str:
    """A vector read at `ptr` (an element of buffer `base`)."""
    raise NotImplementedError

  def vector_store(self, dt: DType, ptr: str, val: str, base: str) -> str:
    raise NotImplementedError

  def _vector_load(self, st: RenderState, u: UOp) -> None:
    ix = u.src[0]
    name, load = st.fresh("val"), self.vector_load(u.dtype, st.names[ix], st.names[ix.src[0]])
    st.emit(f"{self.vector_type(u.dtype)} {name} = {load};")
    st.names[u] = name

  def _wmma(self, st: RenderState, u: UOp) -> None:
    raise RuntimeError(f"{type(self).__name__}: this target has no tensor cores (WMMA)")

  def _special(self, st: RenderState, u: UOp) -> None:
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
    return f"{'-' if v < 0 else ''}{self._bitcast(RenderState(), BITS[reg], reg, bits)}"

  def _alu(self, st: RenderState, u: UOp, s: list[str]) -> str:
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
    object.__setattr__(self, "access_lanes", (4, 2))

  def preamble(self, linear: UOp) -> str: return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"

  def prelude(self, linear: UOp) -> str:
    """float16 converts with OpenCL's vload_half / vstore_half_rte (core OpenCL 1.2, no
    cl_khr_fp16 needed: the device's own conversions), bfloat16 in software."""
    prelude = super().prelude(linear)
    start = prelude.index("static inline float __h2f(")
    end = prelude.index("static inline float __bf2f(")
    return prelude[:start] + OPENCL_HALF + prelude[end:]

  def lane(self, v: str, i: int) -> str: return f"{v}.s{i:x}"

  def vector_literal(self, dt: DType, lanes: list[str]) -> str:
    return f"(({self.vector_type(dt)})({', '.join(lanes)}))"

  def vector_load(self, dt: DType, ptr: str, base: str) -> str: return f"vload{dt.count}(0, {ptr})"

  def vector_store(self, dt: DType, ptr: str, val: str, base: str) -> str:
    return f"vstore{dt.count}({val}, 0, {ptr});"

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: RenderState) -> str:
    rebase = [f"  __global {STORAGE[p.dtype]}* restrict {st.names[p]} = "
              f"(__global {STORAGE[p.dtype]}*)({st.names[p]}_base + {st.names[p]}_off);"
              for p in params if p.arg.name is None]
    body = "\n".join(rebase + lines)
    return f"__kernel void {name}({', '.join(args)}) {{\n{body}\n}}\n"

  def _param_decl(self, p: UOp, st: RenderState) -> str:
    if p.arg.name is not None: return _variable_decl(p, st)
    return f"__global uchar* {st.names[p]}_base, ulong {st.names[p]}_off"


  def _bitcast(self, st: RenderState, src: DType, dst: DType, v: str) -> str:
    sv = self._to_storage(st, src, v)
    if dst == dtypes.bool: return f"((bool){sv})"
    # C promotes narrow operands to int: the value back in its own type first
    sv = f"(({BITCAST_OPENCL[src]}){sv})"
    if src.itemsize != dst.itemsize:  # the low bytes, as the C renderer's memcpy takes them
      sv = f"(({UNSIGNED[dst.itemsize]})as_{UNSIGNED[src.itemsize]}({sv}))"
    return self._from_storage(st, dst, f"as_{BITCAST_OPENCL[dst]}({sv})")


def _uses_16_bit_floats(linear: UOp) -> bool:
  return any(u.dtype.scalar() in HALF_FLOATS for u in linear.src)


PTX_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}
PAIRS = {dtypes.float16: ("__half2", "__floats2half2_rn"),
         dtypes.bfloat16: ("__nv_bfloat162", "__floats2bfloat162_rn")}


def _pack_fn(st: RenderState, dt: DType) -> str:
  """A helper packing two floats as one 32-bit register of two 16-bit values."""
  pair, convert = PAIRS[dt]
  name = f"__pack_{PTX_TYPES[dt]}"
  st.helpers.setdefault(name, f"__device__ static inline unsigned {name}(float lo, float hi) {{\n"
                              f"  {pair} v = {convert}(lo, hi); return __bitcast<unsigned>(v); }}")
  return name


def _mma_fn(st: RenderState, tc: TensorCore) -> str:
  """A helper running mma.sync m16n8k16 (row-major A, column-major B, fp32 accumulators)."""
  name, t = f"__mma_{tc.name}", PTX_TYPES[tc.dtype_in]
  a = ", ".join(f"unsigned a{i}" for i in range(4))
  b = ", ".join(f"unsigned b{i}" for i in range(2))
  st.helpers.setdefault(name, f"""__device__ static inline float4 {name}(float4 c, {a}, {b}) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0, %1, %2, %3}}, "
               "{{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(c.x), "+f"(c.y), "+f"(c.z), "+f"(c.w)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  return c; }}""")
  return name


class CUDARenderer(GPURenderer):
  """CUDA C++ for NVRTC and nvcc."""
  fn_qualifier = "__device__ static inline"
  type_table = CUDA_TYPES
  barrier = "__syncthreads()"
  local_fmt = "__shared__ {ct} {name}[{size}]"
  group_id, local_id = "blockIdx.{xyz}", "threadIdx.{xyz}"
  storage = CUDA_STORAGE

  def __init__(self, device: str = "CUDA",
               global_max: tuple[int, ...] = (2 ** 31 - 1, 65535, 65535), local_max: int = 1024,
               shared_bytes: int = 49152) -> None:
    super().__init__(device, global_max, local_max, shared_bytes)
    object.__setattr__(self, "access_lanes", (4, 2))
    object.__setattr__(self, "access_aligned", True)
    object.__setattr__(self, "tensor_cores", MMA_M16N8K16)

  def preamble(self, linear: UOp) -> str:
    includes = CUDA_INCLUDES if _uses_16_bit_floats(linear) else ""
    return (includes
            + "template <class T, class S> __device__ static inline T __bitcast(S s) {\n"
            "  T d; memcpy(&d, &s, sizeof(d)); return d; }\n")

  def prelude(self, linear: UOp) -> str:
    """Kernels with 16-bit floats convert with cuda_fp16.h / cuda_bf16.h (NVRTC finds them on
    the include path runtime/ops_cuda.py gives it); others need no header."""
    return CUDA_PRELUDE if _uses_16_bit_floats(linear) else super().prelude(linear)

  def _wmma(self, st: RenderState, u: UOp) -> None:
    """One `mma.sync` per warp: the 16-bit fragments packed two to a 32-bit register (the lower
    element in the low half), the fp32 accumulators in and out as a float4."""
    tc: TensorCore = u.arg
    if tc not in MMA_M16N8K16: raise RuntimeError(f"CUDA renderer: no tensor core {tc.name}")
    fn = _mma_fn(st, tc)
    pack = _pack_fn(st, tc.dtype_in)
    regs = [f"{pack}({st.names[x.src[i]]}, {st.names[x.src[i + 1]]})"
            for x in u.src[:2] for i in range(0, len(x.src), 2)]
    name = st.fresh("wmma")
    st.emit(f"float4 {name} = {fn}({st.names[u.src[2]]}, {', '.join(regs)});")
    st.names[u] = name

  def lane(self, v: str, i: int) -> str: return f"{v}.{'xyzw'[i]}"

  def vector_literal(self, dt: DType, lanes: list[str]) -> str:
    return f"make_{self.vector_type(dt)}({', '.join(lanes)})"

  # the index is a multiple of the lanes (codegen/coalesce.py, access_aligned); the buffer's own
  # address is checked too (the same for every thread: no divergence), so a user's Buffer.view at
  # an odd element offset reads lane by lane instead of faulting
  def _is_aligned(self, dt: DType, base: str) -> str:
    return f"(((unsigned long long){base} & {dt.itemsize - 1}) == 0)"

  def vector_load(self, dt: DType, ptr: str, base: str) -> str:
    lanes = [f"{ptr}[{i}]" for i in range(dt.count)]
    return (f"({self._is_aligned(dt, base)} ? *(({self.vector_type(dt)}*){ptr}) : "
            f"{self.vector_literal(dt, lanes)})")

  def vector_store(self, dt: DType, ptr: str, val: str, base: str) -> str:
    lanes = " ".join(f"{ptr}[{i}] = {self.lane(val, i)};" for i in range(dt.count))
    return (f"if {self._is_aligned(dt, base)} *(({self.vector_type(dt)}*){ptr}) = {val}; "
            f"else {{ {lanes} }}")

  def kernel(self, name: str, args: list[str], lines: list[str], params: list[UOp],
             st: RenderState) -> str:
    body = "\n".join(lines)
    return f'extern "C" __global__ void {name}({", ".join(args)}) {{\n{body}\n}}\n'

  def _param_decl(self, p: UOp, st: RenderState) -> str:
    if p.arg.name is not None: return _variable_decl(p, st)
    return f"{self.storage[p.dtype]}* __restrict__ {st.names[p]}"


  def math_fn(self, name: str, suffix: str) -> str: return name + suffix

  def _bitcast(self, st: RenderState, src: DType, dst: DType, v: str) -> str:
    sv = self._to_storage(st, src, v)
    if dst == dtypes.bool: return f"((bool){sv})"
    return self._from_storage(st, dst, f"__bitcast<{self.storage[dst]}>({sv})")
