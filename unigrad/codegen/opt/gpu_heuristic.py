"""Hand-written heuristics for GPU targets (renderers that `has_local`): launch shapes.

- Register tiles for matmul-like reductions: each work item computes a small block of outputs
  (UPCAST of the axis an input is contiguous along and of an axis it does not depend on), so each
  load feeds several multiply-adds.
- Work groups: output axes are split into LOCAL axes (work items of one group), innermost first so
  that neighbouring work items touch neighbouring addresses (coalesced), up to `GROUP_ITEMS` items
  (and the target's limit): the innermost axis takes up to `INNER_ITEMS`, each outer one up to
  `OUTER_ITEMS`. What is left of the output axes becomes the grid of work groups (gpudims).
"""
from __future__ import annotations

from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.heuristic import axis_of, plan_tiles
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.renderer import Renderer
from unigrad.uop import AxisType

__all__ = ["gpu_optimizations"]

GROUP_ITEMS, INNER_ITEMS, OUTER_ITEMS = 256, 64, 16
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


def add_locals(k: OptKernel, limit: int) -> OptKernel:
  """Split LOCAL axes off the output axes, innermost first (see the module docstring)."""
  budget = min(GROUP_ITEMS, limit)
  loops = [r.arg.id for r in k.axes if r.arg.axis_type in (AxisType.LOOP, AxisType.GLOBAL)]
  for n, rid in enumerate(reversed(loops)):
    i = axis_of(k, rid)
    if i is None or k.sizes[i] < 2 or budget < 2: continue
    size = _largest_divisor(k.sizes[i], min(budget, INNER_ITEMS if n == 0 else OUTER_ITEMS))
    if size < 2: continue
    tried = _try(k, Opt.local(i, size))
    if tried is not k: budget //= size
    k = tried
  return k


def gpu_optimizations(k: OptKernel, ren: Renderer) -> OptKernel:
  """The heuristics' choice of opts for `k` on a GPU target `ren`."""
  return add_locals(register_tile(k), ren.local_max)
