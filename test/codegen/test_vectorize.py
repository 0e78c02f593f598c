"""Vector codegen: the range expand keeps becomes vector values (GCC/clang vector extensions on
the CPU). Every vectorized kernel is checked against the PYTHON interpreter of the same kernel
unoptimized, with native (64-byte) vectors."""
import platform
import subprocess

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.expand import expand
from unigrad.codegen.pipeline import full_rewrite
from unigrad.codegen.vectorize import choose_vector_range
from unigrad.renderer import PythonRenderer
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.runtime.ops_python import PythonProgram
from unigrad.uop import AxisType, KernelInfo, Ops, UOp

from codegen.kernels import inputs_for

pytestmark = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
VEC = CRenderer("CPU", vector_bytes=64)


def x(*shape: int, dtype=dtypes.float32) -> Tensor: return Tensor.empty(*shape, dtype=dtype)


def run(kernel: UOp, opts, inputs: list[np.ndarray], ren) -> np.ndarray:
  linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), ren)
  params = sorted((u for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.name is None),
                  key=lambda p: p.arg.slot)
  dev = "PYTHON" if isinstance(ren, PythonRenderer) else "CPU"
  bufs = [Buffer(dev, len(a), p.dtype).copyin(a.tobytes()) for a, p in zip(inputs, params)]
  specials = [u for u in linear.src if u.op is Ops.SPECIAL]
  size = (specials[0].src[0].arg,) if specials else (1,)
  if dev == "PYTHON":
    PythonProgram("k", ren.render("k", linear).encode())(*bufs, global_size=size)
  else:
    d = Device["CPU"]
    d.runtime("k", d.compiler.compile_cached(ren.render("k", linear)))(*bufs, global_size=size,
                                                                        wait=True)
  return np.frombuffer(bufs[0].copyout(), dtype=inputs[0].dtype).copy()


def check(t: Tensor, opts, rtol=1e-5) -> str:
  """The kernel with `opts` on vector CPU code equals the unoptimized PYTHON run; returns the
  rendered C source."""
  call = t.schedule().src[-1]
  kernel = call.src[0]
  inputs = inputs_for(kernel)
  want = run(kernel, (), inputs, PythonRenderer())
  got = run(kernel, opts, inputs, VEC)
  np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5, err_msg=str(opts))
  info = KernelInfo(opts_to_apply=tuple(opts))
  return VEC.render("k", full_rewrite(kernel.replace(arg=info), VEC))


KERNELS = {
  "elementwise": lambda: (x(6, 32) * 2 + x(6, 32)).relu(),
  "reduce": lambda: (x(6, 32) + 1).sum(1),
  "max reduce": lambda: x(6, 32).max(1),
  "matmul": lambda: x(4, 16) @ x(16, 32),
  "padded": lambda: x(5, 6).pad(((1, 2), (0, 3))).sum(0),
  "ragged": lambda: x(5, 7).sum(1),
  "transposed": lambda: (x(16, 8) + x(16, 8)).T,
  "exp": lambda: x(4, 32).exp(),
  "sqrt where": lambda: (x(4, 32) > 0).where(x(4, 32).abs().sqrt(), -1.0),
}
VECTOR_OPTS = [[Opt.upcast(0, 4)], [Opt.upcast(1, 8)], [Opt.upcast(1, 16)], [Opt.unroll(1, 4)],
               [Opt.group(1, 8)], [Opt.upcast(0, 2), Opt.upcast(1, 8)],
               [Opt.upcast(0, 2), Opt.unroll(1, 8)], [Opt.upcast(0, 2), Opt.group(1, 16)],
               [Opt.padto(1, 16), Opt.upcast(1, 16)], [Opt.padto(1, 8), Opt.unroll(1, 8)],
               [Opt.padto(0, 8), Opt.upcast(0, 8)], [Opt.thread(0, 2), Opt.upcast(1, 4)]]


@pytest.mark.parametrize("name", KERNELS)
def test_vectorized_kernels_match_the_unoptimized_kernel(name):
  kernel = KERNELS[name]().schedule().src[-1].src[0]
  tried = 0
  for opts in VECTOR_OPTS:
    try:
      k = OptKernel(kernel)
      for o in opts: k = k.apply(o)
    except KernelOptError: continue
    check(KERNELS[name](), opts)
    tried += 1
  assert tried >= 2


DTYPE_KERNELS = {
  "int32 floor div": lambda: x(4, 16, dtype=dtypes.int32) // 7 + x(4, 16, dtype=dtypes.int32) % 5,
  "int64": lambda: x(4, 16, dtype=dtypes.int64) * 3 - x(4, 16, dtype=dtypes.int64),
  "float64": lambda: (x(4, 16, dtype=dtypes.float64) * 0.5).exp2(),
  "bool mask to float": lambda: (x(4, 16) < x(4, 16)).float() + x(4, 16),
  "cast float to int": lambda: (x(4, 16) * 10).cast(dtypes.int32),
  "int compare max": lambda: x(4, 16, dtype=dtypes.int32).maximum(x(4, 16, dtype=dtypes.int32)),
  "float64 compare": lambda: (x(4, 16, dtype=dtypes.float64) < 0).where(
    x(4, 16, dtype=dtypes.float64), 2.0),
  "half stays scalar": lambda: x(4, 16, dtype=dtypes.float16) * 2,
}


@pytest.mark.parametrize("name", DTYPE_KERNELS)
def test_vector_dtypes_match_the_unoptimized_kernel(name):
  check(DTYPE_KERNELS[name](), [Opt.upcast(1, 16)])


def test_sum_accumulates_in_one_native_vector_register():
  src = check((x(64, 256) + 1).sum(1), [Opt.group(1, 16)])
  assert "float_v16 acc" in src
  assert "((float_v16_u*)" in src  # one unit-stride vector load, no per-lane loads


def test_matmul_tile_is_broadcast_times_vector_load():
  src = check(x(16, 64) @ x(64, 64), [Opt.upcast(1, 16), Opt.upcast(0, 4)])
  assert src.count("float_v16 acc") == 4  # four rows of 16-lane accumulators
  assert " - (float_v16){})" in src  # A's element broadcast across the lanes
  assert "= __fma_float_v16(" in src and "always_inline" in src  # one fused vector update


def assembly(src: str) -> str:
  """`src` compiled to assembly with the CPU device's compiler and flags."""
  cc = Device["CPU"].compiler
  proc = subprocess.run([cc.cc, *cc.flags, "-S", "-x", "c", "-", "-o", "-"], input=src.encode(),
                        capture_output=True, check=True)
  return proc.stdout.decode()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 instruction names")
@pytest.mark.parametrize("lanes", [16, 32])  # one register and two
def test_matmul_tile_compiles_to_vector_fma_and_broadcasts(lanes):
  # gcc 12 made `(vt){} + x` one scalar store per lane and an fma initializer list one scalar
  # vfmadd231ss per lane: matmul 256 ran at 2.5 GFLOPS
  asm = assembly(check(x(16, 64) @ x(64, 64), [Opt.upcast(1, lanes), Opt.upcast(0, 4)]))
  fmas = [ln.split()[0] for ln in asm.splitlines() if ln.strip().startswith("vfmadd")]
  assert fmas and all(f.endswith("ps") for f in fmas), sorted(set(fmas))
  assert asm.count("vmovss") < lanes  # no broadcast through memory, lane by lane


def test_vector_accumulation_is_fused_with_one_rounding():
  # clang renders the vector fma helper as a*b+c under `fp contract(fast)` (its lane loop was
  # rebuilt as spilled 4-lane pieces in a conv tile): still one rounding per step, as BLAS
  k = (x(16, 2) @ x(2, 16)).schedule().src[-1].src[0]
  big = np.float32(1 + 2 ** -12)
  a = np.tile(np.array([-(1 + 2 ** -11), big], np.float32), 16)
  b = np.concatenate([np.ones(16, np.float32), np.full(16, big, np.float32)])
  got = run(k, [Opt.upcast(1, 16), Opt.upcast(0, 4)], [np.zeros(256, np.float32), a, b], VEC)
  np.testing.assert_array_equal(got, np.full(256, 2 ** -24, np.float32))  # unfused: 0


def test_vector_wider_than_a_register_is_one_value_per_register():
  # a 32-lane float_v32 was kept in memory by gcc 12, its fma helper run lane by lane
  src = check(x(16, 64) @ x(64, 64), [Opt.upcast(1, 32), Opt.upcast(0, 4)])
  assert "float_v32" not in src and src.count("float_v16 acc") == 8
  src = check((x(8, 256) + 1).sum(1), [Opt.group(1, 32)])  # partial sums: two registers
  assert "float_v32" not in src and src.count("float_v16 acc") == 2
  src = check(x(4, 32, dtype=dtypes.float64) * 2, [Opt.upcast(1, 16)])
  assert "double_v16" not in src and "double_v8" in src


def test_wide_lanes_beside_register_wide_ones_stay_one_vector():
  # threefry's uint64 beside the floats it makes: splitting the range doubled the kernel's code
  src = check(x(4, 16) + x(4, 16, dtype=dtypes.int64).cast(dtypes.float32), [Opt.upcast(1, 16)])
  assert "float_v16 " in src and "long_long_v16 " in src and "float_v8" not in src


def test_strided_store_is_one_store_per_lane():
  src = check((x(16, 8) + x(16, 8)).T, [Opt.upcast(0, 8)])  # unit-stride loads, strided store
  assert "float_v8_u*" in src and "[7];" in src  # lanes stored one by one


def test_per_lane_gates_load_each_lane():
  check(x(5, 6).pad(((1, 2), (0, 3))).sum(0), [Opt.padto(0, 16), Opt.upcast(0, 16)])


def test_without_vectors_every_lane_is_unrolled():
  kernel = (x(64, 256) + 1).sum(1).schedule().src[-1].src[0]
  k = OptKernel(kernel).apply(Opt.group(1, 16)).finalize()
  assert choose_vector_range(k, 0) is None
  r = choose_vector_range(k, 64)
  assert r is not None and r.arg.axis_type is AxisType.GROUP_REDUCE


def test_vector_range_needs_more_unit_stride_than_strided_accesses():
  kernel = (x(16, 8).T * 3).schedule().src[-1].src[0]  # one access strided in each axis
  for opt in (Opt.upcast(0, 8), Opt.upcast(1, 4)):
    assert choose_vector_range(OptKernel(kernel).apply(opt).finalize(), 64) is None
  kernel = ((x(16, 8) + x(16, 8)).T).schedule().src[-1].src[0]
  assert choose_vector_range(OptKernel(kernel).apply(Opt.upcast(0, 8)).finalize(), 64) is not None


def test_bytes_are_vector_loads_widened_but_byte_arithmetic_stays_scalar():
  # a quantized weight's packed integers: one 16-byte vector load, widened in registers
  src = check((x(4, 16, dtype=dtypes.uint8).cast(dtypes.int32) >> 4).float() * x(4, 16),
              [Opt.upcast(1, 16)])
  assert "((unsigned_char_v16_u*)" in src and "__builtin_convertvector(" in src
  src = check(x(4, 16, dtype=dtypes.int8).float() + 1, [Opt.upcast(1, 16)])
  assert "((signed_char_v16_u*)" in src
  src = check(x(4, 16, dtype=dtypes.uint8) + 200, [Opt.upcast(1, 16)])  # C computes it as int
  assert "unsigned_char_v16" not in src


def test_bool_vectors_order_false_before_true():
  a, b = x(4, 16) > 0, x(4, 16) > 0.5
  check(a.cast(dtypes.int32) < b.cast(dtypes.int32), [Opt.upcast(1, 16)])
  check(a.maximum(b).float() + (a < b).float() + (a + b).float(), [Opt.upcast(1, 16)])


# ---- streaming stores: outputs bigger than the caches are written around them ----

STREAM = CRenderer("CPU", vector_bytes=64, stream_bytes=4096)


def run_at(kernel: UOp, opts, inputs: list[np.ndarray], ren, out_offset: int) -> np.ndarray:
  """Run the C kernel with the output `out_offset` elements into a larger array (so its
  addresses need not be vector aligned); returns the output."""
  linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), ren)
  out = np.zeros(len(inputs[0]) + 16, dtype=inputs[0].dtype)
  arrays = [out, *inputs[1:]]
  addrs = [out.ctypes.data + out_offset * out.itemsize] + [a.ctypes.data for a in arrays[1:]]
  specials = [u for u in linear.src if u.op is Ops.SPECIAL]
  d = Device["CPU"]
  prog = d.runtime("k", d.compiler.compile_cached(ren.render("k", linear)))
  prog(*addrs, global_size=(specials[0].src[0].arg,) if specials else (1,), wait=True)
  return out[out_offset:out_offset + len(inputs[0])]


def test_big_outputs_are_streamed_around_the_caches():
  t = (x(64, 64) * 2 + x(64, 64)).relu()  # a 16 KB output, over STREAM's 4 KB
  kernel = t.schedule().src[-1].src[0]
  opts = [Opt.thread(0, 2), Opt.upcast(2, 16)]  # axes: THREAD, rows, columns
  src = STREAM.render("k", full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))),
                                        STREAM))
  assert "__builtin_nontemporal_store" in src and "__atomic_thread_fence" in src
  inputs = inputs_for(kernel)
  want = run(kernel, (), inputs, PythonRenderer())
  for offset in (0, 1):  # aligned: streamed; one float off: the helper's plain-store fallback
    np.testing.assert_allclose(run_at(kernel, opts, inputs, STREAM, offset), want, rtol=1e-6)


def test_small_read_or_scalar_outputs_are_not_streamed():
  def src(t: Tensor, opts, ren=STREAM) -> str:
    kernel = t.schedule().src[-1].src[0]
    return ren.render("k", full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))),
                                        ren))
  assert "nontemporal" not in src(x(64, 64) * 2, [Opt.upcast(1, 16)], VEC)  # no stream_bytes
  assert "nontemporal" not in src(x(4, 32) * 2, [Opt.upcast(1, 16)])  # 512 bytes
  assert "nontemporal" not in src(x(64, 64) * 2, [])  # scalar stores


# ---- prefetching: loads that stream through memory ask for their data ahead ----

PREFETCHING = CRenderer("CPU", vector_bytes=64, prefetch_bytes=4096)


def rendered(t: Tensor, opts, ren=PREFETCHING) -> tuple[UOp, str]:
  kernel = t.schedule().src[-1].src[0]
  return kernel, ren.render("k", full_rewrite(
    kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), ren))


def prefetch_lines(src: str) -> list[str]:
  return [line.strip() for line in src.splitlines() if "__builtin_prefetch" in line]


def test_a_matvec_prefetches_its_weight_not_its_vector():
  # each weight element is read once (its address moves with every loop): prefetched 4096 bytes
  # ahead (64 trips of the reduce loop moving 64 bytes); the vector is read once per row: not
  kernel, src = rendered((x(64, 256) * x(256)).sum(1), [Opt.thread(0, 2), Opt.unroll(2, 16)])
  lines = prefetch_lines(src)
  assert len(lines) == 1 and lines[0].endswith("+4096);") and "(data1+" in lines[0], src
  inputs = inputs_for(kernel)
  np.testing.assert_allclose(run(kernel, [Opt.thread(0, 2), Opt.unroll(2, 16)], inputs,
                                 PREFETCHING),
                             run(kernel, [], inputs, PythonRenderer()), rtol=1e-5)


def test_reused_narrow_or_unlooped_loads_are_not_prefetched():
  # a matmul reads each input once per output row or column: the caches serve it
  assert not prefetch_lines(rendered(x(64, 64) @ x(64, 64), [Opt.upcast(1, 16)])[1])
  # scalar loads move 4 bytes a trip: the hardware's prefetcher follows them
  assert not prefetch_lines(rendered((x(64, 256) * x(256)).sum(1), [])[1])
  # prefetch_bytes=0 (the PREFETCH knob's 0): none
  assert not prefetch_lines(rendered((x(64, 256) * x(256)).sum(1), [Opt.unroll(1, 16)], VEC)[1])


def test_prefetch_distance_is_shared_by_a_loops_streams():
  # two streamed weights of one loop, 64 bytes a trip each: 4096 bytes in all is 32 trips ahead
  _, src = rendered((x(64, 256) * x(64, 256) * x(256)).sum(1), [Opt.unroll(1, 16)])
  lines = prefetch_lines(src)
  assert len(lines) == 2 and all(line.endswith("+2048);") for line in lines), src


def test_expand_keeps_the_vector_range_the_kernel_records():
  kernel = (x(16, 8) + x(16, 8)).schedule().src[-1].src[0]
  k = OptKernel(kernel).apply(Opt.upcast(1, 8)).apply(Opt.upcast(0, 4))
  best = k.vector_range(64)
  other = next(r for r in k.axes if r.arg.axis_type is AxisType.UPCAST and r is not best)
  for chosen in (best, other):  # the recorded range is kept, even where it scores lower
    out = expand(k.with_vector(chosen).finalize(), 64)
    left = [u.arg.id for u in out.toposort() if u.op is Ops.RANGE
            and u.arg.axis_type is AxisType.UPCAST]
    assert left == [chosen.arg.id] and out.arg.vector == (chosen.arg.id,)
  out = expand(k.with_vector(None).finalize(), 64)  # recorded: no vector
  assert out.arg.vector == () and not any(u.op is Ops.RANGE and u.arg.axis_type is AxisType.UPCAST
                                          for u in out.toposort())


def test_kernel_given_opts_has_its_vector_chosen_by_expand():
  kernel = (x(16, 8) + x(16, 8)).schedule().src[-1].src[0]
  k = OptKernel(kernel).apply(Opt.upcast(1, 8))
  assert k.finalize().arg.vector is None  # nothing chose yet
  out = expand(k.finalize(), 64)
  assert out.arg.vector == (k.vector_range(64).arg.id,)
