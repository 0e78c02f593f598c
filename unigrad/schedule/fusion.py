"""Fusion: which tensor-graph values get a kernel and a buffer of their own (the fusion policy).

Consumes: the function body made by callify, `SINK(STORE(buf, value)...)`.
Produces: `find_realizes(body)`, the set of nodes that rangeify builds a kernel for; every other
node is recomputed inline where it is read. Also the three rewrites of the body before that
choice: long reductions split into two kernels (`pm_split_reduce`), a reduction that one store
writes whole and other stores read read from that store's target (`read_stored_values`: a
gradient and the update reading it), and a store whose value reads its own target at other
positions copied first (`fix_store_hazards`).
The policy is data:
- REALIZED_OPS: nodes that always get a kernel (CONTIGUOUS, COPY, COLLECTIVE), and
  every STORE is a kernel;
- WHOLE_GRAPH_BEFORE_READS, WHOLE_GRAPH_AFTER_READS: nodes chosen by looking at the whole body:
  a REDUCE that several kernels would compute, a transposing copy for a matmul that would read
  no operand contiguously, a scatter read inside another kernel, a reduction of data (or an
  expensive value over a realized one) under a PAD, which a concatenation would compute under
  its region guards; then an expensive value that a
  realized REDUCE sums and another kernel reads too, an in-place matmul followed by a
  transcendental;
- READ_RULES: a node read in a given place (under a broadcasting EXPAND, inside another REDUCE,
  or both) is realized when its test holds: a REDUCE without a closed form, an expensive value
  (a transcendental), a value that would recompute a reduction of data, a value of more than
  MAX_RECOMPUTED_LOADS loads. They keep a kernel's inputs from growing with model depth: a
  LayerNorm's output or a matmul plus bias is never recomputed in another kernel's reduction
  loop. A gather that reads a scatter (the position map of an overwrite) still collapses to a
  direct load; a reduction with a closed form (arange, cumsum windows) is recomputed inline.
The predicates live where their subject does: regions (schedule/regions.py), probes of one
reduction (schedule/probe.py), matmul operands (schedule/matmul.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from unigrad.schedule.indexing import VIEW_OPS
from unigrad.schedule.matmul import dot_epilogues, transposed_operand
from unigrad.schedule.probe import collapses, has_closed_form, is_scatter
from unigrad.schedule.regions import (grows, is_expensive, needs_reduction, reads_many,
                                      recomputes_reduction)
from unigrad.uop import GroupOp, Ops, PatternMatcher, ReduceArg, UOp, UPat
from unigrad.uop import consumer_map_from_toposort, shape_uop

REALIZED_OPS = frozenset({Ops.CONTIGUOUS, Ops.COPY, Ops.COLLECTIVE})  # always a kernel of their own
_LEAVES = (Ops.PARAM, Ops.AFTER)


def _walk(n: UOp) -> bool: return n.op not in _LEAVES


# ---- rules over the whole body: roots (the stored values) -> nodes to realize ----

def shared_reduces(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """REDUCEs that more than one kernel would compute (and that have no closed form): realized
  once instead."""
  seen_by: dict[UOp, int] = {}
  for i, root in enumerate(roots):
    for u in root.toposort(_walk):
      if u.op is Ops.REDUCE: seen_by[u] = -1 if seen_by.get(u, i) != i else i
  return {u for u, owner in seen_by.items() if owner == -1 and not has_closed_form(u)}


def transposed_operands(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """The operand views copied contiguously before a matmul (see schedule/matmul.py)."""
  return {v for r in roots for u in r.toposort(_walk) if u.op is Ops.REDUCE
          and (v := transposed_operand(u)) is not None}


def _stored_directly(root: UOp) -> UOp | None:
  """The REDUCE a stored value is a view of, when the value's kernel is a scatter itself."""
  u = root
  while u.op in VIEW_OPS: u = u.src[0]
  return u if u.op is Ops.REDUCE and is_scatter(root) else None


def scatters(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """A scatter read inside another kernel would run its one-hot loop there: it gets a kernel of
  its own, of direct stores (a root that is a view of one is that kernel already)."""
  direct = {_stored_directly(r) for r in roots}
  return {u for r in roots for u in r.toposort(_walk)
          if u.op is Ops.REDUCE and u not in direct and is_scatter(u)}


def padded_reductions(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """The value under a PAD (through movement ops) whose kernel would compute a reduction of
  data: a concatenation's part or a convolution's padded input. Left inline, the reader's kernel
  computed the reduction under the pad's guard, as scalar loops instead of its register tile
  (nudenet's C2f concatenations, a 3x3 convolution in a 384x10x10 kernel at 3 GFLOPS: the whole
  model 115 -> 45 ms). Realized, the reduction's kernel computes the activation after it in its
  epilogue; where the reduction is realized already (another kernel reads it too), an expensive
  activation over it is realized on its own all the same: each padding copy of it (a
  convolution's padded input, a concatenation, both) recomputed it, two lanes wide."""
  out = set()
  for r in roots:
    for u in r.toposort(_walk):
      if u.op is not Ops.PAD: continue
      v = u.src[0]
      while v.op in VIEW_OPS: v = v.src[0]
      if v in realized or v.op in _LEAVES: continue
      if (not has_closed_form(v)) if v.op is Ops.REDUCE else v.op in GroupOp.ALU and (
          recomputes_reduction(v, realized) or needs_reduction(v) and is_expensive(v, realized)):
        out.add(v)
  return out


def summed_and_read(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """Expensive elementwise values that a realized REDUCE sums and something else reads too
  (softmax's exp(x - max): summed, then divided by the sum): realized once, not computed in both
  kernels (MiniLM softmax sum + normalization, 8x32: 104 -> 66 us, 1x128: 215 -> 116 us)."""
  consumers = consumer_map_from_toposort(u for r in roots for u in r.toposort(_walk))
  return {e for red in realized if red.op is Ops.REDUCE and (e := red.src[0]).op in GroupOp.ALU
          and len(consumers.get(e, ())) > 1 and is_expensive(e, realized)}


def in_place_matmuls(roots: list[UOp], realized: set[UOp]) -> set[UOp]:
  """In-place matmuls followed by a transcendental in their kernel (see schedule/matmul.py)."""
  return {u for v in (*roots, *realized) for u in dot_epilogues(v, realized)}


RootsRule = Callable[[list[UOp], set[UOp]], set[UOp]]
# (name, rule): run on the roots before the walk of READ_RULES (their nodes start the walk's
# realized set), and after it (they read what the walk realized)
WHOLE_GRAPH_BEFORE_READS: tuple[tuple[str, RootsRule], ...] = (
  ("shared reduce", shared_reduces),
  ("transposed operand", transposed_operands),
  ("scatter", scatters),
  ("padded reduction", padded_reductions),
)
WHOLE_GRAPH_AFTER_READS: tuple[tuple[str, RootsRule], ...] = (
  ("summed and read", summed_and_read),
  ("in-place matmul before a transcendental", in_place_matmuls),
)


# ---- rules per read: where a node is read -> whether it is realized ----

class ReadAt(Enum):
  """Where a node is read: under a broadcasting EXPAND, inside another REDUCE, or both."""
  BROADCAST = "under a broadcast"
  BROADCAST_OR_REDUCTION = "under a broadcast or inside a reduction"
  BROADCAST_IN_REDUCTION = "under a broadcast inside a reduction"

  def holds(self, expanded: bool, reduced: bool) -> bool:
    if self is ReadAt.BROADCAST: return expanded
    if self is ReadAt.BROADCAST_OR_REDUCTION: return expanded or reduced
    return expanded and reduced


@dataclass(frozen=True)
class ReadRule:
  """Realize a node of `ops` read where `at` says when `test(node, realized so far)` holds."""
  name: str
  ops: frozenset[Ops]
  at: ReadAt
  test: Callable[[UOp, set[UOp]], bool]

  def applies(self, u: UOp, expanded: bool, reduced: bool, realized: set[UOp]) -> bool:
    if u.op not in self.ops or not self.at.holds(expanded, reduced): return False
    return self.test(u, realized)


_REDUCE, _ALU = frozenset({Ops.REDUCE}), frozenset(GroupOp.ALU)

READ_RULES: tuple[ReadRule, ...] = (
  ReadRule("reduction read again", _REDUCE, ReadAt.BROADCAST_OR_REDUCTION,
           lambda u, realized: not has_closed_form(u)),
  ReadRule("transcendental broadcast", _ALU, ReadAt.BROADCAST, is_expensive),
  ReadRule("reduction recomputed in a reduction", _ALU, ReadAt.BROADCAST_IN_REDUCTION,
           recomputes_reduction),
  ReadRule("many loads recomputed in a reduction", _ALU, ReadAt.BROADCAST_IN_REDUCTION,
           reads_many),
)


def _realized_by_reads(roots: list[UOp], realize: set[UOp]) -> set[UOp]:
  """Walk down from the roots, tracking whether a node is read under a broadcasting EXPAND and
  inside a REDUCE (a realized node starts both afresh), realizing by REALIZED_OPS and
  READ_RULES."""
  seen: set[tuple[UOp, bool, bool]] = set()
  stack = [(r, False, False) for r in roots]  # (node, under a broadcasting EXPAND, inside a REDUCE)
  while stack:
    u, expanded, reduced = stack.pop()
    if (u, expanded, reduced) in seen: continue
    seen.add((u, expanded, reduced))
    if u.op in REALIZED_OPS: realize.add(u)
    if u not in realize and any(r.applies(u, expanded, reduced, realize) for r in READ_RULES):
      realize.add(u)
    if u in realize: expanded, reduced = False, False
    if u.op in _LEAVES: continue
    exp_child = expanded or (u.op is Ops.EXPAND and grows(u))
    stack.extend((s, exp_child, reduced or u.op is Ops.REDUCE) for s in u.src)
  return realize


def find_realizes(body: UOp) -> set[UOp]:
  """Which tensor-graph nodes become their own kernel (see the module docstring)."""
  roots = [s.src[1] for s in body.toposort() if s.op is Ops.STORE]
  realize: set[UOp] = set()
  for _, rule in WHOLE_GRAPH_BEFORE_READS: realize |= rule(roots, realize)
  realize = _realized_by_reads(roots, realize)
  for _, rule in WHOLE_GRAPH_AFTER_READS: realize |= rule(roots, realize)
  return realize


# ---- rewrites of the body before the choice ----

SPLIT_REDUCE_RATIO = 32768  # a reduce that shrinks its input this much is split in two kernels


def split_reduce(red: UOp) -> UOp | None:
  """REDUCE over a long axis -> partial reduces over (s, n/s), then a reduce over s: the first
  kernel has s outputs to spread across cores."""
  in_shape, out_shape = red.src[0].shape, red.shape
  if red.tag == "split" or not all(isinstance(d, int) for d in (*in_shape, *out_shape)): return None
  if math.prod(in_shape) < SPLIT_REDUCE_RATIO * max(1, math.prod(out_shape)): return None
  if collapses(red): return None  # a gather or arange: no loop left to split
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


def read_stored_values(body: UOp) -> UOp:
  """A value that one STORE writes whole into its target and that other STOREs' values read
  too: those read the target once it is written (its AFTER), when the value holds a reduction
  of data. A training step stores each weight's gradient (a `.grad` target, transposed from
  the matmul that sums it) and reads it again in the weight's update: the shared reduction got
  a buffer of its own and each store a copy of it, where now the gradient's store computes it
  in the gradient's layout and the update reads the gradient (the MLP step's 784x256 weight:
  a transposing copy less)."""
  stores = [st for st in body.src if st.op is Ops.STORE]
  if len(stores) < 2: return body
  # each value stored by exactly one STORE, whole (one stored on several devices' buffers is
  # one node: it is read where it is)
  stored: dict[UOp, list[UOp]] = {}
  for st in stores: stored.setdefault(st.src[1], []).append(st)
  first = {v: sts[0] for v, sts in stored.items() if len(sts) == 1 and v.op not in _LEAVES
           and _whole_view(sts[0].src[0]) and v.shape == sts[0].src[0].shape}
  if not first: return body
  # read by another store: consumed by a node other than its writer (one walk of the body)
  consumers = consumer_map_from_toposort(body.toposort(_walk))
  shared = [v for v, st in first.items()
            if any(c is not st for c in consumers.get(v, ())) and _holds_reduction(v)]
  if not shared: return body
  # one substitution of the whole body, so that an AFTER naming a rewritten STORE names the
  # new one; a writer of a shared value keeps it (maps to itself)
  sub = {first[v]: first[v] for v in shared}
  sub.update({v: UOp(Ops.AFTER, v.dtype, (first[v].src[0], first[v])) for v in shared})
  out = body.substitute(sub)
  # a STORE left in its old form beside its new one would write its target twice
  if _count_stores(out) != _count_stores(body): return body
  return out


def _count_stores(body: UOp) -> int: return sum(u.op is Ops.STORE for u in body.toposort())


def base_param(u: UOp) -> UOp:
  """The PARAM under a body node's views (and AFTERs): the buffer it reads or writes."""
  while u.op is not Ops.PARAM and u.src: u = u.src[0]
  return u


def _whole_view(target: UOp) -> bool:
  """A STORE target that is its buffer, whole (a PARAM, or a reshape of one)."""
  return target.op is Ops.PARAM or target.op is Ops.RESHAPE and target.src[0].op is Ops.PARAM


def _holds_reduction(v: UOp) -> bool:
  return any(u.op is Ops.REDUCE and not has_closed_form(u) for u in v.toposort(_walk))


def fix_store_hazards(body: UOp) -> UOp:
  """A STORE whose value reads its own target at other positions first copies the value."""
  def fix(st: UOp) -> UOp:
    target, value = st.src[0], st.src[1]
    base = target.src[0] if target.op is Ops.RESHAPE else target
    # what an AFTER of another buffer reads, its STORE's kernel read before this one runs
    def inside(u: UOp) -> bool: return u.op is not Ops.AFTER or base_param(u.src[0]) is base
    reads = [u for u in value.toposort(inside)
             if u.op in VIEW_OPS and (base in u.src or target in u.src) and u is not target]
    if not reads: return st
    return st.replace(src=(target, UOp(Ops.CONTIGUOUS, value.dtype, (value,)), *st.src[2:]))
  return body.substitute({s: fix(s) for s in body.toposort() if s.op is Ops.STORE})
