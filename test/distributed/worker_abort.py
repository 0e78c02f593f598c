"""Run under `mpiexec -n 2`: rank 1 raises (argument `raise`) or dies (`die`: killed by a signal)
while rank 0 waits in an all-reduce; the job must end (init() makes an uncaught exception abort
every rank; mpiexec ends a job whose process died) instead of hanging."""
import os
import signal
import sys

from unigrad import Tensor
import unigrad.distributed as dist

dist.init()
if dist.rank() == 1:
  if sys.argv[1] == "die": os.kill(os.getpid(), signal.SIGKILL)
  raise RuntimeError("rank 1 fails on purpose")
dist.all_reduce(Tensor.ones(4)).realize()
print("rank 0 returned")
