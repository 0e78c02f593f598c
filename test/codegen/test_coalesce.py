"""coalesce: neighbouring scalar accesses of UPCAST lanes become vector accesses on GPU targets
(float4 in OpenCL C and CUDA C); CUDA's only where the address is provably 16-byte aligned."""
import shutil
import subprocess

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.coalesce import coalesce
from unigrad.codegen.opt import Opt
from unigrad.codegen.opt.gpu_heuristic import MIN_VECTOR_ITEMS, gpu_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
from unigrad.renderer.cstyle import CRenderer
from unigrad.renderer.gpu import CUDARenderer, OpenCLRenderer
from unigrad.runtime.device import Device
from unigrad.uop import AxisType, KernelInfo, Ops

CL, CUDA = OpenCLRenderer(), CUDARenderer()


def lower(t, ren, opts):
  kernel = t.schedule().src[-1].src[0].replace(arg=KernelInfo(opts_to_apply=tuple(opts)))
  return full_rewrite(kernel, ren)


def vector_accesses(linear):
  loads = [u for u in linear.src if u.op is Ops.LOAD and u.dtype.count > 1]
  stores = [u for u in linear.src if u.op is Ops.STORE and u.src[1].dtype.count > 1]
  return [u.dtype.count for u in loads], [u.src[1].dtype.count for u in stores]


def test_upcast_lanes_load_and_store_as_float4_in_both_dialects():
  t = Tensor.empty(64, 64, device="NULL") * 2 + 1
  for ren in (CL, CUDA):
    linear = lower(t, ren, [Opt.upcast(1, 4)])
    assert vector_accesses(linear) == ([4], [4])
  assert "vload4(0, " in CL.render("k", lower(t, CL, [Opt.upcast(1, 4)]))
  src = CUDA.render("k", lower(t, CUDA, [Opt.upcast(1, 4)]))
  assert "float4 " in src and "*((float4*)" in src


def test_an_unaligned_base_is_scalar_on_cuda_and_vload_on_opencl():
  """x[:, 1:] of rows of 65: each row's reads start at 65*i + 1, not a multiple of 4 (CUDA's
  float4 needs 16-byte addresses; OpenCL's vload4 needs only 4); the stores are aligned."""
  t = Tensor.empty(64, 65, device="NULL")[:, 1:] * 2
  assert vector_accesses(lower(t, CUDA, [Opt.upcast(1, 4)])) == ([], [4])
  assert vector_accesses(lower(t, CL, [Opt.upcast(1, 4)])) == ([4], [4])


def test_strided_lanes_and_cpu_targets_stay_scalar():
  t = Tensor.empty(64, 64, device="NULL").T * 2  # lanes of the upcast axis are 64 apart in x
  assert vector_accesses(lower(t, CUDA, [Opt.upcast(1, 4)]))[0] == []
  linear = lower(Tensor.empty(64, 64, device="NULL") * 2, CRenderer(), [Opt.upcast(1, 4)])
  assert coalesce(linear, CRenderer()) is linear  # no access_lanes: nothing to do


def test_two_lane_runs_when_four_do_not_fit():
  t = Tensor.empty(64, 6, device="NULL") + 1
  assert vector_accesses(lower(t, CL, [Opt.upcast(1, 6)])) == ([4, 2], [4, 2])


def test_the_gpu_heuristic_upcasts_the_stores_contiguous_axis_by_four():
  ast = CODEGEN_STAGES[0].run((Tensor.empty(256, 256, device="NULL") + 1).schedule().src[-1].src[0],
                              CL)
  k = gpu_optimizations(OptKernel(ast), CL)
  ups = [s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.UPCAST]
  assert ups == [4]
  small = CODEGEN_STAGES[0].run((Tensor.empty(8, 8, device="NULL") + 1).schedule().src[-1].src[0],
                                CL)
  assert 64 < MIN_VECTOR_ITEMS
  assert AxisType.UPCAST not in gpu_optimizations(OptKernel(small), CL).axis_types()


@pytest.mark.skipif(not Device.device_class("CL").is_available(), reason="no OpenCL")
@pytest.mark.parametrize("npdt", [np.float32, np.int32])
def test_vector_accesses_on_cl_match_numpy(npdt):
  a = (np.arange(128 * 130).reshape(128, 130) % 97 - 40).astype(npdt)
  x = Tensor(a, device="CL")
  out = x[:, 1:129] * 3 + x[:, 2:130]  # reads at unaligned bases: vload4 needs no alignment
  linear = full_rewrite(out.schedule().src[-1].src[0], Device["CL"].renderer)
  # the heuristic upcast by 4: the two reads share elements (5 per row part): one vload4
  assert vector_accesses(linear) == ([4], [4])
  np.testing.assert_array_equal(out.numpy(), a[:, 1:129] * 3 + a[:, 2:130])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_cuda_float4_accesses_are_128_bit_loads_and_stores_in_ptx(tmp_path):
  """The vector access compiles to ld/st .v4.f32 (the buffer-address check keeps a lane-by-lane
  path for views at odd offsets)."""
  src = CUDA.render("k", lower(Tensor.empty(64, 64, device="NULL") * 2, CUDA, [Opt.upcast(1, 4)]))
  (tmp_path / "k.cu").write_text(src)
  ptx = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", "-", str(tmp_path / "k.cu")],
                       capture_output=True, text=True, timeout=300)
  assert ptx.returncode == 0, ptx.stderr
  assert ".v4.f32" in ptx.stdout and "ld.global" in ptx.stdout and "st.global.v4" in ptx.stdout
