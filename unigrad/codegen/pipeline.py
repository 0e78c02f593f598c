"""The codegen pipeline as data: an ordered table of named stages run by one driver.

The driver times each stage (DEBUG>=1 prints the timings), verifies each stage's output with its
spec verifier when SPEC>=1, and prints the graph after each stage at DEBUG>=5. Stages consume and
produce UOps; only the last one (linearize) changes the form, to a LINEAR.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from unigrad.codegen.expand import expand
from unigrad.codegen.opt.heuristic import hand_coded_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.isel import (lower_index_dtype, pm_add_loads, pm_divmod_nonneg,
                                  pm_fma_accumulate, pm_mul_recip)
from unigrad.codegen.linearize import launch_size, linearize
from unigrad.codegen.opt import KernelOptError
from unigrad.codegen.opt.search import TIMED_RUNS, beam_search, kernel_key, scratch_params
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.codegen.vectorize import vectorize
from unigrad.knobs import BEAM, DEBUG, NOOPT, SPEC
from unigrad.runtime.device import Buffer, CompileError, Device
from unigrad.runtime.ops_cpu import cpu_threads
from unigrad.renderer import Renderer
from unigrad.uop import KernelInfo, Ops, PatternMatcher, Spec, UOp, graph_rewrite, pm_simplify
from unigrad.uop.spec_kernel import spec_kernel, spec_linear

try:
  from unigrad.codegen.decompose import pm_decompose
except ImportError:  # pragma: no cover (only while the decompositions are being written)
  pm_decompose = None


@dataclass(frozen=True)
class Stage:
  name: str
  run: Callable[[UOp, Renderer], UOp]
  spec: Spec | None = None  # the verifier of the stage's output, run when SPEC >= 1


def _decompose(ast: UOp, ren: Renderer) -> UOp:
  pm: PatternMatcher = pm_divmod_nonneg
  if Ops.DIV in ren.supported_ops: pm = pm + pm_mul_recip
  if Ops.MULACC in ren.supported_ops: pm = pm + pm_fma_accumulate
  if pm_decompose is not None: pm = pm + pm_decompose(ren.supported_ops)
  return graph_rewrite(ast, pm, name="decompose")


def optimize(ast: UOp, ren: Renderer) -> UOp:
  """Apply the kernel's own opts_to_apply, else (unless NOOPT) the heuristics' choice."""
  k = OptKernel(ast)
  info = ast.arg
  if isinstance(info, KernelInfo) and info.opts_to_apply is not None:
    for opt in info.opts_to_apply: k = k.apply(opt)
  elif not NOOPT:
    heuristic = hand_coded_optimizations(k, ren, ren_threads(ren))
    k = heuristic if BEAM < 1 else beam_search(
      k, heuristic, int(BEAM), make_timer(ast, ren), ren_threads(ren),
      kernel_key(ast, ren.device, int(BEAM)))
  if DEBUG >= 3: print(f"  opts {k.name()}: {list(k.applied)}")
  ast = k.finalize()
  return graph_rewrite(ast, pm_kernel_simplify, name="simplify opts") if k.applied else ast


def make_timer(ast: UOp, ren: Renderer) -> Callable[[OptKernel], float]:
  """Compile and time kernels on scratch buffers shaped like `ast`'s params (for BEAM)."""
  dev = Device[ren.device]
  bufs = [Buffer(dev.name, p.shape[0], p.dtype).ensure_allocated() for p in scratch_params(ast)]

  def time_kernel(k: OptKernel) -> float:
    try:
      linear = lower(k.finalize(), ren)
      lib = dev.compiler.compile_cached(ren.render("beam_candidate", linear))
      prog = dev.runtime("beam_candidate", lib)
    except (KernelOptError, CompileError, RuntimeError): return math.inf
    size, best = launch_size(linear), math.inf
    for _ in range(TIMED_RUNS):
      t = prog(*bufs, global_size=size, wait=True) or 0.0
      best = min(best, t)
      if t > 3 * best: break
    return best
  return time_kernel


def lower(ast: UOp, ren: Renderer) -> UOp:
  """The stages after optimize: an optimized kernel to its LINEAR."""
  kernel = ast
  for stage in CODEGEN_STAGES[2:]: ast = stage.run(ast, ren)
  return keep_all_params(ast, kernel)


def ren_threads(ren: Renderer) -> int:
  return cpu_threads() if ren.has_threads else 1


CODEGEN_STAGES: tuple[Stage, ...] = (
  Stage("simplify", lambda ast, ren: graph_rewrite(ast, pm_kernel_simplify, name="simplify"),
        spec_kernel),
  Stage("optimize", optimize, spec_kernel),
  Stage("expand", lambda ast, ren: expand(ast, ren.vector_bytes), spec_kernel),
  Stage("add loads", lambda ast, ren: graph_rewrite(ast, pm_add_loads, name="add loads")),
  Stage("decompose", _decompose),
  Stage("index dtype", lambda ast, ren: lower_index_dtype(graph_rewrite(ast, pm_simplify))),
  Stage("vectorize", lambda ast, ren: vectorize(ast)),
  Stage("linearize", lambda ast, ren: linearize(ast), spec_linear),
)


def keep_all_params(linear: UOp, ast: UOp) -> UOp:
  """Buffers that simplification made unused still take their place in the kernel's signature:
  a launch passes every buffer of the CALL by position."""
  have = {u.arg.slot for u in linear.src if u.op is Ops.PARAM}
  lost = sorted((u for u in ast.toposort() if u.op is Ops.PARAM and u.arg.name is None
                 and u.arg.slot not in have), key=lambda p: p.arg.slot)
  return linear.replace(src=(*lost, *linear.src)) if lost else linear


def full_rewrite(ast: UOp, renderer: Renderer) -> UOp:
  """Run every codegen stage on a kernel AST; returns its LINEAR."""
  if SPEC >= 1: spec_kernel.verify(ast)
  kernel = ast
  for stage in CODEGEN_STAGES:
    t0 = time.perf_counter()
    ast = stage.run(ast, renderer)
    if SPEC >= 1 and stage.spec is not None: stage.spec.verify(ast)
    if DEBUG >= 5: print(f"--- after {stage.name} ---\n{ast!r}")
    if DEBUG >= 6 and ast.op is Ops.LINEAR:
      print("\n".join(f"{i:4d} {u.op.name}" for i, u in enumerate(ast.src)))
    if DEBUG >= 3: print(f"  codegen {stage.name:12s} {(time.perf_counter() - t0) * 1e3:7.2f} ms")
  return keep_all_params(ast, kernel)
