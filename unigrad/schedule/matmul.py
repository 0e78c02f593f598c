"""Matmul operands: which matmul-like reductions get a transposing copy of an operand, and which
run in place.

A matmul that reads both operands in contiguous runs along its reduce axis (`x @ W.T`, W stored
(out, in), as PyTorch's Linear stores it) runs in place: the scheduler asks codegen
(`runs_in_place`, codegen/opt/heuristic.py) whether its heuristics tile it so (vector partial
sums, transposed at the end by codegen/transpose_sums.py). A matmul that would read no operand
contiguously along an output axis nor run in place gets a transposing copy of its buffer-view
operand first (`transposed_operand`), when the copy is read MIN_COPY_REUSE+ times per element.
When a transcendental follows an in-place matmul in its kernel (a GELU), the matmul is realized
on its own (`dot_epilogues`), so that the epilogue runs as an elementwise kernel of many
independent chains, not once per small tile.
"""
from __future__ import annotations

import math

from unigrad.codegen.opt.heuristic import runs_in_place
from unigrad.schedule.indexing import VIEW_OPS
from unigrad.schedule.probe import has_closed_form, per_node, probe, reads_contiguous_output
from unigrad.schedule.regions import grows, is_expensive, needs_reduction, region
from unigrad.shape import view_chain
from unigrad.uop import GroupOp, Ops, UOp

MIN_COPY_REUSE = 32  # a copied operand is read this many times per element, or it is not copied


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
  if not all(isinstance(d, int) for d in red.src[0].shape) or has_closed_form(red): return None
  views = [v for v in _view_operands(red)
           if math.prod(red.src[0].shape) >= MIN_COPY_REUSE * math.prod(v.shape)]
  # what the kernel reads from buffers is probed as loads: the question is how this kernel's own
  # loads walk, and a probe of everything upstream would grow with the model's depth
  nested = read_from_buffers(red)
  if not views or reads_output_in_place(red): return None
  if (now := reads_contiguous_output(red, nested)) is None or now != (False, True): return None
  if is_dot_in_place(red): return None
  for v in views:
    after = reads_contiguous_output(red, [*nested, v])
    if after is not None and after[0]: return v
  return None


def reads_output_in_place(red: UOp) -> bool:
  """The probe's first answer, read off the view chains without a probe where it can be: an
  operand of the REDUCE's multiply that is one unmasked view of a buffer with stride 1 along an
  output axis (a convolution's weight stored (cin, *k, cout)) is read contiguously there. The
  probe rangeifies and simplifies the whole reduction (a convolution's window view: 10-20 ms;
  nudenet's cold first call probed each of its 64 convolutions several times)."""
  outs = [i for i in range(len(red.src[0].shape)) if i not in red.arg.axes]
  for x in red.src[0].src:
    base, tracker = view_chain(x)
    if base.op not in (Ops.PARAM, Ops.AFTER, Ops.BUFFER) or len(tracker.views) != 1: continue
    v = tracker.views[0]
    if v.mask is None and any(v.strides[i] == 1 and v.shape[i] != 1 for i in outs): return True
  return False


@per_node
def is_dot_in_place(red: UOp) -> bool:
  """Whether `red` is a matmul-like REDUCE that codegen's heuristics run in place (their
  DotPlan: `x @ W.T`, also where x merges two of its axes into the reduce axis, attention's
  heads and head size) as fast as the contiguous matmul (a transposing copy of W would cost one
  pass over W per call: 1.5 ms of a MiniLM layer's 11). The probe is the kernel's value, what it
  reads from other kernels' buffers loaded; codegen answers."""
  if red.op is not Ops.REDUCE or red.arg.op is not Ops.ADD or red.src[0].op is not Ops.MUL:
    return False
  if not all(isinstance(d, int) for d in red.src[0].shape) or has_closed_form(red): return False
  found = probe(red, read_from_buffers(red))
  return found is not None and found[0].op is Ops.REDUCE and runs_in_place(found[0])


def dot_epilogues(root: UOp, realized: set[UOp]) -> set[UOp]:
  """The in-place matmuls (is_dot_in_place) in the kernel of stored value `root` when a
  transcendental follows them there: each realized on its own (a GELU after an FFN's up
  projection: 4.4 ms fused with it, 2.9 + 0.6 ms apart)."""
  if not is_expensive(root, realized): return set()
  return {u for u in region(root, realized) if u.op is Ops.REDUCE and is_dot_in_place(u)}


def read_from_buffers(red: UOp) -> list[UOp]:
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
        expanded and u.op in GroupOp.ALU and needs_reduction(u))):
      out.append(u)
      continue
    stack.extend((s, expanded or (u.op is Ops.EXPAND and grows(u))) for s in u.src)
  return list(dict.fromkeys(out))
