"""Kernel optimizations: the spec's OptOps as data.

An `Opt(op, axis, arg)` transforms one kernel; opts compose left to right. SPLIT is the one
primitive: `Opt(SPLIT, axis, (k, target, top))` splits axis n into (n/k, k) (or (k, n/k) when
top), the new k-sized part getting the `target` AxisType. UPCAST, UNROLL, LOCAL, GROUP and THREAD
are its named forms. PADTO rounds an axis up to a multiple (the extra iterations are masked off),
SWAP exchanges two axes' positions, NOLOCALS forbids workgroup dims, TC is reserved for tensor
cores (no CPU target has them). PACK (not in the spec's table) copies what a loop's body reads of
one input into a contiguous kernel-local panel once per iteration of that loop (codegen/opt/
pack.py: a matmul's B panel). Axis numbers index the kernel's ranges in axis order.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from unigrad.uop import AxisType


class OptOps(Enum):
  SPLIT = auto()
  PADTO = auto()
  SWAP = auto()
  NOLOCALS = auto()
  TC = auto()
  PACK = auto()

  def __repr__(self) -> str: return f"OptOps.{self.name}"


class KernelOptError(ValueError):
  """An opt that cannot apply to this kernel (wrong axis type, size not divisible, ...)."""


@dataclass(frozen=True, order=True)
class Opt:
  """One optimization step: `op` on kernel axis `axis` with `arg`."""
  op: OptOps
  axis: int | None = None
  arg: Any = None

  def __repr__(self) -> str:
    if self.op is OptOps.SPLIT:
      k, target, top = self.arg
      return f"{target.name}({self.axis},{k}{',top' if top else ''})"
    if self.op is OptOps.TC: return f"TC({self.axis},{getattr(self.arg, 'name', self.arg)})"
    return f"{self.op.name}({self.axis},{self.arg})"

  @staticmethod
  def split(axis: int, k: int, target: AxisType, top: bool = False) -> Opt:
    return Opt(OptOps.SPLIT, axis, (k, target, top))

  @staticmethod
  def upcast(axis: int, k: int) -> Opt: return Opt.split(axis, k, AxisType.UPCAST)

  @staticmethod
  def unroll(axis: int, k: int) -> Opt: return Opt.split(axis, k, AxisType.UNROLL)

  @staticmethod
  def local(axis: int, k: int) -> Opt: return Opt.split(axis, k, AxisType.LOCAL)

  @staticmethod
  def group(axis: int, k: int) -> Opt: return Opt.split(axis, k, AxisType.GROUP_REDUCE)

  @staticmethod
  def thread(axis: int, k: int) -> Opt: return Opt.split(axis, k, AxisType.THREAD, top=True)

  @staticmethod
  def padto(axis: int, multiple: int) -> Opt: return Opt(OptOps.PADTO, axis, multiple)

  @staticmethod
  def swap(axis: int, other: int) -> Opt: return Opt(OptOps.SWAP, axis, other)

  @staticmethod
  def pack(axis: int, slot: int) -> Opt:
    """Pack the input in PARAM slot `slot` once per iteration of LOOP axis `axis`."""
    return Opt(OptOps.PACK, axis, slot)


# which axis types a SPLIT may carve each target out of (the spec's "Split from" column)
SPLIT_FROM: dict[AxisType, frozenset[AxisType]] = {
  AxisType.LOCAL: frozenset({AxisType.GLOBAL, AxisType.LOOP}),
  AxisType.THREAD: frozenset({AxisType.GLOBAL, AxisType.LOOP}),
  AxisType.UPCAST: frozenset({AxisType.GLOBAL, AxisType.LOCAL, AxisType.LOOP}),
  AxisType.UNROLL: frozenset({AxisType.REDUCE, AxisType.GROUP_REDUCE}),
  AxisType.GROUP_REDUCE: frozenset({AxisType.REDUCE}),
  AxisType.LOOP: frozenset({AxisType.LOOP, AxisType.GLOBAL}),
  AxisType.REDUCE: frozenset({AxisType.REDUCE}),
}
