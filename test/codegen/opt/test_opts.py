"""OptOps: legality checks, names, and that every opt combination computes what the unoptimized
kernel computes (the PYTHON device's interpreter is the oracle)."""
import itertools

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.opt import KernelOptError, Opt, OptOps
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import full_rewrite
from unigrad.renderer import PythonRenderer
from unigrad.runtime.device import Buffer
from unigrad.runtime.ops_python import PythonProgram
from unigrad.schedule.callify import callify
from unigrad.schedule.rangeify import rangeify
from unigrad.schedule.schedule import finalize_kernel
from unigrad.uop import AxisType, KernelInfo, Ops, UOp

rng = np.random.default_rng(0)


def kernel_and_inputs(t: Tensor) -> tuple[UOp, list[np.ndarray]]:
  call = t.schedule().src[-1]
  kernel, params = call.src[0], call.src[1:]
  inputs = [rng.standard_normal(p.shape[0]).astype(np.float32) for p in params]
  return kernel, inputs


def run(kernel: UOp, opts: tuple[Opt, ...] | None, inputs: list[np.ndarray]) -> np.ndarray:
  info = KernelInfo(opts_to_apply=opts if opts is not None else ())
  linear = full_rewrite(kernel.replace(arg=info), PythonRenderer())
  prog = PythonProgram("k", PythonRenderer().render("k", linear).encode())
  bufs = [Buffer("PYTHON", len(x), kernel_param_dtype(kernel, i)).copyin(x.tobytes())
          for i, x in enumerate(inputs)]
  specials = [u for u in linear.src if u.op is Ops.SPECIAL]
  prog(*bufs, global_size=(specials[0].src[0].arg,) if specials else (1,))
  return np.frombuffer(bufs[0].copyout(), dtype=np.float32).copy()


def kernel_param_dtype(kernel: UOp, slot: int):
  return next(u.dtype for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.slot == slot)


def x(*shape: int) -> Tensor: return Tensor.empty(*shape)


KERNELS = {
  "elementwise": lambda: (x(6, 8) * 2 + x(6, 8)).relu(),
  "reduce": lambda: (x(6, 8) + 1).sum(1),
  "matmul": lambda: x(4, 6) @ x(6, 8),
  "padded": lambda: x(5, 6).pad(((1, 2), (0, 3))).sum(0),
  "ragged": lambda: x(5, 7).sum(1),
}
OPTS = [Opt.upcast(0, 2), Opt.upcast(1, 2), Opt.unroll(0, 2), Opt.group(0, 2), Opt.thread(0, 2),
        Opt.padto(0, 4), Opt.padto(1, 4), Opt.swap(0, 1)]


@pytest.mark.parametrize("name", KERNELS)
def test_every_opt_pair_matches_the_unoptimized_kernel(name):
  kernel, inputs = kernel_and_inputs(KERNELS[name]())
  want = run(kernel, (), inputs)
  base = OptKernel(kernel)
  tried = 0
  for pair in itertools.permutations(OPTS + [Opt.unroll(1, 2), Opt.upcast(2, 2)], 2):
    try:
      k = base
      for o in pair: k = k.apply(o)
    except KernelOptError: continue
    tried += 1
    got = run(kernel, pair, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(pair))
  assert tried >= 3


def test_illegal_opts_raise_typed_errors():
  k = OptKernel(kernel_and_inputs(KERNELS["reduce"]())[0])
  with pytest.raises(KernelOptError, match="divisible|cannot be split"): k.apply(Opt.upcast(0, 4))
  with pytest.raises(KernelOptError, match="REDUCE"):  # can't upcast a reduce axis
    k.apply(Opt.upcast(1, 2))
  with pytest.raises(KernelOptError, match="out of range"): k.apply(Opt.upcast(7, 2))
  with pytest.raises(KernelOptError, match="tensor cores"): k.apply(Opt(OptOps.TC, 0, None))
  k6 = OptKernel(kernel_and_inputs(x(6, 8).sum(1))[0])
  with pytest.raises(KernelOptError, match="at most one THREAD"):
    k6.apply(Opt.thread(0, 2)).apply(Opt.thread(1, 3))


def test_opts_compose_left_to_right_and_names_show_axis_types():
  k = OptKernel(kernel_and_inputs(KERNELS["matmul"]())[0])
  k2 = k.apply(Opt.thread(0, 2)).apply(Opt.upcast(2, 4)).apply(Opt.unroll(3, 2))
  assert k2.name() == "r_t2_L2_L2_R3_u4_r2"
  assert [t for t in k2.axis_types()] == [AxisType.THREAD, AxisType.LOOP, AxisType.LOOP,
                                          AxisType.REDUCE, AxisType.UPCAST, AxisType.UNROLL]


def test_zero_size_axis_cannot_be_split():
  """Regression: 0 % k == 0 let UPCAST(0,16) split a zero-trip axis into 16 stored lanes (an empty
  slice assignment then overwrote, and ran past, the whole buffer). The schedule now leaves such
  a kernel out; rangeify still makes it."""
  x = Tensor([1.0, 2, 3]).contiguous().realize()
  res = callify([x[3:].assign(Tensor.full((0,), 5.0)).uop], ["CPU"])
  kernel = finalize_kernel(rangeify(res.body, len(res.bufs), "CPU").kernels[-1].ast)[0]
  with pytest.raises(KernelOptError, match="cannot be split"):
    OptKernel(kernel).apply(Opt.upcast(0, 16))


def _gated_reads(k: OptKernel) -> int:
  """Reads (INDEX of a PARAM that is not stored to) through a gate WHERE(valid, i, Invalid)."""
  nodes = k.ast.toposort()
  stored = {u.src[0] for u in nodes if u.op is Ops.STORE}
  return sum(u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and u not in stored
             and u.src[1].op is Ops.WHERE for u in nodes)


def test_padto_of_an_output_axis_clamps_its_reads_and_gates_its_stores():
  """Every store depends on the padded output axis: its padded iterations read in-bounds
  elements (the index clamped) and store nothing; a reduce over the padded axis keeps its gates
  (a clamped read would add the last element again)."""
  kernel, inputs = kernel_and_inputs(KERNELS["matmul"]())  # (4, 6) @ (6, 8)
  padded = OptKernel(kernel).apply(Opt.padto(0, 3))
  assert _gated_reads(padded) == 0
  assert padded.sizes[0] == 6
  want = run(kernel, (), inputs)
  np.testing.assert_allclose(run(kernel, (Opt.padto(0, 3), Opt.upcast(0, 3)), inputs), want,
                             rtol=1e-5, atol=1e-5)
  reduced = OptKernel(kernel).apply(Opt.padto(2, 4))  # the reduce axis (6 -> 8)
  assert _gated_reads(reduced) == 2


def test_a_kernel_whose_iterations_run_in_order_takes_no_thread_or_local_split():
  kernel = (Tensor.empty(64, 64) + 1).schedule().src[-1].src[0]
  in_order = OptKernel(kernel.replace(arg=KernelInfo(parallel=False)))
  for opt in (Opt.thread(0, 2), Opt.local(0, 4)):
    with pytest.raises(KernelOptError, match="run in order"): in_order.apply(opt)
  in_order.apply(Opt.upcast(1, 4))  # other splits still apply
  OptKernel(kernel).apply(Opt.thread(0, 2))
