"""Memory plan: place a command buffer's intermediate buffers in one arena by lifetime.

Consumes: for each intermediate, the launches that first and last use it and its size in bytes.
Produces: a byte offset per intermediate and the arena size (spec: "Register/Memory Plan: allocate
and reuse GLOBAL storage for values with non-overlapping lifetimes").
Invariants: two buffers whose lifetimes overlap (both used by one launch, or one used between the
other's first and last use) never share a byte; every offset is a multiple of `ALIGN` (a cache
line and a full vector register, so vector and streaming stores stay aligned); buffers whose
lifetimes do not overlap may share memory whatever their sizes.

Placement is greedy by size (largest first, each at the lowest offset that is free for its whole
lifetime), which is optimal for chains and within a few percent on training graphs.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lifetime", "MemoryPlan", "plan_memory", "ALIGN"]

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
  """A buffer used by launches `first` through `last` (inclusive), `nbytes` long."""
  first: int
  last: int
  nbytes: int

  def overlaps(self, other: Lifetime) -> bool:
    return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
  """Byte offsets into one arena of `size` bytes, in the order the lifetimes were given."""
  offsets: tuple[int, ...]
  size: int


def _aligned(n: int) -> int: return -(-max(n, 1) // ALIGN) * ALIGN


def plan_memory(lifetimes: list[Lifetime]) -> MemoryPlan:
  """Offsets for `lifetimes` in one arena (see the module docstring)."""
  order = sorted(range(len(lifetimes)), key=lambda i: (-lifetimes[i].nbytes, lifetimes[i].first))
  placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, lifetime)
  offsets = [0] * len(lifetimes)
  for i in order:
    life, need = lifetimes[i], _aligned(lifetimes[i].nbytes)
    busy = sorted((o, e) for o, e, other in placed if other.overlaps(life))
    offset = 0
    for start, end in busy:
      if start - offset >= need: break
      offset = max(offset, end)
    offsets[i] = offset
    placed.append((offset, offset + need, life))
  return MemoryPlan(tuple(offsets), max((e for _, e, _ in placed), default=0))
