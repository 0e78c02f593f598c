"""Benchmark of the rewrite engine: graph_rewrite throughput and symbolic simplification.

Run `python bench/rewrite.py` (add `--quick` for one repeat). When `tinygrad` is importable (it is
not a dependency: install it into a separate virtual environment and run this file with that
environment's python and unigrad on PYTHONPATH) the same workloads run there too, and the table
shows unigrad's time over tinygrad's (below 1 means unigrad is faster). Times are CPU seconds of
this process (steadier than wall time on a busy machine), the best of a few runs.

Workloads (each builds the same graph in both libraries through their common UOp operators):
- rewrite, no rule fires: a 100k-node index chain under a 3-rule table that never fires;
- rewrite, half fire: a 100k-node chain where every second node is `x*1` (removed by the table);
- simplify 6-D padded access: flatten, unflatten with // and %, pad two axes, simplify (x40);
- simplify 10k-node random expression: a seeded random DAG of integer ops over 4 variables.
"""
from __future__ import annotations

import gc
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unigrad.uop import Invalid as UInvalid
from unigrad.uop import Ops as UOps
from unigrad.uop import PatternMatcher as UPatternMatcher
from unigrad.uop import UOp as UUOp
from unigrad.uop import UPat as UUPat
from unigrad.uop import dtypes as udtypes
from unigrad.uop import graph_rewrite as ugraph_rewrite

try:
  from tinygrad.dtype import dtypes as tdtypes
  from tinygrad.uop.ops import Ops as TOps
  from tinygrad.uop.ops import PatternMatcher as TPatternMatcher
  from tinygrad.uop.ops import UOp as TUOp
  from tinygrad.uop.ops import UPat as TUPat
  from tinygrad.uop.ops import graph_rewrite as tgraph_rewrite
  HAVE_TINYGRAD = True
except ImportError:
  HAVE_TINYGRAD = False

CHAIN = 100_000
RANDOM_OPS = 6_500  # about 10k distinct nodes with the constants
PADDED_REPEATS = 40


@dataclass(frozen=True)
class Lib:
  """What a workload needs from a library: constructors, the rewrite entry point, UPat."""
  name: str
  UOp: Any
  Ops: Any
  UPat: Any
  PatternMatcher: Any
  graph_rewrite: Callable[..., Any]
  const: Callable[[int], Any]
  variable: Callable[[str, int, int], Any]
  range: Callable[[int, int], Any]
  invalid: Callable[[], Any]
  int_dtype: Any


def unigrad_lib() -> Lib:
  return Lib("unigrad", UUOp, UOps, UUPat, UPatternMatcher, ugraph_rewrite,
             lambda v: UUOp.const(udtypes.index, v), lambda n, lo, hi: UUOp.variable(n, lo, hi),
             lambda n, i: UUOp.range(n, i), lambda: UUOp.const(udtypes.index, UInvalid),
             udtypes.index)


def tinygrad_lib() -> Lib:
  return Lib("tinygrad", TUOp, TOps, TUPat, TPatternMatcher, tgraph_rewrite,
             lambda v: TUOp.const(v, tdtypes.weakint), lambda n, lo, hi: TUOp.variable(n, lo, hi),
             lambda n, i: TUOp.range(n, i), TUOp.invalid, tdtypes.weakint)


# ---- workloads: each returns (nodes, seconds) of one timed run ----

def _never_rules(lib: Lib) -> Any:
  P, Op = lib.UPat, lib.Ops
  return lib.PatternMatcher([
    (P(Op.ADD, src=(P.var("x"), P(Op.CONST, arg=-1))), lambda x: x),  # x+-1 (never built)
    (P(Op.MUL, src=(P.var("x"), P(Op.CONST, arg=1))), lambda x: x),  # x*1 -> x
    (P(Op.MAX, src=(P.var("x"), P.var("x"))), lambda x: x),  # max(x,x) -> x
  ])


def rewrite_noop(lib: Lib, salt: int) -> tuple[int, float]:
  x = lib.variable(f"a{salt}", 0, 10)
  for i in range(CHAIN // 2): x = x * 3 + i
  pm = _never_rules(lib)
  t0 = time.process_time()
  lib.graph_rewrite(x, pm)
  return CHAIN, time.process_time() - t0


def rewrite_half(lib: Lib, salt: int) -> tuple[int, float]:
  x = lib.variable(f"a{salt}", 0, 10)
  for i in range(CHAIN // 2): x = (x + i) * 1
  pm = _never_rules(lib)
  t0 = time.process_time()
  lib.graph_rewrite(x, pm)
  return CHAIN, time.process_time() - t0


def padded_access(lib: Lib, first_axis: int) -> Any:
  """A 6-D access with padding on two axes, flattened, unflattened by // and %, re-indexed."""
  shape, pad = (2, 3, 4, 5, 6, 7), (0, 0, 1, 0, 2, 0)
  padded = tuple(s + 2 * p for s, p in zip(shape, pad))
  rs = [lib.range(n, first_axis + i) for i, n in enumerate(padded)]
  flat = lib.const(0)
  for i, r in enumerate(rs): flat = flat + r * math.prod(padded[i + 1:])
  valid, idx = None, lib.const(0)
  for i, (n, p) in enumerate(zip(shape, pad)):
    c = (flat // math.prod(padded[i + 1:])) % padded[i]
    if p:
      v = (c >= p) & (c < n + p)
      valid = v if valid is None else valid & v
    idx = idx + (c - p) * math.prod(shape[i + 1:])
  return valid.where(idx, lib.invalid())


def simplify_padded(lib: Lib, salt: int) -> tuple[int, float]:
  exprs = [padded_access(lib, 6 * (k + salt * PADDED_REPEATS)) for k in range(PADDED_REPEATS)]
  nodes = len(lib.UOp.sink(*exprs).toposort())
  t0 = time.process_time()
  for e in exprs: e.simplify()
  return nodes, time.process_time() - t0


def random_expression(lib: Lib, n: int, salt: int = 0) -> Any:
  """A SINK of `n` random integer ops over 4 variables (operands drawn uniformly from earlier
  ones), with the constants about 1.5n distinct nodes.
  The op sequence is fixed; `salt` only renames the variables (fresh nodes, no warm caches)."""
  rng = random.Random(0)
  pool = [lib.variable(f"v{i}_{salt}", 0, hi) for i, hi in enumerate((7, 15, 31, 100))]
  pool += [lib.const(c) for c in (1, 3, 8)]
  while len(pool) < n:
    a, b = pool[rng.randrange(len(pool))], pool[rng.randrange(len(pool))]
    k, c = rng.randrange(9), rng.randint(1, 9)
    if k == 0: pool.append(a + b)
    elif k == 1: pool.append(a * c)
    elif k == 2: pool.append(a + c)
    elif k == 3: pool.append(a // c)
    elif k == 4: pool.append(a % c)
    elif k == 5: pool.append(a.maximum(b))
    elif k == 6: pool.append((a < b).where(a, b + c))
    elif k == 7: pool.append(a.ne(c).where(b, a))
    else: pool.append(a * 4 + b % 4)
  return lib.UOp.sink(*pool)


def simplify_random(lib: Lib, salt: int) -> tuple[int, float]:
  sink = random_expression(lib, RANDOM_OPS, salt)
  nodes = len(sink.toposort())
  t0 = time.process_time()
  sink.simplify()
  return nodes, time.process_time() - t0


Workload = Callable[[Lib, int], tuple[int, float]]
WORKLOADS: list[tuple[str, Workload]] = [
  ("rewrite, no rule fires (100k chain)", rewrite_noop),
  ("rewrite, half the nodes fire", rewrite_half),
  ("simplify 6-D padded access (x40)", simplify_padded),
  ("simplify 10k-node random expr", simplify_random),
]


def best_of(fn: Workload, lib: Lib, repeats: int) -> tuple[int, float]:
  """The fastest of `repeats` runs after a warm-up run, each on graphs of fresh nodes (so no
  cache keyed by node, in either library, carries over from an earlier run)."""
  best: tuple[int, float] | None = None
  for salt in range(repeats + 1):
    gc.collect()
    try: nodes, secs = fn(lib, salt)
    except RecursionError: return 0, math.nan
    if salt == 0: continue
    best = (nodes, secs) if best is None or secs < best[1] else best
  assert best is not None
  return best


def main() -> None:
  repeats = 1 if "--quick" in sys.argv else 3
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
  libs = [unigrad_lib()] + ([tinygrad_lib()] if HAVE_TINYGRAD else [])
  print(f"{'workload':38} {'nodes':>7} {'unigrad ms':>11} {'nodes/s':>10}"
        + (f" {'tinygrad ms':>12} {'ratio':>6}" if HAVE_TINYGRAD else ""))
  for label, fn in WORKLOADS:
    nodes, secs = best_of(fn, libs[0], repeats)
    row = f"{label:38} {nodes:>7} {secs * 1e3:>11.1f} {nodes / secs:>10,.0f}"
    if HAVE_TINYGRAD:
      _, tsecs = best_of(fn, libs[1], repeats)
      row += f" {tsecs * 1e3:>12.1f} {secs / tsecs:>6.2f}"
    print(row)
  print(f"(CPU milliseconds, best of {repeats} after a warm-up run; ratio = unigrad / tinygrad)")
  if not HAVE_TINYGRAD: print("tinygrad not installed")


if __name__ == "__main__":
  main()
