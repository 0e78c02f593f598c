"""Symbolic kernels compile once for every value of their variables: the kernel AST keeps the
variable (not the value), the schedule cache key holds no value, the value is a launch argument
(CPU: an int kernel argument; PYTHON: the interpreter's environment; NULL accepts it)."""
import numpy as np
import pytest

from unigrad import Context, Tensor, Variable
from unigrad.codegen.pipeline import full_rewrite, make_timer
from unigrad import engine
from unigrad.engine import entry, programs
from unigrad.helpers import GlobalCounters
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.uop import Ops

RNG = np.random.default_rng(1)
X = RNG.standard_normal((64, 4)).astype(np.float32)
W = RNG.standard_normal((4, 3)).astype(np.float32)


def kernels(t):
  return [c.src[0] for c in t.schedule().src]


def variables_of(kernel):
  return [u for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.name is not None]


def test_kernel_keeps_the_variable_not_the_value():
  n = Variable("n", 1, 64)
  x = Tensor(X, device="PYTHON").realize()
  k3, k5 = (kernels((x[:n.bind(v)] * 2).sum(axis=0)) for v in (3, 5))
  assert len(k3) == 1 and k3[0] is k5[0]  # the same AST for every value
  (var,) = variables_of(k3[0])
  assert var.arg.name == "n" and var.arg.value is None and (var.vmin, var.vmax) == (1, 64)
  assert not any(u.op is Ops.CONST and u.arg in (3, 5) for u in k3[0].toposort())


def _run_all_sizes(device, check):
  """Run both programs for n = 1..64; returns (new programs compiled, new schedules)."""
  n = Variable("n", 1, 64)
  x, w = Tensor(X, device=device).realize(), Tensor(W, device=device).realize()
  runners, schedules = len(programs.programs.runners), len(entry.schedule_cache)
  for v in range(1, 65):
    nb = n.bind(v)
    s, m = (x[:nb] * 2).sum(axis=0), x[:nb] @ w
    Tensor.realize_all(s, m)
    if check:
      np.testing.assert_allclose(s.numpy(), (X[:v] * 2).sum(0), rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(m.numpy(), X[:v] @ W, rtol=1e-5, atol=1e-5)
  return len(programs.programs.runners) - runners, len(entry.schedule_cache) - schedules


@pytest.mark.parametrize("dev", ["CPU", "PYTHON", "NULL"])
def test_one_compile_for_every_value(dev):
  if dev == "CPU" and find_c_compiler() is None: pytest.skip("no C compiler")
  entry.schedule_cache.clear()
  before = GlobalCounters.kernel_count
  compiled, scheduled = _run_all_sizes(dev, check=dev != "NULL")
  assert scheduled == 1  # one program (both outputs), scheduled once for 64 values
  assert compiled == 2  # its two kernels, each compiled once
  assert GlobalCounters.kernel_count - before == 2 * 64  # and launched for every value


def test_cpu_kernel_takes_the_value_as_an_int_argument():
  if find_c_compiler() is None: pytest.skip("no C compiler")
  n = Variable("n", 1, 64)
  x = Tensor(X, device="CPU").realize()
  t = (x[:n.bind(9)] * 2).sum(axis=0)
  src = engine.renderer_for("CPU").render("k", _linear(kernels(t)[0]))
  assert "int var_n" in src
  np.testing.assert_allclose(t.numpy(), (X[:9] * 2).sum(0), rtol=1e-5)


def _linear(kernel):
  return full_rewrite(kernel, engine.renderer_for("CPU"))


def test_beam_times_symbolic_kernels_at_the_largest_values():
  """BEAM's scratch buffers are sized for the variables' largest values; it launches with them."""
  n = Variable("n", 1, 64)
  kernel = kernels((Tensor(X, device="PYTHON").realize()[:n.bind(3)] * 2).sum(axis=0))[0]
  timer = make_timer(kernel, engine.renderer_for("PYTHON"))
  assert timer.vals == [64]


def test_symbolic_kernel_counts_its_largest_work_for_threads():
  """A symbolic axis counts at its largest size: (x[:n] * 2) with n <= 4096 rows of 1024 is
  enough work to thread its static axis (it was left on one core)."""
  n = Variable("n", 1, 4096)
  (kernel,) = kernels(Tensor.empty(4096, 1024, device="NULL")[:n.bind(5)] * 2)
  with Context(THREADS=2): linear = full_rewrite(kernel, engine.renderer_for("CPU"))
  assert linear.arg.name.startswith("E_t2_")
