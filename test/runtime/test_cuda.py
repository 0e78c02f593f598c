"""The CUDA device. Without a GPU: opening it is a clear error, and the compile-only checks render
a broad set of kernels (every dtype through every kind of op, reductions, matmul, conv, softmax,
a training step, random numbers, indexing, tensor-core matmuls in fp16 and bf16, float4 accesses,
natively stored halves) in the CUDA dialect and compile them to PTX and SASS for sm_90
(`nvcc -cubin`, or NVRTC), all in one compiler call; they run wherever a CUDA compiler is found.
On a GPU the differential tests run against numpy."""
import pathlib
import re
import shutil

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import dtypes
from unigrad.knobs import Context
from unigrad.renderer.gpu import CUDARenderer
from unigrad.runtime import ops_cuda
from unigrad.runtime.device import CompileError, Device
from unigrad.uop import Ops

HAS_COMPILER = ops_cuda.find_cuda_compiler() is not None
HAS_GPU = ops_cuda.CUDADevice.is_available()
DTYPES = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
          dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16,
          dtypes.float32, dtypes.float64)


def _elementwise(dt):
  a = Tensor(np.arange(-6, 6).reshape(3, 4) % 5 + 1, device="NULL").cast(dt)
  b = Tensor(np.arange(12).reshape(3, 4)[::-1] % 3 + 1, device="NULL").cast(dt)
  outs = [a + b, a * b, a.maximum(b), (a < b).where(a, b), a == b]
  if dt != dtypes.bool: outs += [a - b, -a, a // b, a % b, a.abs()]
  if dtypes.is_int(dt): outs += [a & b, a | b, a ^ b, ~a, a << 3, a >> 1]
  if dtypes.is_float(dt):
    outs += [a / b, a.exp(), a.log(), a.sin(), a.sqrt(), a.reciprocal(), a.trunc(), a.tanh()]
    outs += [a.maximum(float("nan")), a.minimum(float("inf"))]
  return outs + [a.cast(o) for o in DTYPES] + [a.sum(1), a.max(0)]


def _models():
  x = Tensor(np.ones((2, 3, 8, 8), np.float32), device="NULL")
  w = Tensor(np.ones((4, 3, 3, 3), np.float32), device="NULL", requires_grad=True)
  y = x.conv2d(w, padding=1).relu().reshape(2, -1)
  loss = y.softmax(-1).log().mean() + y.cross_entropy(Tensor([1, 2], device="NULL"))
  loss.backward()
  m = Tensor(np.ones((33, 17), np.float32), device="NULL")
  idx = Tensor([[0, 2], [1, 1]], device="NULL")
  h, bh = (Tensor.empty(2, 64, 64, dtype=d, device="NULL") for d in (dtypes.half, dtypes.bfloat16))
  big = Tensor.empty(256, 256, device="NULL")
  return [loss, w.grad, m @ m.T, m.cumsum(1), m.argmax(1), m.float().bitcast(dtypes.int32),
          m[idx], m.pad(((1, 2), (0, 3))), Tensor.rand(7, 5, device="NULL"),
          m.cast(dtypes.float16).sum(0), m.cast(dtypes.bfloat16) @ m.cast(dtypes.bfloat16).T,
          h @ h, bh @ bh.transpose(1, 2), (h @ h).relu().sum(2),  # tensor cores (TC opt)
          big * 2 + 1, big.T + big, big.sum(0), big @ big,  # float4 accesses, reductions, matmul
          h.exp() * h, bh.softmax(-1), h.max(1)]  # half and bfloat16 natively stored


def _kernels():
  """The CUDA source of every distinct kernel of the programs above, one name each."""
  ren, srcs = CUDARenderer(), {}
  outs = [t for dt in DTYPES for t in _elementwise(dt)] + _models()
  for t in outs:
    for call in t.schedule().src:
      if call.src[0].op is not Ops.SINK: continue
      linear = full_rewrite(call.src[0], ren)
      name = linear.arg.name
      src = ren.render(name, linear)
      srcs.setdefault(src, f"k{len(srcs)}")
  return srcs


def _one_unit(srcs):
  """Every kernel in one translation unit: each in its own namespace, its name made unique (the
  #include lines go first, outside the namespaces)."""
  parts, includes = [], {}
  for src, tag in srcs.items():
    src = re.sub(r'extern "C" __global__ void (\w+)\(', rf'extern "C" __global__ void \1_{tag}(',
                 src)
    lines = src.splitlines()
    includes.update(dict.fromkeys(x for x in lines if x.startswith("#include")))
    body = "\n".join(x for x in lines if not x.startswith("#include"))
    parts.append(f"namespace {tag} {{\n{body}\n}}")
  return "\n".join([*includes, *parts])


@pytest.mark.skipif(not HAS_COMPILER, reason="no CUDA compiler (nvcc or NVRTC)")
def test_every_kernel_compiles_to_ptx_and_sass_for_sm90():
  srcs = _kernels()
  assert len(srcs) > 100
  assert sum("__syncthreads();" in s and "__shared__" in s for s in srcs) >= 2  # GROUP_REDUCE
  assert sum("threadIdx.x" in s for s in srcs) > len(srcs) // 2  # work groups of several threads
  assert sum("mma.sync.aligned.m16n8k16" in s for s in srcs) >= 3  # fp16 and bf16 tensor cores
  assert sum("*((float4*)" in s for s in srcs) >= 2  # vector loads and stores
  assert any("half* __restrict__" in s for s in srcs)  # native 16-bit storage types
  assert any("__nv_bfloat16* __restrict__" in s for s in srcs)
  compiler = ops_cuda.CUDACompiler("sm_90")
  try: assert compiler.compile(_one_unit(srcs))
  except CompileError:  # name the kernels that fail, one compile each
    bad = []
    for src in srcs:
      try: compiler.compile(src)
      except CompileError as e: bad.append(str(e))
    raise AssertionError(f"{len(bad)} kernels do not compile:\n" + "\n\n".join(bad[:3])) from None


@pytest.mark.skipif(not HAS_COMPILER, reason="no CUDA compiler (nvcc or NVRTC)")
def test_compile_only_device_compiles_what_it_launches():
  with Context(CUDA_COMPILE_ONLY=1):
    dev = ops_cuda.CUDADevice("CUDA:3")
    assert isinstance(dev.renderer, CUDARenderer) and dev.compiler.arch == "sm_90"
    lib = dev.compiler.compile(dev.renderer.render("k", full_rewrite(
      (Tensor(np.ones((64, 64), np.float32), device="NULL").exp()).schedule().src[-1].src[0],
      dev.renderer)))
    assert lib[:4] == b"\x7fELF"  # a cubin
    with pytest.raises(CompileError, match="nope"):
      dev.compiler.compile("__global__ void k() { nope; }")


@pytest.mark.skipif(not HAS_COMPILER, reason="no CUDA compiler (nvcc or NVRTC)")
def test_compile_only_runs_programs_through_the_whole_pipeline():
  """CUDA_COMPILE_ONLY: a half matmul (tensor cores) and its epilogue schedule, render and
  compile on a CUDA device that launches nothing."""
  with Context(CUDA_COMPILE_ONLY=1):
    a = Tensor.empty(64, 64, dtype=dtypes.half, device="CUDA:7")
    out = (a @ a).float().relu()
    kernels = [c.src[0] for c in out.schedule().src if c.src[0].op is Ops.SINK]
    ren = Device["CUDA:7"].renderer
    assert any(u.op is Ops.WMMA for k in kernels for u in full_rewrite(k, ren).src)
    out.realize()


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_opening_cuda_without_a_gpu_is_a_clear_error():
  with pytest.raises(RuntimeError, match="CUDA"): Device["CUDA:5"]


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU")
@pytest.mark.parametrize("shape", [(64, 64), (5, 33)])
def test_gpu_matmul_softmax_and_reductions(shape):
  a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  t = Tensor(a, device="CUDA")
  np.testing.assert_allclose((t @ t.T).numpy(), a @ a.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
  e = np.exp(a - a.max(-1, keepdims=True))
  np.testing.assert_allclose(t.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_only_kernels_with_16_bit_floats_include_the_cuda_headers():
  """cuda_fp16.h / cuda_bf16.h are needed (and looked up on NVRTC's include path) only where a
  kernel stores half or bfloat16: other kernels compile with no header at all."""
  ren = CUDARenderer()
  def src(t): return ren.render("k", full_rewrite(t.schedule().src[-1].src[0], ren))
  x = Tensor.empty(8, 8, device="NULL")
  assert "#include" not in src(x * 2)
  assert "#include <cuda_fp16.h>" in src(x.cast(dtypes.half) * 2)
  assert "__float2bfloat16_rn" in src(x.cast(dtypes.bfloat16) * 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit")
def test_nvrtc_include_path_has_the_16_bit_headers():
  dirs = ops_cuda.cuda_include_dirs()
  assert dirs and all(pathlib.Path(d, "cuda_fp16.h").is_file() for d in dirs)
