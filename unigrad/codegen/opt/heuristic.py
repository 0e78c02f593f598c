"""Hand-written heuristics: good opts for elementwise, reduction and matmul-shaped kernels.

The choice is read off the kernel's loads: for each input buffer read, the stride of every output
(LOOP) axis in its index (0: the buffer is broadcast along that axis).
- Register tiles for matmul-like reductions (matmul, batched matmul, convolution): the *vector
  axis* is an output axis along which an input is contiguous (stride 1), upcast to as many lanes
  as the target's vector registers allow (up to two registers); the *reuse axis* is an output axis
  that input does not depend on, upcast so each vector load is reused across the tile (the
  accumulators take half the target's vector registers, a quarter for a nested reduce, at least 8
  (the FMAs in flight): 16 or 8 on AVX-512, 8 on AVX2 (the renderer's `vector_bytes` and
  `vector_registers`); two registers of the vector axis are two vector values); with a single
  reduce loop the vector axis's loop runs outside the reuse axis's (see `panel_order`). Among
  several contiguous axes the one giving the widest vectors wins, and a tile is taken only when
  the codegen will make its vector axis the vector (see codegen/vectorize.py); else the next
  candidate is tried. A target with 16 vector registers (AVX2) takes 6 rows of two vectors
  instead, its rows padded to a multiple of 6 (`few_register_tile`). The tile's contiguous input
  (a matmul's B) is then packed (PACK, codegen/opt/pack.py): each K x tile-width panel copied into
  a contiguous buffer once, before the tile rows that reuse it (`pack_panel`).
- Vector partial sums for the rest of the matmul-like kernels whose loads are contiguous along
  the innermost reduce axis: `a @ b.T` (DotPlan: PyTorch's Linear layout, run in place within
  ~10% of the contiguous matmul with the transposed sums of codegen/transpose_sums.py; the
  schedule copies no weight for it), and short reductions such as a convolution's weight
  gradient, whose kernel width (3) gives no vector output axis (ReducePlan).
- Short windows (every reduce axis shorter than SHORT_WINDOW: a depthwise convolution) get a
  register tile only where the tile's contiguous input is read in the window loop and reused
  across an output axis; else their plain loops are left to the C compiler, which vectorizes
  them along the output width.
- THREAD: split an output axis across the cores when there is enough work per core, preferring
  one the contiguous input does not depend on (so `core_id` stays out of its addresses).
- Vectors for everything else: the output axis along which the store is contiguous (else a load
  is) is upcast to one vector register, unless a reduce reads contiguously along its own
  innermost axis; such reductions (and any kernel left without a vector axis) split that reduce
  axis into independent partial accumulators.
A tile records the vector range it was made for in the kernel (`OptKernel.vector`, written to
KernelInfo.vector; codegen/vectorize.py's choose_vector_range, asked once per candidate): expand
keeps that range, and chooses with the same function only where nothing chose (no tile). The
scheduler asks `runs_in_place` whether a matmul gets a DotPlan tile, rather than predicting it
(schedule/matmul.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.opt.pack import is_contiguous_panel
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.renderer import Renderer
from unigrad.dtype import DType, dtypes
from unigrad.uop import AxisType, GroupOp, Ops, UOp, graph_rewrite
from unigrad.uop.symbolic import is_invalid, linear_terms

MIN_WORK_PER_THREAD = 1 << 15
WORK_OPS = 16  # value ops one unit of a kernel's work per iteration stands for (see work)
MIN_TILE_REDUCE = 16  # a reduce this short is not worth a register tile
# the share of the target's vector registers a register tile's accumulators take: with one reduce
# loop (matmul) half (16 of AVX-512's 32, 8 of AVX2's 16; the rest hold the loaded vectors and
# broadcasts), with the reduce nested over several loops (convolution: cin, kh, kw) a quarter
TILE_SHARE, NESTED_TILE_SHARE = 2, 4
# but never fewer accumulators than the FMAs in flight: Zen's and Intel's two FMA units of 4
# cycles' latency need 8 independent ones (a quarter of AVX2's 16 registers is 4: an AVX2
# convolution, 16x64x56x56 3x3, ran at half the FMA rate: 37 ms, with 8 accumulators 27 ms)
MIN_ACCUMULATORS = 8
SCALAR_REGISTERS = 32  # sizes the tile where the target has no vector values
SCALAR_VECTOR_BYTES = 16  # sizes the tile where the target has no vector values (the C compiler
                          # may still vectorize the unrolled tile)


def _try(k: OptKernel, opt: Opt) -> OptKernel:
  try: return k.apply(opt)
  except KernelOptError: return k


def axis_of(k: OptKernel, range_id: int) -> int | None:
  """The current position of the output (LOOP or GLOBAL) axis with this range id (ids survive
  splits)."""
  for i, r in enumerate(k.axes):
    if r.arg.id == range_id and r.arg.axis_type in (AxisType.LOOP, AxisType.GLOBAL): return i
  return None


# ---- what the loads say about the axes ----

@dataclass(frozen=True)
class Strides:
  """The stride of each LOOP axis (by range id) in one buffer read's index (None: not linear),
  and the buffer's element size."""
  of: dict[int, int | None]
  itemsize: int


def _index_strides(idx: UOp, ranges: list[UOp]) -> dict[int, int | None]:
  if idx.op is Ops.WHERE and is_invalid(idx.src[2]): idx = idx.src[1]
  terms, _ = linear_terms(idx)
  nonlinear = {r for t in terms if t.op is not Ops.RANGE for r in t.toposort() if r in ranges}
  return {r.arg.id: None if r in nonlinear else terms.get(r, 0) for r in ranges}


def access_strides(k: OptKernel, stored: bool,
                   axis_type: AxisType = AxisType.LOOP) -> list[Strides]:
  """For each buffer write (`stored`) or read (an INDEX of a PARAM that is not stored to), the
  stride of each `axis_type` axis in its index."""
  nodes = k.ast.toposort()
  written = {u.src[0] for u in nodes if u.op is Ops.STORE}
  axes = [r for r in k.axes if r.arg.axis_type is axis_type]
  return [Strides(_index_strides(u.src[1], axes), u.src[0].dtype.itemsize) for u in nodes
          if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and len(u.src) > 1
          and (u in written) == stored]


def load_strides(k: OptKernel) -> list[Strides]: return access_strides(k, stored=False)


# a reduce whose every axis is shorter than this is a small sliding window (a depthwise
# convolution: 3x3 or 5x5 per channel, no sum over channels)
SHORT_WINDOW = 8


def is_short_window(k: OptKernel) -> bool:
  """Whether every REDUCE axis of `k` is shorter than SHORT_WINDOW."""
  reduces = [s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.REDUCE]
  return bool(reduces) and max(reduces) < SHORT_WINDOW


@dataclass(frozen=True)
class TilePlan:
  """A register tile, as range ids: the vector axis, the reuse axis (or None), and the LOOP axes
  the vector axis's contiguous input does not depend on (preferred for THREAD), and that input's
  element size. `checked`: taken only if the codegen makes the vector axis its vector."""
  vector: int
  reuse: int | None
  independent: tuple[int, ...] = ()
  itemsize: int = 4
  checked: bool = True


def _lanes(size: int, budget: int) -> int:
  """The largest power of two <= budget that divides size and leaves a loop of 2 or more."""
  lanes = budget
  while lanes > 1 and (size % lanes or size == lanes): lanes //= 2
  return lanes


def plan_tiles(k: OptKernel, vector_bytes: int) -> list[TilePlan]:
  """Candidate tiles of a matmul-like kernel, best first (none if it is not one): the widest
  vectors (up to two registers), then the innermost axis; the last one, the two innermost output
  axes, is taken unchecked."""
  types, sizes = k.axis_types(), k.sizes
  loops = [r.arg.id for r, t in zip(k.axes, types) if t is AxisType.LOOP]
  size = {r.arg.id: s for r, s in zip(k.axes, sizes)}
  reduce = math.prod(s for s, t in zip(sizes, types) if t is AxisType.REDUCE)
  if len(loops) < 2 or reduce < MIN_TILE_REDUCE: return []
  strides = load_strides(k)
  plans: list[tuple[int, int, TilePlan]] = []
  for pos, rid in enumerate(loops):
    for st in strides:
      if st.of.get(rid) != 1: continue
      rest = tuple(o for o in loops if o != rid and st.of.get(o) == 0)
      used = [o for o in rest if any(s.of.get(o) != 0 for s in strides if s is not st)]
      plan = TilePlan(rid, used[-1] if used else None, rest, st.itemsize)
      plans.append((_lanes(size[rid], 2 * vector_bytes // st.itemsize) * st.itemsize, pos, plan))
  plans.sort(key=lambda p: p[:2], reverse=True)
  if is_short_window(k): return short_window_tiles(k, [p for *_, p in plans])
  widest = max((s.itemsize for s in strides), default=4)
  # a tile of the two innermost output axes pays only where a load is reused across one of them
  # (a row sum of softmax's exp, read once: 4x4 scalar sums 33 us, vector partial sums 10 us)
  if not any(st.of.get(o) == 0 for st in strides for o in loops[-2:]): return [p for *_, p in plans]
  return [p for _, _, p in plans] + [TilePlan(loops[-1], loops[-2], (), widest, checked=False)]


def short_window_tiles(k: OptKernel, plans: list[TilePlan]) -> list[TilePlan]:
  """The tiles of a kernel whose reduce is a short window: only those whose contiguous input is
  read in the reduce loop and reused across an output axis (a convolution over 3 input channels
  reuses each input across its output channels). A depthwise convolution reuses nothing: its
  per-channel loads (a batchnorm's statistics after it) made tiles that were no vectors, then
  the unchecked tile of the two innermost output axes took 2 or 4 lanes of the output width;
  left as it is (threads only), the C compiler vectorizes its loops along the output width
  (depthwise 5x5 with batchnorm, one thread, kernel time: 672x14x14 1.11 -> 0.13 ms,
  144x56x56 stride 2 1.08 -> 0.33 ms; 240x28x28 0.50 either way)."""
  reduces = [r for r in k.axes if r.arg.axis_type is AxisType.REDUCE]
  def in_loop(vector: int) -> bool:
    return any(st.of.get(vector) == 1 and any(st_r.of.get(r.arg.id) for r in reduces)
               for st, st_r in zip(load_strides(k), access_strides(k, False, AxisType.REDUCE)))
  return [p for p in plans if p.reuse is not None and in_loop(p.vector)]


# ---- the opts ----

def work(k: OptKernel) -> int:
  """The kernel's iterations (symbolic sizes at their largest), times its value ops per
  iteration in units of WORK_OPS: an int8 matvec over packed weights runs a few hundred per
  iteration (its byte products), a copy one."""
  ops = sum(1 for u in k.ast.toposort() if u.op in GroupOp.ALU and u.dtype.scalar() != dtypes.index)
  return math.prod(k.max_sizes) * max(1, ops // WORK_OPS)


def add_threads(k: OptKernel, threads: int, prefer: tuple[int, ...] = ()) -> OptKernel:
  """THREAD over the first preferred LOOP axis the threads divide, else over the first one; if
  the threads divide none, over the first LOOP axis padded to a multiple of them (PADTO) that
  leaves at most MAX_IDLE_SHARE of the padded iterations idle: SmolLM2's attention scores over
  3 key/value heads (and a symbolic number of positions) ran on one core, now 2 heads on one and
  1 on the other."""
  if threads <= 1: return k
  if work(k) < MIN_WORK_PER_THREAD * threads: return k
  loops = [(i, r) for i, (r, t) in enumerate(zip(k.axes, k.axis_types())) if t is AxisType.LOOP]
  fits = [(r.arg.id not in prefer, i) for i, r in loops
          if k.sizes[i] >= threads and k.sizes[i] % threads == 0]
  if fits: return _try(k, Opt.thread(min(fits)[1], threads))
  for i, r in loops:
    if not isinstance(k.sizes[i], int) or k.sizes[i] < threads: continue
    padded = -(-k.sizes[i] // threads) * threads
    if (padded - k.sizes[i]) > MAX_IDLE_SHARE * padded: continue
    if (padded_k := _try(k, Opt.padto(i, threads))) is k: continue
    if (axis := axis_of(padded_k, r.arg.id)) is None: continue
    if (threaded := _try(padded_k, Opt.thread(axis, threads))) is not padded_k: return threaded
  return k


MAX_IDLE_SHARE = 0.25  # a padded THREAD axis leaves at most this share of its iterations idle


def _upcast(k: OptKernel, range_id: int | None, lanes: int,
            whole: bool = False) -> tuple[OptKernel, UOp | None]:
  """Upcast the axis by up to `lanes` (see _lanes); `whole`: an axis of at most `lanes` is
  upcast whole, whatever its size (decode attention's 3 query heads per key, SmolLM2: each
  loaded key then serves the 3); also the new UPCAST range."""
  axis = None if range_id is None else axis_of(k, range_id)
  if axis is None: return k, None
  size = k.sizes[axis]
  amt = size if whole and isinstance(size, int) and 2 <= size <= lanes else _lanes(size, lanes)
  if amt < 2: return k, None
  up = _try(k, Opt.upcast(axis, amt))
  new = [r for r in up.axes if r.arg.axis_type is AxisType.UPCAST and r not in k.axes]
  return up, (new[0] if new else None)


def register_tile(k: OptKernel, plan: TilePlan, vector_bytes: int,
                  registers: int = SCALAR_REGISTERS) -> OptKernel | None:
  """The tile of `plan`: the vector axis upcast to up to two registers, the reuse axis so that
  the tile's accumulators take a share of the target's `registers` (TILE_SHARE, NESTED_TILE_SHARE
  for a nested reduce; a narrower vector still takes a whole one); None if the codegen would not
  make the vector axis its vector (when the plan is checked and the target has vector values)."""
  reg = (vector_bytes or SCALAR_VECTOR_BYTES) // plan.itemsize  # lanes of one register
  tiled, vec = _upcast(k, plan.vector, reg)
  if vec is None: return None
  # the second register is a second vector value: gcc keeps a vector wider than a register in
  # memory, moving it through general registers (AVX2 matmul 256: 10 GFLOPS)
  tiled, pair = _upcast(tiled, plan.vector, 2) if vec.src[0].arg == reg else (tiled, None)
  nested = sum(t is AxisType.REDUCE and s > 1 for t, s in zip(k.axis_types(), k.sizes)) > 1
  regs = max((registers or SCALAR_REGISTERS) // (NESTED_TILE_SHARE if nested else TILE_SHARE),
             MIN_ACCUMULATORS)
  tiled = _pad_rows(tiled, plan.reuse, rows := regs // (1 if pair is None else 2))
  tiled, _ = _upcast(tiled, plan.reuse, rows)
  if not nested: tiled = panel_order(tiled, plan)
  if not vector_bytes: return tiled
  got = tiled.vector_range(vector_bytes)
  if plan.checked: return tiled.with_vector(vec) if got is vec else None
  return tiled.with_vector(got) if got is not None else scalar_tile(k, plan)


def _pad_rows(k: OptKernel, range_id: int | None, rows: int) -> OptKernel:
  """The reuse axis padded to a multiple of `rows` (PADTO) when its size admits fewer rows and
  is at least MIN_PADDED_ROWS: magika's convolution over 508 positions, 254 per thread, took 2
  rows of two vectors, 4 accumulators for FMAs of 4 cycles' latency (55 GFLOPS); padded to 256,
  4 rows."""
  axis = None if range_id is None else axis_of(k, range_id)
  if axis is None or k.sizes[axis] < MIN_PADDED_ROWS or _lanes(k.sizes[axis], rows) == rows:
    return k
  return _try(k, Opt.padto(axis, rows))


# rows of the tile on a target with few vector registers (AVX2's 16): 6 rows of two vectors are
# 12 accumulators; half the registers (4 rows, 8 accumulators) are exactly as many FMAs as Zen's
# two FMA units keep in flight (4 cycles each), so any late load stalls them (AVX2 matmul 1024:
# 98 -> 105 GFLOPS, 2048: 89 -> 98). Sizes are rarely multiples of 6: the rows are padded
# (PADTO, its reads clamped into bounds: plain loads in the reduce loop)
FEW_REGISTERS, FEW_REGISTER_ROWS = 16, 6
MIN_PADDED_ROWS = 48  # padding to a multiple of 6 adds at most 5 rows: a tenth of 48


def few_register_tile(k: OptKernel, plan: TilePlan, ren: Renderer) -> OptKernel | None:
  """The register tile of a target with at most FEW_REGISTERS vector registers: the vector axis
  upcast to two registers, the reuse axis (padded to a multiple of FEW_REGISTER_ROWS if need be)
  to FEW_REGISTER_ROWS rows, the rows unrolled outside the two vectors (one broadcast live at a
  time: 12 accumulators, 2 vectors and a broadcast fit 16 registers); None where this does not
  apply (more registers, a nested reduce, too few rows, no vector of the vector axis)."""
  if not ren.vector_bytes or ren.vector_registers > FEW_REGISTERS or plan.reuse is None: return None
  if sum(t is AxisType.REDUCE and s > 1 for t, s in zip(k.axis_types(), k.sizes)) != 1: return None
  reg = ren.vector_bytes // plan.itemsize
  tiled, vec = _upcast(k, plan.vector, reg)
  rows = axis_of(tiled, plan.reuse)
  if vec is None or vec.src[0].arg != reg or rows is None: return None
  if tiled.sizes[rows] < MIN_PADDED_ROWS: return None
  if tiled.sizes[rows] % FEW_REGISTER_ROWS:
    tiled = _try(tiled, Opt.padto(rows, FEW_REGISTER_ROWS))
  if (up := _try(tiled, Opt.upcast(rows, FEW_REGISTER_ROWS))) is tiled: return None
  tiled, pair = _upcast(up, plan.vector, 2)
  if pair is None: return None
  tiled = panel_order(tiled, plan)
  return tiled.with_vector(vec) if tiled.vector_range(ren.vector_bytes) is vec else None


SCALAR_TILE = 4  # an unvectorized tile: 4x4 scalar accumulators


def scalar_tile(k: OptKernel, plan: TilePlan) -> OptKernel:
  """A tile of scalar accumulators that fits in registers, for a target with vectors where the
  tile's vector axis is no vector (strided loads): the register tile's 128 scalar accumulators
  spilled, and took 200 ms to generate."""
  tiled, _ = _upcast(k, plan.vector, SCALAR_TILE)
  tiled, _ = _upcast(tiled, plan.reuse, SCALAR_TILE)
  return tiled


def panel_order(k: OptKernel, plan: TilePlan) -> OptKernel:
  """Loop over the vector axis outside the reuse axis: one panel of the contiguous input (a few
  vector columns down the whole reduce) stays in cache while every block of the reuse axis
  streams past it (matmul 1024: 9.0 -> 6.8 ms), instead of the whole input streaming once per
  block."""
  vec, reuse = axis_of(k, plan.vector), axis_of(k, plan.reuse) if plan.reuse is not None else None
  if vec is None or reuse is None or vec < reuse: return k
  return _try(k, Opt.swap(reuse, vec))


# ---- packing the contiguous input's panel (codegen/opt/pack.py) ----

PACK_MIN_BYTES = 16 << 10  # a smaller panel stays in L1 as it is (matmul 256: packing gains 0)
PACK_MAX_PANEL = 256 << 10  # the panel stays in L2 (half of Zen 2/3's 512 KiB)
PACK_MIN_REUSE = 8  # tile rows (iterations of the reuse axis) per copy of the panel


def contiguous_slot(k: OptKernel, plan: TilePlan) -> int | None:
  """The PARAM slot of the input that is contiguous along the plan's vector axis and broadcast
  along its reuse axis (a matmul's B), in the untiled kernel `k`; None if there is no one such."""
  ranges = {r.arg.id: r for r in k.axes}
  found = [u.src[0].arg.slot for u in k.ast.toposort() if u.op is Ops.INDEX
           and u.src[0].op is Ops.PARAM and u.src[0].arg.name is None and len(u.src) == 2
           and _index_strides(u.src[1], [ranges[plan.vector]]).get(plan.vector) == 1
           and plan.reuse is not None and ranges[plan.reuse] not in u.src[1].ranges]
  return found[0] if len(set(found)) == 1 else None


def pack_panel(tiled: OptKernel, slot: int | None, vector_bytes: int) -> OptKernel:
  """PACK the tile's contiguous input (`slot`) at the innermost LOOP axis it depends on, when a
  LOOP axis it does not depend on (the tile rows, which panel_order put inside) follows: each
  copy of the K x tile-width panel then serves every tile row from contiguous memory (matmul
  2048, AVX-512: 71 -> 105 GFLOPS; AVX2 1024: 51 -> 94, one thread). Only with one reduce
  loop, a panel between PACK_MIN_BYTES and PACK_MAX_PANEL bytes and at least PACK_MIN_REUSE tile
  rows per copy; else `tiled` as it is."""
  if slot is None or sum(t is AxisType.REDUCE for t in tiled.axis_types()) != 1: return tiled
  read = next(u for u in tiled.ast.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM
              and u.src[0].arg.slot == slot)
  loops = [i for i, t in enumerate(tiled.axis_types()) if t is AxisType.LOOP]
  uses = [i for i in loops if tiled.axes[i] in read.src[1].ranges]
  if not uses: return tiled
  reuse = math.prod(tiled.sizes[i] for i in loops if i > uses[-1] and i not in uses)
  if reuse < PACK_MIN_REUSE: return tiled
  packed = _try(tiled, Opt.pack(uses[-1], slot))
  if packed is tiled or is_contiguous_panel(tiled.ast, tiled.axes[uses[-1]], slot): return tiled
  panel = next(u for u in packed.ast.toposort() if u.op is Ops.BUFFER)
  if not PACK_MIN_BYTES <= panel.shape[0] * panel.dtype.itemsize <= PACK_MAX_PANEL: return tiled
  keep = tiled.vector_range(vector_bytes)
  if keep is not None and packed.vector_range(vector_bytes) is not keep: return tiled
  return packed if keep is None else packed.with_vector(keep)


def group_reduce(k: OptKernel, lanes: int) -> OptKernel:
  """Split the innermost REDUCE axis into `lanes` partial accumulators (independent chains)."""
  reduces = [i for i, t in enumerate(k.axis_types()) if t is AxisType.REDUCE]
  if not reduces: return k
  i = reduces[-1]
  # long enough counted over every reduce axis: a packed weight's 16 lanes of a block are its
  # innermost reduce axis, the blocks an outer one
  total = math.prod(k.sizes[j] for j in reduces)
  for g in (lanes, lanes // 2, lanes // 4, 2):
    if g > 1 and k.sizes[i] % g == 0 and total >= 4 * g: return _try(k, Opt.group(i, g))
  return k


def contiguous_reduce(k: OptKernel) -> bool:
  """Whether a load reads contiguously along the innermost REDUCE axis."""
  reduces = [r for r in k.axes if r.arg.axis_type is AxisType.REDUCE]
  return bool(reduces) and any(st.of[reduces[-1].arg.id] == 1
                               for st in access_strides(k, False, AxisType.REDUCE))


# outputs_in_lanes keeps at least this many bytes of outputs per step (two AVX2 registers): each
# activation word broadcast serves them all
LANES_BYTES = 64


def outputs_in_lanes(k: OptKernel, vector_bytes: int) -> OptKernel | None:
  """`k` with an output axis as its vector (output_vector) when every load that varies along it
  then reads it contiguously and no such load reads the innermost reduce axis contiguously: a
  matvec over row-interleaved packed weights (nn/quantized.py), whose activations are contiguous
  along the reduction but are one vector every output reads. Each vector of outputs then sums
  its lanes apart (no horizontal sums), reading whole vectors of weights. None otherwise."""
  reduces = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.REDUCE]
  if not reduces or (vectored := output_vector(k, max(vector_bytes, LANES_BYTES))) is k:
    return None
  simple = OptKernel(_simplified(vectored))
  lanes = [r.arg.id for r in simple.axes if r.arg.axis_type is AxisType.UPCAST]
  if not lanes: return None
  along_lanes = access_strides(simple, False, AxisType.UPCAST)
  along_reduce = access_strides(simple, False, AxisType.REDUCE)
  varying = [(a.of[lanes[-1]], r.of.get(reduces[-1]), dt) for a, r, dt in
             zip(along_lanes, along_reduce, _load_dtypes(simple)) if a.of[lanes[-1]] != 0]
  if not varying or any(lane != 1 or red == 1 for lane, red, _ in varying): return None
  # packed integer weights only: a float kernel keeps the choice below (the order of its sums
  # is what training runs reproduce: 2-rank data parallel equals one process to 1e-5)
  return vectored if any(not dtypes.is_float(dt) for _, _, dt in varying) else None


def _load_dtypes(k: OptKernel) -> list[DType]:
  """The element dtype of each buffer read, in access_strides' order."""
  nodes = k.ast.toposort()
  written = {u.src[0] for u in nodes if u.op is Ops.STORE}
  return [u.src[0].dtype.scalar() for u in nodes if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM
          and len(u.src) > 1 and u not in written]


# rows of a transposing load unrolled per vector (each cache line used 8x): clang turns 8 rows
# of 16 or 8 lanes into register transposes, 4 rows of 16 lanes stay scalar (a 512x512
# transposing copy: 0.42 ms with 4 rows, 0.09 with 8; 1536x384: 1.05 -> 0.19 ms)
TRANSPOSE_ROWS = 8


def output_vector(k: OptKernel, vector_bytes: int) -> OptKernel:
  """Upcast the LOOP axis the store is contiguous along (else one a load is) to one register;
  a load contiguous along another LOOP axis (a transpose) gets that axis upcast by
  TRANSPOSE_ROWS too (a 512x512 transposing copy: 0.70 -> 0.09 ms)."""
  for strides in (access_strides(k, stored=True), load_strides(k)):
    for st in strides:
      unit = [rid for rid, s in st.of.items() if s == 1 and axis_of(k, rid) is not None]
      if unit:
        up, vec = _upcast(k, unit[-1], vector_bytes // st.itemsize)
        if vec is not None: return transpose_rows(up, unit[-1])
  return k


def transpose_rows(k: OptKernel, vector: int) -> OptKernel:
  """Upcast the LOOP axis a load is contiguous along, when that load is strided along the vector
  axis: each unrolled row then reads the next element of the lines the vector's lanes loaded. A
  load broadcast along the vector axis (stride 0: a per-row statistic) is one scalar per vector
  and gains nothing from the rows (they multiplied a GELU-backward kernel's code by 4: 1600
  instructions, 200 ms of codegen)."""
  for st in load_strides(k):
    if st.of.get(vector) in (0, 1): continue
    rows = [rid for rid, s in st.of.items() if s == 1 and rid != vector]
    if rows and axis_of(k, rows[-1]) is not None: return _upcast(k, rows[-1], TRANSPOSE_ROWS)[0]
  return k


@dataclass(frozen=True)
class DotPlan:
  """A tile of a kernel whose two inputs are contiguous along its innermost reduce axis and
  neither along an output axis (`x @ W.T` with W stored (out, in), as PyTorch stores weights):
  range ids of the reduce axis and of the output axes only one input depends on; `panel`'s
  input is held (a few rows) while `stream`'s streams past them; `lanes`: the partial sums;
  `batch`: the other output axes only the streamed input depends on."""
  reduce: int
  panel: int
  stream: int
  itemsize: int
  lanes: int
  batch: tuple[int, ...] = ()


def _simplified(k: OptKernel) -> UOp:
  """The kernel's AST simplified as finish() will (a reduce axis split off a merged (h, d)
  axis reads `(8*r + g) % 32`, which simplifies to `8*(r % 4) + g`, contiguous along g)."""
  return graph_rewrite(k.ast, pm_kernel_simplify, name="simplify dot plan")


def dot_lanes(k: OptKernel, ren: Renderer) -> int:
  """The partial sums of a DotPlan tile: DOT_LANE_BYTES of the widest input's elements."""
  widest = max((st.itemsize for st in load_strides(k)), default=4)
  return min(ren.vector_bytes, DOT_LANE_BYTES) // widest


def plan_dot(k: OptKernel, lanes: int) -> DotPlan | None:
  """The DotPlan of `k`, or None when it is no such kernel. Contiguity is read along the reduce
  axis's last `lanes` (split off as in the tile): an input whose reduce axis merges two of its
  axes (attention's heads and head size, (h, d) -> h*d) is contiguous along runs of d."""
  reduces = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.REDUCE]
  loops = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.LOOP]
  if not reduces or len(loops) < 2 or lanes < 2: return None
  red = next(i for i, r in enumerate(k.axes) if r.arg.id == reduces[-1])
  if k.sizes[red] % lanes or k.sizes[red] < 2 * lanes: return None
  if (split := _try(k, Opt.group(red, lanes))) is k: return None
  split = OptKernel(_simplified(split))
  lane = next(r.arg.id for r in split.axes if r.arg.axis_type is AxisType.GROUP_REDUCE)
  along, outs = access_strides(split, False, AxisType.GROUP_REDUCE), load_strides(split)
  unit = [i for i, st in enumerate(along) if st.of[lane] == 1]
  if len(unit) != 2 or any(outs[i].of.get(o) == 1 for i in unit for o in loops): return None
  a, b = (outs[i].of for i in unit)
  only_b = [o for o in loops if a.get(o) == 0 and b.get(o) not in (0, None)]
  only_a = [o for o in loops if b.get(o) == 0 and a.get(o) not in (0, None)]
  if not only_a or not only_b: return None
  panel, streams = (only_b[-1], only_a) if only_b[-1] > only_a[-1] else (only_a[-1], only_b)
  return DotPlan(reduces[-1], panel, streams[-1], max(outs[i].itemsize for i in unit), lanes,
                 tuple(streams[:-1]))


# partial sums of a DotPlan tile: at most 32 bytes of lanes. Each output's lanes are summed once
# after the reduce loop (one transposed sum per 8 outputs, codegen/transpose_sums.py); on AMD Zen 4
# a 512-bit FMA is two 256-bit halves, so 8 lanes cost no FMA throughput (a @ b.T 512: 0.71 -> 0.81
# of a @ b's speed, x @ W.T 256x384x1536: 0.79 -> 0.86, before the transposed sums)
DOT_LANE_BYTES = 32
# the panel's rows (a few rows of one input, down the whole reduce) stay in L1 while the other
# input streams past: 8 rows where they fit in this many bytes, else 4 (x @ W.T 256x384x1536,
# Zen 4's 32 KiB L1: 82 -> 91 GFLOPS with 4 rows of 6 KiB)
DOT_PANEL_BYTES = 16 << 10
# the streamed input is blocked to rows that fit in this many bytes (half of Zen 4's 1 MiB L2)
# when it is larger, each block streaming past every panel (256x384x1536: 91 -> 101 GFLOPS,
# 1024: 85 -> 92)
DOT_STREAM_BYTES = 512 << 10


def runs_in_place(value: UOp) -> bool:
  """The scheduler's question (schedule/matmul.py): whether these heuristics tile the reduction
  `value` (a kernel's REDUCE over its LOOP output ranges, as rangeify makes it) in place as a
  DotPlan, its partial sums DOT_LANE_BYTES of its widest input's elements; if not, the scheduler
  may copy an operand so that the kernel is the contiguous matmul."""
  k = OptKernel(value)
  widest = max((st.itemsize for st in load_strides(k)), default=4)
  return plan_dot(k, DOT_LANE_BYTES // widest) is not None


def dot_tile(k: OptKernel, plan: DotPlan, ren: Renderer) -> OptKernel | None:
  """The reduce axis split into vector partial sums (GROUP_REDUCE, `plan.lanes`: vector loads of
  both inputs, one transposed sum per 8 outputs at the end), the panel axis upcast by 8 rows (4
  when 8 overflow DOT_PANEL_BYTES) and the stream axis so that the tile's accumulators take half
  the target's registers, then the loop order (dot_order): 28x faster than the matmul tile on
  strided loads for `a @ b.T`, 512, and with the transposed sums within 10% of `a @ b`."""
  red = next(i for i, r in enumerate(k.axes) if r.arg.id == plan.reduce)
  row_bytes = k.sizes[red] * plan.itemsize
  if (tiled := _try(k, Opt.group(red, plan.lanes))) is k: return None
  regs = max(2, ren.vector_registers // TILE_SHARE)
  rows = min(8 if 8 * row_bytes <= DOT_PANEL_BYTES else 4, regs // 2)
  # a panel of symbolic length (attention over the cache's positions; its size reads -1) takes
  # no rows: the stream takes the registers
  panel = axis_of(tiled, plan.panel)
  if panel is None or tiled.sizes[panel] < 2: rows = 1
  tiled, up = _upcast(tiled, plan.stream, max(1, regs // rows), whole=True)
  tiled, _ = _upcast(tiled, plan.panel, rows, whole=True)
  tiled = dot_order(tiled, plan, row_bytes * (1 if up is None else up.src[0].arg))
  # chosen on the AST as finish() simplifies it (see _simplified), and recorded so
  vec = OptKernel(_simplified(tiled)).vector_range(ren.vector_bytes)
  if vec is None or vec.arg.axis_type is not AxisType.GROUP_REDUCE: return None
  return tiled.with_vector(vec)


def dot_order(k: OptKernel, plan: DotPlan, tile_bytes: int) -> OptKernel:
  """The loops of a DotPlan tile (`tile_bytes`: the streamed rows one tile reads): the panel's
  outside the stream's (the panel's rows stay in L1 while the other input streams past), and
  outside the stream's batch loops too (MiniLM's x, 8 sequences of 32 rows: W read from L2
  once per call, not once per sequence) when the whole stream fits DOT_STREAM_BYTES; else the
  stream in blocks that fit, each block's loop outside the panel's. Loops run in range id
  order, and SWAP exchanges two ranges' ids."""
  stream, panel = axis_of(k, plan.stream), axis_of(k, plan.panel)
  if stream is None or panel is None: return k
  batch = [b for i in plan.batch if (b := axis_of(k, i)) is not None]
  streamed = tile_bytes * k.sizes[stream] * math.prod(k.sizes[b] for b in batch)
  block = _divisor_upto(k.sizes[stream], max(1, DOT_STREAM_BYTES // tile_bytes))
  if streamed > DOT_STREAM_BYTES and block < k.sizes[stream]:
    blocked = _try(k, Opt.split(stream, block, AxisType.LOOP))
    if blocked is not k:  # the block loop (the stream's id) goes outside the panel's
      b_panel, b_stream = axis_of(blocked, plan.panel), axis_of(blocked, plan.stream)
      if b_panel is None or b_stream is None: return blocked  # (a split keeps both axes)
      return _try(blocked, Opt.swap(b_stream, b_panel)) if b_stream > b_panel else blocked
  if stream < panel: k, panel = _try(k, Opt.swap(stream, panel)), stream
  if streamed > DOT_STREAM_BYTES: return k
  for b in sorted(b for b in batch if b < panel): k, panel = _try(k, Opt.swap(b, panel)), b
  return k


# ---- short contiguous reductions (convolution weight gradients) ----

@dataclass(frozen=True)
class ReducePlan:
  """A tile of a kernel whose loads along its innermost reduce axis are all contiguous, when no
  output axis makes a vector (a convolution's weight gradient: the input and the output gradient
  are contiguous along the output width, the kernel is 3 wide): range ids of the reduce axis and
  of up to two output axes that different loads depend on, innermost first (upcast, each vector
  load is reused across the other loads' axis)."""
  reduce: int
  reuse: tuple[int, ...]
  itemsize: int


MIN_REDUCE_LANES = 4  # partial sums narrower than this do not pay their final horizontal sums
REUSE_UPCAST = 4  # the first reuse axis's share of a ReducePlan tile (the second takes the rest)


def plan_reduce(k: OptKernel) -> ReducePlan | None:
  """The ReducePlan of `k`, or None: at least two loads read contiguously along the innermost
  reduce axis, none at a constant stride other than 1 (a non-linear index is gathered), and some
  output axis is read by only some of them."""
  reduces = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.REDUCE]
  loops = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.LOOP]
  if not reduces or not loops: return None
  along, outs = access_strides(k, False, AxisType.REDUCE), load_strides(k)
  on = [i for i, st in enumerate(along) if st.of[reduces[-1]] != 0]
  unit = [i for i in on if along[i].of[reduces[-1]] == 1]
  # a load at a non-linear index (the pool gradient's x // 2) is gathered lane by lane
  if len(unit) < 2 or any(along[i].of[reduces[-1]] not in (1, None) for i in on): return None
  reads = {o: frozenset(i for i in on if outs[i].of.get(o) != 0) for o in loops}
  reuse = [o for o in reversed(loops) if reads[o] and len(reads[o]) < len(on)]
  if not reuse: return None
  other = next((o for o in reuse if not reads[o] & reads[reuse[0]]), None)
  return ReducePlan(reduces[-1], (reuse[0],) if other is None else (reuse[0], other),
                    max(outs[i].itemsize for i in on))


def _divisor_upto(n: int, cap: int) -> int:
  return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def reduce_lane_bytes(k: OptKernel, ren: Renderer) -> int:
  """The bytes of a ReducePlan's partial sums: DOT_LANE_BYTES for a sum of products (no FMA
  throughput lost on Zen 4, and conv weight gradients keep their tiles), else a full register:
  a max's or a plain sum's chains are latency-bound, and a transcendental's ~40 instructions
  per vector issue once per 16 lanes, not once per 8 (MiniLM 1x128 softmax sum of exp:
  112 -> 94 us, masked max: 35 -> 25 us)."""
  reduces = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
  if all(r.arg.op is Ops.ADD and r.src[0].op is Ops.MUL for r in reduces):
    return min(ren.vector_bytes, DOT_LANE_BYTES)
  return ren.vector_bytes


def reduce_tile(k: OptKernel, plan: ReducePlan, ren: Renderer) -> OptKernel | None:
  """The reduce axis split into vector partial sums (GROUP_REDUCE, up to DOT_LANE_BYTES of
  lanes dividing it, at least MIN_REDUCE_LANES), the reuse axes upcast (the first by up to
  REUSE_UPCAST) so the tile's accumulators take up to half the target's registers; None if the
  codegen would not vectorize the partial sums. The conv2d weight gradient of the digits CNN
  (16x8x3x3 over 64x4x4): one scalar accumulator before, 1.3 ms -> 0.05 ms."""
  lanes = reduce_lane_bytes(k, ren) // plan.itemsize
  red = next(i for i, r in enumerate(k.axes) if r.arg.id == plan.reduce)
  while lanes >= MIN_REDUCE_LANES and k.sizes[red] % lanes: lanes //= 2
  if lanes < MIN_REDUCE_LANES or (tiled := _try(k, Opt.group(red, lanes))) is k: return None
  budget = max(1, ren.vector_registers // TILE_SHARE)
  for j, rid in enumerate(plan.reuse):
    if (axis := axis_of(tiled, rid)) is None: continue
    amt = _divisor_upto(tiled.sizes[axis], budget if j else min(budget, REUSE_UPCAST))
    if amt > 1: tiled, budget = _try(tiled, Opt.upcast(axis, amt)), budget // amt
  vec = tiled.vector_range(ren.vector_bytes)
  if vec is None or vec.arg.axis_type is not AxisType.GROUP_REDUCE: return None
  return tiled.with_vector(vec)


def hand_coded_optimizations(k: OptKernel, ren: Renderer, threads: int) -> OptKernel:
  """The heuristics' choice of opts for `k` on `ren` (see the module docstring); a tile records
  the vector range it was made for (OptKernel.vector: expand keeps it)."""
  for plan in plan_tiles(k, ren.vector_bytes or SCALAR_VECTOR_BYTES):
    if not plan.checked and ren.vector_bytes and (dot := plan_dot(k, dot_lanes(k, ren))):
      threaded = add_threads(k, threads, (dot.panel,)) if ren.has_threads else k
      if (tiled := dot_tile(threaded, dot, ren)) is not None: return tiled
    if not plan.checked and ren.vector_bytes and (red := plan_reduce(k)) is not None:
      threaded = add_threads(k, threads) if ren.has_threads else k
      if (tiled := reduce_tile(threaded, red, ren)) is not None: return tiled
    threaded = add_threads(k, threads, plan.independent) if ren.has_threads else k
    tiled = (few_register_tile(threaded, plan, ren)
             or register_tile(threaded, plan, ren.vector_bytes, ren.vector_registers))
    if tiled is not None: return pack_panel(tiled, contiguous_slot(k, plan), ren.vector_bytes)
  threaded = add_threads(k, threads) if ren.has_threads else k
  if ren.vector_bytes and (lanes := outputs_in_lanes(threaded, ren.vector_bytes)) is not None:
    return lanes
  if ren.vector_bytes and not contiguous_reduce(threaded):
    vectored = output_vector(threaded, ren.vector_bytes)
    if vectored is not threaded: return vectored
  # one register of partial sums: gcc keeps a wider vector in memory (AVX2 sum of 16M floats
  # with 16 lanes: 5x slower than with 8)
  grouped = group_reduce(threaded, ren.vector_bytes // 4 if ren.vector_bytes else 16)
  # a reduce that cannot be split (a symbolic length: attention over the cache's `end`
  # positions) takes its vector from an output axis instead of running scalar (SmolLM2's
  # decode, probabilities @ values, 9 heads x 64 over 140 positions: 70 -> 10 us)
  if ren.vector_bytes and symbolic_reduce(threaded):
    return output_accumulators(output_vector(threaded, ren.vector_bytes), ren)
  return affine_unroll(grouped, ren) if grouped is not threaded else grouped


# unrolls tried to make a reduce's loads affine (see affine_unroll)
AFFINE_UNROLLS = (2, 4)


def affine_unroll(k: OptKernel, ren: Renderer) -> OptKernel:
  """A kernel split into partial sums whose loads index the rest of its reduce non-linearly
  (a packed weight: the byte `r // 2` and its nibble `r % 2`, a block's scale `r // 2`) with that
  axis unrolled by the smallest of AFFINE_UNROLLS that makes every load affine in it: the
  unrolled copies share one load and their shifts become constants (SmolLM2's Q4_1 matvec,
  1536x576 on one core: 114 -> 82 us); `k` itself if none does or the vector would change."""
  reduces = [i for i, t in enumerate(k.axis_types()) if t is AxisType.REDUCE]
  if not reduces or None not in _reduce_strides(k): return k
  vec = k.vector_range(ren.vector_bytes)
  for u in AFFINE_UNROLLS:
    if k.sizes[reduces[-1]] % u or k.sizes[reduces[-1]] < 2 * u: continue
    tiled = _try(k, Opt.unroll(reduces[-1], u))
    if tiled is k or None in _reduce_strides(tiled): continue
    if vec is None: return tiled
    if tiled.vector_range(ren.vector_bytes) is vec: return tiled.with_vector(vec)
  return k


def _reduce_strides(k: OptKernel) -> list[int | None]:
  """Each load's stride along the innermost REDUCE axis (None: not affine in it)."""
  reduce = [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.REDUCE][-1]
  simple = OptKernel(_simplified(k))  # (16*r + g) // 32 with g < 16 reads as r // 2
  return [st.of.get(reduce) for st in access_strides(simple, False, AxisType.REDUCE)]


def output_accumulators(k: OptKernel, ren: Renderer) -> OptKernel:
  """A kernel whose reduce cannot be split into partial sums (a symbolic length) with its first
  other LOOP axis upcast by its largest divisor up to half the target's registers: that many
  independent accumulators, where one FMA chain waited on its own latency at every step
  (SmolLM2's decode, probabilities @ values, 18 vectors of outputs per core over 150 positions:
  one chain per vector, each position's loads read once per vector)."""
  budget = max(1, ren.vector_registers // TILE_SHARE)
  for i, t in enumerate(k.axis_types()):
    if t is AxisType.LOOP and k.sizes[i] >= 2 and (amt := _divisor_upto(k.sizes[i], budget)) > 1:
      return _try(k, Opt.upcast(i, amt))
  return k


def symbolic_reduce(k: OptKernel) -> bool:
  """Whether the innermost REDUCE axis has a symbolic length (it cannot be split)."""
  reduces = [s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.REDUCE]
  return bool(reduces) and reduces[-1] == -1
