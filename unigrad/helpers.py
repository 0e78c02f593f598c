"""Small pure utilities shared by every layer, and the public debugging names."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import operator
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from unigrad.knobs import CHECK_OOB, DEBUG, EMULATED_DTYPES, JIT, THREADS, Context, getenv

__all__ = ["DEBUG", "Context", "getenv", "GlobalCounters", "prod", "dedup", "all_same", "flatten",
           "argsort", "ceildiv", "round_up", "unwrap", "Timing", "make_tuple", "partition",
           "CHECK_OOB", "EMULATED_DTYPES", "JIT", "cdiv", "cmod", "argfix", "fully_flatten",
           "merge_dicts", "strip_parens", "colored", "ansistrip", "get_shape", "time_to_str",
           "getbits", "word_wrap", "bounded_put", "cpu_threads", "usable_cores", "tqdm", "trange"]

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


class Timing(contextlib.ContextDecorator):
  """tinygrad's timer: `with Timing("ran model in "):` (or as a decorator) prints the elapsed
  time in ms on exit, followed by `on_exit(elapsed_ns)` when given; `enabled=False` prints
  nothing. `elapsed` holds the last time in seconds."""

  def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None,
               enabled: bool = True) -> None:
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
    self.start, self.et, self.elapsed = 0, 0, 0.0

  def __enter__(self) -> Timing:
    self.start = time.perf_counter_ns()
    return self

  def __exit__(self, *exc: object) -> None:
    self.et = time.perf_counter_ns() - self.start
    self.elapsed = self.et * 1e-9
    if not self.enabled: return
    tail = self.on_exit(self.et) if self.on_exit else ""
    print(f"{self.prefix}{self.et * 1e-6:6.2f} ms{tail}")


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


# *** a progress bar (tinygrad's helpers.tqdm: a small subset of the tqdm package's interface) ***

def _hms(t: float) -> str:
  """Seconds as [h:]mm:ss."""
  h, m, sec = int(t) // 3600, int(t) % 3600 // 60, int(t) % 60
  return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class tqdm(Generic[T]):  # noqa: N801 (the tqdm package's name, as tinygrad spells it)
  """A progress bar on stderr: `for x in tqdm(items, desc="load")`, `t = tqdm(total=n);
  t.update(k)`, `t.set_description(...)`. `total` defaults to `len(iterable)` when it has one
  (without a total: a count and a rate). Redrawn at most `rate` times a second; off a terminal it
  draws too (a log gets its lines, each ending in a carriage return), and `disable=True` draws
  nothing (`disable=None`: only on a terminal, as in the tqdm package)."""

  def __init__(self, iterable: Iterable[T] | None = None, desc: str = "",
               disable: bool | None = False, unit: str = "it", unit_scale: bool = False,
               total: int | None = None, rate: int = 100) -> None:
    self.iterable, self.unit, self.unit_scale, self.rate = iterable, unit, unit_scale, rate
    self.disable = (not sys.stderr.isatty()) if disable is None else disable
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
      total = len(iterable)  # type: ignore[arg-type]
    self.total = total
    self.n, self.start, self.last_draw, self.closed = 0, time.perf_counter(), -math.inf, False
    self.desc = ""
    self.set_description(desc)

  def __iter__(self) -> Iterator[T]:
    if self.iterable is None: raise TypeError("tqdm: nothing to iterate (made without an iterable)")
    try:
      for x in self.iterable:
        yield x
        self.update(1)
    finally: self.close()

  def __len__(self) -> int: return self.total or 0
  def __enter__(self) -> tqdm[T]: return self
  def __exit__(self, *exc: object) -> None: self.close()

  def set_description(self, desc: str = "", refresh: bool = True) -> None:
    """Text drawn before the bar (`desc: `), shown at the next redraw."""
    self.desc = f"{desc}: " if desc else ""
    if refresh: self.update(0)

  def update(self, n: int = 1) -> None:
    """Count `n` more units done and redraw (at most `rate` times a second)."""
    self.n += n
    if time.perf_counter() - self.last_draw >= 1 / self.rate or \
        (self.total is not None and self.n >= self.total): self.refresh()

  def close(self) -> None:
    """Draw the final state and end the line."""
    if self.closed: return
    self.closed = True
    self.refresh(end="\n")

  def _num(self, x: float) -> str:
    """A count (an int as is) or a rate (two decimals); with `unit_scale`, SI prefixes."""
    if self.unit_scale and abs(x) >= 1000:
      k = min(int(math.log(abs(x), 1000)), 8)
      return f"{x / 1000 ** k:.2f}{' kMGTPEZY'[k]}"
    return str(x) if isinstance(x, int) else f"{x:.2f}"

  def line(self, width: int = 80) -> str:
    """The bar's text for a terminal `width` columns wide."""
    elapsed = time.perf_counter() - self.start
    rate = self.n / elapsed if elapsed > 0 and self.n else 0.0
    rate_s = f"{self._num(rate) if rate else '?'}{self.unit}/s"
    if not self.total:
      return f"{self.desc}{self._num(self.n)}{self.unit} [{_hms(elapsed)}, {rate_s}]"
    frac = min(self.n / self.total, 1.0)
    eta = _hms((self.total - self.n) / rate) if rate else "?"
    tail = f" {self._num(self.n)}/{self._num(self.total)} [{_hms(elapsed)}<{eta}, {rate_s}]"
    head = f"{self.desc}{frac * 100:3.0f}%|"
    size = max(width - len(ansistrip(head)) - len(tail) - 1, 1)
    fill = int(frac * size)
    return head + "#" * fill + " " * (size - fill) + "|" + tail

  def refresh(self, end: str = "") -> None:
    if self.disable: return
    self.last_draw = time.perf_counter()
    sys.stderr.write("\r" + self.line(shutil.get_terminal_size((80, 24)).columns - 1) + end)
    sys.stderr.flush()

  @staticmethod
  def write(s: str) -> None:
    """Print `s` on a line of its own above the bar."""
    sys.stderr.write(f"\r\033[K{s}\n")
    sys.stderr.flush()


def trange(n: int, **kwargs: Any) -> tqdm[int]:
  """`tqdm(range(n), **kwargs)`: `for i in (t := trange(steps)): ...; t.set_description(...)`"""
  return tqdm(range(n), total=n, **kwargs)


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
