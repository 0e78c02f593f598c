"""Hand-written heuristics: good opts for elementwise, reduction and matmul-shaped kernels.

- THREAD: split the first LOOP axis that divides evenly across the cores, when there is enough
  work per core to pay for the launch of the extra threads.
- Register tiles for matmul-like reductions: an output axis along which an input is broadcast is
  upcast (each loaded value is reused across the tile), and the innermost contiguous output axis is
  upcast to the vector width so the C compiler forms full-width vector FMAs.
"""
from __future__ import annotations

import math

from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.renderer import Renderer
from unigrad.uop import AxisType

MIN_WORK_PER_THREAD = 1 << 15


def _try(k: OptKernel, opt: Opt) -> OptKernel:
  try: return k.apply(opt)
  except KernelOptError: return k


def add_threads(k: OptKernel, threads: int) -> OptKernel:
  if threads <= 1: return k
  if math.prod(s for s in k.sizes if s > 0) < MIN_WORK_PER_THREAD * threads: return k
  for i, (t, s) in enumerate(zip(k.axis_types(), k.sizes)):
    if t is AxisType.LOOP and s >= threads and s % threads == 0:
      return _try(k, Opt.thread(i, threads))
  return k


def group_reduce(k: OptKernel, lanes: int) -> OptKernel:
  """Split the innermost REDUCE axis into `lanes` partial accumulators (independent chains)."""
  reduces = [i for i, t in enumerate(k.axis_types()) if t is AxisType.REDUCE]
  if not reduces: return k
  i = reduces[-1]
  for g in (lanes, lanes // 2, lanes // 4, 2):
    if g > 1 and k.sizes[i] % g == 0 and k.sizes[i] >= 4 * g: return _try(k, Opt.group(i, g))
  return k


def register_tile(k: OptKernel) -> OptKernel:
  """Matmul-like kernels (a reduce with two or more output loops): upcast the innermost output
  axis by up to 16 (one vector of float32) and the one before it by up to 8, so every loaded
  value is reused across the tile."""
  loops = [i for i, t in enumerate(k.axis_types()) if t is AxisType.LOOP]
  reduces = [i for i, t in enumerate(k.axis_types()) if t is AxisType.REDUCE]
  if len(loops) < 2 or not reduces or k.sizes[reduces[-1]] < 16: return k
  for axis, amounts in ((loops[-1], (16, 8, 4)), (loops[-2], (8, 4, 2))):
    for amt in amounts:
      if k.sizes[axis] % amt == 0 and k.sizes[axis] > amt:
        k = _try(k, Opt.upcast(axis, amt))
        break
  return k


def hand_coded_optimizations(k: OptKernel, ren: Renderer, threads: int) -> OptKernel:
  """The heuristics' choice of opts for `k` on `ren` (see the module docstring)."""
  if ren.has_threads: k = add_threads(k, threads)
  tiled = register_tile(k)
  return tiled if tiled.applied != k.applied else group_reduce(k, 16)
