"""GPU dims: the output axes of a kernel on a GPU target become the launch's thread indices.

Consumes: an expanded kernel (no REDUCE left; LOOP/GLOBAL, LOCAL and REDUCE loops).
Produces: the same kernel where each LOOP/GLOBAL axis with a constant bound that encloses every
STORE is `SPECIAL("gidx<d>")` (the work group index in launch dimension d) and each LOCAL axis is
`SPECIAL("lidx<d>")` (the work item index in its group); their loops are gone. Dimension 0 is the
innermost axis (a WARP axis, codegen/opt/tc.py, is always work-item dimension 0). More axes
than the target has dimensions (or a dimension above the target's limit) are merged into one
index and recovered by division and modulo.
Invariants: runs only where the renderer `has_local`; a kernel whose KernelInfo says its
iterations run in order (`parallel=False`: a scatter, whose iterations may write the same
element) keeps its loops and runs as one work item; a THREAD axis (a CPU opt), or work groups
above the target's `local_max` work items, raise KernelOptError.
`launch_dims(linear)` reads the launch size back off the SPECIALs.
"""
from __future__ import annotations

import math

from unigrad.codegen.opt import KernelOptError
from unigrad.codegen.opt.kernel import axis_key
from unigrad.renderer import Renderer
from unigrad.uop.rewrite import rebuild
from unigrad.uop import AxisType, KernelInfo, Ops, UOp

__all__ = ["gpudims", "launch_dims", "GLOBAL_PREFIX", "LOCAL_PREFIX"]

GLOBAL_PREFIX, LOCAL_PREFIX = "gidx", "lidx"
OUTPUT_AXES = (AxisType.LOOP, AxisType.GLOBAL)
DIMS = 3


def _size(r: UOp) -> int: return r.src[0].arg


def _is_parallel(r: UOp, stores: list[UOp], types: tuple[AxisType, ...]) -> bool:
  return (r.arg.axis_type in types and r.src[0].op is Ops.CONST
          and all(r in s.ranges for s in stores))


def _groups(sizes: list[int], limits: tuple[int, ...]) -> list[list[int]]:
  """Which axes (innermost first) share each launch dimension: one each while they fit, else the
  outer ones merged into the last dimension, else all of them merged into dimension 0."""
  n = len(sizes)
  if n == 0: return []
  idx = list(range(n))
  groups = [[i] for i in idx[:DIMS - 1]] + ([idx[DIMS - 1:]] if n >= DIMS else [])
  fits = all(math.prod(sizes[i] for i in g) <= lim for g, lim in zip(groups, limits))
  return groups if fits and len(limits) >= len(groups) else [idx]


def _bind(ranges: list[UOp], prefix: str, limits: tuple[int, ...]) -> dict[UOp, UOp]:
  """range -> its index expression over SPECIALs; `ranges` outermost first."""
  inner_first = ranges[::-1]
  sizes = [_size(r) for r in inner_first]
  out: dict[UOp, UOp] = {}
  for d, group in enumerate(_groups(sizes, limits)):
    total = math.prod(sizes[i] for i in group)
    special = UOp(Ops.SPECIAL, inner_first[group[0]].dtype,
                  (UOp.const(inner_first[group[0]].dtype, total),), f"{prefix}{d}")
    stride = 1
    for i in group:  # innermost first: the fastest-moving index
      x = special if len(group) == 1 else (special // stride) % sizes[i]
      out[inner_first[i]] = x
      stride *= sizes[i]
  return out


def gpudims(ast: UOp, ren: Renderer) -> UOp:
  """The kernel with its parallel axes bound to thread indices (see the module docstring)."""
  if not ren.has_local: return ast
  nodes = ast.toposort()
  if any(u.op is Ops.SPECIAL and u.arg == "core_id" for u in nodes):
    raise KernelOptError("THREAD axes are CPU chunks; a GPU target runs its output axes as work "
                         "groups and work items (use LOCAL)")
  if isinstance(ast.arg, KernelInfo) and not ast.arg.parallel: return ast
  stores = [u for u in nodes if u.op is Ops.STORE]
  ranges = sorted((u for u in nodes if u.op is Ops.RANGE), key=axis_key)
  glob = [r for r in ranges if _is_parallel(r, stores, OUTPUT_AXES)]
  # a WARP axis (tensor cores, codegen/opt/tc.py) is the fastest work-item dimension: its lanes
  # are one hardware warp
  local = sorted((r for r in ranges if _is_parallel(r, stores, (AxisType.LOCAL, AxisType.WARP))),
                 key=lambda r: r.arg.axis_type is AxisType.WARP)
  if (items := math.prod(_size(r) for r in local)) > ren.local_max:
    raise KernelOptError(f"a work group of {items} work items is above the target's limit of "
                         f"{ren.local_max}: use fewer or smaller LOCAL/GROUP axes")
  sub = {**_bind(glob, GLOBAL_PREFIX, ren.global_max),
         **_bind(local, LOCAL_PREFIX, (ren.local_max,) * DIMS)}
  if not sub: return ast
  memo: dict[UOp, UOp] = {}
  for u in nodes:
    if u in sub: memo[u] = sub[u]
    elif u.op is Ops.END and u.src[1] in sub: memo[u] = memo[u.src[0]]
    else:
      new_src = tuple([memo[s] for s in u.src])
      memo[u] = rebuild(u, new_src)
  return memo[ast]


def launch_dims(linear: UOp) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
  """(global, local) launch size of a LINEAR: work groups and work items per dimension from its
  gidx/lidx SPECIALs (local None: the kernel has no work-group axes); a CPU kernel's
  (core_id chunks,) from its core_id SPECIAL; else ((1,), None)."""
  specials = {u.arg: u.src[0].arg for u in linear.src if u.op is Ops.SPECIAL}
  if "core_id" in specials: return (specials["core_id"],), None
  if not any(isinstance(k, str) and k[:4] in (GLOBAL_PREFIX, LOCAL_PREFIX) for k in specials):
    return (1,), None
  glob = tuple(specials.get(f"{GLOBAL_PREFIX}{d}", 1) for d in range(DIMS))
  local = tuple(specials.get(f"{LOCAL_PREFIX}{d}", 1) for d in range(DIMS))
  return glob, local
