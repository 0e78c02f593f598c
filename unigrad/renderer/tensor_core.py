"""Tensor cores as data: the tile shapes, dtypes and fragment layouts a renderer declares.

A `TensorCore` multiplies an MxK tile of A by a KxN tile of B into an MxN tile of accumulators
with one instruction per warp of `threads` work items; each work item holds a few elements of each
tile (its fragments) at the positions `a_pos`, `b_pos`, `c_pos` give for (work item, element).
`MMA_M16N8K16` is PTX's `mma.sync.aligned.m16n8k16` for float16 and bfloat16 inputs with float32
accumulators (sm_80 and later), positions as the PTX ISA's "matrix fragments" tables: with
`g = lane // 4` (groupID) and `t = lane % 4` (threadID_in_group), A's element i is at row
g + 8*(i//2 % 2), column 2t + i%2 + 8*(i//4); B's at row 2t + i%2 + 8*(i//2), column g; the
accumulators' at row g + 8*(i//2), column 2t + i%2.
"""
from __future__ import annotations

from dataclasses import dataclass

from unigrad.dtype import DType, dtypes
from unigrad.uop import UOp

__all__ = ["TensorCore", "MMA_M16N8K16"]


@dataclass(frozen=True)
class TensorCore:
  """One tensor-core instruction: tile sizes, dtypes, work items, fragment sizes (see above)."""
  name: str
  m: int
  n: int
  k: int
  dtype_in: DType
  dtype_out: DType
  threads: int = 32
  a_elems: int = 8
  b_elems: int = 4
  c_elems: int = 4

  def a_pos(self, g: UOp, t: UOp, i: int) -> tuple[UOp, UOp]:
    """(row m, column k) of element i of A's fragment of lane (g, t)."""
    return g + 8 * ((i >> 1) & 1), t * 2 + (i & 1) + 8 * (i >> 2)

  def b_pos(self, g: UOp, t: UOp, i: int) -> tuple[UOp, UOp]:
    """(row k, column n) of element i of B's fragment."""
    return t * 2 + (i & 1) + 8 * (i >> 1), g

  def c_pos(self, g: UOp, t: UOp, i: int) -> tuple[UOp, UOp]:
    """(row m, column n) of accumulator element i."""
    return g + 8 * (i >> 1), t * 2 + (i & 1)


def _mma(dt: DType) -> TensorCore:
  return TensorCore(f"m16n8k16_{dt.name}_f32", 16, 8, 16, dt, dtypes.float32)


MMA_M16N8K16 = (_mma(dtypes.float16), _mma(dtypes.bfloat16))
