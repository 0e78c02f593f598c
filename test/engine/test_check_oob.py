"""CHECK_OOB: every generated load and store checks its index; an access outside its buffer raises
OutOfBoundsError naming the kernel, the buffer and the index (CPU with the knob; PYTHON always)."""
import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.codegen.pipeline import full_rewrite
from unigrad.engine.programs import get_runner, renderer_for
from unigrad.knobs import CHECK_OOB, Context
from unigrad.runtime.device import Buffer, OutOfBoundsError
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.uop import AxisType, KernelInfo, Ops, ParamArg, UOp
from unigrad.uop.ops import AddrSpace, RangeArg


def _param(slot: int, n: int, device: str) -> UOp:
  size = UOp(Ops.VCONST, dtypes.index, arg=(n,))
  return UOp(Ops.PARAM, dtypes.float32, (size,), ParamArg(slot, dtypes.float32, device,
                                                          AddrSpace.GLOBAL))


def shifted_copy(n: int, shift: int, device: str, name: str) -> UOp:
  """out[i] = in[i + shift] for i < n over two n-element buffers: reads past the end when
  shift > 0 (a kernel AST built by hand, as rangeify would never make it)."""
  out, inp = _param(0, n, device), _param(1, n, device)
  r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), RangeArg(0, AxisType.LOOP))
  src = UOp(Ops.INDEX, dtypes.float32, (inp, r + shift))
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dtypes.float32, (out, r)), src))
  end = UOp(Ops.END, dtypes.void, (store, r))
  return UOp(Ops.SINK, dtypes.void, (end,), KernelInfo(name=name))


def run(kernel: UOp, device: str, n: int) -> np.ndarray:
  runner = get_runner(kernel, device)
  bufs = [Buffer(device, n, dtypes.float32).copyin(np.arange(n, dtype=np.float32).tobytes())
          for _ in range(2)]
  runner.program(*bufs, global_size=runner.global_size)
  return np.frombuffer(bufs[0].copyout(), dtype=np.float32)


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_out_of_bounds_load_raises_naming_kernel_buffer_and_index(device):
  if device == "CPU" and find_c_compiler() is None: pytest.skip("no C compiler")
  with Context(CHECK_OOB=1):
    np.testing.assert_array_equal(run(shifted_copy(37, 0, device, "in_bounds"), device, 37),
                                  np.arange(37))
    kernel = shifted_copy(37, 3, device, "oob_read")
    with pytest.raises(OutOfBoundsError, match=r"kernel \w+: load at index 37 of buffer data1, "
                                               r"which has 37 elements") as e:
      run(kernel, device, 37)
  assert e.value.kernel == get_runner(kernel, device).name
  assert (e.value.slot, e.value.index, e.value.store) == (1, 37, False)


def c_source(kernel: UOp) -> str:
  ren = renderer_for("CPU")
  return ren.render("k", full_rewrite(kernel, ren))


def test_out_of_bounds_vector_access_names_its_lanes():
  if find_c_compiler() is None: pytest.skip("no C compiler")
  with Context(CHECK_OOB=1), pytest.raises(OutOfBoundsError, match=r"load of \d+ lanes at index"):
    run(shifted_copy(64, 3, "CPU", "oob_vector"), "CPU", 64)


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_out_of_bounds_negative_index_and_last_element(device):
  """The check's edges: index -1 (below the buffer) raises, and the last element of the buffer
  is in bounds (the C check is one unsigned compare: a negative index must not pass it)."""
  if device == "CPU" and find_c_compiler() is None: pytest.skip("no C compiler")
  with Context(CHECK_OOB=1):
    with pytest.raises(OutOfBoundsError, match=r"load at index -1 of buffer data1") as e:
      run(shifted_copy(5, -1, device, "oob_negative"), device, 5)
    assert (e.value.slot, e.value.index) == (1, -1)
    np.testing.assert_array_equal(run(shifted_copy(1, 0, device, "one_element"), device, 1), [0])


def test_out_of_bounds_checks_are_rendered_only_with_the_knob():
  """Without the knob the C code has no checks (the hot path stays as it was)."""
  k = shifted_copy(64, 0, "CPU", "plain")
  with Context(CHECK_OOB=0): assert "__oob" not in c_source(k)
  with Context(CHECK_OOB=1): assert "__oob(" in c_source(k)


def test_real_programs_pass_with_check_oob():
  """Everyday programs (gathers, padding, vector loads, reductions) make no bad access."""
  if find_c_compiler() is None: pytest.skip("no C compiler")
  with Context(CHECK_OOB=1):
    a = np.random.default_rng(0).standard_normal((33, 70)).astype(np.float32)
    x = Tensor(a)
    np.testing.assert_allclose((x @ x.T).numpy(), a @ a.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(x.pad(((1, 2), (3, 0))).sum(0).numpy(),
                               np.pad(a, ((1, 2), (3, 0))).sum(0), rtol=1e-5, atol=1e-5)
    idx = Tensor([0, 32, 5])
    np.testing.assert_array_equal(x[idx].numpy(), a[[0, 32, 5]])
    np.testing.assert_allclose(x.softmax(1).numpy().sum(1), np.ones(33), rtol=1e-5)


def test_the_whole_suite_runs_with_bounds_checks():
  """test/conftest.py turns CHECK_OOB on for every test, so the suite itself is the bounds-check run
  (any out-of-bounds access in any test fails it)."""
  assert CHECK_OOB
  assert "__oob(" in c_source(shifted_copy(64, 0, "CPU", "default"))
