"""The CL device (OpenCL through PoCL here): the same programs on PYTHON, CPU and CL agree with
numpy and PyTorch; the device's errors are clear. Skips when no OpenCL platform exists."""
import math

import numpy as np
import pytest
import torch

from unigrad import Context, Tensor
from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.opt.search import GPUTarget, extend, work_items
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
from unigrad.engine.programs import get_runner
from unigrad.runtime import ops_cl
from unigrad.runtime.device import Buffer, CompileError, Device
from unigrad.dtype import dtypes
from unigrad.uop import AxisType, KernelInfo

if not Device.device_class("CL").is_available():
  pytest.skip("no OpenCL platform", allow_module_level=True)

DEVICES = ("PYTHON", "CPU", "CL")


def rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_and_broadcast(device):
  a, b = rand(5, 7), rand(1, 7, seed=1)
  got = ((Tensor(a, device=device) * Tensor(b, device=device)).exp().sqrt() - 1).numpy()
  np.testing.assert_allclose(got, np.sqrt(np.exp(a * b)) - 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_over_each_axis(device):
  a = rand(6, 5, 4)
  t = Tensor(a, device=device)
  np.testing.assert_allclose(t.sum(0).numpy(), a.sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(t.max(1).numpy(), a.max(1))
  np.testing.assert_allclose(t.mean(2).numpy(), a.mean(2), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.sum().numpy(), a.sum(), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul(device):
  a, b = rand(9, 17), rand(17, 6, seed=1)
  got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
  np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d(device):
  x, w = rand(2, 3, 7, 7), rand(4, 3, 3, 3, seed=1)
  got = Tensor(x, device=device).conv2d(Tensor(w, device=device), padding=1).numpy()
  want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax(device):
  a = rand(4, 33) * 10
  got = Tensor(a, device=device).softmax(-1).numpy()
  np.testing.assert_allclose(got, torch.from_numpy(a).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", ("CPU", "CL"))
def test_training_step_matches_torch(device):
  x, w0, y = rand(8, 5), rand(5, 3, seed=1), np.arange(8) % 3
  w = Tensor(w0, device=device, requires_grad=True)
  loss = (Tensor(x, device=device) @ w).cross_entropy(Tensor(y, device=device))
  loss.backward()
  tw = torch.from_numpy(w0).requires_grad_()
  tl = torch.nn.functional.cross_entropy(torch.from_numpy(x) @ tw, torch.from_numpy(y))
  tl.backward()
  np.testing.assert_allclose(loss.numpy(), tl.item(), rtol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_half_and_bfloat16_are_emulated_and_round_like_torch():
  a = rand(3, 8)
  for dt, tdt in ((dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)):
    t = Tensor(a, device="CL").cast(dt)
    got = (t * t + t).cast(dtypes.float32).numpy()
    ta = torch.from_numpy(a).to(tdt)
    np.testing.assert_array_equal(got, (ta * ta + ta).float().numpy())


def test_copy_between_cpu_and_cl_and_to():
  a = rand(4, 4)
  t = Tensor(a, device="CPU").to("CL") + 1
  assert t.device == "CL"
  back = t.to("CPU") * 2
  np.testing.assert_allclose(back.numpy(), (a + 1) * 2, rtol=1e-6)


def test_kernels_run_as_work_groups():
  """The output axes are the launch: work groups of several work items cover every element."""
  t = Tensor(rand(64, 32), device="CL").exp()
  kernel = t.schedule().src[-1].src[0]
  runner = get_runner(kernel, "CL")
  assert math.prod(runner.global_size) * math.prod(runner.local_size) == 64 * 32
  assert math.prod(runner.local_size) > 1  # work groups of several items
  np.testing.assert_allclose(t.numpy(), np.exp(rand(64, 32)), rtol=1e-6)


def test_a_kernel_that_does_not_build_raises_with_the_build_log_and_source():
  dev = Device["CL"]
  with pytest.raises(CompileError) as e: dev.compiler.compile("__kernel void k() { nope; }")
  assert "nope" in str(e.value) and "1 | __kernel void k()" in str(e.value)


def test_a_buffer_larger_than_the_device_allows_raises_memory_error():
  dev = Device["CL"]
  with pytest.raises(MemoryError, match="CL_DEVICE_MAX_MEM_ALLOC_SIZE"):
    Buffer("CL", dev.max_alloc + 1, dtypes.uint8).ensure_allocated()


def test_a_work_group_above_the_device_limit_raises():
  dev = Device["CL"]
  lib = dev.compiler.compile("__kernel void k(__global uchar* a, ulong o) { }")
  prog = dev.runtime("k", lib)
  buf = Buffer("CL", 4, dtypes.uint8).ensure_allocated()
  with pytest.raises(ValueError, match="CL_DEVICE_MAX_WORK_GROUP_SIZE"):
    prog(buf, global_size=(1, 1, 1), local_size=(dev.max_group + 1, 1, 1))
  assert prog(buf, global_size=(2, 1, 1), local_size=(1, 1, 1), wait=True) >= 0


def test_views_into_one_buffer_are_offsets():
  base = Buffer("CL", 8, dtypes.float32).copyin(np.arange(8, dtype=np.float32).tobytes())
  view = base.view(3, 4, dtypes.float32)
  assert np.frombuffer(view.copyout(), np.float32).tolist() == [3, 4, 5, 6]


def test_no_opencl_platform_is_a_clear_error(monkeypatch):
  monkeypatch.setattr(ops_cl, "opencl_devices", lambda: ())
  with pytest.raises(RuntimeError, match="no OpenCL platform"): ops_cl.CLDevice("CL:7")
  assert not ops_cl.CLDevice.is_available()


def test_a_tuple_of_cpu_and_cl_shards_and_gathers():
  a = np.arange(16, dtype=np.float32).reshape(4, 4)
  t = Tensor(a).shard(("CPU", "CL"), axis=0)
  r = (t * 2).sum(1)
  assert r.device == ("CPU", "CL")
  np.testing.assert_allclose(r.numpy(), (a * 2).sum(1))
  np.testing.assert_allclose(((t + 1) @ Tensor(a).to(("CPU", "CL"))).numpy(), (a + 1) @ a)


@pytest.mark.parametrize("dt, npdt", [(dtypes.float16, np.float16), (dtypes.bfloat16, None)])
def test_half_tensors_run_end_to_end_against_numpy(dt, npdt):
  """16-bit tensors through elementwise ops, reductions, a matmul and softmax on CL (PoCL reports
  no cl_khr_fp16: stored as 16 bits, computed in float, each op rounded to 16 bits)."""
  a, b = rand(16, 32, seed=1), rand(32, 8, seed=2)
  ta, tb = Tensor(a, device="CL").cast(dt), Tensor(b, device="CL").cast(dt)
  ra = ta.float().numpy()  # the inputs as rounded to dt
  rb = tb.float().numpy()
  if npdt is not None:  # numpy's float16 rounds the same way
    np.testing.assert_array_equal(ra, a.astype(np.float16).astype(np.float32))
  tol = {"rtol": 2e-2, "atol": 2e-2} if dt == dtypes.bfloat16 else {"rtol": 2e-3, "atol": 2e-3}
  np.testing.assert_allclose((ta @ tb).float().numpy(), ra @ rb, **tol)
  np.testing.assert_allclose(ta.sum(1).float().numpy(), ra.sum(1), **tol)
  np.testing.assert_allclose((ta * 2 - 1).exp().float().numpy(), np.exp(ra * 2 - 1), **tol)
  e = np.exp(ra - ra.max(-1, keepdims=True))
  np.testing.assert_allclose(ta.softmax(-1).float().numpy(), e / e.sum(-1, keepdims=True), **tol)
  assert ta.softmax(-1).dtype == dt and (ta @ tb).dtype == dt


def test_beam_search_on_cl_picks_launch_shapes_that_compute_the_same():
  """BEAM=2 on a small reduction: candidates include LOCAL and GROUP launch shapes, every one
  within the device's work-group limit; the chosen kernel matches numpy."""
  a = rand(64, 256, seed=3)
  with Context(BEAM=2, BEAM_BUDGET=6, CACHELEVEL=0):
    t = Tensor(a, device="CL").sum(1)
    kernel = t.schedule().src[-1].src[0]
    got = t.numpy()
  np.testing.assert_allclose(got, a.sum(1), rtol=1e-5, atol=1e-5)
  ren = Device["CL"].renderer
  k = OptKernel(CODEGEN_STAGES[0].run(kernel, ren))
  gpu = GPUTarget(ren.local_max, ren.tensor_cores)
  cands = extend(k, 1, 0, 1, gpu)
  assert any(AxisType.LOCAL in c.axis_types() for c in cands)
  assert any(AxisType.GROUP_REDUCE in c.axis_types() for c in cands)
  assert all(work_items(c) <= ren.local_max for c in cands)
  small = extend(k, 1, 0, 1, GPUTarget(8))
  assert small and all(work_items(c) <= 8 for c in small)
  assert len(small) < len(cands)  # the limit prunes wider work groups


def test_a_local_size_above_the_device_limit_is_a_clear_error_before_running(no_kernels):
  t = Tensor(rand(8, 64), device="CL").exp()
  kernel = t.schedule().src[-1].src[0]
  ren = Device["CL"].renderer
  opts = (Opt.local(1, 64), Opt.local(0, 8))
  if 64 * 8 <= ren.local_max: pytest.skip("the device takes work groups of 512")
  with pytest.raises(KernelOptError, match="above the target's limit"):
    full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=opts)), ren)


def test_float16_conversions_use_the_opencl_builtins_and_round_like_numpy():
  """Casts to and from float16 (vload_half / vstore_half_rte): ties to even, subnormals,
  overflow to infinity, NaN, signed zeros, bit for bit as numpy."""
  x = np.array([0.1, -0.0, 65504.0, 65520.0, 1e-7, 6e-8, 2.9802322e-08, 1.00048828125,
                1.000732421875, -3.1e5, np.inf, -np.inf, np.nan, 5.96e-8], np.float32)
  t = Tensor(x, device="CL").cast(dtypes.float16)
  kernel = t.schedule().src[-1].src[0]
  assert "vstore_half_rte" in Device["CL"].renderer.render("k", full_rewrite(
    kernel, Device["CL"].renderer))
  got = t.numpy()
  with np.errstate(over="ignore"): want = x.astype(np.float16)
  assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist()
  back = Tensor(want, device="CL").cast(dtypes.float32).numpy()
  np.testing.assert_array_equal(back, want.astype(np.float32))


def test_pocl_program_binaries_are_not_kept_on_disk():
  """Regression: a PoCL binary from the on-disk cache, loaded by a later process after PoCL's own
  kernel cache changed, aborted the process (pocl_binary.c assertion) in the middle of the
  suite; PoCL binaries are compiled per process, other drivers' are cached."""
  dev = Device["CL"]
  if not dev.is_pocl: pytest.skip("the OpenCL device is not PoCL")
  assert dev.compiler.cache_key is None
