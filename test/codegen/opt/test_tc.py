"""The TC opt: matmuls of 16-bit inputs with float32 accumulation on tensor cores (WMMA).

Without a GPU the lowering's index math is checked by running the lowered kernels on the PYTHON
device emulating CUDA (EMULATE=CUDA): work groups in lockstep, WMMA per warp with the PTX ISA's
fragment layouts transcribed in the emulator on their own. A lowering that put any element of A,
B or the accumulators at the wrong lane gives a wrong product there (the mutation test shows
it). The rendered CUDA kernels compile for sm_90 with nvcc wherever it is installed, and their
PTX holds the mma.sync instruction.
"""
import shutil
import subprocess

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.opt import KernelOptError, Opt, OptOps
from unigrad.codegen.opt.gpu_heuristic import gpu_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
from unigrad.dtype import dtypes
from unigrad.knobs import Context
from unigrad.renderer.gpu import PTX_TYPES, CUDARenderer, OpenCLRenderer
from unigrad.renderer.tensor_core import MMA_M16N8K16, TensorCore
from unigrad.runtime.device import Device
from unigrad.runtime.ops_cuda import CUDACompiler
from unigrad.uop import AxisType, KernelInfo, Ops

EMU = "PYTHON:13"  # a PYTHON device opened with EMULATE=CUDA (devices are cached by name)
F16, BF16 = MMA_M16N8K16
NVCC = shutil.which("nvcc")


@pytest.fixture(scope="module")
def emu():
  with Context(EMULATE="CUDA"): dev = Device[EMU]
  assert dev.renderer.has_local and dev.renderer.tensor_cores == MMA_M16N8K16
  return EMU


def _matmul_kernel(m, k, n, dt=dtypes.float16, batch=()):
  a = Tensor.empty(*batch, m, k, dtype=dt, device="NULL")
  b = Tensor.empty(*batch, k, n, dtype=dt, device="NULL")
  ast = (a @ b).schedule().src[-1].src[0]
  return CODEGEN_STAGES[0].run(ast, CUDARenderer())  # simplified, as optimize sees it


def _reduce_axis(ast):
  types = OptKernel(ast).axis_types()
  return types.index(AxisType.REDUCE)


def _rand(shape, dt, seed):
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return x.astype(np.float16) if dt == dtypes.float16 else x


def _uses_wmma(out, dev):
  """How many WMMA instructions the kernel of `out` runs per warp step (0: no tensor cores)."""
  kernel = out.schedule().src[-1].src[0]
  return sum(u.op is Ops.WMMA for u in full_rewrite(kernel, Device[dev].renderer).src)


def _reference(a, b, dt):
  """fp32 products and sums of the 16-bit inputs, rounded to the output's 16 bits."""
  out = Tensor(a.astype(np.float32) @ b.astype(np.float32), device="CPU").cast(dt)
  return out.float().numpy()


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(32, 48, 16), (16, 16, 8), (32, 16, 64)])
def test_tc_matmul_on_the_warp_emulator_matches_numpy(emu, dt, shape):
  m, k, n = shape
  a, b = _rand((m, k), dtypes.float16, 1), _rand((k, n), dtypes.float16, 2)
  ta = Tensor(a.astype(np.float32), device=emu).cast(dt)
  tb = Tensor(b.astype(np.float32), device=emu).cast(dt)
  out = ta @ tb
  assert _uses_wmma(out, emu) == min(4, n // 8)  # TC, tiles per warp along n (fragment reuse)
  got = out.float().numpy()
  ra = Tensor(a.astype(np.float32), device="CPU").cast(dt).float().numpy()
  rb = Tensor(b.astype(np.float32), device="CPU").cast(dt).float().numpy()
  np.testing.assert_allclose(got, _reference(ra, rb, dt), rtol=1e-2, atol=1e-2)


def test_tc_batched_matmul_with_an_epilogue_on_the_warp_emulator(emu):
  a, b = _rand((2, 16, 32), dtypes.float16, 3), _rand((2, 32, 8), dtypes.float16, 4)
  bias = np.arange(8, dtype=np.float32)
  ta, tb = Tensor(a, device=emu), Tensor(b, device=emu)
  out = ((ta @ tb).float() + Tensor(bias, device=emu)).relu()
  assert _uses_wmma(out, emu)
  ref = np.maximum(_reference(a, b, dtypes.float16) + bias, 0)
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-2, atol=1e-2)


def test_a_wrong_fragment_layout_gives_a_wrong_product(emu, monkeypatch):
  """The emulator checks the lowering: B's fragments read with the lane's roles swapped (group
  as k, lane in group as n) put elements at the wrong k, and the product differs from numpy."""
  def swapped(self, g, t, i): return g + 8 * (i >> 1), t * 2 + (i & 1)
  monkeypatch.setattr(TensorCore, "b_pos", swapped)
  a, b = _rand((16, 16), dtypes.float16, 5), _rand((16, 8), dtypes.float16, 6)
  out = Tensor(a, device=emu) @ Tensor(b, device=emu)
  assert _uses_wmma(out, emu)
  got = out.float().numpy()
  assert not np.allclose(got, _reference(a, b, dtypes.float16), rtol=1e-2, atol=1e-2)


def test_tc_opt_lowers_to_a_warp_axis_and_wmma():
  ast = _matmul_kernel(32, 32, 16)
  k = OptKernel(ast).apply(Opt(OptOps.TC, _reduce_axis(ast), F16))
  types = k.axis_types()
  assert types.count(AxisType.WARP) == 1 and k.sizes[types.index(AxisType.WARP)] == 32
  assert [s for s, t in zip(k.sizes, types) if t is AxisType.LOOP] == [2, 2]  # 32/16, 16/8
  assert [s for s, t in zip(k.sizes, types) if t is AxisType.REDUCE] == [2]  # 32/16
  wmmas = [u for u in k.ast.toposort() if u.op is Ops.WMMA]
  assert len(wmmas) == 1 and wmmas[0].src[0].dtype == dtypes.float16.vec(8)


@pytest.mark.parametrize("make, why", [
  (lambda: _matmul_kernel(32, 32, 16, dtypes.float32), "multiplies half"),  # fp32 inputs: no TC
  (lambda: _matmul_kernel(32, 24, 16), "multiple of 16"),  # K not a multiple of 16
  (lambda: _matmul_kernel(24, 32, 12), "divisible"),  # M, N not multiples of the tile
])
def test_tc_refuses_kernels_it_cannot_compute(make, why):
  ast = make()
  with pytest.raises(KernelOptError, match=why):
    OptKernel(ast).apply(Opt(OptOps.TC, _reduce_axis(ast), F16))


def test_tc_must_come_first_and_apply_to_a_reduce_axis():
  ast = _matmul_kernel(32, 32, 16)
  with pytest.raises(KernelOptError, match="first"):
    OptKernel(ast).apply(Opt.local(0, 2)).apply(Opt(OptOps.TC, _reduce_axis(ast), F16))
  with pytest.raises(KernelOptError, match="REDUCE axis"):
    OptKernel(ast).apply(Opt(OptOps.TC, 0, F16))
  with pytest.raises(KernelOptError, match="TensorCore"):
    OptKernel(ast).apply(Opt(OptOps.TC, _reduce_axis(ast), "m16n8k16"))


def test_the_cuda_heuristic_applies_tc_to_half_matmuls_only():
  ren = CUDARenderer()
  half = gpu_optimizations(OptKernel(_matmul_kernel(64, 64, 64)), ren)
  assert half.applied[0].op is OptOps.TC
  assert AxisType.UPCAST in half.axis_types()  # several tiles per warp share fragments
  single = gpu_optimizations(OptKernel(_matmul_kernel(64, 64, 64, dtypes.float32)), ren)
  assert all(o.op is not OptOps.TC for o in single.applied)
  cl = gpu_optimizations(OptKernel(_matmul_kernel(64, 64, 64)), OpenCLRenderer())
  assert all(o.op is not OptOps.TC for o in cl.applied)  # OpenCL declares no tensor cores


def test_wmma_on_a_target_without_tensor_cores_is_a_clear_error():
  ast = _matmul_kernel(16, 16, 8)
  ast = ast.replace(arg=KernelInfo(opts_to_apply=(Opt(OptOps.TC, _reduce_axis(ast), F16),)))
  ren = OpenCLRenderer()
  with pytest.raises(RuntimeError, match="no tensor cores"): ren.render("k", full_rewrite(ast, ren))


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
@pytest.mark.parametrize("tc", MMA_M16N8K16, ids=lambda tc: tc.name)
def test_tc_kernels_compile_to_ptx_with_mma_sync_and_to_sass_for_sm90(tc, tmp_path):
  ren = CUDARenderer()
  ast = _matmul_kernel(64, 64, 32, tc.dtype_in, batch=(2,))
  ast = ast.replace(arg=KernelInfo(opts_to_apply=(Opt(OptOps.TC, _reduce_axis(ast), tc),)))
  src = ren.render("tc_kernel", full_rewrite(ast, ren))
  assert "mma.sync.aligned.m16n8k16.row.col.f32" in src
  cu = tmp_path / "k.cu"
  cu.write_text(src)
  ptx = subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-o", "-", str(cu)], capture_output=True,
                       text=True, timeout=300)
  assert ptx.returncode == 0, ptx.stderr
  t = PTX_TYPES[tc.dtype_in]
  assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx.stdout
  assert CUDACompiler("sm_90").compile(src)[:4] == b"\x7fELF"  # SASS (ptxas) in a cubin
