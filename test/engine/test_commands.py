"""The command buffer: one object for eager runs, Tensor.schedule(), TinyJit and the C export."""
import numpy as np
import pytest

from unigrad import Tensor, TinyJit, function
from unigrad.engine import commands, entry, execute
from unigrad.engine.capture import capture
from unigrad.engine.commands import CommandBuffer
from unigrad.runtime.device import Device


def test_schedule_and_realize_take_one_path(monkeypatch):
  x = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4), device="CPU").realize()
  y = (x @ x.T).relu().sum(1)
  linear = y.schedule()
  ran: list[CommandBuffer] = []
  real = entry.run_commands
  monkeypatch.setattr(entry, "run_commands", lambda cb, *a: ran.append(cb) or real(cb, *a))
  np.testing.assert_allclose(y.numpy(), np.maximum(x.numpy() @ x.numpy().T, 0).sum(1))
  assert len(ran) == 1
  assert [c.src[0] for c in ran[0].linear.src] == [c.src[0] for c in linear.src], \
    "realize runs the kernels Tensor.schedule() showed"


def test_the_entry_point_is_not_re_entered(monkeypatch):
  """A graph over several devices that calls a function: lowered and inlined in one pass."""
  @function
  def f(a): return a * 2 + 1
  calls = []
  real = entry.Realizer.prepare
  monkeypatch.setattr(entry.Realizer, "prepare", lambda self, *a: calls.append(1) or real(self, *a))
  devs = ("CPU", "CPU:1")
  x = Tensor(np.arange(8, dtype=np.float32)).shard(devs, axis=0)
  assert f(x).tolist() == [2.0 * i + 1 for i in range(8)]
  assert len(calls) <= 2, "one prepare for the value, at most one for the gather onto a device"


def test_a_capture_is_joined_into_one_command_buffer_and_replanned():
  @TinyJit
  def step(a):
    b = (a * 2).contiguous().realize()  # a run of its own inside the capture
    return ((b + 1).exp() * 3).sum()
  xs = [Tensor(np.full(64, i, np.float32), device="CPU") for i in range(4)]
  outs = [step(x).item() for x in xs]
  np.testing.assert_allclose(outs, [64 * 3 * np.exp(2 * i + 1) for i in range(4)], rtol=1e-5)
  prog = step.captured
  assert isinstance(prog.commands, CommandBuffer) and prog.kernel_count >= 2
  assert prog.commands.linear.src, "the joined LINEAR of the capture's CALLs"
  assert prog.arena_bytes <= prog.inter_bytes


def test_an_executor_serves_every_run_of_a_command_buffer(monkeypatch):
  ran, real = [], execute.Executor.run
  monkeypatch.setattr(execute.Executor, "run", lambda ex, *a: ran.append(ex) or real(ex, *a))
  for i in range(3):  # new input buffers each time: the same command buffer, re-pointed
    x = Tensor(np.full(32, i, np.float32), device="CPU")
    assert (x.exp() + 1).sum().item() == pytest.approx(32 * (np.exp(i) + 1), rel=1e-5)
  kernels = [ex for ex in ran if ex.kernels]
  assert len(kernels) == 3 and kernels[0] is kernels[1] is kernels[2]
  cb = kernels[0].cb
  assert commands.command_buffer(cb.linear, cb.nargs) is cb, "built once per LINEAR"


def test_a_command_buffer_with_no_kernels_runs_again_on_a_device_without_addresses():
  """Regression: a run with no entries counted as all-batched and took the address path, which
  an OpenCL buffer (no raw address) cannot give."""
  if not Device.device_class("CL").is_available(): pytest.skip("no OpenCL device")
  for _ in range(3): assert Tensor.eye(0, device="CL").numpy().shape == (0, 0)


def test_a_run_after_a_captured_run_points_the_batch_back_at_its_own_inputs():
  """Regression: a fast run skips the arguments that are the same Buffers as the last fast
  run's; a run in between (recorded by a capture) had pointed the batch elsewhere."""
  a = Tensor(np.full(64, 1.0, np.float32), device="CPU").realize()
  b = Tensor(np.full(64, 5.0, np.float32), device="CPU").realize()
  def f(t: Tensor) -> float: return (t * 2 + 1).sum().item()
  assert f(a) == f(a) == 64 * 3.0  # the batch is made, then a fast run
  with capture(): out = (b * 2 + 1).sum().realize()
  assert out.item() == 64 * 11.0
  assert f(a) == 64 * 3.0, "the batch points at a's buffer again"
