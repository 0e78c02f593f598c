"""Codegen time per kernel: every kernel of a small transformer's training step, stage by stage.

  python bench/codegen_time.py [--layers 2] [--width 64] [--worst 5] [--profile] [--cpu-time]

Schedules the forward + backward of `common.make_transformer` (nothing runs), then runs the
codegen pipeline (every stage of `CODEGEN_STAGES`, then the C renderer) on each kernel in this
process, timing each stage. Prints the total, the mean per kernel, and the slowest kernels with
their AST size, instruction count, applied opts and per-stage milliseconds; `--profile` prints
cProfile's top entries for the slowest kernel (where the time goes). The C compiler is not run.
`--cpu-time` times by the thread's CPU time (codegen is single-threaded Python; a loaded machine's
preemption inflates wall times several fold).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from common import CLOCK, make_transformer, transformer_loss

from unigrad import Tensor
from unigrad.codegen.pipeline import CODEGEN_STAGES, gc_paused, keep_all_params
from unigrad.engine.programs import renderer_for
from unigrad.uop import Ops, UOp


def codegen_stages(kernel: UOp) -> tuple[dict[str, float], UOp]:
  """Seconds per stage (and render) for one kernel, and its LINEAR."""
  ren = renderer_for("CPU")
  times: dict[str, float] = {}
  ast = kernel
  with gc_paused():  # as the driver (full_rewrite) runs the stages
    for stage in CODEGEN_STAGES:
      t0 = CLOCK[0]()
      ast = stage.run(ast, ren)
      times[stage.name] = CLOCK[0]() - t0
  linear = keep_all_params(ast, kernel)
  t0 = CLOCK[0]()
  ren.render("k", linear)
  times["render"] = CLOCK[0]() - t0
  return times, linear


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--width", type=int, default=64)
  p.add_argument("--worst", type=int, default=5)
  p.add_argument("--profile", action="store_true")
  p.add_argument("--cpu-time", action="store_true", help="time by the thread's CPU time")
  args = p.parse_args()
  if args.cpu_time: CLOCK[0] = time.thread_time
  outs = transformer_loss(*make_transformer(args.layers, args.width))
  t0 = time.perf_counter()
  schedule = Tensor.schedule(*outs)
  print(f"schedule: {len(schedule.src)} calls in {(time.perf_counter() - t0) * 1e3:.0f} ms")
  kernels = [c.src[0] for c in schedule.src if c.src[0].op is Ops.SINK]
  results = [(kernel, *codegen_stages(kernel)) for kernel in kernels]
  results.sort(key=lambda r: -sum(r[1].values()))
  total = sum(sum(t.values()) for _, t, _ in results)
  print(f"codegen: {len(results)} kernels in {total * 1e3:.0f} ms, "
        f"{total / len(results) * 1e3:.1f} ms per kernel on average")
  for kernel, times, linear in results[:args.worst]:
    stages = "  ".join(f"{name} {t * 1e3:.0f}" for name, t in times.items() if t >= 1e-3)
    nodes = len(kernel.toposort())
    print(f"{sum(times.values()) * 1e3:7.1f} ms  {linear.arg.name:28s} ast {nodes:4d} nodes,"
          f" {len(linear.src):5d} instructions  opts {list(linear.arg.applied_opts)}\n"
          f"           ms per stage: {stages}")
  if args.profile:
    prof = cProfile.Profile()
    prof.enable()
    codegen_stages(results[0][0].replace(tag=None))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
  main()
