"""BEAM search over the opt space, timing real kernels.

The initial beam holds the heuristics' kernel (timed first: it is the fallback) and the
unoptimized kernel. Each round extends every beam member by every action that applies: one opt
(UPCAST, UNROLL, GROUP, THREAD, SWAP), or, on a kernel with no register tile yet, a whole tile
(THREAD on an outer axis, then UPCAST of a vector axis and of a reuse axis). On a GPU target the
launch shape is searched too: LOCAL splits of the output axes and wider GROUPs (shared-memory
reductions), TC first where the target has tensor cores, and no candidate whose work group
exceeds the target's limit; the register-tile actions and floor are the CPU's and do not apply.
Candidates that cannot compile well are pruned: too many accumulator lanes or too much unrolled
code, a matmul-like reduce without a register tile, a tile the vectorizer would not make a vector.

The timer compiles a round's candidates in parallel (lowering in Python, the C compiler in
subprocesses), then times them one at a time on scratch buffers: the best of a few runs, stopping
after a run far slower than the best so far. The `width` fastest form the next beam. The search
stops after two rounds in a row improve the best time by less than 1%, or when the time budget
(BEAM_BUDGET seconds, compiles included) runs out; then the top few and the heuristics' kernel are
re-timed, interleaved, with more runs, and the fastest wins. The result is never slower than the
heuristics' kernel as measured, and is cached on disk per (kernel, device, width).
"""
from __future__ import annotations

import hashlib
import math
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from unigrad.codegen.opt import KernelOptError, Opt, OptOps
from unigrad.codegen.opt.heuristic import MIN_TILE_REDUCE, SCALAR_VECTOR_BYTES, axis_of
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.knobs import BEAM_BUDGET, CACHELEVEL, DEBUG, IGNORE_BEAM_CACHE
from unigrad.runtime.diskcache import diskcache_get, diskcache_put
from unigrad.uop import AxisType, Ops, UOp

MIN_PROGRESS = 0.01  # a round must beat the best time by this fraction to count as progress
PATIENCE = 1  # rounds without progress before the search stops
TIMED_RUNS = 3  # runs per candidate (the fastest counts)
EARLY_STOP = 3.0  # a run this many times slower than the best so far ends a candidate's timing
FINAL_TOP, FINAL_RUNS = 3, 8  # the top few re-timed at the end (with the heuristics' kernel)
MAX_ACC_LANES = 512  # accumulator lanes (UPCAST x GROUP): 32 AVX-512 registers of float32
MAX_EXPANSION = 1024  # lanes the expander writes out (UPCAST x UNROLL x GROUP): lowering time
TILE_REGISTERS = (4, 32)  # accumulator registers of a matmul's register tile (fewest, most)
MIN_THREAD_WORK = 1 << 15  # iterations per thread below which tiles from scratch take no THREAD
OUTPUT_AXES = (AxisType.LOOP, AxisType.GLOBAL)
GPU_LOCALS = (2, 4, 8, 16, 32)  # LOCAL splits (work items per group along one axis)
GPU_GROUPS = (4, 8, 16, 32, 64)  # GROUP_REDUCE splits (CPU: up to 16 partial accumulators)


@dataclass(frozen=True)
class GPUTarget:
  """What the search needs of a GPU target: the work-group limit and the tensor cores."""
  local_max: int
  tensor_cores: tuple = ()


class Timer(Protocol):
  """What the search compiles and times candidates with (pipeline.make_timer gives the real one)."""

  def build(self, ks: Sequence[OptKernel], deadline: float) -> list[OptKernel]:
    """The kernels of `ks` that compiled (in parallel) by `deadline`, ready to time."""
    ...

  def time(self, k: OptKernel, runs: int, cap: float) -> float:
    """Seconds of the fastest of up to `runs` runs of built `k`, stopping after a run over `cap`
    (inf if it cannot run)."""
    ...


@dataclass(frozen=True)
class FunctionTimer:
  """A Timer from a function of the kernel (tests time candidates with a model)."""
  fn: Callable[[OptKernel], float]

  def build(self, ks: Sequence[OptKernel], deadline: float) -> list[OptKernel]: return list(ks)

  def time(self, k: OptKernel, runs: int, cap: float) -> float: return self.fn(k)


# ---- actions ----

def _axes_of(k: OptKernel, types: tuple[AxisType, ...]) -> list[int]:
  return [i for i, (t, s) in enumerate(zip(k.axis_types(), k.sizes)) if t in types and s > 1]


def actions(k: OptKernel, threads: int, gpu: GPUTarget | None = None) -> list[Opt]:
  """Every single-step opt BEAM considers on `k` (on a GPU target also its launch shape)."""
  loops, reduces = _axes_of(k, OUTPUT_AXES), _axes_of(k, (AxisType.REDUCE,))
  acts = [Opt.upcast(a, n) for a in loops for n in (2, 4, 8, 16, 32)]
  acts += [Opt.unroll(a, n) for a in reduces for n in (2, 4, 8)]
  acts += [Opt.group(a, n) for a in reduces for n in GPU_GROUPS if gpu is not None or n <= 16]
  acts += [Opt.thread(a, threads) for a in loops] if threads > 1 else []
  acts += [Opt.swap(a, b) for a in loops for b in loops if a < b]
  if gpu is not None:
    acts += [Opt.local(a, n) for a in loops for n in GPU_LOCALS]
    if not k.applied:  # TC comes first
      acts += [Opt(OptOps.TC, a, tc) for tc in gpu.tensor_cores for a in reduces]
  return acts


def work_items(k: OptKernel) -> int:
  """Work items of one work group: the LOCAL, WARP and GROUP_REDUCE axes together."""
  return _lanes(k, "lwG")


def _lanes(k: OptKernel, types: str) -> int:
  return math.prod(s for t, s in zip(k.axis_types(), k.sizes) if t.letter in types)


def register_lanes(k: OptKernel, vector_bytes: int) -> int:
  """Lanes of one vector register for the kernel's widest buffer."""
  itemsize = max((u.dtype.itemsize for u in k.ast.toposort() if u.op is Ops.PARAM), default=4)
  return max(1, (vector_bytes or SCALAR_VECTOR_BYTES) // itemsize)


def _pow2_part(n: int, cap: int) -> int:
  """The largest power of two that divides n, at most cap."""
  p = 1
  while 2 * p <= cap and n % (2 * p) == 0: p *= 2
  return p


def tile_floor(k: OptKernel, vector_bytes: int) -> int:
  """The fewest accumulator lanes a candidate must hold to compile well: on a matmul-like kernel
  (a long reduce inside two or more output axes) TILE_REGISTERS[0] registers, or as many as its
  axes allow; 1 on other kernels."""
  reduce = math.prod(s for t, s in zip(k.axis_types(), k.sizes) if t is AxisType.REDUCE)
  parts = sorted((_pow2_part(k.sizes[i], MAX_ACC_LANES) for i in _axes_of(k, OUTPUT_AXES)),
                 reverse=True)
  if len(parts) < 2 or reduce < MIN_TILE_REDUCE: return 1
  return min(TILE_REGISTERS[0] * register_lanes(k, vector_bytes), parts[0] * parts[1])


def _range_axis(k: OptKernel, range_id: int) -> int:
  if (axis := axis_of(k, range_id)) is None: raise KernelOptError(f"no output axis {range_id}")
  return axis


def _tile(k: OptKernel, vec: int, reuse: int, v: int, r: int, vector_bytes: int) -> OptKernel:
  """`k` with output range `vec` upcast by v and `reuse` by r (raises KernelOptError if it cannot
  apply, or if the vectorizer would not make `vec` the vector)."""
  up = k.apply(Opt.upcast(_range_axis(k, vec), v))
  new = next(a for a in up.axes if a.arg.axis_type is AxisType.UPCAST and a not in k.axes)
  up = up.apply(Opt.upcast(_range_axis(up, reuse), r))
  if vector_bytes and up.vector_range(vector_bytes) is not new:
    raise KernelOptError("the vectorizer would not vectorize the tile's vector axis")
  return up


def _threaded(k: OptKernel, threads: int) -> list[OptKernel]:
  """`k` with a THREAD axis split off each output axis the threads divide, when there is enough
  work for the threads (else `k` alone)."""
  out = []
  if threads > 1 and math.prod(s for s in k.sizes if s > 0) >= MIN_THREAD_WORK * threads:
    for a in _axes_of(k, OUTPUT_AXES):
      try: out.append(k.apply(Opt.thread(a, threads)))
      except KernelOptError: continue
  return out or [k]


def tiles(k: OptKernel, threads: int, vector_bytes: int, floor: int) -> list[OptKernel]:
  """Register tiles built from scratch on a kernel with none that needs one (floor > 1): THREAD
  on an output axis, then a vector axis upcast by half a register to two registers and a reuse
  axis upcast so that the tile holds `floor` to TILE_REGISTERS[1] registers of accumulators."""
  if floor <= 1 or _lanes(k, "uG") > 1: return []
  reg = register_lanes(k, vector_bytes)
  out = []
  for base in _threaded(k, threads):
    ids = [base.axes[i].arg.id for i in _axes_of(base, OUTPUT_AXES)]
    for vec, reuse in ((a, b) for a in ids for b in ids if a != b):
      for v in sorted({max(2, reg // 2), reg, 2 * reg}):
        for r in (2 ** e for e in range(1, 10) if floor <= v * 2 ** e <= TILE_REGISTERS[1] * reg):
          try: out.append(_tile(base, vec, reuse, v, r, vector_bytes))
          except KernelOptError: continue
  return out


def is_promising(k: OptKernel, floor: int) -> bool:
  """Whether `k` can compile well: a bounded tile (and expansion), at least `floor` lanes."""
  acc = _lanes(k, "uG")
  return floor <= acc <= MAX_ACC_LANES and acc * _lanes(k, "r") <= MAX_EXPANSION


def extend(k: OptKernel, threads: int, vector_bytes: int = 0, floor: int = 1,
           gpu: GPUTarget | None = None) -> list[OptKernel]:
  """Every promising kernel one action away from `k` (see tile_floor for `floor`); on a GPU
  target only those whose work groups fit its limit."""
  out = tiles(k, threads, vector_bytes, floor) if gpu is None else []
  for a in actions(k, threads, gpu):
    try: out.append(k.apply(a))
    except KernelOptError: continue
  if gpu is not None: out = [c for c in out if work_items(c) <= gpu.local_max]
  return [c for c in out if is_promising(c, floor)]


# ---- the search ----

def kernel_key(ast: UOp, device: str, width: int) -> str:
  return hashlib.sha256(f"{ast!r}|{device}|{width}".encode()).hexdigest()


@dataclass
class BeamCtx:
  """One search: the timer, the deadline, and every kernel timed so far (by AST)."""
  name: str
  timer: Timer
  heuristic: OptKernel
  start: float
  deadline: float
  times: dict[UOp, float] = field(default_factory=dict)
  kernels: dict[UOp, OptKernel] = field(default_factory=dict)

  def ranked(self) -> list[OptKernel]:
    return [self.kernels[a] for a in sorted(self.times, key=self.times.__getitem__)]

  def best(self) -> float: return min(self.times.values(), default=math.inf)

  def finalists(self) -> list[OptKernel]:
    top = [c for c in self.ranked()[:FINAL_TOP] if self.times[c.ast] < math.inf]
    return list({c.ast: c for c in [self.heuristic, *top]}.values())

  def search_deadline(self) -> float:
    """When the search must stop to leave time for the final re-timing (at most a quarter of the
    budget: slow finalists get fewer runs)."""
    retime = sum(t for c in self.finalists() if (t := self.times.get(c.ast, 0.0)) < math.inf)
    return self.deadline - min(FINAL_RUNS * retime * 1.5, (self.deadline - self.start) / 4)

  def out_of_time(self) -> bool: return time.perf_counter() >= self.search_deadline()

  def time_all(self, cands: list[OptKernel], rnd: int) -> None:
    """Compile `cands` together, then time each (until the search deadline)."""
    built = self.timer.build(cands, self.search_deadline())
    for c in cands: self.times[c.ast], self.kernels[c.ast] = math.inf, c
    for i, c in enumerate(built):
      if self.out_of_time(): break
      self.times[c.ast] = self.timer.time(c, TIMED_RUNS, EARLY_STOP * self.best())
      if DEBUG >= 2: print(f"\n  {self.times[c.ast] * 1e6:10.2f} us {c.name()}: {list(c.applied)}")
      # on a terminal the line updates per kernel; in a log, one line per round
      if sys.stderr.isatty() or i + 1 == len(built):
        self._progress(f"round {rnd}, timed {i + 1}/{len(cands)}")

  def pick(self) -> OptKernel:
    """Re-time the finalists, interleaved, and take the fastest (the heuristics' on a tie)."""
    finalists = self.finalists()
    final = dict.fromkeys((c.ast for c in finalists), math.inf)
    for run in range(FINAL_RUNS):
      if run and time.perf_counter() >= self.deadline: break
      for c in finalists: final[c.ast] = min(final[c.ast], self.timer.time(c, 1, math.inf))
    winner = min(finalists, key=lambda c: final[c.ast])
    if final[winner.ast] >= final[self.heuristic.ast]: winner = self.heuristic
    self.times.update(final)
    self._progress(f"chose {winner.name()}")
    return winner

  def _progress(self, what: str) -> None:
    start = "\r" if sys.stderr.isatty() else "\n"
    sys.stderr.write(f"{start}BEAM {self.name}: {len(self.times)} kernels, {what}, best "
                     f"{self.best() * 1e6:10.2f} us (heuristic "
                     f"{self.times.get(self.heuristic.ast, math.inf) * 1e6:10.2f} us), "
                     f"{time.perf_counter() - self.start:5.1f} s   ")
    sys.stderr.flush()


def beam_search(k: OptKernel, heuristic: OptKernel, width: int, timer: Timer, threads: int,
                key: str | None = None, vector_bytes: int = 0,
                gpu: GPUTarget | None = None) -> OptKernel:
  """The fastest kernel found from the unoptimized `k` and from `heuristic` (see the module
  docstring); `timer` compiles and times kernels, `vector_bytes` is the target's vector width,
  `gpu` the launch limits of a GPU target (None on the CPU)."""
  if (hit := _cached(k, key)) is not None: return hit
  start = time.perf_counter()
  ctx = BeamCtx(k.name(), timer, heuristic, start, start + float(BEAM_BUDGET.value))
  if ctx.out_of_time(): return heuristic
  ctx.time_all([heuristic], 0)
  floor = tile_floor(k, vector_bytes) if gpu is None else 1  # GPU tiles: work items, TC
  beam = list({c.ast: c for c in (heuristic, k)}.values())
  best, rnd, stalls = ctx.best(), 0, 0
  while not ctx.out_of_time():
    rnd += 1
    cands = [c for b in beam for c in extend(b, threads, vector_bytes, floor, gpu)]
    cands = [c for c in {c.ast: c for c in cands}.values() if c.ast not in ctx.times]
    if not cands: break
    ctx.time_all(cands, rnd)
    beam = ctx.ranked()[:width]
    stalls = stalls + 1 if ctx.best() > best * (1 - MIN_PROGRESS) else 0
    if stalls > PATIENCE: break
    best = min(best, ctx.best())
  winner = ctx.pick()
  sys.stderr.write("\n")
  if DEBUG >= 2: print(f"BEAM {k.name()}: {list(winner.applied)} after {rnd} rounds")
  if key is not None and CACHELEVEL >= 1: diskcache_put("beam", key, pickle.dumps(winner.applied))
  return winner


def _cached(k: OptKernel, key: str | None) -> OptKernel | None:
  """The cached choice for `key` applied to `k` (None when not cached or no longer applies)."""
  if key is None or CACHELEVEL < 1 or IGNORE_BEAM_CACHE: return None
  if (hit := diskcache_get("beam", key)) is None: return None
  try:
    for o in pickle.loads(hit): k = k.apply(o)
  except KernelOptError: return None
  return k


def scratch_params(ast: UOp) -> list[UOp]:
  """The kernel's buffer PARAMs in slot order (what a launch needs)."""
  params = {u.arg.slot: u for u in ast.toposort() if u.op is Ops.PARAM and u.arg.name is None}
  return [params[s] for s in sorted(params)]
