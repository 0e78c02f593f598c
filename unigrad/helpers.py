"""Small pure utilities shared by every layer, and the public debugging names."""
from __future__ import annotations

import functools
import math
import os
import operator
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from unigrad.knobs import CHECK_OOB, DEBUG, EMULATED_DTYPES, JIT, THREADS, Context, getenv

__all__ = ["DEBUG", "Context", "getenv", "GlobalCounters", "prod", "dedup", "all_same", "flatten",
           "argsort", "ceildiv", "round_up", "unwrap", "Timing", "make_tuple", "partition",
           "CHECK_OOB", "EMULATED_DTYPES", "JIT", "cdiv", "cmod", "argfix", "fully_flatten",
           "merge_dicts", "strip_parens", "colored", "ansistrip", "get_shape", "time_to_str",
           "getbits", "word_wrap", "bounded_put", "cpu_threads", "usable_cores"]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def prod(xs: Iterable[Any], start: Any = 1) -> Any:
  """The product of `xs` (works for ints, floats and UOps)."""
  return functools.reduce(operator.mul, xs, start)


def dedup(xs: Iterable[T]) -> list[T]:
  """`xs` without repeats, first occurrence kept."""
  return list(dict.fromkeys(xs))


def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs[1:])


def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]


def argsort(xs: Sequence[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)


def ceildiv(a: int, b: int) -> int: return -(-a // b)


def round_up(a: int, b: int) -> int: return ceildiv(a, b) * b


def unwrap(x: T | None) -> T:
  assert x is not None
  return x


def make_tuple(x: int | Sequence[int], n: int) -> tuple[int, ...]:
  """`x` repeated `n` times if it is an int, else `x` as a tuple."""
  return (x,) * n if isinstance(x, int) else tuple(x)


def bounded_put(cache: dict[K, V], key: K, value: V, maxsize: int) -> V:
  """`cache[key] = value` after dropping the oldest entries until fewer than `maxsize` remain, so
  the cache holds at most `maxsize`. Oldest is insertion order: FIFO, or LRU when the caller
  re-inserts an entry on each hit. Returns `value`."""
  while cache and len(cache) >= maxsize: cache.pop(next(iter(cache)))
  cache[key] = value
  return value


def partition(xs: Iterable[T], pred: Any) -> tuple[list[T], list[T]]:
  yes: list[T] = []
  no: list[T] = []
  for x in xs: (yes if pred(x) else no).append(x)
  return yes, no


def is_pow2(x: int) -> bool: return x > 0 and x & (x - 1) == 0


def float_eq(a: float, b: float) -> bool:
  """Equality that treats nan as equal to nan and keeps -0.0 apart from 0.0."""
  if isinstance(a, float) and isinstance(b, float):
    if math.isnan(a) or math.isnan(b): return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)
  return a == b


class GlobalCounters:
  """Process-wide counters of the work done by kernels."""
  kernel_count: int = 0
  global_ops: int = 0
  global_mem: int = 0
  mem_used: int = 0
  time_sum_s: float = 0.0
  programs_compiled: int = 0  # kernels turned into device programs (program cache misses)

  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
    GlobalCounters.time_sum_s = 0.0


@dataclass
class Timing:
  """`with Timing("compile: "):` prints the elapsed time when DEBUG >= level."""
  prefix: str = ""
  level: int = 1
  start: float = 0.0
  elapsed: float = 0.0

  def __enter__(self) -> Timing:
    self.start = time.perf_counter()
    return self

  def __exit__(self, *exc: object) -> None:
    self.elapsed = time.perf_counter() - self.start
    if DEBUG >= self.level: print(f"{self.prefix}{self.elapsed * 1e3:.2f} ms")


def pairwise(xs: Sequence[T]) -> Iterator[tuple[T, T]]: return zip(xs, xs[1:])


# ---- tinygrad's small helpers, for programs that import them ----

def cdiv(a: int, b: int) -> int:
  """Integer division rounding toward zero (C's `/`); 0 for b == 0, like the spec's CDIV."""
  return 0 if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)


def cmod(a: int, b: int) -> int:
  """The remainder of `cdiv` (C's `%`: the sign of a)."""
  return 0 if b == 0 else a - cdiv(a, b) * b


def argfix(*x: Any) -> tuple:
  """f(1, 2) and f((1, 2)) as the same tuple (tinygrad's shape-argument convention)."""
  if x and isinstance(x[0], (tuple, list)):
    if len(x) != 1: raise ValueError(f"bad arg {x}: one sequence or several values, not both")
    return tuple(x[0])
  return x


def fully_flatten(xs: Any) -> list:
  """Every leaf of nested lists/tuples, in order."""
  if not isinstance(xs, (list, tuple)): return [xs]
  return [y for x in xs for y in fully_flatten(x)]


def merge_dicts(ds: Iterable[dict]) -> dict:
  """One dict of all `ds`; a key given two different values raises ValueError."""
  out: dict = {}
  for d in ds:
    for k, v in d.items():
      if k in out and out[k] != v: raise ValueError(f"cannot merge, {k} has {out[k]} and {v}")
      out[k] = v
  return out


def strip_parens(s: str) -> str:
  """s without one pair of enclosing parentheses (only if they match each other)."""
  if not (s.startswith("(") and s.endswith(")")): return s
  depth = 0
  for i, c in enumerate(s):
    depth += (c == "(") - (c == ")")
    if depth == 0 and i < len(s) - 1: return s
  return s[1:-1]


ANSI_COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")


def colored(st: str, color: str | None, background: bool = False) -> str:
  """st in an ANSI terminal color (`colored("ok", "green")`; an upper-case name is bright)."""
  if color is None: return st
  code = 10 * background + 60 * color.isupper() + 30 + ANSI_COLORS.index(color.lower())
  return f"\u001b[{code}m{st}\u001b[0m"


def ansistrip(s: str) -> str: return re.sub(r"\x1b\[(K|.*?m)", "", s)


def word_wrap(x: str, wrap: int = 80) -> str:
  """x with every line longer than `wrap` (ANSI codes not counted) broken into pieces."""
  if len(ansistrip(x)) <= wrap and "\n" not in x: return x
  return "\n".join(line[i:i + wrap] for line in x.split("\n")
                   for i in range(0, max(len(line), 1), wrap))


def get_shape(x: Any) -> tuple[int, ...]:
  """The shape of nested lists (a scalar is ()); ragged nesting raises ValueError."""
  if not isinstance(x, (list, tuple)): return ()
  subs = [get_shape(e) for e in x]
  if not all_same(subs): raise ValueError(f"inhomogeneous shape from {x}")
  return (len(subs),) + (subs[0] if subs else ())


def time_to_str(t: float, w: int = 8) -> str:
  """Seconds as a fixed-width string in s, ms or us."""
  if t > 10: return f"{t:{w}.2f}s"
  if t > 1e-2: return f"{t * 1e3:{w}.2f}ms"
  return f"{t * 1e6:{w}.2f}us"


def getbits(value: int, start: int, end: int) -> int:
  """Bits start..end (inclusive) of value."""
  return (value >> start) & ((1 << (end - start + 1)) - 1)


# *** the host's cores ***

def cpu_threads() -> int:
  """How many OS threads run a kernel's chunks: the `THREADS` knob, 0 meaning every usable core."""
  if (n := THREADS.value) > 0: return int(n)
  return usable_cores()


_cores: list[int] = []  # [count]: asked of the OS once per process (each launch reads it)


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask), read once per process."""
  if _cores: return _cores[0]
  n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  _cores[:] = [n]
  return n


# a forked child may run on other cores: it asks the OS again
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_cores.clear)
