"""PACK (codegen/opt/pack.py): an input's panel copied into a kernel-local buffer computes what
the kernel computed without it (the PYTHON interpreter is the meaning; the CPU's packed kernels
equal their unpacked selves bit for bit), its legality checks, and that the heuristics pack a
large matmul's B panel (pack_panel) and leave small or already contiguous panels alone."""
import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.opt import KernelOptError, Opt, OptOps
from unigrad.codegen.opt.heuristic import hand_coded_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.opt.pack import is_contiguous_panel
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
from unigrad.renderer import PythonRenderer
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.runtime.ops_python import PythonProgram
from unigrad.uop import AxisType, KernelInfo, Ops, UOp

from codegen.kernels import inputs_for, params_of

AVX512, AVX2 = CRenderer(vector_bytes=64, vector_registers=32), CRenderer(vector_bytes=32)
needs_cc = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")


def reduce_kernel(t: Tensor) -> UOp:
  """The (simplified) kernel of t that has a REDUCE, as the optimize stage gets it."""
  asts = [c.src[0] for c in t.schedule().src if c.src[0].op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(asts) == 1
  return CODEGEN_STAGES[0].run(asts[0], CRenderer())


def run(kernel: UOp, opts: tuple[Opt, ...], inputs: list[np.ndarray], ren) -> np.ndarray:
  """Output buffer 0 of `kernel` with `opts`, on PYTHON (a PythonRenderer) or the CPU."""
  linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=opts)), ren)
  dev = "PYTHON" if isinstance(ren, PythonRenderer) else "CPU"
  bufs = [Buffer(dev, len(a), p.dtype).copyin(a.tobytes())
          for a, p in zip(inputs, params_of(kernel))]
  specials = [u for u in linear.src if u.op is Ops.SPECIAL]
  size = (specials[0].src[0].arg,) if specials else (1,)
  src = ren.render("k", linear)
  if dev == "PYTHON": prog = PythonProgram("k", src.encode())
  else: prog = Device["CPU"].runtime("k", Device["CPU"].compiler.compile_cached(src))
  prog(*bufs, global_size=size)
  return np.frombuffer(bufs[0].copyout(), dtype=inputs[0].dtype).copy()


def matmul(a: tuple[int, ...], b: tuple[int, ...]) -> Tensor:
  return Tensor.empty(*a) @ Tensor.empty(*b)


def b_slot(kernel: UOp) -> int:
  """The slot of a matmul kernel's B: the input read contiguously along the last output axis."""
  return max(p.arg.slot for p in params_of(kernel))


def panel(k: OptKernel) -> UOp: return next(u for u in k.ast.toposort() if u.op is Ops.BUFFER)


# ---- meaning: the PYTHON interpreter ----

SMALL = {  # name -> (tensor, opts before PACK, PACK's axis)
  "matmul": (lambda: matmul((8, 12), (12, 16)), (Opt.upcast(1, 4), Opt.upcast(0, 2),
                                                 Opt.swap(0, 1)), 0),
  "ragged tile": (lambda: matmul((6, 5), (5, 10)), (Opt.upcast(1, 2), Opt.upcast(0, 3)), 0),
  "batched": (lambda: matmul((3, 4, 6), (3, 6, 8)), (Opt.upcast(2, 4), Opt.swap(1, 2)), 1),
  "no tile": (lambda: matmul((5, 7), (7, 3)), (), 1),
}


@pytest.mark.parametrize("name", SMALL)
def test_packed_kernel_computes_what_the_unpacked_one_does(name):
  make, opts, axis = SMALL[name]
  kernel = reduce_kernel(make())
  inputs = inputs_for(kernel)
  want = run(kernel, (), inputs, PythonRenderer())
  packed = OptKernel(kernel)
  for o in opts: packed = packed.apply(o)
  packed = packed.apply(Opt.pack(axis, b_slot(kernel)))
  assert panel(packed).src[0].arg[0] > 1, "the panel holds more than one element"
  got = run(kernel, (*opts, Opt.pack(axis, b_slot(kernel))), inputs, PythonRenderer())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_panel_keeps_the_inputs_contiguous_runs_innermost():
  kernel = reduce_kernel(matmul((8, 12), (12, 16)))
  k = OptKernel(kernel).apply(Opt.upcast(1, 4)).apply(Opt.upcast(1, 2)).apply(Opt.swap(0, 1))
  packed = k.apply(Opt.pack(0, b_slot(kernel)))
  assert panel(packed).src[0].arg == (12 * 8,), "K rows of the 8 columns of one panel"
  copies = [r for r in packed.axes if r not in k.axes]
  assert [r.src[0].arg for r in copies] == [12, 2, 4], "rows, then the 4 lanes innermost"
  assert all(r.arg.axis_type is AxisType.LOOP for r in copies)


# ---- legality ----

def test_pack_legality_errors():
  kernel = reduce_kernel(matmul((8, 12), (12, 16)))
  k = OptKernel(kernel).apply(Opt.upcast(1, 4)).apply(Opt.swap(0, 1))
  with pytest.raises(KernelOptError, match="no buffer"): k.apply(Opt.pack(0, 7))
  with pytest.raises(KernelOptError, match="written"): k.apply(Opt.pack(0, 0))
  with pytest.raises(KernelOptError, match="LOOP axis"): k.apply(Opt.pack(2, b_slot(kernel)))
  with pytest.raises(KernelOptError, match="PARAM slot"): k.apply(Opt(OptOps.PACK, 0, None))
  packed = k.apply(Opt.pack(0, b_slot(kernel)))
  with pytest.raises(KernelOptError, match="last opt"): packed.apply(Opt.upcast(1, 2))
  rows = reduce_kernel((Tensor.empty(6, 8) * Tensor.empty(6, 1)).sum(1))  # (6, 1): one per row
  with pytest.raises(KernelOptError, match="does not vary"): OptKernel(rows).apply(Opt.pack(0, 2))


def test_pack_refuses_gated_reads_and_oversized_panels():
  padded = reduce_kernel(Tensor.empty(8, 12) @ Tensor.empty(12, 14).pad(((0, 0), (0, 2))))
  with pytest.raises(KernelOptError, match="gated"): OptKernel(padded).apply(Opt.pack(0, 2))
  big = reduce_kernel(matmul((16, 4096), (4096, 128)))  # 2 MiB of B inside the loop of m
  with pytest.raises(KernelOptError, match="exceeds"): OptKernel(big).apply(Opt.pack(0, 2))


# ---- the heuristics ----

@pytest.mark.parametrize("ren", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_large_matmul_packs_its_b_panel(ren, threads):
  """Losing the packing loses matmul 2048 a third of its speed (AVX-512) or half (AVX2)."""
  kernel = reduce_kernel(matmul((2048, 2048), (2048, 2048)))
  out = hand_coded_optimizations(OptKernel(kernel), ren, threads)
  assert out.applied[-1] == Opt.pack(out.applied[-1].axis, b_slot(kernel))
  width = 2 * ren.vector_bytes // 4
  assert panel(out).src[0].arg == (2048 * width,), "K rows of the tile's two vectors"
  pack_loop = out.axes[out.applied[-1].axis]
  assert pack_loop.src[0].arg == 2048 // width, "one panel per tile column"


@pytest.mark.parametrize("ren", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_a_transposed_matmul_packs_its_b_panel_too(ren):
  """Regression: in `a.T @ b` both inputs are contiguous along an output axis; the panel's reads
  did not count for the vector choice (only global accesses did), so packing B moved the vector
  to A's axis and the heuristic dropped it: a.T @ b 1024 ran at 0.86 of a @ b (0.95 packed)."""
  kernel = reduce_kernel(Tensor.empty(1024, 1024).T @ Tensor.empty(1024, 1024))
  out = hand_coded_optimizations(OptKernel(kernel), ren, 1)
  assert out.applied[-1] == Opt.pack(out.applied[-1].axis, b_slot(kernel))


@pytest.mark.parametrize("shape", [((16, 512), (512, 512)), ((64, 64), (64, 64))])
def test_matmul_keeps_small_or_little_reused_panels_unpacked(shape):
  """16 rows: 2 tile rows per copy; 64x64: the panel fits L1."""
  out = hand_coded_optimizations(OptKernel(reduce_kernel(matmul(*shape))), AVX512, 1)
  assert all(o.op is not OptOps.PACK for o in out.applied)


def test_a_panel_that_is_the_whole_input_is_contiguous():
  kernel = reduce_kernel(matmul((8, 12), (12, 16)))
  whole = OptKernel(kernel).apply(Opt.upcast(1, 16))  # the loop of m reads all of B in order
  assert is_contiguous_panel(whole.ast, whole.axes[0], b_slot(kernel))
  half = OptKernel(kernel).apply(Opt.upcast(1, 8)).apply(Opt.swap(0, 1))
  assert not is_contiguous_panel(half.ast, half.axes[0], b_slot(kernel))


# ---- the CPU: packed tiles equal their unpacked selves ----

@needs_cc
@pytest.mark.parametrize("ren", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("shape", [((256, 256), (256, 256)), ((200, 300), (300, 48)),
                                   ((2, 128, 384), (2, 384, 96)), ((128, 1000), (1000, 64))],
                         ids=["square", "odd", "batched", "long-k"])
def test_packed_cpu_kernel_is_bit_exact(ren, shape):
  kernel = reduce_kernel(matmul(*shape))
  out = hand_coded_optimizations(OptKernel(kernel), ren, threads=1)
  assert out.applied[-1].op is OptOps.PACK, f"{shape} should pack: {out.applied}"
  inputs = inputs_for(kernel)
  got = run(kernel, out.applied, inputs, ren)
  np.testing.assert_array_equal(got, run(kernel, out.applied[:-1], inputs, ren))
  a, b = (x.reshape(s) for x, s in zip(inputs[1:], shape))
  np.testing.assert_allclose(got.reshape((a @ b).shape), a @ b, rtol=1e-4, atol=1e-4)
