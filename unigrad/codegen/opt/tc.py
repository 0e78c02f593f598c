"""Tensor cores: the TC opt turns a matmul-like reduction into warp-wide WMMA steps.

A `TensorCore` (renderer/tensor_core.py: declared by a renderer, e.g. CUDA's `mma.sync`)
multiplies an MxK tile of A by a KxN tile of B into an MxN tile of fp32 accumulators with one
instruction per warp of `threads` work items; each work item holds a few elements of each tile
(its fragments), at the positions the hardware fixes: `a_pos`, `b_pos`, `c_pos` map (work item,
element) to a tile position.

The TC opt (`Opt(OptOps.TC, reduce axis, tc)`, before any other opt) applies to a kernel whose
stored value reads one `REDUCE(ADD, MUL(CAST(f32, x), CAST(f32, y)), k)` over the given axis k,
with x and y of the tensor core's input dtype, x depending on an output axis m and not on n, y on
n and not m, and sizes divisible by the tile. It rewrites
  m -> m_o * M + row,  n -> n_o * N + col,  k -> k_o * K + depth
with a WARP axis `lane` of `threads` work items and, per accumulator element i of a work item:
  W = WMMA(STACK(x at a_pos(lane, 0..)), STACK(y at b_pos(lane, 0..)), STACK(0, ...))
  REDUCE(ADD, GEP(W, i), k_o)            at the output position c_pos(lane, i)
so every element of the tile is computed by exactly one (lane, i). The WARP axis is the fastest
work-item dimension (codegen/gpudims.py), so the 32 lanes of each tile are one hardware warp.
"""
from __future__ import annotations

from dataclasses import dataclass

from unigrad.codegen.opt import KernelOptError
from unigrad.dtype import dtypes
from unigrad.renderer.tensor_core import TensorCore
from unigrad.uop import AxisType, Ops, RangeArg, ReduceArg, UOp
from unigrad.uop.ops import AXIS_ORDER

__all__ = ["tensor_core_ast", "matmul_parts", "TensorCoreError"]


class TensorCoreError(KernelOptError):
  """The kernel is no matmul this tensor core can compute."""




@dataclass(frozen=True)
class MatmulParts:
  """What the TC opt needs of a kernel: the REDUCE, its operands and the m, n, k ranges."""
  red: UOp
  x: UOp
  y: UOp
  m: UOp
  n: UOp
  k: UOp


def _operands(red: UOp, tc: TensorCore) -> tuple[UOp, UOp]:
  """x and y of REDUCE(ADD, MUL(CAST(f32, x), CAST(f32, y))), of the tensor core's dtypes."""
  mul = red.src[0]
  if red.arg.op is not Ops.ADD or red.dtype != tc.dtype_out or mul.op is not Ops.MUL:
    raise TensorCoreError("TC needs a sum of products in float32")
  if any(s.op is not Ops.CAST or s.src[0].dtype != tc.dtype_in for s in mul.src):
    raise TensorCoreError(f"TC {tc.name} multiplies {tc.dtype_in.name} values")
  return mul.src[0].src[0], mul.src[1].src[0]


def _only_in(a: UOp, b: UOp, size: int) -> UOp:
  """The innermost output range that `a` depends on and `b` does not, dividing by size."""
  outputs = [r for r in a.ranges if r.arg.axis_type in (AxisType.LOOP, AxisType.GLOBAL)
             and r not in b.ranges and r.src[0].op is Ops.CONST and r.src[0].arg % size == 0]
  if not outputs: raise TensorCoreError(f"no output axis of a size divisible by {size}")
  return max(outputs, key=lambda r: r.arg.id)


def matmul_parts(ast: UOp, k: UOp, tc: TensorCore) -> MatmulParts:
  """The parts of the kernel's one REDUCE over exactly range k (raises TensorCoreError)."""
  reds = [u for u in ast.toposort() if u.op is Ops.REDUCE]
  if len(reds) != 1 or reds[0].src[1:] != (k,):
    raise TensorCoreError("TC needs one REDUCE over the given axis alone")
  red = reds[0]
  if not all(red in s.toposort() for s in ast.src):
    raise TensorCoreError("TC needs every store of the kernel to store the matmul's result")
  if k.src[0].op is not Ops.CONST or k.src[0].arg % tc.k:
    raise TensorCoreError(f"the reduce axis must be a multiple of {tc.k}")
  if any(r.arg.axis_type not in (AxisType.LOOP, AxisType.GLOBAL) for r in red.ranges):
    raise TensorCoreError("TC applies first, to a REDUCE directly inside the output loops")
  x, y = _operands(red, tc)
  return MatmulParts(red, x, y, _only_in(x, y, tc.m), _only_in(y, x, tc.n), k)


def _close(x: UOp, ranges: list[UOp]) -> UOp:
  """END over `ranges`, innermost (in axis order) first."""
  key = lambda r: (AXIS_ORDER[r.arg.axis_type], r.arg.id)  # noqa: E731
  for r in sorted(ranges, key=key, reverse=True): x = UOp(Ops.END, dtypes.void, (x, r))
  return x


def _strip_ends(x: UOp) -> tuple[UOp, list[UOp]]:
  rs = []
  while x.op is Ops.END:
    rs.append(x.src[1])
    x = x.src[0]
  return x, rs


def _fragment(v: UOp, pos: list[tuple[UOp, UOp]], rows: tuple[UOp, UOp],
              cols: tuple[UOp, UOp]) -> UOp:
  """STACK of v at each (row, col) of `pos`, offset by the tile's base row and column."""
  (r_rng, r_base), (c_rng, c_base) = rows, cols
  lanes = tuple(v.substitute({r_rng: r_base + r, c_rng: c_base + c}) for r, c in pos)
  return UOp(Ops.STACK, v.dtype.vec(len(lanes)), lanes)


def tensor_core_ast(ast: UOp, k: UOp, tc: TensorCore) -> UOp:
  """The kernel computing its matmul over range k with tensor core `tc` (module docstring)."""
  p = matmul_parts(ast, k, tc)
  new_id = max(u.arg.id for u in ast.toposort() if u.op is Ops.RANGE) + 1
  m_o = UOp.range(p.m.src[0].arg // tc.m, p.m.arg.id, p.m.arg.axis_type)
  n_o = UOp.range(p.n.src[0].arg // tc.n, p.n.arg.id, p.n.arg.axis_type)
  k_o = UOp.range(p.k.src[0].arg // tc.k, p.k.arg.id, AxisType.REDUCE)
  lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, tc.threads),),
             RangeArg(new_id, AxisType.WARP))
  g, t = lane // 4, lane % 4

  base_m, base_n, base_k = m_o * tc.m, n_o * tc.n, k_o * tc.k
  a = _fragment(p.x, [tc.a_pos(g, t, i) for i in range(tc.a_elems)], (p.m, base_m), (p.k, base_k))
  b = _fragment(p.y, [tc.b_pos(g, t, i) for i in range(tc.b_elems)], (p.k, base_k), (p.n, base_n))
  zero = UOp.const(tc.dtype_out, 0.0)
  acc = UOp(Ops.STACK, tc.dtype_out.vec(tc.c_elems), (zero,) * tc.c_elems)
  w = UOp(Ops.WMMA, acc.dtype, (a, b, acc), tc)
  outs = []
  for s in ast.src:
    body, closes = _strip_ends(s)
    lanes = []
    for i in range(tc.c_elems):
      red_i = UOp(Ops.REDUCE, tc.dtype_out, (UOp(Ops.GEP, tc.dtype_out, (w,), (i,)), k_o),
                  ReduceArg(Ops.ADD, p.red.arg.axes))
      row, col = tc.c_pos(g, t, i)
      lanes.append(body.substitute({p.red: red_i, p.m: base_m + row, p.n: base_n + col}))
    rs = [m_o if r is p.m else n_o if r is p.n else r for r in closes] + [lane]
    outs.append(_close(UOp(Ops.GROUP, dtypes.void, tuple(lanes)), rs))
  return ast.replace(src=tuple(outs))
