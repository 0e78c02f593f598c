"""Multi-process runs over MPI: the process group, collectives on Tensors, data and tensor
parallelism.
"""
from unigrad.distributed.collectives import (REDUCE_OPS, all_gather, all_reduce, broadcast,
                                             recv, reduce_in_backward, reduce_scatter, send)
from unigrad.distributed.mpi import (CollectiveError, DistributedError, barrier, init,
                                     is_initialized, local_size, rank, shutdown, world_size)

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_size", "barrier",
           "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv",
           "reduce_in_backward", "REDUCE_OPS", "CollectiveError", "DistributedError"]
