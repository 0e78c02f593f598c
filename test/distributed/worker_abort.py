"""Run under `mpiexec -n 2`: rank 1 raises while rank 0 waits in an all-reduce; the job must end
(init() makes an uncaught exception abort every rank) instead of hanging."""
from unigrad import Tensor
import unigrad.distributed as dist

dist.init()
if dist.rank() == 1: raise RuntimeError("rank 1 fails on purpose")
dist.all_reduce(Tensor.ones(4)).realize()
print("rank 0 returned")
