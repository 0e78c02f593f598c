"""Hand-written heuristics for GPU targets (renderers that `has_local`): launch shapes.

- Register tiles for matmul-like reductions: each work item computes a small block of outputs
  (UPCAST of the axis an input is contiguous along and of an axis it does not depend on), so each
  load feeds several multiply-adds.
- Reductions with few outputs (under `FEW_OUTPUTS`) and a long innermost reduce: GROUP_REDUCE of
  up to `GROUP_ITEMS` work items, each reducing a strided share (neighbouring items read
  neighbouring addresses), combined in LOCAL memory (codegen/local_reduce.py).
- Work groups: output axes are split into LOCAL axes (work items of one group), innermost first so
  that neighbouring work items touch neighbouring addresses (coalesced), up to `GROUP_ITEMS` items
  (and the target's limit): the innermost axis takes up to `INNER_ITEMS`, each outer one up to
  `OUTER_ITEMS`. What is left of the output axes becomes the grid of work groups (gpudims).
"""
from __future__ import annotations

import math

from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.heuristic import axis_of, plan_tiles
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.renderer import Renderer
from unigrad.uop import AxisType

__all__ = ["gpu_optimizations"]

GROUP_ITEMS, INNER_ITEMS, OUTER_ITEMS = 256, 64, 16
FEW_OUTPUTS = 1 << 14
MIN_GROUP = 16  # fewer items than this are not worth a barrier
TILE = 4  # outputs per work item along each of the tile's two axes
MIN_TILE_REDUCE = 16


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


def add_locals(k: OptKernel, limit: int) -> OptKernel:
  """Split LOCAL axes off the output axes, sized innermost first (see the module docstring) and
  applied outermost first: new axes get increasing ids, and gpudims makes the last one work-item
  dimension 0 (the fastest)."""
  items = math.prod(s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.GROUP_REDUCE)
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


def gpu_optimizations(k: OptKernel, ren: Renderer) -> OptKernel:
  """The heuristics' choice of opts for `k` on a GPU target `ren`."""
  tiled = register_tile(k)
  if tiled is k: tiled = group_reduce(k, ren.local_max)
  return add_locals(tiled, ren.local_max)
