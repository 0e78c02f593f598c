"""The C renderer: a LINEAR kernel as one C function.

ABI (runtime/ops_cpu.py): `void name(T* restrict data0, ..., int var0, ..., int core_id)`.
float16 and bfloat16 live in memory as 16-bit integers and in registers as float; every op on
them rounds its float result back to 16 bits, so results match PyTorch's per-op rounding. The
8-bit floats do the same with one byte: their conversions are integer code (renderer/fp8.py,
emitted only into kernels that use them), bit-exact with `unigrad.dtype.float_to_fp8`.
Single-use pure expressions are inlined; LOADs and multi-use values get local variables.
Integers wrap like the PYTHON device: int and long long rely on `-fwrapv` (ops_cpu.CFLAGS),
narrower types (which C computes as int) are cast back after each op that can leave their range,
shifts by an amount outside [0, bits) and division by 0 or -1 go through guards (no C UB).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from unigrad.dtype import FP8S, DType, dtypes
from unigrad.knobs import CHECK_OOB
from unigrad.renderer import Renderer
from unigrad.renderer.fp8 import FP8_HELPER_NAMES, fp8_helpers
from unigrad.uop import GroupOp, Ops, UOp
from unigrad.uop.symbolic import linear_terms

# the C symbol (long long[6]) where a CHECK_OOB kernel records its first bad access:
# (set, buffer slot, index, buffer size, 1 for a store, lanes accessed); the runtime reads it
OOB_STATE = "unigrad_oob"

C_TYPES = {dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char",
           dtypes.int16: "short", dtypes.uint16: "unsigned short", dtypes.int32: "int",
           dtypes.uint32: "unsigned int", dtypes.int64: "long long",
           dtypes.uint64: "unsigned long long", dtypes.float32: "float", dtypes.float64: "double",
           dtypes.float16: "float", dtypes.bfloat16: "float", **{dt: "float" for dt in FP8S}}
STORAGE = {**C_TYPES, dtypes.float16: "unsigned short", dtypes.bfloat16: "unsigned short",
           **{dt: "unsigned char" for dt in FP8S}}
# float in registers, their own bits in memory: (decode, encode, round) helper names
EMULATED_FLOATS = {dtypes.float16: ("__h2f", "__f2h", "__rh"),
                   dtypes.bfloat16: ("__bf2f", "__f2bf", "__rbf"),
                   **FP8_HELPER_NAMES}
INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.XOR: "^", Ops.OR: "|",
         Ops.AND: "&", Ops.SHL: "<<", Ops.SHR: ">>", Ops.SUB: "-", Ops.DIV: "/"}

# the C prelude: float16 and bfloat16 conversions in software (every C compiler), and with the
# F16C instructions where the target has them: a kernel of many float16 values compiled 5x
# faster (each conversion two instructions, not an inlined branchy function) and runs faster
_PRELUDE_HEAD = """\
#include <stdint.h>
typedef union { float f; uint32_t u; } __fu;
"""
_HALF_F16C = """\
typedef short __v8h_u __attribute__((vector_size(16)));
typedef float __v4f_u __attribute__((vector_size(16)));
static inline float __h2f(unsigned short h) {
  __v8h_u v = {(short)h, 0, 0, 0, 0, 0, 0, 0}; return __builtin_ia32_vcvtph2ps(v)[0]; }
static inline unsigned short __f2h(float f) {
  __v4f_u v = {f, 0, 0, 0}; return (unsigned short)__builtin_ia32_vcvtps2ph(v, 0)[0]; }
"""
_HALF_SOFTWARE = """\
static inline float __h2f(unsigned short h) {
  uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff; __fu r;
  if (e == 0x1f) r.u = s | 0x7f800000 | (m << 13);
  else if (e) r.u = s | ((e + 112) << 23) | (m << 13);
  else if (m) { r.f = (float)m * 5.9604644775390625e-8f; r.u |= s; }
  else r.u = s;
  return r.f; }
static inline unsigned short __f2h(float f) {
  __fu v; v.f = f; uint32_t s = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffff;
  if (a > 0x7f800000) return (unsigned short)(s | 0x7e00);
  if (a >= 0x477ff000) return (unsigned short)(s | 0x7c00);
  if (a < 0x38800000) {
    __fu t; t.u = a; t.f += 0.5f; return (unsigned short)(s | (t.u - 0x3f000000)); }
  uint32_t r = a + ((uint32_t)(15 - 127) << 23) + 0xfff + ((a >> 13) & 1);
  return (unsigned short)(s | (r >> 13)); }
"""
_PRELUDE_TAIL = """\
static inline float __bf2f(unsigned short b) { __fu r; r.u = (uint32_t)b << 16; return r.f; }
static inline unsigned short __f2bf(float f) {
  __fu v; v.f = f; if ((v.u & 0x7fffffff) > 0x7f800000) return (unsigned short)((v.u >> 16) | 0x40);
  return (unsigned short)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16); }
static inline float __rh(float f) { return __h2f(__f2h(f)); }
static inline float __rbf(float f) { return __bf2f(__f2bf(f)); }
"""
PRELUDE = (_PRELUDE_HEAD + "#if defined(__F16C__)\n" + _HALF_F16C + "#else\n" + _HALF_SOFTWARE +
           "#endif\n" + _PRELUDE_TAIL)
# the same without target-specific code: the GPU dialects' helpers
PORTABLE_PRELUDE = _PRELUDE_HEAD + _HALF_SOFTWARE + _PRELUDE_TAIL


def _var_name(name: str) -> str:
  """A variable's C identifier: `var_` and its name (any other character as `_`)."""
  return "var_" + "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _fn(ct: str, name: str, body: str) -> str:
  """A binary helper `static inline T name(T a, T b) { body }`."""
  return f"static inline {ct} {name}({ct} a, {ct} b) {{ {body} }}"


def _max_fn(ct: str, is_float: bool) -> str:
  cond = "(a > b || a != a)" if is_float else "(a > b)"
  return _fn(ct, f"__max_{ct.replace(' ', '_')}", f"return {cond} ? a : b;")


def _div_fn(ct: str, op: str, dt: DType) -> str:
  """C's truncating `/` or `%` as a helper: x/0 and x%0 give 0 (like the PYTHON device) and
  MIN/-1 wraps instead of trapping."""
  neg = f"({ct})-a" if op == "/" else "0"
  guard = "" if dtypes.is_unsigned(dt) else f"b == -1 ? {neg} : "
  return _fn(ct, _helper(op, ct), f"return b == 0 ? 0 : {guard}a {op} b;")


def _floor_fn(ct: str, op: str, dt: DType) -> str:
  """Python's `//` or `%` (round toward -inf; the remainder takes the divisor's sign) on top of
  the truncating helper; unsigned values need no fix."""
  trunc = f"{_helper(op, ct)}(a, b)"
  if dtypes.is_unsigned(dt): body = f"return {trunc};"
  elif op == "/": body = f"{ct} q = {trunc}; return (q*b != a && ((a < 0) != (b < 0))) ? q-1 : q;"
  else: body = f"{ct} r = {trunc}; return (r != 0 && ((r < 0) != (b < 0))) ? r+b : r;"
  return _fn(ct, _helper("f" + op, ct), body)


def _helper(op: str, ct: str) -> str:
  kind = {"/": "div", "%": "mod", "f/": "floordiv", "f%": "floormod"}[op]
  return f"__{kind}_{ct.replace(' ', '_')}"


# ops whose C result may leave a narrow type's range (C computes them in int)
WIDENS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL})


def is_narrow(dt: DType) -> bool:
  """Integer types C promotes to int before any arithmetic (the size first: it is one attribute
  read, the int test compares against every integer type)."""
  return dt.itemsize < 4 and (dt == dtypes.bool or (dtypes.is_int(dt) and dt != dtypes.index))


def _fits(u: UOp) -> bool:
  """The exact (unwrapped) result of ADD/SUB/MUL/NEG provably lies in u.dtype's range."""
  if u.op is Ops.SHL or u.dtype == dtypes.bool: return False
  (a0, a1), (b0, b1) = u.src[0].min_max, u.src[-1].min_max
  if u.op is Ops.NEG: lo, hi = -a1, -a0
  elif u.op is Ops.ADD: lo, hi = a0 + b0, a1 + b1
  elif u.op is Ops.SUB: lo, hi = a0 - b1, a1 - b0
  else: lo, hi = min(p := (a0 * b0, a0 * b1, a1 * b0, a1 * b1)), max(p)
  return u.dtype.min <= lo and hi <= u.dtype.max


def _is_shift_in_range(u: UOp) -> bool:
  """A shift by an amount in [0, bits) of one lane: C's << and >> are defined there (a vector
  dtype's itemsize is all its lanes: counting it let `x << 32` through on int32 vectors)."""
  b = u.src[1]
  return 0 <= b.vmin and b.vmax < 8 * u.dtype.scalar().itemsize


def _guarded_shift(op: Ops, dt: DType, s: list[str]) -> str:
  """Shifts by >= bits (or < 0) give 0, or -1 for a negative value shifted right (like PyTorch)."""
  bits, ct = 8 * dt.itemsize, C_TYPES[dt]
  ok = f"(unsigned long long){s[1]} < {bits}"
  if op is Ops.SHL: return f"({ok} ? ({ct})({s[0]}<<{s[1]}) : 0)"
  return f"({ok} ? ({s[0]}>>{s[1]}) : ({s[0]} < 0 ? -1 : 0))"


def c_const(v: object, dt: DType) -> str:
  """A C literal of `v` as `dt`."""
  if dt == dtypes.bool: return "1" if v else "0"
  if dtypes.is_float(dt):
    f = float(v)  # type: ignore[arg-type]
    suffix = "" if dt == dtypes.float64 else "f"
    if math.isnan(f): return f"__builtin_nan{suffix}(\"\")"
    if math.isinf(f): return f"{'-' if f < 0 else ''}__builtin_inf{suffix}()"
    return f"{f!r}{suffix}" if "e" in repr(f) or "." in repr(f) else f"{f!r}.0{suffix}"
  iv = int(v)  # type: ignore[call-overload]
  if dt in (dtypes.int64,) and iv == -(2 ** 63): return "(-9223372036854775807LL-1)"
  if dt == dtypes.int32 and iv == -(2 ** 31): return "(-2147483647-1)"
  suffix = {dtypes.int64: "LL", dtypes.uint64: "ULL", dtypes.uint32: "u"}.get(dt, "")
  return f"{iv}{suffix}"


# bool vectors are masks (true is -1): ordered ops rewritten so that false < true
BOOL_MASK_OPS = {Ops.ADD: "({0}|{1})", Ops.MUL: "({0}&{1})", Ops.MAX: "({0}|{1})",
                 Ops.CMPLT: "(~{0}&{1})"}
NATIVE_VECTOR_INFIX = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.XOR, Ops.OR, Ops.AND})


def _is_vector(u: UOp) -> bool: return u.dtype.count > 1 or u.op is Ops.STACK


def _vdt(u: UOp) -> DType:
  """A value's vector dtype (a STACK of scalars may carry its lanes' dtype)."""
  if u.op is Ops.STACK and u.dtype.count == 1: return u.src[0].dtype.vec(len(u.src))
  return u.dtype


def _lane_value(dt: DType, expr: str) -> str:
  """A scalar as a vector lane: bools become mask lanes (-1 for true)."""
  return f"(-(int)({expr}))" if dt == dtypes.bool else expr


def _stack(u: UOp, vt: str, s: list[str]) -> str:
  """A STACK of scalars: k copies of one value broadcast, else a vector literal. A broadcast is
  `x - 0` (-0.0 stays -0.0; gcc 12 writes `0 + x` as one scalar add and a store per lane, and
  makes +0.0 of -0.0)."""
  lanes = [_lane_value(x.dtype, n) for x, n in zip(u.src, s)]
  if all(x is u.src[0] for x in u.src): return f"({lanes[0]} - ({vt}){{}})"
  return f"(({vt}){{{', '.join(lanes)}}})"


def uses_and_params(linear: UOp) -> tuple[dict[UOp, int], list[UOp]]:
  """How many instructions of `linear` read each value, and its PARAMs in argument order (the
  buffers by slot, then the named symbolic variables)."""
  uses: dict[UOp, int] = {}
  for u in linear.src:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  params = sorted((u for u in linear.src if u.op is Ops.PARAM),
                  key=lambda p: (p.arg.name is not None, p.arg.slot))
  return uses, params


@dataclass
class RenderState:
  names: dict[UOp, str] = field(default_factory=dict)
  lines: list[str] = field(default_factory=list)
  helpers: dict[str, str] = field(default_factory=dict)
  depth: int = 1
  counter: int = 0
  streamed: frozenset[UOp] = frozenset()  # PARAMs whose vector stores are streaming stores
  stream_used: bool = False
  checked: dict[UOp, tuple[int, bool]] = field(default_factory=dict)  # CHECK_OOB: (lanes, store)
  prefetched: dict[UOp, int] = field(default_factory=dict)  # LOAD -> bytes ahead to prefetch
  dot4_chains: dict[UOp, list[UOp]] = field(default_factory=dict)  # see _dot4_chains
  absorbed: set[UOp] = field(default_factory=set)  # DOT4s a chain's last one renders

  def emit(self, line: str) -> None: self.lines.append("  " * self.depth + line)

  def fresh(self, prefix: str) -> str:
    self.counter += 1
    return f"{prefix}{self.counter}"


def _checked_accesses(linear: UOp) -> dict[UOp, tuple[int, bool]]:
  """INDEX nodes into buffer PARAMs of a known size -> (widest access in lanes, any store)."""
  out: dict[UOp, tuple[int, bool]] = {}
  for u in linear.src:
    if u.op not in (Ops.LOAD, Ops.STORE): continue
    ix = u.src[0]
    if ix.op is not Ops.INDEX or ix.dtype.count > 1 or ix.src[0].op is not Ops.PARAM: continue
    if not isinstance(ix.src[0].shape[0], int): continue
    lanes = _vdt(u.src[1] if u.op is Ops.STORE else u).count
    w, store = out.get(ix, (1, False))
    out[ix] = (max(w, lanes), store or u.op is Ops.STORE)
  return out


def _stride(e: UOp, r: UOp) -> int | None:
  """The change of integer expression `e` when RANGE `r` steps by one, if `e` is affine in `r`;
  None otherwise (`r` inside a term that is not linear: a division, a remainder)."""
  terms, _ = linear_terms(e)
  if any(t is not r and r in t.ranges for t in terms): return None
  return terms.get(r, 0)


def _prefetched(linear: UOp, ahead: int) -> dict[UOp, int]:
  """The streamed loads -> how many bytes ahead of each to prefetch. A load is streamed when its
  address depends on every loop around it (each element is read once: from memory, not a cache)
  and moves at least a cache line per trip of the innermost loop; each streamed load of a loop
  prefetches the same number of trips ahead, so that together they have `ahead` bytes in flight."""
  loops: list[UOp | None] = []
  streams: dict[UOp, list[tuple[UOp, int]]] = {}
  for u in linear.src:
    if u.op is Ops.RANGE: loops.append(u)
    elif u.op is Ops.IF: loops.append(None)
    elif u.op in (Ops.END, Ops.ENDIF): loops.pop()
    elif u.op is Ops.LOAD:
      ix, open_ranges = u.src[0], [r for r in loops if r is not None]
      if not open_ranges or len(u.src) == 3 or ix.op is not Ops.INDEX or ix.dtype.count > 1:
        continue  # (a gated load's address may lie outside its buffer)
      if ix.src[0].op is not Ops.PARAM or ix.src[0].arg.name is not None: continue
      if any(r not in ix.src[1].ranges for r in open_ranges): continue
      step = _stride(ix.src[1], open_ranges[-1])
      if step is None or abs(step) * ix.src[0].dtype.itemsize < 64: continue
      streams.setdefault(open_ranges[-1], []).append((u, step * ix.src[0].dtype.itemsize))
  out: dict[UOp, int] = {}
  for loads in streams.values():
    trips = max(1, -(-ahead // sum(_vdt(u).itemsize for u, _ in loads)))
    for u, b in loads: out[u] = trips * b
  return out


def _oob_index(st: RenderState, ix: UOp, idx: str) -> str:
  """`idx` checked against its buffer: outside, the first bad access is recorded in OOB_STATE
  (read by the runtime after the launch) and element 0 is accessed instead. The check is one
  unsigned compare against the count of valid starts (negative indices wrap above it); the
  recording is a call to a cold function, so the checks add little code for clang to optimize."""
  st.helpers.setdefault("__oob", f"""long long {OOB_STATE}[6];
static __attribute__((noinline, cold)) long long __oob_fail(long long i, long long n, long long w,
                                                            long long b, long long st) {{
  if (!__atomic_exchange_n(&{OOB_STATE}[0], 1, __ATOMIC_RELAXED)) {{
    {OOB_STATE}[1] = b; {OOB_STATE}[2] = i; {OOB_STATE}[3] = n; {OOB_STATE}[4] = st;
    {OOB_STATE}[5] = w; }}
  return 0; }}
static inline long long __oob(long long i, unsigned long long starts, long long n, long long w,
                              long long b, long long st) {{
  return (unsigned long long)i < starts ? i : __oob_fail(i, n, w, b, st); }}""")
  lanes, store = st.checked[ix]
  size = ix.src[0].shape[0]
  return (f"__oob({idx}, {max(size - lanes + 1, 0)}ull, {size}, {lanes}, {ix.src[0].arg.slot}, "
          f"{int(store)})")


def _ctype(st: RenderState, dt: DType) -> str:
  """The C type of a value: a scalar's, or a vector typedef declared once per source (with an
  unaligned twin `<name>_u` for loads and stores at element alignment)."""
  if dt.count == 1: return C_TYPES[dt]
  sct = "int" if dt.scalar() == dtypes.bool else C_TYPES[dt.scalar()]
  size = 4 if dt.scalar() == dtypes.bool else dt.scalar().itemsize
  name = f"{sct.replace(' ', '_')}_v{dt.count}"
  attr = f"vector_size({size * dt.count})"
  st.helpers.setdefault(name, f"typedef {sct} {name} __attribute__(({attr}));\n"
                              f"typedef {sct} {name}_u __attribute__(({attr}, aligned({size})));")
  return name


# gcc leaves small vector helpers as calls unless told
VECTOR_INLINE = "static inline __attribute__((always_inline))"
# float ops with a C builtin per lane: a vector helper applies it to every lane in a loop, which
# clang and gcc vectorize into one instruction per register (vfmadd, vrndscale, vsqrt); gcc 12
# leaves the same lanes written as one initializer list scalar (vfmadd231ss) for vectors wider
# than one register and on AVX2 (matmul 256: 2.5 GFLOPS)
LANE_BUILTINS = {Ops.MULACC: ("fma", 3), Ops.TRUNC: ("trunc", 1), Ops.SQRT: ("sqrt", 1)}


def _lane_fn(st: RenderState, op: Ops, dt: DType) -> str:
  """The helper `__<builtin>_<vector type>(...)`, declared once per source."""
  vt, (fn, nargs) = _ctype(st, dt), LANE_BUILTINS[op]
  name = f"__{fn}_{vt}"
  builtin = f"__builtin_{fn}{'' if dt.scalar() == dtypes.float64 else 'f'}"
  params = ", ".join(f"{vt} {a}" for a in "abc"[:nargs])
  lane = f"{builtin}({', '.join(f'{a}[i]' for a in 'abc'[:nargs])})"
  body = f"{vt} r; for (int i = 0; i < {dt.count}; i++) r[i] = {lane}; return r;"
  if op is Ops.MULACC: body = f"\n{FUSED_VECTOR_FMA}\n#else\n  {body}\n#endif\n"
  st.helpers.setdefault(name, f"{VECTOR_INLINE} {vt} {name}({params}) {{ {body} }}")
  return name


# clang with hardware fma: `a*b+c` on whole vectors, contracted to one fused multiply-add per
# register. clang's vectorizer rebuilt the lane loop of a convolution tile (three nested short
# reduce loops) as 4-lane pieces and spilled: conv 16x64x56x56 3x3 with AVX-512 625 -> 44 ms
FUSED_VECTOR_FMA = """#if defined(__clang__) && (defined(__FMA__) || defined(__ARM_FEATURE_FMA))
#pragma clang fp contract(fast)
  return a*b+c;"""


# DOT4 (a byte dot product: the 4 unsigned bytes of a times the 4 signed bytes of b, plus c, per
# int32 lane) on a vector of 16, 8 or 4 lanes: x86's instruction sequences, the best first (the
# preprocessor picks by the -march macros; {r} is the register type); any other width or target
# runs the lanes in C
DOT4_X86 = {
  16: (("__AVX512VNNI__", "_mm512_dpbusd_epi32(({r})c, ({r})a, ({r})b)"),
       ("__AVX512BW__", "_mm512_add_epi32(({r})c, _mm512_madd_epi16(_mm512_maddubs_epi16(({r})a, "
                        "({r})b), _mm512_set1_epi16(1)))")),
  8: (("__AVX512VNNI__) && defined(__AVX512VL__", "_mm256_dpbusd_epi32(({r})c, ({r})a, ({r})b)"),
      ("__AVXVNNI__", "_mm256_dpbusd_avx_epi32(({r})c, ({r})a, ({r})b)"),
      ("__AVX2__", "_mm256_add_epi32(({r})c, _mm256_madd_epi16(_mm256_maddubs_epi16(({r})a, "
                   "({r})b), _mm256_set1_epi16(1)))")),
  4: (("__AVX512VNNI__) && defined(__AVX512VL__", "_mm_dpbusd_epi32(({r})c, ({r})a, ({r})b)"),
      ("__AVXVNNI__", "_mm_dpbusd_avx_epi32(({r})c, ({r})a, ({r})b)"),
      ("__SSSE3__", "_mm_add_epi32(({r})c, _mm_madd_epi16(_mm_maddubs_epi16(({r})a, ({r})b), "
                    "_mm_set1_epi16(1)))")),
}
DOT4_REGISTERS = {16: "__m512i", 8: "__m256i", 4: "__m128i"}
DOT4_SCALAR = """static inline int __dot4(int a, int b, int c) {
  for (int k = 0; k < 32; k += 8) c += ((a >> k) & 255) * (int)(signed char)(b >> k);
  return c; }"""
X86 = "(defined(__x86_64__) || defined(__i386__))"


# x86 byte products summed in 16 bits (vpmaddubsw's pairs, then plain 16-bit adds) before one
# widening vpmaddwd, per vector width: (the instruction set, the intrinsics' prefix, the byte dot
# product instructions that make it pointless)
MADDUBS_X86 = {16: ("__AVX512BW__", "_mm512", "defined(__AVX512VNNI__)"),
               8: ("__AVX2__", "_mm256", "(defined(__AVX512VNNI__) && defined(__AVX512VL__)) || "
                   "defined(__AVXVNNI__)"),
               4: ("__SSSE3__", "_mm", "(defined(__AVX512VNNI__) && defined(__AVX512VL__)) || "
                   "defined(__AVXVNNI__)")}


def _dot4_chains(linear: UOp, uses: dict[UOp, int]) -> tuple[dict[UOp, list[UOp]], set[UOp]]:
  """Vector DOT4s whose accumulator is another DOT4 read only there, as chains (the last DOT4 ->
  the chain, last first) short enough that their byte products summed in 16 bits cannot
  overflow: each pair of products is at most 2 * 128 * the bound on a's bytes (DOT4's arg, see
  codegen/isel.py), so 8 DOT4s of nibbles (15) fit where one of 7-bit bytes does. Without a
  byte dot product instruction a chain costs one widening multiply, not one per DOT4 (AVX2: 4
  DOT4s in 9 instructions, not 12). Also the DOT4s inside chains."""
  chains: dict[UOp, list[UOp]] = {}
  absorbed: set[UOp] = set()
  for u in reversed(linear.src):
    if u.op is not Ops.DOT4 or u.dtype.count not in MADDUBS_X86 or u in absorbed: continue
    chain, c = [u], u.src[2]
    while c.op is Ops.DOT4 and c.dtype == u.dtype and uses.get(c, 0) == 1:
      bounds = [d.arg for d in (*chain, c)]
      if not all(isinstance(b, int) for b in bounds) or \
         len(bounds) * 2 * 128 * max(bounds) > 32767: break
      chain.append(c)
      c = c.src[2]
    if len(chain) > 1:
      chains[u] = chain
      absorbed.update(chain[1:])
  return chains, absorbed


def _dot4_chain_fn(st: RenderState, dt: DType, n: int) -> str:
  """The helper computing a chain of `n` DOT4s on vector `dt`: `(a0, b0, ..., c)`."""
  one, vt = _dot4_fn(st, dt), _ctype(st, dt)
  name = f"__dot4x{n}_{vt}"
  if name in st.helpers: return name
  isa, mm, dot_isa = MADDUBS_X86[dt.count]
  reg = DOT4_REGISTERS[dt.count]
  params = ", ".join(f"{vt} a{i}, {vt} b{i}" for i in range(n))
  nested = "c"
  for i in reversed(range(n)): nested = f"{one}(a{i}, b{i}, {nested})"
  sums = [f"  {reg} s = {mm}_maddubs_epi16(({reg})a0, ({reg})b0);"]
  sums += [f"  s = {mm}_add_epi16(s, {mm}_maddubs_epi16(({reg})a{i}, ({reg})b{i}));"
           for i in range(1, n)]
  st.helpers[name] = (
    f"{VECTOR_INLINE} {vt} {name}({params}, {vt} c) {{\n"
    f"#if {X86} && defined({isa}) && !({dot_isa})\n" + "\n".join(sums) + "\n"
    f"  return ({vt}){mm}_add_epi32(({reg})c, {mm}_madd_epi16(s, {mm}_set1_epi16(1)));\n"
    f"#else\n  return {nested};\n#endif\n}}")
  return name


def _dot4_fn(st: RenderState, dt: DType) -> str:
  """The helper computing DOT4 on `dt` (int32 or a vector of them), declared once per source."""
  st.helpers.setdefault("__dot4", DOT4_SCALAR)
  if dt.count == 1: return "__dot4"
  vt = _ctype(st, dt)
  name = f"__dot4_{vt}"
  loop = f"{vt} r; for (int i = 0; i < {dt.count}; i++) r[i] = __dot4(a[i], b[i], c[i]); return r;"
  body = f" {loop} "
  if (choices := DOT4_X86.get(dt.count)):
    st.helpers.setdefault("immintrin", f"#if {X86}\n#include <immintrin.h>\n#endif")
    reg = DOT4_REGISTERS[dt.count]
    arms = [f"#{'el' if i else ''}if {X86} && defined({cond})\n  return ({vt}){code.format(r=reg)};"
            for i, (cond, code) in enumerate(choices)]
    body = "\n" + "\n".join(arms) + f"\n#else\n  {loop}\n#endif\n"
  st.helpers.setdefault(name, f"{VECTOR_INLINE} {vt} {name}({vt} a, {vt} b, {vt} c) {{{body}}}")
  return name


def _stream_fn(st: RenderState, dt: DType) -> str:
  """A helper storing one vector around the caches (a non-temporal store) where the compiler has
  them and the address is register aligned; a plain store otherwise."""
  vt = _ctype(st, dt)
  name, sct = f"__stream_{vt}", C_TYPES[dt.scalar()]
  st.helpers.setdefault(name, f"""{VECTOR_INLINE} void {name}({sct}* p, {vt} v) {{
#if defined(__has_builtin)
#if __has_builtin(__builtin_nontemporal_store)
  if (((uintptr_t)p & {dt.itemsize - 1}) == 0) {{
    __builtin_nontemporal_store(v, ({vt}*)p); return; }}
#endif
#endif
  *({vt}_u*)p = v; }}""")
  return name


def _vector_address(st: RenderState, ix: UOp, dt: DType) -> str:
  """The address of a vector access: a vector register as is, global memory through a cast to
  the unaligned vector type."""
  if ix.dtype.count > 1: return st.names[ix]
  return f"(({_ctype(st, dt)}_u*){st.names[ix]})"


def _mask(st: RenderState, operand: UOp, cmp: str) -> str:
  """A vector comparison's result as a bool vector (int lanes): C gives lanes as wide as the
  operands', so 8-byte operands are narrowed."""
  dt = _vdt(operand)
  if dt.scalar() == dtypes.bool or dt.scalar().itemsize == 4: return cmp
  return f"__builtin_convertvector({cmp}, {_ctype(st, dtypes.bool.vec(dt.count))})"


def _select(st: RenderState, dt: DType, cond: str, a: str, b: str) -> str:
  """WHERE on vectors: lanes of a where the mask is set, else of b (as bits)."""
  k, size = dt.count, (4 if dt.scalar() == dtypes.bool else dt.scalar().itemsize)
  it = _ctype(st, (dtypes.int32 if size == 4 else dtypes.int64).vec(k))
  m = cond if size == 4 else f"__builtin_convertvector({cond}, {it})"
  vt = _ctype(st, dt)
  return f"(({vt})(({m}&({it}){a})|(~{m}&({it}){b})))"


def _convert(st: RenderState, src: UOp, dt: DType, x: str) -> str:
  """CAST of a vector: bool masks convert as 1/0, a cast to bool is a `!= 0` mask."""
  sdt = _vdt(src)
  if dt.scalar() == dtypes.bool: return _mask(st, src, f"({x}!=0)")
  if sdt.scalar() == dtypes.bool: x = f"(-{x})"
  return f"__builtin_convertvector({x}, {_ctype(st, dt)})"


class CRenderer(Renderer):
  """C99 (GNU extensions) for clang and gcc."""
  # fp8 conversions stay calls: inlined into a 64-lane unrolled kernel they made compiling a
  # one-line elementwise op take 11 s
  conversion_attr = "__attribute__((noinline)) "

  def __init__(self, device: str = "CPU", vector_bytes: int = 0, stream_bytes: int = 0,
               vector_registers: int = 16, byte_dot: bool = False,
               prefetch_bytes: int = 0) -> None:
    """`byte_dot`: the target has a byte dot-product instruction (x86 AVX2 or VNNI): DOT4 is
    rendered with it (and nn's quantized matvecs take int8 activations)."""
    ops = frozenset(GroupOp.Primitive | {Ops.CDIV, Ops.CMOD, Ops.SQRT, Ops.DIV, Ops.SUB, Ops.NEG,
                                         Ops.MULACC} | ({Ops.DOT4} if byte_dot else set()))
    super().__init__(device, ops, has_threads=True, emulated_dtypes=frozenset(EMULATED_FLOATS),
                     vector_bytes=vector_bytes, stream_bytes=stream_bytes,
                     vector_registers=vector_registers if vector_bytes else 0,
                     byte_dot=byte_dot, prefetch_bytes=prefetch_bytes)

  def render(self, name: str, linear: UOp) -> str:
    helpers, function = self.render_parts(name, linear)
    return PRELUDE + "\n".join(helpers.values()) + "\n" + function

  def render_parts(self, name: str, linear: UOp) -> tuple[dict[str, str], str]:
    """The kernel as (helpers by name, the function's text): a file holding several kernels
    (unigrad.export) declares each helper once and the PRELUDE once."""
    st, (uses, params) = RenderState(), uses_and_params(linear)
    st.streamed = self._streamed(linear)
    if CHECK_OOB: st.checked = _checked_accesses(linear)
    if self.prefetch_bytes: st.prefetched = _prefetched(linear, self.prefetch_bytes)
    if Ops.DOT4 in self.supported_ops: st.dot4_chains, st.absorbed = _dot4_chains(linear, uses)
    for u in linear.src: self._node(st, u, uses)
    # streaming stores are weakly ordered: fence them before the caller reads the output
    if st.stream_used: st.emit("__atomic_thread_fence(__ATOMIC_SEQ_CST);")
    args = [self._param_decl(p, st) for p in params] + ["int core_id"]
    body = "\n".join(st.lines)
    return dict(st.helpers), f"void {name}({', '.join(args)}) {{\n{body}\n}}\n"

  def _streamed(self, linear: UOp) -> frozenset[UOp]:
    """Output buffers at least `stream_bytes` big that the kernel does not read: their whole-
    register vector stores bypass the caches (the data would only evict the inputs)."""
    if not self.stream_bytes or not self.vector_bytes: return frozenset()
    loaded = {u.src[0].src[0] for u in linear.src if u.op is Ops.LOAD}
    return frozenset(p for p in linear.src if p.op is Ops.PARAM and p.arg.name is None
                     and p not in loaded and p.shape[0] * p.dtype.itemsize >= self.stream_bytes)

  def _store(self, st: RenderState, u: UOp) -> None:
    ix, val = u.src[0], st.names[u.src[1]]
    if not _is_vector(u.src[1]):
      st.emit(f"*{st.names[ix]} = {self._to_storage(st, u.src[1].dtype, val)};")
      return
    dt = _vdt(u.src[1])
    if (ix.dtype.count == 1 and ix.src[0] in st.streamed and dt.itemsize == self.vector_bytes
        and dt.scalar() != dtypes.bool):
      st.stream_used = True
      st.emit(f"{_stream_fn(st, dt)}({st.names[ix]}, {val});")
    else: st.emit(f"*{_vector_address(st, ix, dt)} = {val};")

  def _param_decl(self, p: UOp, st: RenderState) -> str:
    if p.arg.name is None: return f"{STORAGE[p.dtype]}* restrict {st.names[p]}"
    # the ABI passes integer variables as int (runtime/ops_cpu.py); C widens them where used
    return f"{'int' if dtypes.is_int(p.dtype) else C_TYPES[p.dtype]} {st.names[p]}"

  def _node(self, st: RenderState, u: UOp, uses: dict[UOp, int]) -> None:
    op = u.op
    if op is Ops.PARAM:
      st.names[u] = f"data{u.arg.slot}" if u.arg.name is None else _var_name(u.arg.name)
    elif op is Ops.BUFFER:
      st.names[u] = st.fresh("acc")
      ct = _ctype(st, u.dtype) if u.dtype.count > 1 else STORAGE[u.dtype]
      st.emit(f"{ct} {st.names[u]}[{u.shape[0]}];")
    elif op is Ops.CONST: st.names[u] = c_const(u.arg, u.dtype)
    elif op is Ops.AFTER: st.names[u] = st.names[u.src[0]]
    elif op is Ops.SPECIAL: st.names[u] = "core_id"  # the chunk index of a THREAD launch
    elif op is Ops.RANGE:
      st.names[u] = f"ridx{u.arg.id}"
      ct = C_TYPES[u.dtype]
      r = st.names[u]
      st.emit(f"for ({ct} {r} = 0; {r} < {st.names[u.src[0]]}; {r}++) {{")
      st.depth += 1
    elif op in (Ops.END, Ops.ENDIF):
      st.depth -= 1
      st.emit("}")
    elif op is Ops.IF:
      st.emit(f"if ({st.names[u.src[0]]}) {{")
      st.depth += 1
    elif op is Ops.INDEX:
      idx = _oob_index(st, u, st.names[u.src[1]]) if u in st.checked else st.names[u.src[1]]
      st.names[u] = f"({st.names[u.src[0]]}+{idx})"
    elif op is Ops.LOAD: self._load(st, u)
    elif op is Ops.STORE: self._store(st, u)
    elif op is Ops.GEP:
      lane = f"{st.names[u.src[0]]}[{u.arg[0]}]"
      st.names[u] = f"({lane}!=0)" if u.dtype == dtypes.bool else lane
    elif u in st.absorbed: return  # rendered by the DOT4 chain that reads it
    elif _is_vector(u): self._value(st, u, self._vector_expr(st, u), uses)
    else: self._value(st, u, self._expr(st, u), uses)

  def _helper_names(self, st: RenderState, dt: DType) -> tuple[str, str, str]:
    """An emulated float's (decode, encode, round) helpers, declared in the source if needed."""
    if dt in FP8S:
      for k, src in fp8_helpers(dt, self.conversion_attr).items(): st.helpers.setdefault(k, src)
    return EMULATED_FLOATS[dt]

  def _to_storage(self, st: RenderState, dt: DType, v: str) -> str:
    return f"{self._helper_names(st, dt)[1]}({v})" if dt in EMULATED_FLOATS else v

  def _from_storage(self, st: RenderState, dt: DType, v: str) -> str:
    return f"{self._helper_names(st, dt)[0]}({v})" if dt in EMULATED_FLOATS else v

  def _load(self, st: RenderState, u: UOp) -> None:
    if _is_vector(u): val = f"*{_vector_address(st, u.src[0], u.dtype)}"
    else: val = self._from_storage(st, u.dtype, f"*{st.names[u.src[0]]}")
    if len(u.src) == 3: val = f"({st.names[u.src[2]]} ? {val} : {st.names[u.src[1]]})"
    name = st.fresh("val")
    st.emit(f"{_ctype(st, u.dtype)} {name} = {val};")
    st.names[u] = name
    if (ahead := st.prefetched.get(u)) is not None:  # unchecked (CHECK_OOB): it cannot fault
      ix = u.src[0]
      st.emit(f"__builtin_prefetch((const char*)({st.names[ix.src[0]]}+{st.names[ix.src[1]]})"
              f"+{ahead});")

  def _value(self, st: RenderState, u: UOp, expr: str, uses: dict[UOp, int]) -> None:
    if u.dtype.count == 1 and self.emulates(u.dtype) and u.op is not Ops.BITCAST:
      expr = f"{self._helper_names(st, u.dtype)[2]}({expr})"
    # vectors always get a variable: lane-wise ops read their operands once per lane
    if uses.get(u, 0) <= 1 and u.op is not Ops.WHERE and not _is_vector(u):
      st.names[u] = expr
      return
    name = st.fresh("alu")
    st.emit(f"{_ctype(st, _vdt(u))} {name} = {expr};")
    st.names[u] = name

  # ---- vectors (GCC/clang vector extensions; a bool vector is an int mask of 0 / -1 lanes) ----

  def _vector_expr(self, st: RenderState, u: UOp) -> str:
    if chain := st.dot4_chains.get(u):
      args = [st.names[x] for d in chain for x in d.src[:2]] + [st.names[chain[-1].src[2]]]
      return f"{_dot4_chain_fn(st, _vdt(u), len(chain))}({', '.join(args)})"
    op, dt, s = u.op, _vdt(u), [st.names[x] for x in u.src]
    vt = _ctype(st, dt)
    if op is Ops.STACK: return _stack(u, vt, s)
    if op is Ops.NEG: return f"(-{s[0]})"
    if _vdt(u.src[0]).scalar() == dtypes.bool and op in BOOL_MASK_OPS:  # masks are 0 / -1
      return BOOL_MASK_OPS[op].format(*s)
    if op in NATIVE_VECTOR_INFIX or (op in (Ops.SHL, Ops.SHR) and _is_shift_in_range(u)):
      return f"({s[0]}{INFIX[op]}{s[1]})"
    if op in (Ops.CMPLT, Ops.CMPNE): return _mask(st, u.src[0], f"({s[0]}{INFIX[op]}{s[1]})")
    if op is Ops.WHERE: return _select(st, dt, s[0], s[1], s[2])
    if op is Ops.MAX:
      nan = f"|({s[0]}!={s[0]})" if dtypes.is_float(dt) else ""
      return _select(st, dt, _mask(st, u.src[0], f"(({s[0]}>{s[1]}){nan})"), s[0], s[1])
    if op is Ops.RECIP: return f"({c_const(1, dt.scalar())}/{s[0]})"
    if op is Ops.BITCAST: return f"(({vt}){s[0]})"
    if op is Ops.CAST: return _convert(st, u.src[0], dt, s[0])
    if op in LANE_BUILTINS and dtypes.is_float(dt): return f"{_lane_fn(st, op, dt)}({', '.join(s)})"
    if op is Ops.DOT4: return f"{_dot4_fn(st, dt)}({', '.join(s)})"
    return self._lanewise(st, u, vt)

  def _lanewise(self, st: RenderState, u: UOp, vt: str) -> str:
    """An op with no vector form, one lane at a time: `(vt){f(a[0], b[0]), f(a[1], b[1]), ...}`."""
    lanes = []
    for i in range(_vdt(u).count):
      srcs = tuple(UOp(Ops.GEP, _vdt(x).scalar(), (x,), (i,)) for x in u.src)
      for g in srcs: self._node(st, g, {})
      lane = u.replace(dtype=u.dtype.scalar(), src=srcs)
      lanes.append(_lane_value(lane.dtype, self._expr(st, lane)))
    return f"(({vt}){{{', '.join(lanes)}}})"
  def _expr(self, st: RenderState, u: UOp) -> str:
    s = [st.names[x] for x in u.src]
    op, dt = u.op, u.dtype
    if op in (Ops.SHL, Ops.SHR) and not _is_shift_in_range(u): return _guarded_shift(op, dt, s)
    if op not in INFIX and op is not Ops.NEG: return self._alu(st, u, s)
    expr = f"(-{s[0]})" if op is Ops.NEG else f"({s[0]}{INFIX[op]}{s[1]})"
    # C computes narrow integers (and _Bool) as int: cut the result back to its width
    if op in WIDENS and is_narrow(dt) and not _fits(u): return f"(({C_TYPES[dt]}){expr})"
    return expr

  def _alu(self, st: RenderState, u: UOp, s: list[str]) -> str:
    """Ops with no C operator: function-like builtins and helpers."""
    op, dt = u.op, u.dtype
    if op is Ops.WHERE: return f"({s[0]}?{s[1]}:{s[2]})"
    if op is Ops.MULACC:
      fma = "__builtin_fma" if dt == dtypes.float64 else "__builtin_fmaf"
      return f"{fma}({s[0]}, {s[1]}, {s[2]})"
    if op is Ops.RECIP: return f"({c_const(1, dt)}/{s[0]})"
    if op is Ops.TRUNC: return f"__builtin_trunc{'f' if dt != dtypes.float64 else ''}({s[0]})"
    if op is Ops.SQRT: return f"__builtin_sqrt{'f' if dt != dtypes.float64 else ''}({s[0]})"
    if op is Ops.CAST: return f"(({C_TYPES[dt]}){s[0]})"
    if op is Ops.BITCAST: return self._bitcast(st, u.src[0].dtype, dt, s[0])
    if op is Ops.DOT4: return f"{_dot4_fn(st, dt)}({', '.join(s)})"
    if op is Ops.MAX:
      ct = C_TYPES[dt]
      st.helpers.setdefault(f"max{ct}", _max_fn(ct, dtypes.is_float(dt)))
      return f"__max_{ct.replace(' ', '_')}({s[0]}, {s[1]})"
    if op in (Ops.CDIV, Ops.CMOD, Ops.IDIV, Ops.MOD): return self._divmod(st, u, s)
    raise RuntimeError(f"C renderer: no rendering for {op.name} ({dt!r}); "
                       "it should have been decomposed")

  def _divmod(self, st: RenderState, u: UOp, s: list[str]) -> str:
    op, dt, ct = u.op, u.dtype, C_TYPES[u.dtype]
    sym = "/" if op in (Ops.CDIV, Ops.IDIV) else "%"
    if op in (Ops.CDIV, Ops.CMOD) and u.src[1].op is Ops.CONST and u.src[1].arg not in (0, -1):
      return f"({s[0]}{sym}{s[1]})"
    st.helpers.setdefault(_helper(sym, ct), _div_fn(ct, sym, dt))
    if op in (Ops.CDIV, Ops.CMOD): return f"{_helper(sym, ct)}({s[0]}, {s[1]})"
    st.helpers.setdefault(_helper("f" + sym, ct), _floor_fn(ct, sym, dt))
    return f"{_helper('f' + sym, ct)}({s[0]}, {s[1]})"

  def _bitcast(self, st: RenderState, src: DType, dst: DType, v: str) -> str:
    sv = self._to_storage(st, src, v)
    # a byte other than 0 or 1 is no valid _Bool: read it as true, as the PYTHON device does
    if dst == dtypes.bool: return f"((_Bool){sv})"
    src_ct, dst_ct = STORAGE[src], STORAGE[dst]
    copy = f"{dst_ct} __d; __builtin_memcpy(&__d, &__s, sizeof(__d)); __d;"
    raw = f"(__extension__({{{src_ct} __s = {sv}; {copy}}}))"
    return self._from_storage(st, dst, raw)
