"""Run under `mpiexec -n 2 python worker_cases.py CASE...`: the worker_CASE.py scripts beside
this file one after another in one job (one launch: a process start, the imports and MPI's
initialization paid once), each ending with "case CASE rank R ok". A failing case aborts the
job (an uncaught exception on one rank would leave the other waiting in a collective)."""
import importlib
import pathlib
import sys
import time

import unigrad.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

if __name__ == "__main__":
  dist.init()
  for case in sys.argv[1:]:
    start = time.perf_counter()
    importlib.import_module(f"worker_{case}").main()
    dist.barrier()
    print(f"case {case} rank {dist.rank()} ok ({time.perf_counter() - start:.1f} s)", flush=True)
  dist.shutdown()
