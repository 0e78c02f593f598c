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
from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import full_rewrite
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.renderer import PythonRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.uop import KernelInfo, UOp, graph_rewrite

from codegen.kernels import inputs_for, params_of
from codegen.opt.test_random_kernels import (amounts_for, assert_same, elementwise_kernels,
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


def draw_gpu_opts(data, kernel: UOp) -> list[Opt]:
  k = OptKernel(graph_rewrite(kernel, pm_kernel_simplify, name="simplify"))
  want, opts = data.draw(st.integers(1, 3), label="number of opts"), []
  for _ in range(12):
    if len(opts) == want or not k.axes: break
    kind = data.draw(st.sampled_from(GPU_OPTS))
    axis = data.draw(st.integers(0, len(k.axes) - 1))
    others = [a for a in range(len(k.axes)) if a != axis]
    amounts = others if kind == "swap" else amounts_for(kind, k.sizes[axis])
    if not amounts: continue
    opt = getattr(Opt, kind)(axis, data.draw(st.sampled_from(amounts)))
    try: k = k.apply(opt)
    except KernelOptError: continue
    opts.append(opt)
  return opts


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
