"""BEAM search over the opt space, timing real kernels.

Starting from the heuristics' choice, each round extends every beam
member by every action that applies, compiles the new candidates in parallel (the C compiler runs
in subprocesses), times each on scratch buffers (best of a few runs, stopping early when a run is
far slower than the best so far), and keeps the `width` fastest. It stops when a round improves
the best time by less than 1%, or when the time budget (BEAM_BUDGET seconds) is spent. The result
is never slower than the heuristics' kernel, and is cached on disk per (kernel, device, width).
"""
from __future__ import annotations

import hashlib
import math
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.knobs import BEAM_BUDGET, CACHELEVEL, DEBUG
from unigrad.runtime.diskcache import diskcache_get, diskcache_put
from unigrad.uop import Ops, UOp

MIN_PROGRESS = 0.01
TIMED_RUNS = 3


def actions(threads: int) -> list[Opt]:
  """Every single-step opt BEAM considers."""
  acts = [Opt.upcast(a, k) for a in range(6) for k in (2, 3, 4, 8, 16)]
  acts += [Opt.unroll(a, k) for a in range(6) for k in (2, 4, 8)]
  acts += [Opt.group(a, k) for a in range(6) for k in (4, 8, 16)]
  acts += [Opt.thread(a, threads) for a in range(3)] if threads > 1 else []
  acts += [Opt.swap(a, b) for a in range(3) for b in range(a + 1, 4)]
  return acts


def extend(k: OptKernel, acts: list[Opt], max_upcast: int = 256) -> list[OptKernel]:
  """Every kernel one applicable action away from `k` (with a bounded register tile)."""
  out = []
  for a in acts:
    try: nk = k.apply(a)
    except KernelOptError: continue
    tile = 1
    for t, s in zip(nk.axis_types(), nk.sizes):
      if t.letter in "urG": tile *= s
    if tile <= max_upcast: out.append(nk)
  return out


def kernel_key(ast: UOp, device: str, width: int) -> str:
  return hashlib.sha256(f"{ast!r}|{device}|{width}".encode()).hexdigest()


Timer = Callable[[OptKernel], float]


def beam_search(k: OptKernel, heuristic: OptKernel, width: int, timer: Timer, threads: int,
                key: str | None = None) -> OptKernel:
  """The fastest kernel found (see the module docstring); `timer` compiles and times one kernel."""
  if key is not None and CACHELEVEL >= 1 and (hit := diskcache_get("beam", key)) is not None:
    for o in pickle.loads(hit): k = k.apply(o)
    return k
  start = time.perf_counter()
  deadline = start + float(BEAM_BUDGET.value)

  def timed_before_deadline(c: OptKernel) -> float:
    return timer(c) if time.perf_counter() < deadline else math.inf

  timed = {heuristic.applied: timer(heuristic)}
  kernels = {heuristic.applied: heuristic}
  beam = [heuristic.applied]
  best = timed[heuristic.applied]
  acts = actions(threads)
  rnd = 0
  with ThreadPoolExecutor() as pool:
    while time.perf_counter() < deadline:
      rnd += 1
      cands = [c for b in beam for c in extend(kernels[b], acts) if c.applied not in timed]
      cands = list({c.applied: c for c in cands}.values())
      if not cands: break
      for c, t in zip(cands, pool.map(timed_before_deadline, cands)):
        timed[c.applied], kernels[c.applied] = t, c
      beam = sorted(timed, key=timed.__getitem__)[:width]
      new_best = timed[beam[0]]
      _progress(k, rnd, len(cands), new_best, time.perf_counter() - start)
      if new_best > best * (1 - MIN_PROGRESS): break
      best = new_best
  winner = kernels[beam[0]] if timed[beam[0]] <= timed[heuristic.applied] else heuristic
  if key is not None and CACHELEVEL >= 1: diskcache_put("beam", key, pickle.dumps(winner.applied))
  return winner


def _progress(k: OptKernel, rnd: int, n: int, best: float, elapsed: float) -> None:
  sys.stderr.write(f"\rBEAM {k.name()}: round {rnd}, {n} candidates, "
                   f"best {best * 1e6:9.2f} us, {elapsed:5.1f} s")
  if DEBUG >= 1: sys.stderr.write("\n")
  sys.stderr.flush()


def scratch_params(ast: UOp) -> list[UOp]:
  """The kernel's buffer PARAMs in slot order (what a launch needs)."""
  params = {u.arg.slot: u for u in ast.toposort() if u.op is Ops.PARAM and u.arg.name is None}
  return [params[s] for s in sorted(params)]
