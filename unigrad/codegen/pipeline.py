"""The codegen pipeline as data: an ordered table of named stages run by one driver.

The driver times each stage (DEBUG>=3 prints the timings), verifies each stage's output with its
spec verifier when SPEC>=1, prints the graph after each stage at DEBUG>=5 and records each stage
as a step of the active rewrite traces (the viewer, VIZ=1). Stages consume and produce UOps:
`CODEGEN_STAGES` lower a kernel AST to its LINEAR (`full_rewrite`), `PROGRAM_STAGES` render and
compile it into the spec's PROGRAM(LINEAR, SOURCE, BINARY) with the device's renderer and
compiler (codegen/program.py; `to_program` runs the whole pipeline). The engine runs the two
program stages apart (`to_rendered`, then `to_compiled`): its disk cache keeps the rendered
half, and a schedule's new kernels compile on several threads at once.
"""
from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from unigrad.codegen.coalesce import coalesce
from unigrad.codegen.decompose import pm_decompose
from unigrad.codegen.expand import expand
from unigrad.codegen.gpudims import gpudims, launch_dims
from unigrad.codegen.opt.gpu_heuristic import gpu_optimizations
from unigrad.codegen.opt.heuristic import hand_coded_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.isel import (lower_index_dtype, pm_add_loads, pm_divmod_nonneg, pm_dot4,
                                  pm_fma_accumulate, pm_fma_horner, pm_mul_recip)
from unigrad.codegen.linearize import linearize
from unigrad.codegen.merge_axes import merge_axes
from unigrad.codegen.transpose_sums import transpose_sums
from unigrad.codegen.local_reduce import local_reduce
from unigrad.codegen.program import compile_program, render_program, spec_program
from unigrad.codegen.opt import KernelOptError
from unigrad.codegen.opt.search import GPUTarget, beam_search, kernel_key, scratch_params
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.codegen.vectorize import vectorize
from unigrad.knobs import BEAM, DEBUG, NOOPT, SPEC
from unigrad.dtype import dtypes
from unigrad.helpers import cpu_threads
from unigrad.runtime.device import Buffer, CompileError, Device, Program
from unigrad.renderer import Renderer
from unigrad.uop import KernelInfo, Ops, PatternMatcher, Spec, UOp, graph_rewrite, pm_simplify
from unigrad.uop.spec_kernel import spec_kernel, spec_linear
from unigrad.uop.upat import active_traces, begin_step, end_step


@dataclass(frozen=True)
class Stage:
  name: str
  run: Callable[[UOp, Renderer], UOp]
  spec: Spec | None = None  # the verifier of the stage's output, run when SPEC >= 1


def _isel(ast: UOp, ren: Renderer) -> UOp:
  """Loads and gates, then what the target lacks decomposed, in one rewrite. The loads come
  first in the table and a node's sources are rewritten before it, so every decomposition sees
  loaded values, as when the two tables ran one after the other (the same C for every kernel of
  the transformer and MiniLM benches), and the graph above the loads is rebuilt once, not twice."""
  pm: PatternMatcher = pm_add_loads + pm_divmod_nonneg
  if Ops.DIV in ren.supported_ops: pm = pm + pm_mul_recip
  if Ops.MULACC in ren.supported_ops: pm = pm + pm_fma_accumulate + pm_fma_horner
  if Ops.DOT4 in ren.supported_ops: pm = pm + pm_dot4
  pm = pm + pm_decompose(ren.supported_ops)
  return graph_rewrite(ast, pm, name="isel")


def _merged(ast: UOp) -> UOp:
  """The simplified `ast` with adjacent axes merged (codegen/merge_axes.py), unless the kernel
  names its own opts (their axis numbers are those of its ranges as they are)."""
  info = ast.arg
  return ast if isinstance(info, KernelInfo) and info.opts_to_apply is not None else merge_axes(ast)


def optimize(ast: UOp, ren: Renderer) -> UOp:
  """Apply the kernel's own opts_to_apply, else (unless NOOPT) the heuristics' choice."""
  k = OptKernel(ast)
  info = ast.arg
  if isinstance(info, KernelInfo) and info.opts_to_apply is not None:
    for opt in info.opts_to_apply: k = k.apply(opt)
  elif not NOOPT:
    heuristic = gpu_optimizations(k, ren) if ren.has_local else hand_coded_optimizations(
      k, ren, ren.threads)
    k = heuristic if BEAM < 1 else beam_search(
      k, heuristic, int(BEAM), make_timer(ast, ren), ren.threads,
      kernel_key(ast, f"{ren.device}:{ren.vector_bytes}x{ren.vector_registers}", int(BEAM)),
      ren.vector_bytes, GPUTarget(ren.local_max, ren.tensor_cores) if ren.has_local else None)
  if DEBUG >= 3: print(f"  opts {k.name()}: {list(k.applied)}")
  return finish(k)


def finish(k: OptKernel) -> UOp:
  """The AST of `k` with its opts applied, simplified: what optimize hands on."""
  ast = k.finalize()
  return graph_rewrite(ast, pm_kernel_simplify, name="simplify opts") if k.applied else ast


Launch = tuple[tuple[int, ...], tuple[int, ...] | None]  # (global, local) sizes
SCRATCH_FILL = 0x3C  # every byte of a float scratch input: small normal values (never NaN)
BEAM_KERNEL = "beam_candidate"


@dataclass
class KernelTimer:
  """BEAM's timer (see search.Timer): lowers candidates one by one (Python holds the GIL) while
  the C compiler runs on the ones before in parallel subprocesses, then times built kernels one
  at a time (each launch uses every core) on scratch buffers shaped like the kernel's params."""
  ren: Renderer
  bufs: list[Buffer]
  vals: list[int]  # each symbolic variable at its largest value (the scratch buffers fit it)
  programs: dict[UOp, tuple[Program, Launch]] = field(default_factory=dict)

  def build(self, ks: Sequence[OptKernel], deadline: float) -> list[OptKernel]:
    dev = Device[self.ren.device]
    compile_src = dev.compiler.compile_cached if dev.compiler is not None else str.encode
    jobs: dict[OptKernel, tuple[Future[bytes], Launch]] = {}
    with ThreadPoolExecutor(max(2, cpu_threads())) as pool:
      for k in ks:
        if time.perf_counter() >= deadline: break
        if (src := self._render(k)) is not None:
          jobs[k] = (pool.submit(compile_src, src[0]), src[1])
      wait([f for f, _ in jobs.values()], timeout=max(0.0, deadline - time.perf_counter()))
      for f, _ in jobs.values(): f.cancel()  # queued compiles past the deadline never start
    for k, (f, size) in jobs.items():
      if f.cancelled() or f.exception() is not None: continue
      try: self.programs[k.ast] = (dev.runtime(BEAM_KERNEL, f.result()), size)
      except (RuntimeError, OSError): continue
    return [k for k in jobs if k.ast in self.programs]

  def _render(self, k: OptKernel) -> tuple[str, Launch] | None:
    """The source of candidate `k` and its launch size (None if it cannot be lowered)."""
    try:
      linear = lower(finish(k), self.ren)
      return self.ren.render(BEAM_KERNEL, linear), launch_dims(linear)
    except (KernelOptError, CompileError, RuntimeError): return None

  def time(self, k: OptKernel, runs: int, cap: float) -> float:
    if (built := self.programs.get(k.ast)) is None: return math.inf
    prog, (size, local) = built
    best = math.inf
    for _ in range(runs):
      t = prog(*self.bufs, global_size=size, local_size=local, vals=self.vals, wait=True) or 0.0
      best = min(best, t)
      if t > cap: break
    return best


def make_timer(ast: UOp, ren: Renderer) -> KernelTimer:
  """BEAM's timer for kernels like `ast` on `ren`, with scratch buffers for its params."""
  dev = Device[ren.device]
  bufs = [Buffer(dev.name, p.shape[0], p.dtype).ensure_allocated() for p in scratch_params(ast)]
  # fresh memory reads as one shared zero page, far kinder to the caches than real data
  for b in bufs:
    if dtypes.is_float(b.dtype): b.copyin(bytes([SCRATCH_FILL]) * b.nbytes)
  variables = sorted((u for u in ast.toposort() if u.op is Ops.PARAM and u.arg.name is not None),
                     key=lambda v: v.arg.slot)
  return KernelTimer(ren, bufs, [int(v.vmax) for v in variables])


def lower(ast: UOp, ren: Renderer) -> UOp:
  """The stages after optimize: an optimized kernel to its LINEAR."""
  kernel = ast
  with gc_paused():
    for stage in CODEGEN_STAGES[2:]: ast = stage.run(ast, ren)
  return keep_all_params(ast, kernel)


CODEGEN_STAGES: tuple[Stage, ...] = (
  Stage("simplify", lambda ast, ren: _merged(graph_rewrite(ast, pm_kernel_simplify,
                                                           name="simplify")), spec_kernel),
  Stage("optimize", optimize, spec_kernel),
  Stage("local reduce", local_reduce, spec_kernel),
  Stage("expand", lambda ast, ren: expand(ast, ren.vector_bytes), spec_kernel),
  Stage("gpudims", gpudims, spec_kernel),
  Stage("isel", _isel),
  Stage("index dtype", lambda ast, ren: lower_index_dtype(graph_rewrite(ast, pm_simplify))),
  Stage("vectorize", lambda ast, ren: vectorize(ast)),
  Stage("transpose_sums", transpose_sums),
  Stage("coalesce", coalesce),
  Stage("linearize", lambda ast, ren: linearize(ast), spec_linear),
)


def keep_all_params(linear: UOp, ast: UOp) -> UOp:
  """Buffers that simplification made unused still take their place in the kernel's signature:
  a launch passes every buffer of the CALL by position."""
  have = {u.arg.slot for u in linear.src if u.op is Ops.PARAM}
  lost = sorted((u for u in ast.toposort() if u.op is Ops.PARAM and u.arg.name is None
                 and u.arg.slot not in have), key=lambda p: p.arg.slot)
  return linear.replace(src=(*lost, *linear.src)) if lost else linear


@contextmanager
def gc_paused() -> Iterator[None]:
  """The cyclic garbage collector off while one kernel is lowered. The stages build and drop
  tens of thousands of acyclic nodes (reference counting frees them), and every collection that
  this churn triggers walks the live nodes again: a tenth of the codegen time of a transformer's
  kernels. Nested or concurrent uses leave the collector as the outermost one found it."""
  was_enabled = gc.isenabled()
  gc.disable()
  try: yield
  finally:
    if was_enabled: gc.enable()


PROGRAM_STAGES: tuple[Stage, ...] = (
  Stage("render", render_program),
  Stage("compile", lambda prog, ren: compile_program(prog), spec_program),
)


def full_rewrite(ast: UOp, renderer: Renderer) -> UOp:
  """Run the lowering stages on a kernel AST; returns its LINEAR."""
  if SPEC >= 1: spec_kernel.verify(ast)
  with gc_paused(): return keep_all_params(_run_stages(ast, renderer, CODEGEN_STAGES), ast)


def to_rendered(ast: UOp, renderer: Renderer) -> UOp:
  """A kernel AST lowered and rendered: PROGRAM(LINEAR, SOURCE), not compiled yet."""
  return _run_stages(full_rewrite(ast, renderer), renderer, PROGRAM_STAGES[:1])


def to_compiled(rendered: UOp, renderer: Renderer, binary: bytes | None = None) -> UOp:
  """The compile stage on a rendered PROGRAM (`binary`: its bytes, compiled elsewhere)."""
  if binary is None: return _run_stages(rendered, renderer, PROGRAM_STAGES[1:])
  prog = compile_program(rendered, binary)
  return spec_program.verify(prog) if SPEC >= 1 else prog


def to_program(ast: UOp, renderer: Renderer) -> UOp:
  """The whole codegen pipeline: a kernel AST to its PROGRAM(LINEAR, SOURCE, BINARY)."""
  return to_compiled(to_rendered(ast, renderer), renderer)


def _run_stages(ast: UOp, renderer: Renderer, stages: tuple[Stage, ...]) -> UOp:
  for stage in stages:
    t0 = time.perf_counter()
    if active_traces: begin_step(stage.name, ast)
    ast = stage.run(ast, renderer)
    if active_traces: end_step(ast)
    if SPEC >= 1 and stage.spec is not None: stage.spec.verify(ast)
    if DEBUG >= 5: print(f"--- after {stage.name} ---\n{ast!r}")
    if DEBUG >= 6 and ast.op is Ops.LINEAR:
      print("\n".join(f"{i:4d} {u.op.name}" for i, u in enumerate(ast.src)))
    if DEBUG >= 3: print(f"  codegen {stage.name:12s} {(time.perf_counter() - t0) * 1e3:7.2f} ms")
  return ast
