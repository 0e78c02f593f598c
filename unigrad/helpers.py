"""Small pure utilities shared by every layer, and the public debugging names."""
from __future__ import annotations

import functools
import math
import operator
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from unigrad.knobs import DEBUG, Context, getenv

__all__ = ["DEBUG", "Context", "getenv", "GlobalCounters", "prod", "dedup", "all_same", "flatten",
           "argsort", "ceildiv", "round_up", "unwrap", "Timing", "make_tuple", "partition"]

T = TypeVar("T")


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
