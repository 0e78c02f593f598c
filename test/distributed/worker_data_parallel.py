"""Run under `mpiexec -n 2`: 5 Adam steps of the digits CNN with each rank on half of every
batch (data parallel, TinyJit) against one process on the whole batch (rank 0, no
collectives): the parameters agree within 1e-5."""
import pathlib
import sys
import time

import numpy as np

from unigrad import Tensor, TinyJit, nn
from unigrad.nn.state import get_parameters
from unigrad.uop import Ops
import unigrad.distributed as dist
from unigrad.distributed.data_parallel import DistributedOptimizer, broadcast_parameters

# 5 steps: the two sum each gradient over the batch in a different order (two halves, then the
# all-reduce), and Adam amplifies that rounding chaotically after some steps. One process
# against itself with the batch's halves swapped differs by 1e-8 after 5 steps, 9e-5 after 10
# and 6e-4 after 20, with kernels as correct as before (a missing all-reduce differs by ~lr, 3e-3)
STEPS, BATCH = 5, 32


def idle_barrier() -> None:
  """A barrier that sleeps while it waits (MPI's spins, taking a core from a rank still
  compiling on an oversubscribed machine)."""
  req = dist.mpi.group().comm.Ibarrier()
  while not req.Test(): time.sleep(0.02)


# the example's model: this test checks what `train_digits.py --distributed` trains
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from train_digits import DigitsCNN  # noqa: E402


def data() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.random((STEPS, BATCH, 64), dtype=np.float32), rng.integers(0, 10, (STEPS, BATCH))


def model_and_params(distributed: bool) -> tuple[DigitsCNN, list[Tensor]]:
  Tensor.manual_seed(7)
  model = DigitsCNN()
  params = get_parameters(model)
  if distributed: broadcast_parameters(params)
  return model, params


def train(model: DigitsCNN, params: list[Tensor], rank: int, world: int,
          distributed: bool) -> list[np.ndarray]:
  Tensor.manual_seed(7)
  opt = nn.optim.Adam(params, lr=3e-3)
  if distributed: opt = DistributedOptimizer(opt, bucket_bytes=8 << 10)  # several buckets

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    return loss
  xs, ys = data()
  part = BATCH // world
  with Tensor.train():
    for i in range(STEPS):
      lo, hi = (rank * part, (rank + 1) * part) if distributed else (0, BATCH)
      step(Tensor(xs[i, lo:hi]), Tensor(ys[i, lo:hi].astype(np.int32)))
  if distributed:  # the replay is one native command buffer: no Python between collectives
    program = next(e.program for e in step.entries.values() if e.program is not None)
    segments = program.executor.segments
    assert [s.batch is not None for s in segments] == [True], segments
    assert sum(r is not None and r.name == "all_reduce"
               for r in program.executor.runners) >= 2, "expected several gradient buckets"
    # the first bucket's all-reduce starts before the backward kernels of the earlier layers,
    # which run before it is waited for
    phases = [e.ast.arg.phase if e.ast.op is Ops.COLLECTIVE else "kernel"
              for e in program.executor.cb.entries]
    start, wait = phases.index("start"), phases.index("wait")
    assert phases[start + 1:wait].count("kernel") >= 10, phases
  return [p.numpy().copy() for p in params]


def main() -> None:
  dist.init()
  rank, world = dist.rank(), dist.world_size()
  model, params = model_and_params(True)  # every rank joins the broadcast first
  # rank 1 trains the one-process reference (no collectives) while rank 0 compiles the
  # distributed step, whose kernels rank 1 then finds in the compile cache
  want = train(*model_and_params(False), 0, 1, False) if rank == 1 else None
  got = train(model, params, rank, world, True)
  others = [dist.all_gather(Tensor(g.reshape(1, -1))).numpy() for g in got]
  for o in others: assert np.array_equal(o[0], o[1]), "the ranks' parameters differ"
  if want is not None:
    err = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    print(f"max |2 ranks - 1 process| = {err:.3g}")
    assert err <= 1e-5, err
  idle_barrier()
  print(f"rank {rank} ok")
  sys.stdout.flush()


if __name__ == "__main__":
  main()
