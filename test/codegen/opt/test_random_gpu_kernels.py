"""Random kernels on a GPU target: every legal sequence of opts (LOCAL included, THREAD excluded:
a GPU's parallelism is its launch) lowered for the OpenCL renderer (output axes bound to work
groups and work items, codegen/gpudims.py) and run on CL computes what the unoptimized kernel
computes on the PYTHON interpreter. Skips without an OpenCL platform."""
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

from unigrad import Context
from unigrad.codegen.gpudims import launch_dims
from unigrad.codegen.opt import Opt
from unigrad.codegen.pipeline import full_rewrite
from unigrad.renderer import PythonRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.uop import KernelInfo, UOp

from codegen.kernels import inputs_for, params_of
from codegen.opt.test_random_kernels import (assert_same, draw_opts, elementwise_kernels,
                                             matmul_kernels, run, single_kernel)

if not Device.device_class("CL").is_available():
  pytest.skip("no OpenCL platform", allow_module_level=True)

GPU_OPTS = ("upcast", "unroll", "group", "local", "padto", "swap")


def run_cl(kernel: UOp, opts, inputs: list[np.ndarray]) -> np.ndarray:
  """The output buffer (slot 0) after running `kernel` with `opts` on CL."""
  dev = Device["CL"]
  with Context(SPEC=1):
    linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), dev.renderer)
  bufs = [Buffer("CL", len(a), p.dtype).copyin(a.tobytes())
          for a, p in zip(inputs, params_of(kernel))]
  prog = dev.runtime("k", dev.compiler.compile_cached(dev.renderer.render("k", linear)))
  glob, local = launch_dims(linear)
  prog(*bufs, global_size=glob, local_size=local, wait=True)
  return np.frombuffer(bufs[0].copyout(), dtype=inputs[0].dtype).copy()


def draw_gpu_opts(data, kernel: UOp) -> list[Opt]: return draw_opts(data, kernel, GPU_OPTS)


def check_random_gpu(data, expr: str) -> None:
  note(f"kernel: {expr}")
  kernel = single_kernel(expr)
  assume(kernel is not None)
  opts = draw_gpu_opts(data, kernel)
  note(f"opts: {opts}")
  inputs = inputs_for(kernel)
  want = run(kernel, (), inputs, PythonRenderer())
  assert_same(run_cl(kernel, opts, inputs), want, f"CL {opts} {expr}")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.data(), elementwise_kernels())
def test_random_elementwise_and_reduce_kernels_on_cl(data, expr):
  check_random_gpu(data, expr)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.data(), matmul_kernels())
def test_random_matmul_kernels_on_cl(data, expr):
  check_random_gpu(data, expr)
