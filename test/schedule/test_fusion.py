"""The fusion policy as data (schedule/fusion.py), the question the scheduler asks codegen
(whether a matmul runs in place), and the size of the schedule phase's modules."""
import pathlib

import pytest

from unigrad import Tensor
from unigrad.codegen.opt.heuristic import runs_in_place
from unigrad.schedule import fusion
from unigrad.uop import Ops

SCHEDULE = pathlib.Path(fusion.__file__).parent
MAX_LINES = 400  # a module of the schedule phase does one job


def test_fusion_rules_are_a_table_of_named_rules():
  whole = fusion.WHOLE_GRAPH_BEFORE_READS + fusion.WHOLE_GRAPH_AFTER_READS
  names = [r.name for r in fusion.READ_RULES] + [n for n, _ in whole]
  assert len(names) == len(set(names))
  assert all(isinstance(r.at, fusion.ReadAt) for r in fusion.READ_RULES)


def test_read_rule_applies_only_where_it_is_read():
  rule = next(r for r in fusion.READ_RULES if r.name == "transcendental broadcast")
  e = Tensor.empty(4, 1).exp().uop
  while e.op is not Ops.EXP2: e = e.src[0]
  assert rule.applies(e, expanded=True, reduced=False, realized=set())
  assert not rule.applies(e, expanded=False, reduced=True, realized=set())


def reduce_of(t: Tensor):
  kernel = t.schedule().src[-1].src[0]
  return next(u for u in kernel.toposort() if u.op is Ops.REDUCE)


def test_codegen_answers_whether_a_matmul_runs_in_place():
  x, w = Tensor.empty(64, 384), Tensor.empty(1536, 384)
  assert runs_in_place(reduce_of(x @ w.T))  # both operands contiguous along the reduce axis
  assert not runs_in_place(reduce_of(x @ Tensor.empty(384, 1536)))  # contiguous along an output
  assert len((x @ w.T).schedule().src) == 1  # so no transposing copy of W


@pytest.mark.parametrize("path", sorted(SCHEDULE.glob("*.py")), ids=lambda p: p.name)
def test_schedule_modules_stay_small(path):
  assert len(path.read_text().splitlines()) <= MAX_LINES, f"{path.name}: split it by job"


def test_padded_reduction_gets_a_kernel_of_its_own():
  # a concatenation computes each part under its region's guard; a matmul or convolution part
  # computed there ran as guarded scalar loops instead of its register tile (nudenet 10x slower)
  a, b, c = Tensor.empty(64, 96), Tensor.empty(96, 80), Tensor.empty(64, 48)
  kernels = [k.src[0] for k in Tensor.cat(a @ b, c, dim=1).schedule().src]
  reducing = [k for k in kernels if any(u.op is Ops.REDUCE for u in k.toposort())]
  assert len(kernels) == 2 and len(reducing) == 1
  assert not any(u.op is Ops.WHERE for u in reducing[0].toposort())  # no region guard
  x, w = Tensor.empty(1, 8, 10, 10), Tensor.empty(16, 8, 3, 3)
  cat = Tensor.cat(x.conv2d(w, padding=1).silu(), x, dim=1)
  kernels = [k.src[0] for k in cat.schedule().src]
  conv = [k for k in kernels if any(u.op is Ops.REDUCE for u in k.toposort())]
  assert len(conv) == 1
  # the silu is the convolution's epilogue, not recomputed by the concatenation's copy
  assert [any(u.op is Ops.EXP2 for u in k.toposort()) for k in kernels if k is not conv[0]] == \
    [False] * (len(kernels) - 1)
  assert any(u.op is Ops.EXP2 for u in conv[0].toposort())


def test_arange_under_a_pad_is_still_recomputed_inline():
  assert len(Tensor.arange(8).pad((2, 2)).schedule().src) == 1


def test_an_operand_read_in_place_along_an_output_axis_needs_no_probe():
  from unigrad.schedule.matmul import reads_output_in_place  # noqa: PLC0415
  def graph_reduce(t: Tensor):
    return next(u for u in t.uop.toposort() if u.op is Ops.REDUCE)
  x = Tensor.empty(64, 384)
  assert reads_output_in_place(graph_reduce(x @ Tensor.empty(384, 1536)))  # b along its columns
  assert not reads_output_in_place(graph_reduce(x @ Tensor.empty(1536, 384).T))  # W.T: strided


def test_a_stored_gradient_is_read_by_the_update_not_copied():
  """A training step stores each weight's gradient and reads it in the update: the gradient's
  store computes the matmul in the gradient's layout and the update reads the gradient. The
  shared reduction had a buffer of its own, copied (transposed) into the gradient and read
  again by the update (the MLP step's 784x256 weight: 0.3 ms of its 2.2)."""
  from unigrad import TinyJit, nn  # noqa: PLC0415
  from unigrad.nn.optim import SGD  # noqa: PLC0415
  lin = nn.Linear(96, 64)
  x, opt = Tensor.rand(32, 96).realize(), SGD([lin.weight, lin.bias], lr=0.1)

  @TinyJit
  def step() -> None:
    with Tensor.train():
      opt.zero_grad()
      loss = lin(x).relu().sum()
      loss.backward()
      Tensor.realize_all(loss, *opt.schedule_step())
  for _ in range(3): step()
  kernels = [e.ast for e in step.captured.commands.entries if not e.is_copy]
  # the kernels writing a buffer of the weight's size: the gradient's and the update's, no
  # third (the shared reduction's own buffer)
  assert sum(_stored_numel(k) == 64 * 96 for k in kernels) == 2


def _stored_numel(kernel) -> int:
  u = next(u for u in kernel.toposort() if u.op is Ops.STORE).src[0]
  while u.op is not Ops.PARAM: u = u.src[0]
  return u.src[0].arg[0]


def test_values_read_from_stored_gradients_are_written_once_over_two_lazy_steps():
  """Two momentum steps realized together: an AFTER inside the update named the momentum's old
  STORE while the body held a rewritten one, and the momentum buffer was written twice (the
  second time from its own new value)."""
  import numpy as np  # noqa: PLC0415
  rng = np.random.default_rng(0)
  xs, w0 = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(
    np.float32)
  w, b, x = Tensor(w0, requires_grad=True).realize(), Tensor.zeros(4, 5).contiguous().realize(), \
    Tensor(xs)
  wn, bn = w0.copy(), np.zeros((4, 5), np.float32)
  for _ in range(2):
    w.grad = None
    (x @ w.T).relu().square().mean().backward()
    with Tensor.no_grad():
      b.assign(b * 0.9 + w.grad * 0.1)
      w.assign(w - b)
    h = xs @ wn.T
    g = (2 * np.maximum(h, 0) * (h > 0) / h.size).T @ xs
    bn = bn * 0.9 + g * 0.1
    wn = wn - bn
  np.testing.assert_allclose(b.numpy(), bn, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w.numpy(), wn, rtol=1e-5, atol=1e-6)
