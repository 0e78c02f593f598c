"""Rangeify: split the function body into kernels over scalar-shaped values indexed by RANGEs.

Consumes: the body `SINK(STORE(buf, value)...)` made by callify (PARAMs, movement ops, ALU,
tensor-graph REDUCE(axes), AFTER(buf, STORE) for earlier writes).
Produces: a list of `Kernel`s, each `SINK(END(STORE(INDEX(PARAM, flat), value), ranges...))`, where
every value is scalar-shaped: movement ops became index arithmetic on RANGEs, PAD became a
validity `WHERE(valid, idx, Invalid)` on the index (gated loads) and `WHERE(valid, x, 0)` on the
value, and REDUCE is `REDUCE(value, *ranges)`. A symbolic variable (a named PARAM) is a scalar
value, never indexed; loops and views over symbolic sizes keep the variable in their bounds, and
intermediate buffers are sized for the variables' largest values (read as row-major prefixes).
Fusion policy (which values get their own kernel and buffer): every STORE is a kernel; a REDUCE
read under an EXPAND that broadcasts, inside another REDUCE, or by several kernels is realized
(unless it has a closed form: arange, cumsum windows), and so is an expensive
elementwise value (one with a transcendental) read under a broadcasting EXPAND, and so is an
elementwise value over a reduction of data (a LayerNorm's output, a matmul plus bias) read under a
broadcasting EXPAND inside another REDUCE: never recomputed in another kernel's reduction loop,
so a kernel's inputs do not grow with model depth; so is an elementwise value of more than
MAX_RECOMPUTED_LOADS loads read there (a ReLU gradient read by a convolution's gradients). A
matmul that reads both operands in contiguous runs along its reduce axis (`x @ W.T`, W stored
(out, in), as PyTorch's Linear stores it) runs in place (the heuristics' DotPlan: vector partial
sums, transposed at the end by codegen/transpose_sums.py); when a transcendental follows it in
its kernel (a GELU), the matmul is realized on its own, so that the epilogue runs as an
elementwise kernel of many independent chains, not once per small tile (is_dot_in_place). A
matmul that would read no operand contiguously along an output axis nor run in place gets a
transposing copy of its buffer-view operand first (transposed_operand), when the copy is read
32+ times per element. An expensive value that a realized REDUCE sums and another kernel reads
too (softmax's exp(x - max)) is realized once. A scatter (a one-hot REDUCE over one of its
output positions, schedule/scatter.py) is always realized, and its kernel becomes a fill and a
sequential loop of direct stores, O(N) instead of O(N*K); a gather that reads one (the position
map of an overwrite) still collapses to a direct load. Everything else is recomputed inline where
it is read.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from unigrad.dtype import dtypes
from unigrad.uop import AxisType, GroupOp, Invalid, Ops, ParamArg, PatternMatcher, ReduceArg, UOp
from unigrad.uop import NodeMap, UPat, consumer_map_from_toposort, graph_rewrite, shape_uop
from unigrad.codegen.expand import identity_element
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.schedule.callify import buffer_view, max_numel
from unigrad.schedule.scatter import compares_position, scatter_kernels, scatter_plan
from unigrad.uop.properties import as_shape
from unigrad.uop.symbolic import linear_terms, pm_invalid

EXPENSIVE = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW, Ops.THREEFRY})
VIEW_OPS = GroupOp.Movement


@dataclass
class Kernel:
  """One kernel: its AST (over body PARAMs and intermediates) and what it reads and writes."""
  ast: UOp
  key: UOp  # the realized node (or STORE) this kernel computes
  writes: UOp  # the PARAM written
  reads: set[UOp] = field(default_factory=set)  # PARAMs read
  deps: set[int] = field(default_factory=set)  # kernels whose results it reads (RAW)


@dataclass
class RangeifyCtx:
  """State of one rangeify run: realized nodes, their buffers, the kernels made so far."""
  nargs: int
  device: str
  realize: set[UOp] = field(default_factory=set)
  buffers: dict[UOp, UOp] = field(default_factory=dict)  # realized node -> PARAM holding it
  producer: dict[UOp, int] = field(default_factory=dict)  # realized node / STORE -> kernel index
  kernels: list[Kernel] = field(default_factory=list)
  next_range: int = 0
  current: Kernel | None = None

  def new_range(self, size: int, axis_type: AxisType) -> UOp:
    self.next_range += 1
    return UOp.range(size, self.next_range, axis_type)


# ---- the fusion policy ----

def _grows(u: UOp) -> bool:
  """An EXPAND that repeats data (some axis goes from 1 to more than 1)."""
  return any(a == 1 and b != 1 for a, b in zip(u.src[0].shape, u.shape))


def _region(u: UOp, realized: set[UOp]) -> list[UOp]:
  """The nodes a kernel reading `u` would compute for it: down to buffers, realized nodes and
  REDUCEs (a REDUCE read where `u` is read, under a broadcast or inside a reduction, is realized
  or has a closed form: its body is never part of the reader's loop)."""
  stack, seen, out = [u], {u}, []
  while stack:
    x = stack.pop()
    out.append(x)
    if x.op is Ops.REDUCE and x is not u: continue
    for s in x.src:
      if s not in seen and s not in realized and s.op not in (Ops.PARAM, Ops.AFTER):
        seen.add(s)
        stack.append(s)
  return out


def _is_expensive(u: UOp, realized: set[UOp]) -> bool:
  """`u` computes a transcendental (not counting what a REDUCE it reads computes)."""
  return any(x.op in EXPENSIVE for x in _region(u, realized))


def _needs_reduction(u: UOp) -> bool:
  """`u` is elementwise over the result of a reduction of data (a normalization's output, a
  matmul plus its bias): recomputing it in another reduction's loop would re-read every input of
  its region there, and a model's next layer reads this layer's output the same way, so the
  reader's inputs would grow with depth. Whether that reduction is itself realized does not
  matter (the value over it would still be recomputed once per iteration of the reader's loop),
  so the answer does not depend on the order in which the walk meets the nodes."""
  if u.op is Ops.REDUCE: return False
  for x in u.toposort(lambda n: n not in _over_data and n.op not in _REGION_STOPS):
    _over_data[x] = any(_is_reduction_of_data(s) for s in x.src)
  return _over_data[u]


def _recomputes_reduction(u: UOp, realized: set[UOp]) -> bool:
  """Reading `u` inside another reduction's loop would recompute a reduction of data that is not
  realized. A value over realized reductions only reloads them: whether that costs too much is
  `_reads_many`'s question (a LayerNorm's output over its realized statistics reads five buffers
  and is realized; a scatter's `index == last writer` reads one and stays inline)."""
  return any(x.op is Ops.REDUCE and x is not u and not _has_closed_form(x)
             for x in _region(u, realized))


_REGION_STOPS = (Ops.REDUCE, Ops.PARAM, Ops.AFTER, Ops.BUFFER)
# node -> whether its elementwise region reads a reduction of data (see _needs_reduction)
_over_data: NodeMap[bool] = NodeMap("over_data")


def _is_reduction_of_data(u: UOp) -> bool:
  if u.op is Ops.REDUCE: return not _has_closed_form(u)
  return u.op not in _REGION_STOPS and _over_data[u]


MAX_RECOMPUTED_LOADS = 2  # an elementwise value reading more is realized before a reduction
                         # recomputes it under a broadcast


def _reads_many(u: UOp, realized: set[UOp]) -> bool:
  """`u` is elementwise over more than MAX_RECOMPUTED_LOADS loads (distinct views of buffers or
  of realized nodes): a reduction reading it under a broadcast would redo all of them for every
  element it broadcasts to: the digits CNN's ReLU gradient (the output, the bias, the incoming
  gradient) read by the next convolution's input gradient once per input channel and kernel
  position, 72 times. A one-hot (a comparison with an arange) is left to collapse into a gather."""
  def is_load(s: UOp) -> bool:
    while s.op in VIEW_OPS and s not in realized: s = s.src[0]
    return s in realized or s.op in (Ops.PARAM, Ops.AFTER, Ops.BUFFER)
  region = _region(u, realized)
  if any(x.op is Ops.REDUCE and x is not u and _has_closed_form(x) for x in region): return False
  loads = {s for x in region if x.op in GroupOp.ALU for s in x.src
           if (s.op in VIEW_OPS or s in realized or s.op in (Ops.PARAM, Ops.AFTER)) and is_load(s)}
  return len(loads) > MAX_RECOMPUTED_LOADS


def _per_node(fn: Callable[[UOp], bool]) -> Callable[[UOp], bool]:
  """A pure predicate of a tensor-graph node, remembered per node (weakly: the entry goes with
  the node). The fusion probes ask about the same node many times in one schedule."""
  seen: NodeMap[bool] = NodeMap(f"per_node_{fn.__qualname__}")

  @functools.wraps(fn)
  def remembered(u: UOp) -> bool:
    if (hit := seen.get(u)) is None: hit = seen[u] = fn(u)
    return hit
  return remembered


def _body(red: UOp) -> tuple[bool, list[UOp]]:
  """What a REDUCE computes itself, down to buffers and other REDUCEs: whether it compares for
  equality (a one-hot does) and the outermost REDUCEs it reads."""
  compares, nested, seen, stack = False, [], set(), [red.src[0]]
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE: nested.append(u)
    elif u.op not in (Ops.PARAM, Ops.AFTER, Ops.BUFFER):
      compares = compares or u.op is Ops.CMPNE
      stack.extend(u.src)
  return compares, nested


def _collapses(red: UOp) -> bool:
  """The REDUCE's indexed form (loads allowed) simplifies to no loop: a gather, an arange. A
  reduction it reads must have a closed form (inlined) or be a scatter (realized, so read from
  its buffer, as a gather reads the position map of an overwrite); any other reduction of data is
  never inlined."""
  loaded = [u for u in _body(red)[1] if not _has_closed_form(u)]
  if not all(is_scatter(u) for u in loaded): return False
  return _probe_simplified(red, loaded)


def _loaded(red: UOp, loaded: list[UOp]) -> UOp:
  """`red` reading each node of `loaded` from a buffer (a placeholder PARAM) of its own."""
  def buf(u: UOp, i: int) -> UOp:
    numel = max_numel(u.shape)
    return UOp(Ops.PARAM, u.dtype, (shape_uop((numel,)),), ParamArg(-1 - i, u.dtype, "NULL"))
  return red.substitute({u: _view(buf(u, i), u.shape) for i, u in enumerate(loaded)})


def _probe(red: UOp, loaded: list[UOp] | None = None,
           simplify: bool = True) -> tuple[UOp, tuple[UOp, ...]] | None:
  """Rangeify `red` alone at fresh LOOP ranges (the nodes in `loaded` read from buffers) and
  simplify: its value there and the ranges."""
  if loaded: red = _loaded(red, loaded)
  ctx = RangeifyCtx(0, "NULL", realize=set())
  ctx.current = Kernel(ast=red, key=red, writes=red)
  rngs = tuple(ctx.new_range(s, AxisType.LOOP) for s in red.shape)
  try:
    value = graph_rewrite(_index(red, rngs), pm_rangeify, ctx=ctx, bottom_up=True, name="probe")
  except NotImplementedError: return None
  if not simplify: return value, rngs
  return graph_rewrite(value, pm_kernel_simplify, name="probe simplify"), rngs


def _probe_simplified(red: UOp, loaded: list[UOp] | None = None) -> bool:
  """Rangeify `red` alone at fresh ranges and simplify: True when no REDUCE is left."""
  probe = _probe(red, loaded)
  return probe is not None and not probe[0].op_in_backward_slice_with_self(Ops.REDUCE)


@_per_node
def is_scatter(u: UOp) -> bool:
  """A REDUCE (or a view of one) that is a one-hot over one of its output positions (see
  scatter_plan): its kernel fills its buffer and then stores directly, instead of looping over
  every output position. A one-hot compares with an arange (a closed form) for equality; the
  probe reads the other reductions it contains from buffers, as its kernel will, so it stays as
  small as the reduction's own body."""
  red = u
  while red.op in VIEW_OPS: red = red.src[0]
  if red.op is not Ops.REDUCE or not all(isinstance(d, int) for d in u.shape): return False
  compares, nested = _body(red)
  if not compares: return False  # no one-hot
  closed = [r for r in nested if _has_closed_form(r)]
  if not closed: return False  # no arange to compare positions with
  probe = _probe(u, [r for r in nested if r not in closed], simplify=False)
  if probe is None or not compares_position(probe[0], probe[1]): return False
  value = graph_rewrite(probe[0], pm_kernel_simplify, name="probe simplify")
  return value.op is Ops.REDUCE and scatter_plan(value, probe[1]) is not None


@_per_node
def _has_closed_form(red: UOp) -> bool:
  """A REDUCE whose indexed form simplifies to no loop at all (arange, cumsum windows): recomputing
  it where it is read costs less than a buffer. Only reductions of constants qualify, so the probe
  never inlines a nested reduction over data."""
  if red.op_in_backward_slice_with_self(Ops.PARAM, Ops.AFTER, Ops.BUFFER): return False
  return _probe_simplified(red)


def _shared_reduces(roots: list[UOp]) -> set[UOp]:
  """REDUCEs that more than one kernel would compute: realized once instead."""
  seen_by: dict[UOp, int] = {}
  for i, root in enumerate(roots):
    for u in root.toposort(lambda n: n.op not in (Ops.PARAM, Ops.AFTER)):
      if u.op is Ops.REDUCE: seen_by[u] = -1 if seen_by.get(u, i) != i else i
  return {u for u, owner in seen_by.items() if owner == -1}


def _summed_and_read(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """Expensive elementwise values that a realized REDUCE sums and something else reads too
  (softmax's exp(x - max): summed, then divided by the sum): realized once, not computed in both
  kernels (MiniLM softmax sum + normalization, 8x32: 104 -> 66 us, 1x128: 215 -> 116 us)."""
  gate = lambda n: n.op not in (Ops.PARAM, Ops.AFTER)  # noqa: E731
  consumers = consumer_map_from_toposort(u for r in roots for u in r.toposort(gate))
  return {e for red in realized if red.op is Ops.REDUCE and (e := red.src[0]).op in GroupOp.ALU
          and len(consumers.get(e, ())) > 1 and _is_expensive(e, realized)}


def _stored_directly(root: UOp) -> UOp | None:
  """The REDUCE a stored value is a view of, when the value's kernel is a scatter itself."""
  u = root
  while u.op in VIEW_OPS: u = u.src[0]
  return u if u.op is Ops.REDUCE and is_scatter(root) else None


# ---- transposing copies for matmuls that would read no operand along an output axis ----

MIN_COPY_REUSE = 32  # a copied operand is read this many times per element, or it is not copied


def _unit_loads(value: UOp, r: UOp) -> int:
  """How many loads of `value` (a probed kernel value) are contiguous along range r."""
  loads = [u for u in value.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM]
  return sum(linear_terms(u.src[1])[0].get(r) == 1 for u in loads if u.src[1].op is not Ops.WHERE)


def _reads_contiguous_output(red: UOp, loaded: list[UOp]) -> tuple[bool, bool] | None:
  """Probe `red` (the nodes in `loaded` read from buffers): whether a load is contiguous along
  an output axis, and whether one is along the innermost reduce axis."""
  probe = _probe(red, loaded)
  if probe is None or probe[0].op is not Ops.REDUCE: return None
  value, loops = probe
  return any(_unit_loads(value, r) for r in loops), _unit_loads(value, value.src[-1]) > 0


def _view_operands(red: UOp) -> list[UOp]:
  """The operands of a multiply-accumulate REDUCE that are views of a buffer under their
  broadcast (a transposed weight): copying one costs one pass over it."""
  if red.arg.op is not Ops.ADD or red.src[0].op is not Ops.MUL: return []
  out = []
  for x in red.src[0].src:
    while x.op in (Ops.EXPAND, Ops.RESHAPE): x = x.src[0]
    chain = x.toposort(lambda n: n.op not in (Ops.PARAM, Ops.AFTER))
    if x.op in VIEW_OPS and all(n.op in VIEW_OPS or n.op in (Ops.PARAM, Ops.AFTER, Ops.VCONST,
                                                                Ops.CONST) for n in chain):
      out.append(x)
  return out


def transposed_operand(red: UOp) -> UOp | None:
  """The operand view of a matmul-like REDUCE to copy contiguously first, when no operand is
  read contiguously along an output axis but both along the reduce axis (`x @ W.T` with W
  stored (out, in)): the copy makes it the contiguous matmul (a @ b.T 1024: 0.68 -> 0.95 of
  a @ b's speed, where the heuristics' tile of partial sums reaches 0.68)."""
  if not all(isinstance(d, int) for d in red.src[0].shape) or _has_closed_form(red): return None
  views = [v for v in _view_operands(red)
           if math.prod(red.src[0].shape) >= MIN_COPY_REUSE * math.prod(v.shape)]
  # what the kernel reads from buffers is probed as loads: the question is how this kernel's own
  # loads walk, and a probe of everything upstream would grow with the model's depth
  nested = _read_from_buffers(red)
  if not views or (now := _reads_contiguous_output(red, nested)) is None or now != (False, True):
    return None
  if is_dot_in_place(red): return None
  for v in views:
    after = _reads_contiguous_output(red, [*nested, v])
    if after is not None and after[0]: return v
  return None


DOT_LANES = 8  # the partial sums of the heuristics' DotPlan (codegen/opt/heuristic.py)


@_per_node
def is_dot_in_place(red: UOp) -> bool:
  """Whether `red` is a matmul-like REDUCE that two loads read in contiguous runs of DOT_LANES
  along its innermost reduce axis, none contiguously along an output axis: `x @ W.T`, also where
  x merges two of its axes into the reduce axis (attention's heads and head size). The
  heuristics' DotPlan runs it in place as fast as the contiguous matmul (a transposing copy of
  W would cost one pass over W per call: 1.5 ms of a MiniLM layer's 11)."""
  if red.op is not Ops.REDUCE or red.arg.op is not Ops.ADD or red.src[0].op is not Ops.MUL:
    return False
  if not all(isinstance(d, int) for d in red.src[0].shape) or _has_closed_form(red): return False
  probe = _probe(red, _read_from_buffers(red))
  if probe is None or probe[0].op is not Ops.REDUCE: return False
  value, loops = probe
  r = value.src[-1]
  n = r.src[0].arg
  if not isinstance(n, int) or n % DOT_LANES or n < 2 * DOT_LANES: return False
  if any(_unit_loads(value, o) for o in loops): return False
  rid = max(u.arg.id for u in value.toposort() if u.op is Ops.RANGE) + 1
  lane = UOp.range(DOT_LANES, rid, AxisType.REDUCE)
  outer = UOp.range(n // DOT_LANES, r.arg.id, AxisType.REDUCE)
  body = value.src[0].substitute({r: outer * DOT_LANES + lane})
  return _unit_loads(graph_rewrite(body, pm_kernel_simplify, name="probe dot"), lane) >= 2


def _dot_epilogues(root: UOp, realized: set[UOp]) -> set[UOp]:
  """The in-place matmuls (is_dot_in_place) in the kernel of stored value `root` when a
  transcendental follows them there: each realized on its own (a GELU after an FFN's up
  projection: 4.4 ms fused with it, 2.9 + 0.6 ms apart)."""
  if not _is_expensive(root, realized): return set()
  return {u for u in _region(root, realized) if u.op is Ops.REDUCE and is_dot_in_place(u)}


def _read_from_buffers(red: UOp) -> list[UOp]:
  """What `red`'s kernel will read from buffers that find_realizes makes: the REDUCEs below its
  body that no other one below it contains, and the elementwise values over a reduction that it
  reads under a broadcast (a LayerNorm's output: its per-row statistics are not loads of the
  matmul, which would count as reads along an output axis)."""
  out, seen, stack = [], set(), [(red.src[0], False)]
  while stack:
    u, expanded = stack.pop()
    if (u, expanded) in seen or u.op in (Ops.PARAM, Ops.AFTER): continue
    seen.add((u, expanded))
    if u is not red.src[0] and (u.op is Ops.REDUCE or (
        expanded and u.op in GroupOp.ALU and _needs_reduction(u))):
      out.append(u)
      continue
    stack.extend((s, expanded or (u.op is Ops.EXPAND and _grows(u))) for s in u.src)
  return list(dict.fromkeys(out))


def find_realizes(body: UOp) -> set[UOp]:
  """Which tensor-graph nodes become their own kernel (see the module docstring)."""
  roots = [s.src[1] for s in body.toposort() if s.op is Ops.STORE]
  realize: set[UOp] = {u for u in _shared_reduces(roots) if not _has_closed_form(u)}
  gate = lambda n: n.op not in (Ops.PARAM, Ops.AFTER)  # noqa: E731
  realize |= {v for r in roots for u in r.toposort(gate) if u.op is Ops.REDUCE
              and (v := transposed_operand(u)) is not None}
  # a scatter read inside another kernel would run its one-hot loop there: it gets a kernel of
  # its own, of direct stores (a root that is a view of one is that kernel already)
  direct = {_stored_directly(r) for r in roots}
  realize |= {u for r in roots for u in r.toposort(lambda n: n.op not in (Ops.PARAM, Ops.AFTER))
              if u.op is Ops.REDUCE and u not in direct and is_scatter(u)}
  seen: set[tuple[UOp, bool, bool]] = set()
  stack = [(r, False, False) for r in roots]  # (node, under a broadcasting EXPAND, inside a REDUCE)
  while stack:
    u, expanded, reduced = stack.pop()
    if (u, expanded, reduced) in seen: continue
    seen.add((u, expanded, reduced))
    if u.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.COLLECTIVE): realize.add(u)
    if u not in realize and (
        ((expanded or reduced) and u.op is Ops.REDUCE and not _has_closed_form(u))
        or (expanded and u.op in GroupOp.ALU and _is_expensive(u, realize))
        or (expanded and reduced and u.op in GroupOp.ALU and _recomputes_reduction(u, realize))
        or (expanded and reduced and u.op in GroupOp.ALU and _reads_many(u, realize))):
      realize.add(u)
    if u in realize: expanded, reduced = False, False
    if u.op in (Ops.PARAM, Ops.AFTER): continue
    exp_child = expanded or (u.op is Ops.EXPAND and _grows(u))
    stack.extend((s, exp_child, reduced or u.op is Ops.REDUCE) for s in u.src)
  realize |= _summed_and_read(roots, realize)
  return realize | {u for v in (*roots, *realize) for u in _dot_epilogues(v, realize)}


SPLIT_REDUCE_RATIO = 32768  # a reduce that shrinks its input this much is split in two kernels


def split_reduce(red: UOp) -> UOp | None:
  """REDUCE over a long axis -> partial reduces over (s, n/s), then a reduce over s: the first
  kernel has s outputs to spread across cores."""
  in_shape, out_shape = red.src[0].shape, red.shape
  if red.tag == "split" or not all(isinstance(d, int) for d in (*in_shape, *out_shape)): return None
  if math.prod(in_shape) < SPLIT_REDUCE_RATIO * max(1, math.prod(out_shape)): return None
  if _collapses(red): return None  # a gather or arange: no loop left to split
  if is_scatter(red): return None  # direct stores: no loop over the outputs to split
  for a in red.arg.axes:
    n = in_shape[a]
    s = next((s for s in (256, 128, 64, 32, 16, 8) if n % s == 0 and n // s >= 8), None)
    if s is None: continue
    split = (*in_shape[:a], s, n // s, *in_shape[a + 1:])
    x = UOp(Ops.RESHAPE, red.dtype, (red.src[0], shape_uop(split)))
    inner = tuple(ax if ax < a else ax + 1 for ax in red.arg.axes if ax != a) + (a + 1,)
    part = UOp(Ops.REDUCE, red.dtype, (x,), ReduceArg(red.arg.op, inner), tag="split")
    total = UOp(Ops.REDUCE, red.dtype, (part,), ReduceArg(red.arg.op, (a,)), tag="split")
    return UOp(Ops.RESHAPE, red.dtype, (total, shape_uop(out_shape)))
  return None


pm_split_reduce = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), split_reduce),  # long reductions -> two kernels
])


def fix_store_hazards(body: UOp) -> UOp:
  """A STORE whose value reads its own target at other positions first copies the value."""
  def fix(st: UOp) -> UOp:
    target, value = st.src[0], st.src[1]
    base = target.src[0] if target.op is Ops.RESHAPE else target
    reads = [u for u in value.toposort()
             if u.op in VIEW_OPS and (base in u.src or target in u.src) and u is not target]
    if not reads: return st
    return st.replace(src=(target, UOp(Ops.CONTIGUOUS, value.dtype, (value,)), *st.src[2:]))
  return body.substitute({s: fix(s) for s in body.toposort() if s.op is Ops.STORE})


# ---- index pushing (the rangeify rules) ----

def _strides(shape: tuple[int, ...]) -> list[int]:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= s
  return out[::-1]


def _flat(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  out: UOp = UOp.const(dtypes.index, 0)
  for i, st in zip(idx, _strides(shape)): out = out + i * st
  return out


def index_reshape(r: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Flatten the output index row-major, then peel the source dims off with // and %."""
  src_shape = tuple(r.src[0].shape)
  flat = _flat(idx, tuple(r.shape))
  out: list[UOp] = []
  for k, (st, s) in enumerate(zip(_strides(src_shape), src_shape)):
    if s == 1:
      out.append(UOp.const(dtypes.index, 0))
      continue
    v = flat // st if st != 1 else flat
    out.append(v % s if k > 0 else v)
  return tuple(out)


def index_movement(x: UOp, idx: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], UOp | None]:
  """The source index for output index `idx` of movement op `x`, and a validity (for PAD)."""
  src_shape = x.src[0].shape
  if x.op is Ops.RESHAPE: return index_reshape(x, idx), None
  if x.op is Ops.PERMUTE:
    out: list[UOp] = [idx[0]] * len(idx)
    for k, p in enumerate(x.arg): out[p] = idx[k]
    return tuple(out), None
  if x.op is Ops.EXPAND:
    zero = UOp.const(dtypes.index, 0)
    return tuple(zero if a == 1 and b != 1 else i for i, a, b in zip(idx, src_shape, x.shape)), None
  if x.op is Ops.FLIP:
    return tuple((s - 1 - i) if f else i for i, s, f in zip(idx, src_shape, x.arg)), None
  offs = as_shape(x.src[1])
  if x.op is Ops.SHRINK: return tuple(i + o if o else i for i, o in zip(idx, offs)), None
  assert x.op is Ops.PAD
  valid: UOp | None = None
  new: list[UOp] = []
  for i, o, s, n in zip(idx, offs, src_shape, x.shape):
    if o == 0 and s == n:
      new.append(i)
      continue
    gate, raw = _ungate(i)
    v = (raw < o).logical_not() & (raw < o + s)
    if gate is not None: v = gate & v  # an index already padded outside stays invalid
    valid = v if valid is None else valid & v
    new.append(v.where(raw - o, UOp.const(dtypes.index, Invalid)))
  return tuple(new), valid


def _ungate(i: UOp) -> tuple[UOp | None, UOp]:
  """(gate, raw index) of an index that may be WHERE(gate, raw, Invalid) after simplification."""
  i = graph_rewrite(i, pm_invalid, name="ungate")
  if i.op is Ops.WHERE and i.src[2].op is Ops.CONST and isinstance(i.src[2].arg, type(Invalid)):
    return i.src[0], i.src[1]
  return None, i


def _index(x: UOp, idx: tuple[UOp, ...]) -> UOp:
  return UOp(Ops.INDEX, x.dtype, (x, *idx))


def _broadcast_idx(src: UOp, out_shape: tuple, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Index into a source that broadcasts implicitly (fewer or size-1 axes)."""
  ss = tuple(src.shape)
  tail = idx[len(idx) - len(ss):] if ss else ()
  zero = UOp.const(dtypes.index, 0)
  out_tail = out_shape[len(out_shape) - len(ss):]
  return tuple(zero if s == 1 and o != 1 else i for i, s, o in zip(tail, ss, out_tail))


def push_index(ctx: RangeifyCtx, ix: UOp) -> UOp | None:
  """INDEX(x, *idx) -> x's value at idx, one step closer to buffers and constants."""
  x, idx = ix.src[0], ix.src[1:]
  if x.op is Ops.PARAM and x.arg.name is not None: return x  # a variable: a value, not memory
  if x.op in (Ops.PARAM, Ops.BUFFER) or len(idx) != len(x.shape): return None
  if x in ctx.realize and (ctx.current is None or x is not ctx.current.key):
    return _read_realized(ctx, x, idx)
  if x.op is Ops.CONST: return x
  if x.op is Ops.AFTER: return _read_after(ctx, x, idx)
  if x.op in VIEW_OPS:
    new_idx, valid = index_movement(x, idx)
    inner = _index(x.src[0], new_idx)
    return inner if valid is None else valid.where(inner, UOp.const(x.dtype, 0))
  if x.op in GroupOp.Elementwise:
    shape = tuple(x.shape)
    return x.replace(src=tuple(_index(s, _broadcast_idx(s, shape, idx)) for s in x.src))
  if x.op is Ops.REDUCE: return _index_reduce(ctx, x, idx)
  if x.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUSBACKWARD): return _index(x.src[0], idx)
  raise NotImplementedError(f"rangeify: no rule to index a {x.op.name} node")


def _index_reduce(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  src_shape = x.src[0].shape
  if any(src_shape[a] == 0 for a in x.arg.axes):  # an empty reduction is its identity
    return UOp.const(x.dtype, identity_element(x.arg.op, x.dtype))
  rngs = {a: ctx.new_range(src_shape[a], AxisType.REDUCE) for a in x.arg.axes}
  new_idx = tuple(rngs.get(a, i) for a, i in enumerate(idx))
  return UOp(Ops.REDUCE, x.dtype, (_index(x.src[0], new_idx), *rngs.values()), ReduceArg(x.arg.op))


def _read_after(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  for dep in x.src[1:]:
    if dep in ctx.producer and ctx.current is not None: ctx.current.deps.add(ctx.producer[dep])
  return _index(x.src[0], idx)


def _read_realized(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  buf = ctx.buffers.get(x)
  if buf is None:
    buf = _intermediate(ctx, x)
    _build_kernel(ctx, UOp(Ops.STORE, dtypes.void, (_view(buf, x.shape), x)), x)
  if ctx.current is not None: ctx.current.deps.add(ctx.producer[x])
  return _index(_view(buf, x.shape), idx)


def _view(buf: UOp, shape: tuple) -> UOp:
  return buffer_view(buf, shape)  # a symbolic shape: the buffer's prefix


def _intermediate(ctx: RangeifyCtx, x: UOp) -> UOp:
  slot = ctx.nargs + len(ctx.buffers)
  numel = max_numel(x.shape)  # symbolic: sized for the variables' largest values
  dev = x.device or ctx.device
  buf = UOp(Ops.PARAM, x.dtype, (shape_uop((numel,)),), ParamArg(slot, x.dtype, dev))
  ctx.buffers[x] = buf
  return buf


pm_rangeify = PatternMatcher([
  (UPat(Ops.INDEX, name="ix"), push_index),  # x[idx] -> value of x at idx
])


def _source_buffer(ctx: RangeifyCtx, x: UOp) -> tuple[UOp, int | None]:
  """A PARAM holding x contiguously (x itself, or x realized by its own kernel)."""
  if x.op is Ops.PARAM: return x, None
  if x.op is Ops.RESHAPE and x.src[0].op is Ops.PARAM: return x.src[0], None
  if x.op is Ops.AFTER:
    base, dep = _source_buffer(ctx, x.src[0])
    return base, next((ctx.producer[d] for d in x.src[1:] if d in ctx.producer), dep)
  if x not in ctx.buffers:
    ctx.realize.add(x)
    _build_kernel(ctx, UOp(Ops.STORE, dtypes.void, (_view(_intermediate(ctx, x), x.shape), x)), x)
  return ctx.buffers[x], ctx.producer[x]


def _build_copy(ctx: RangeifyCtx, target: UOp, copy: UOp, key: UOp) -> None:
  """A COPY to another device (or a COLLECTIVE between processes) is a call of its own in the
  command buffer, not a kernel."""
  src, dep = _source_buffer(ctx, copy.src[0])
  dst = _base_param(target)
  ast = UOp(copy.op, copy.dtype, (dst, src), copy.arg)
  kernel = Kernel(ast=ast, key=key, writes=dst, reads={src})
  if dep is not None: kernel.deps.add(dep)
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(kernel)


def _is_whole_buffer(target: UOp) -> bool:
  """Whether a store target is all of its buffer (a copy call writes a buffer from its start)."""
  while target.op is Ops.RESHAPE: target = target.src[0]
  return target.op is Ops.PARAM


def _build_kernel(ctx: RangeifyCtx, store: UOp, key: UOp) -> None:
  """Make the kernel computing `store` (a STORE into a buffer view) and register it."""
  target, value = store.src[0], store.src[1]
  if value.op in (Ops.COPY, Ops.COLLECTIVE):
    if _is_whole_buffer(target): return _build_copy(ctx, target, value, key)
    _source_buffer(ctx, value)  # copied whole into an intermediate, stored into the view below
  kernel = Kernel(ast=value, key=key, writes=_base_param(target))
  saved = ctx.current
  ctx.current = kernel
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(kernel)
  rngs = tuple(ctx.new_range(s, AxisType.LOOP) for s in target.shape)
  st = UOp(Ops.STORE, dtypes.void, (_index(target, rngs), _index(value, rngs)))
  for r in reversed(rngs): st = UOp(Ops.END, dtypes.void, (st, r))
  sink = UOp(Ops.SINK, dtypes.void, (st,))
  ast = graph_rewrite(sink, pm_rangeify, ctx=ctx, bottom_up=True, name="rangeify")
  kernel.ast, kernel.reads = ast, _reads(ast)
  ctx.current = saved
  split = scatter_kernels(ast)
  if split is not None: _split_scatter(ctx, key, kernel, *split)


def _reads(ast: UOp) -> set[UOp]:
  """The PARAMs a kernel reads (an address it stores to is no read)."""
  topo = ast.toposort()
  addrs = {u.src[0] for u in topo if u.op is Ops.STORE}
  return {u.src[0] for u in topo
          if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and u not in addrs}


def _split_scatter(ctx: RangeifyCtx, key: UOp, kernel: Kernel, fill: UOp, scatter: UOp) -> None:
  """`kernel` becomes the fill; the scatter kernel runs after it, reads what `kernel` read, and is
  the one later readers of `key` wait for."""
  after = Kernel(ast=scatter, key=key, writes=kernel.writes, reads=_reads(scatter),
                 deps=kernel.deps | {ctx.producer[key]})
  kernel.ast, kernel.reads, kernel.deps = fill, set(), set()
  ctx.producer[key] = len(ctx.kernels)
  ctx.kernels.append(after)


def _base_param(u: UOp) -> UOp:
  while u.op is not Ops.PARAM: u = u.src[0]
  return u


def rangeify(body: UOp, nargs: int, device: str) -> RangeifyCtx:
  """All kernels of the function `body` (a SINK of STOREs over PARAM slots 0..nargs-1)."""
  body = fix_store_hazards(graph_rewrite(body, pm_split_reduce, name="split reduce"))
  ctx = RangeifyCtx(nargs, device, realize=find_realizes(body))
  for st in body.src: _build_store(ctx, st)
  return ctx


def _build_store(ctx: RangeifyCtx, st: UOp) -> None:
  if st in ctx.producer: return
  for u in st.src[1].toposort():
    if u.op is Ops.AFTER:
      for dep in u.src[1:]:
        if dep.op is Ops.STORE: _build_store(ctx, dep)
  _build_realized_below(ctx, st.src[1])
  _build_kernel(ctx, st, st)


def _build_realized_below(ctx: RangeifyCtx, root: UOp) -> None:
  """The kernels of the realized nodes below `root`, sources first: building a kernel then finds
  every realized input built and never recurses into another (in a deep graph, one nested
  build per kernel boundary went past Python's recursion limit: a 30-layer model in one
  realize)."""
  for u in root.toposort(lambda n: n.op not in (Ops.PARAM, Ops.AFTER)):
    if u is root or u not in ctx.realize or u in ctx.buffers: continue
    buf = _intermediate(ctx, u)
    _build_kernel(ctx, UOp(Ops.STORE, dtypes.void, (_view(buf, u.shape), u)), u)
