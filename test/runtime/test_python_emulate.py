"""The PYTHON device emulating a GPU target (EMULATE=CUDA): the GPU lowering (work groups and
work items, shared-memory reductions with barriers, gated accesses) runs in lockstep in the
reference interpreter and agrees with numpy, so the GPU path has an executable meaning here."""
import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.pipeline import full_rewrite
from unigrad.knobs import Context
from unigrad.runtime.device import Device
from unigrad.uop import Ops

EMU = "PYTHON:14"


@pytest.fixture(scope="module")
def emu():
  with Context(EMULATE="CUDA"): assert Device[EMU].renderer.has_local
  return EMU


def _lowered_ops(t, dev):
  kernel = t.schedule().src[-1].src[0]
  return {u.op for u in full_rewrite(kernel, Device[dev].renderer).src}


def test_a_shared_memory_reduction_runs_in_lockstep(emu):
  a = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
  t = Tensor(a, device=emu).sum(1)
  assert {Ops.BARRIER, Ops.SPECIAL} <= _lowered_ops(t, emu)  # GROUP_REDUCE through LOCAL memory
  np.testing.assert_allclose(t.numpy(), a.sum(1), rtol=1e-4, atol=1e-4)


def test_work_groups_gated_reads_and_softmax_match_numpy(emu):
  a = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
  x = Tensor(a, device=emu)
  e = np.exp(a - a.max(-1, keepdims=True))
  np.testing.assert_allclose(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(x.pad(((1, 2), (0, 3))).numpy(), np.pad(a, ((1, 2), (0, 3))))
  np.testing.assert_allclose((x @ x.T).numpy(), a @ a.T, rtol=1e-4, atol=1e-4)


def test_the_emulated_renderer_takes_the_targets_limits(emu):
  ren = Device[emu].renderer
  assert ren.local_max == 1024 and ren.tensor_cores and not ren.access_lanes
  assert not Device["PYTHON"].renderer.has_local  # the plain PYTHON device is unchanged
