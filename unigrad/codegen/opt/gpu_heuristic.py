"""Hand-written heuristics for GPU targets (renderers that `has_local`): launch shapes.

- Register tiles for matmul-like reductions: each work item computes a small block of outputs
  (UPCAST of the axis an input is contiguous along and of an axis it does not depend on), so each
  load feeds several multiply-adds.
- Reductions with few outputs (under `FEW_OUTPUTS`) and a long innermost reduce: GROUP_REDUCE of
  up to `GROUP_ITEMS` work items, each reducing a strided share (neighbouring items read
  neighbouring addresses), combined in LOCAL memory (codegen/local_reduce.py).
- Vector accesses: a kernel without a register tile UPCASTs the output axis its stores are
  contiguous along by the target's widest vector access (`access_lanes`, 4 elements) where it
  divides and enough work items remain (`MIN_VECTOR_ITEMS`): codegen/coalesce.py turns the lanes'
  loads and stores into `float4` accesses.
- Tensor cores: on a target that declares them (CUDA's mma.sync), a matmul of 16-bit inputs with
  float32 accumulation whose sizes divide the tile takes the TC opt (codegen/opt/tc.py) first,
  then up to TILE tiles per warp along the innermost output axis (fragment reuse); its warps are
  grouped into work groups like any other work items.
- Work groups: output axes are split into LOCAL axes (work items of one group), innermost first so
  that neighbouring work items touch neighbouring addresses (coalesced), up to `GROUP_ITEMS` items
  (and the target's limit): the innermost axis takes up to `INNER_ITEMS`, each outer one up to
  `OUTER_ITEMS`. What is left of the output axes becomes the grid of work groups (gpudims).
"""
from __future__ import annotations

import math

from unigrad.codegen.opt import KernelOptError, Opt, OptOps
from unigrad.codegen.opt.heuristic import axis_of, plan_tiles
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.renderer import Renderer
from unigrad.uop import AxisType, Ops
from unigrad.uop.symbolic import linear_terms

__all__ = ["gpu_optimizations"]

GROUP_ITEMS, INNER_ITEMS, OUTER_ITEMS = 256, 64, 16
FEW_OUTPUTS = 1 << 14
MIN_GROUP = 16  # fewer items than this are not worth a barrier
TILE = 4  # outputs per work item along each of the tile's two axes
MIN_TILE_REDUCE = 16
MIN_VECTOR_ITEMS = 1 << 12  # work items a vector upcast must leave (the GPU stays busy)


def _try(k: OptKernel, opt: Opt) -> OptKernel:
  try: return k.apply(opt)
  except KernelOptError: return k


def _largest_divisor(size: int, cap: int) -> int:
  """The largest power of two <= cap dividing size (1 if none above 1)."""
  d = 1
  while d * 2 <= cap and size % (d * 2) == 0: d *= 2
  return d


def register_tile(k: OptKernel) -> OptKernel:
  """UPCAST the two axes of the best register tile by TILE where they divide (matmul-like only)."""
  plans = plan_tiles(k, TILE * 4)
  if not plans: return k
  for rid in (plans[0].vector, plans[0].reuse):
    if rid is None or (i := axis_of(k, rid)) is None: continue
    if k.sizes[i] % TILE == 0 and k.sizes[i] > TILE: k = _try(k, Opt.upcast(i, TILE))
  return k


def group_reduce(k: OptKernel, limit: int) -> OptKernel:
  """GROUP_REDUCE the innermost REDUCE axis of a reduction with few outputs (see above)."""
  types, sizes = k.axis_types(), k.sizes
  outputs = math.prod(s for s, t in zip(sizes, types) if t in (AxisType.LOOP, AxisType.GLOBAL))
  reduces = [i for i, t in enumerate(types) if t is AxisType.REDUCE and sizes[i] > 0]
  if not reduces or outputs >= FEW_OUTPUTS: return k
  i = reduces[-1]
  items = _largest_divisor(sizes[i], min(GROUP_ITEMS, limit))
  return _try(k, Opt.group(i, items)) if items >= MIN_GROUP else k


def store_contiguous_axis(k: OptKernel) -> int | None:
  """The output axis along which every store of `k` writes neighbouring elements, or None."""
  stores = [u for u in k.ast.toposort() if u.op is Ops.STORE]
  if not stores: return None
  for i in reversed(range(len(k.axes))):
    r = k.axes[i]
    if r.arg.axis_type not in (AxisType.LOOP, AxisType.GLOBAL): continue
    if all(linear_terms(s.src[0].src[1])[0].get(r) == 1 for s in stores): return i
  return None


def upcast_vector(k: OptKernel, ren: Renderer) -> OptKernel:
  """UPCAST the stores' contiguous axis by the widest vector access that fits (see above)."""
  if (i := store_contiguous_axis(k)) is None: return k
  outputs = math.prod(s for s, t in zip(k.sizes, k.axis_types())
                      if t in (AxisType.LOOP, AxisType.GLOBAL))
  for lanes in ren.access_lanes:
    if k.sizes[i] % lanes == 0 and outputs // lanes >= MIN_VECTOR_ITEMS:
      return _try(k, Opt.upcast(i, lanes))
  return k


def add_locals(k: OptKernel, limit: int) -> OptKernel:
  """Split LOCAL axes off the output axes, sized innermost first (see the module docstring) and
  applied outermost first: new axes get increasing ids, and gpudims makes the last one work-item
  dimension 0 (the fastest)."""
  items = math.prod(s for s, t in zip(k.sizes, k.axis_types())
                    if t in (AxisType.GROUP_REDUCE, AxisType.WARP))
  budget = min(GROUP_ITEMS, limit) // items
  loops = [r.arg.id for r in k.axes if r.arg.axis_type in (AxisType.LOOP, AxisType.GLOBAL)]
  plan: list[tuple[int, int]] = []
  for n, rid in enumerate(reversed(loops)):
    i = axis_of(k, rid)
    if i is None or budget < 2: continue
    size = _largest_divisor(k.sizes[i], min(budget, INNER_ITEMS if n == 0 else OUTER_ITEMS))
    if size < 2: continue
    plan.append((rid, size))
    budget //= size
  for rid, size in reversed(plan):
    if (i := axis_of(k, rid)) is not None: k = _try(k, Opt.local(i, size))
  return k


def tensor_core_options(k: OptKernel, ren: Renderer) -> list[OptKernel]:
  """`k` with the TC opt of each of the target's tensor cores on each REDUCE axis that takes it."""
  out = []
  for tc in ren.tensor_cores:
    for i, t in enumerate(k.axis_types()):
      if t is not AxisType.REDUCE: continue
      try: out.append(k.apply(Opt(OptOps.TC, i, tc)))
      except KernelOptError: continue
  return out


def tile_tensor_cores(k: OptKernel) -> OptKernel:
  """Each warp computes up to TILE tensor-core tiles along the innermost output axis: the other
  operand's fragments are loaded once for all of them."""
  loops = [i for i, t in enumerate(k.axis_types()) if t in (AxisType.LOOP, AxisType.GLOBAL)]
  if not loops: return k
  i = loops[-1]
  n = _largest_divisor(k.sizes[i], TILE)
  return _try(k, Opt.upcast(i, n)) if n > 1 else k


def gpu_optimizations(k: OptKernel, ren: Renderer) -> OptKernel:
  """The heuristics' choice of opts for `k` on a GPU target `ren`."""
  if not k.applied and (tcs := tensor_core_options(k, ren)):
    return add_locals(tile_tensor_cores(tcs[0]), ren.local_max)
  tiled = register_tile(k)
  if tiled is k: tiled = group_reduce(k, ren.local_max)
  if tiled is k: tiled = upcast_vector(k, ren)
  return add_locals(tiled, ren.local_max)
