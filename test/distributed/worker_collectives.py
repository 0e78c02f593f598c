"""Run under `mpiexec -n 2`: every collective against numpy, a TinyJit replay running its
collectives inside the CPU command buffer, and the errors of ranks that disagree."""
import numpy as np

from unigrad import Tensor, TinyJit, dtypes
from unigrad.engine import jit as engine_jit
import unigrad.distributed as dist


def values(rank: int) -> np.ndarray:
  return (np.arange(12, dtype=np.float32) * (rank + 1)).reshape(4, 3)


def check_values(rank: int, n: int) -> None:
  x, every = Tensor(values(rank)), [values(r) for r in range(n)]
  assert np.array_equal(dist.all_reduce(x).numpy(), sum(every))
  assert np.array_equal(dist.all_reduce(x, "max").numpy(), np.maximum.reduce(every))
  assert np.array_equal(dist.all_reduce(x, "min").numpy(), np.minimum.reduce(every))
  assert np.allclose(dist.all_reduce(x, "mean").numpy(), sum(every) / n)
  assert np.array_equal(dist.all_gather(x).numpy(), np.concatenate(every, 0))
  assert np.array_equal(dist.all_gather(x, axis=1).numpy(), np.concatenate(every, 1))
  assert np.array_equal(dist.reduce_scatter(x).numpy(), np.split(sum(every), n, 0)[rank])
  x2, every2 = Tensor(values(rank).reshape(2, 6)), [v.reshape(2, 6) for v in every]
  assert np.array_equal(dist.reduce_scatter(x2, "max", axis=1).numpy(),
                        np.split(np.maximum.reduce(every2), n, 1)[rank])
  assert np.array_equal(dist.broadcast(x, root=1).numpy(), every[1])
  ints = Tensor(np.arange(5, dtype=np.int64) + rank)
  assert np.array_equal(dist.all_reduce(ints).numpy(), sum(np.arange(5) + r for r in range(n)))
  flags = Tensor([rank == 0, True])
  assert dist.all_reduce(flags, "max").tolist() == [True, True]
  assert dist.all_reduce(flags, "min").tolist() == [False, True]
  half = Tensor(values(rank), dtype=dtypes.float16)
  assert np.array_equal(dist.all_gather(half).numpy(), np.concatenate(every, 0).astype(np.float16))
  if rank == 0: dist.send(x * 10, dst=1, tag=5)
  if rank == 1: assert np.array_equal(dist.recv(x, src=0, tag=5).numpy(), every[0] * 10)
  into = Tensor.zeros(8).contiguous().realize()  # a collective stored into a slice
  into[4:8].assign(dist.all_reduce(Tensor.ones(4)))
  assert into.tolist() == [0.0] * 4 + [float(n)] * 4
  big = dist.all_reduce(Tensor.full((1 << 16,), rank + 1.0))  # 256 KB: a non-blocking start
  assert dist.mpi.ASYNC_BYTES <= big.nbytes() and big.min().item() == big.max().item() == 3.0
  scalar = dist.all_reduce(Tensor(float(rank)))
  assert scalar.shape == () and scalar.item() == sum(range(n))


def check_gradients(rank: int, n: int) -> None:
  x, weights = Tensor(values(rank), requires_grad=True), np.arange(12 * n, dtype=np.float32)
  (dist.all_gather(x) * Tensor(weights.reshape(4 * n, 3))).sum().backward()
  assert np.array_equal(x.grad.numpy(), weights.reshape(4 * n, 3)[4 * rank:4 * rank + 4])
  y = Tensor(values(rank), requires_grad=True)
  (dist.reduce_scatter(y) * (rank + 1)).sum().backward()  # the gradient of rank r's part is r + 1
  want = np.repeat(np.arange(1, n + 1, dtype=np.float32), 4 // n)[:, None].repeat(3, 1)
  assert np.array_equal(y.grad.numpy(), want)


def check_jit(rank: int) -> None:
  w = Tensor.zeros(16).contiguous().realize()

  @TinyJit
  def step(x: Tensor) -> Tensor:
    y = dist.all_reduce(x * 2) + 1
    w.assign(w + y).realize()
    return y.sum()
  calls = []
  for i in range(5):
    calls.append(step(Tensor(np.full(16, i + rank, np.float32))).item())
  assert calls == [sum(16 * (2 * (i + r) + 1) for r in range(2)) - 16 for i in range(5)], calls
  program = next(e.program for e in step.entries.values() if e.program is not None)
  assert isinstance(program, engine_jit.CapturedProgram)
  # the collective sits in the one native command buffer with the kernels around it
  segments = program.executor.segments
  assert [s.batch is not None for s in segments] == [True], segments
  assert any(r is not None and r.name == "all_reduce" for r in program.executor.runners)


def check_replay_checks_once(rank: int) -> None:
  """A replay checks its collectives' headers once, at the first: the others run unchecked
  (every rank replays the same capture, checked collective by collective when captured). A rank
  replaying while the other runs its collectives eagerly, or replays another capture, raises
  on every rank, and the replay's later collectives are skipped (no rank left in a transfer)."""
  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (dist.all_reduce(x) + dist.all_reduce(x * 2, "max")).realize()
  n4, n6 = 1 << 16, (1 << 16) + 2  # 256 KB: a start is non-blocking (MPI_Iallreduce)
  for n in (n4, n4, n4, n6, n6, n6):  # two captures
    assert (step(Tensor.full((n,), float(rank))).numpy() == 1.0 + 2.0).all()
  program = step.entries[next(iter(step.entries))].program
  progs = [r.program for r in program.executor.runners if r is not None and r.name == "all_reduce"]
  assert [p.desc.check for p in progs] == [1, 0], [p.desc.check for p in progs]
  assert progs[0].desc.header[0] == dist.mpi.REPLAY and progs[0].desc.header[1] == 2
  assert all(p.desc.gate == progs[0].address + type(progs[0].desc).error.offset for p in progs[1:])
  # the first is a non-blocking start (x * 2 is computed while it transfers), the second one
  # whole call (nothing to overlap)
  assert [p.desc.phase for p in progs] == [1, 0], [p.desc.phase for p in progs]
  for other in (lambda: dist.all_reduce(Tensor.ones(n4)).realize(), lambda: step(Tensor.ones(n6))):
    try:
      if rank == 0: step(Tensor.ones(n4))  # a replay
      else: other()  # an eager all-reduce / a replay of the other capture
    except dist.CollectiveError as e:
      assert "disagree" in str(e) and "replay" in str(e), e
    else: raise AssertionError("no error for a replay on one rank only")
  assert (step(Tensor.full((n4,), float(rank))).numpy() == 3.0).all()  # the replay still works


def check_mismatch(rank: int) -> None:
  other = dtypes.float32 if rank else dtypes.float64
  for bad in (Tensor.ones(4 + rank), Tensor.ones(4, dtype=other)):
    try:
      dist.all_reduce(bad).realize()
    except dist.CollectiveError as e:
      assert "disagree" in str(e) and ("element count" in str(e) or "dtype differs" in str(e)), e
    else: raise AssertionError("no error for ranks that disagree")
  try:
    if rank == 0: dist.send(Tensor.ones(3), dst=1)
    else: dist.recv(Tensor.ones(4), src=0)
  except dist.CollectiveError as e: assert "same count and dtype" in str(e), e
  else: raise AssertionError("no error for a send and recv that disagree")
  # 256 KB: non-blocking where kernels run while it transfers (rank 0), blocking where none do
  big, other = Tensor.ones(1 << 16), Tensor.ones(8).contiguous().realize()
  try:
    if rank == 0: Tensor.realize_all(dist.all_reduce(big), other * 2)
    else: dist.all_reduce(big).realize()
  except dist.CollectiveError as e: assert "non-blocking" in str(e), e
  else: raise AssertionError("no error for a blocking and a non-blocking all-reduce")
  assert dist.all_reduce(Tensor.ones(2)).tolist() == [2.0, 2.0]  # the group still works


def main() -> None:
  dist.init()
  r, n = dist.rank(), dist.world_size()
  assert n == 2, n
  check_values(r, n)
  check_gradients(r, n)
  check_jit(r)
  check_replay_checks_once(r)
  check_mismatch(r)
  dist.barrier()
  print(f"rank {r} ok")


if __name__ == "__main__":
  main()
  dist.shutdown()
