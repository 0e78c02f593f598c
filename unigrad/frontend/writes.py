"""In-place writes and the lazy values they must not change: PyTorch's rule for a lazy library.

The rule (README, "Lazy values and in-place writes"):
- a value computed from tensors (any op that is not a view) is what its inputs held when it was
  created: an `assign` made later (an optimizer step, a slice write) does not change it, whether
  it was realized before the write or is realized after it;
- a view of a realized buffer (reshape, permute, slice, expand...) shares the buffer's memory, like
  a PyTorch view: reading it shows every write to the buffer, pending ones included;
- every pending write is seen by every later read: any realize, and any read of values (`numpy`,
  `tolist`, `item`, DLPack), first runs every write still pending.

How: `Tensor.assign` records its write here (`pending`: the buffer and the AFTER node that writes
it). The realize that runs the pending writes also computes, in the same command buffer (the
scheduler orders reads of a buffer before writes to it), every live lazy value that reads a
written buffer's old contents (`stale_readers`), so those values keep their inputs' old values.
A write runs at once when another live tensor views the same buffer (`views`: a value computed
from that view after the assign must see the write), or when it writes through a view that is
not the whole buffer (a slice): the tensors holding the buffer do not hold the pending write.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

from unigrad.dtype import dtypes
from unigrad.schedule.callify import buffer_base
from unigrad.uop import NodeMap, Ops, UOp


class PendingWrites:
  """The writes made by `assign` that no realize has run yet: buffer node -> the AFTER node that
  writes it (a later write of the same buffer reads the earlier one's result, so the last one
  stands for both), with its device."""

  def __init__(self) -> None:
    self._writes: dict[UOp, tuple[UOp, str]] = {}

  def __bool__(self) -> bool: return bool(self._writes)

  def add(self, base: UOp, after: UOp, device: str) -> None: self._writes[base] = (after, device)

  def take(self, held: dict[UOp, None]) -> tuple[dict[UOp, None], list[UOp], list[str]]:
    """(written buffers, AFTER nodes, their devices) of the writes that a tensor still holds
    (in `held`), all forgotten here: the caller runs them."""
    writes, self._writes = self._writes, {}
    kept = {b: w for b, w in writes.items() if w[0] in held}
    return dict.fromkeys(kept), [a for a, _ in kept.values()], [d for _, d in kept.values()]


pending = PendingWrites()


class TracedWrites:
  """The writes made while `@function` traces its body (frontend/function.py): an `assign` to a
  tensor from outside the function does not run; the tensor takes the new value lazily (so the
  rest of the body reads it) and the write is recorded, to become an extra result of the
  FUNCTION that each call assigns (BatchNorm's running statistics). A tensor made inside the
  function takes the value, since nothing outside holds it."""

  def __init__(self, outside: dict[int, tuple[Any, UOp]]) -> None:
    self.outside = outside  # id -> (tensor, UOp) of every tensor alive when the trace began
    self.written: dict[int, tuple[Any, UOp]] = {}  # id -> (tensor, its UOp before the trace)

  def record(self, t: Any, value: UOp) -> None:
    entry = self.outside.get(id(t))
    if entry is not None and entry[0] is t and id(t) not in self.written:
      self.written[id(t)] = (t, t.uop)
    t.uop = value


class _Tracing(threading.local):
  def __init__(self) -> None: self.stack: list[TracedWrites] = []  # innermost last


tracing = _Tracing()  # the @function traces running on this thread


class ViewRefs:
  """The tensors viewing one buffer, held weakly; the dead ones are dropped once the list has
  grown to twice what was alive at the last pruning."""

  def __init__(self) -> None:
    self.refs: list[weakref.ref] = []
    self.limit = 8

  def add(self, t: Any) -> None:
    self.refs.append(weakref.ref(t))
    if len(self.refs) > self.limit:
      self.refs = [r for r in self.refs if r() is not None]
      self.limit = 2 * len(self.refs) + 8


class Views:
  """Per buffer, the tensors made as views of it: the tensors an assign to the buffer must
  reach (kept on the BUFFER node, as long as it lives)."""

  def __init__(self) -> None: self._of: NodeMap[ViewRefs] = NodeMap("views")

  def note(self, t: Any) -> None:
    """Remember `t` if its value is a view of a buffer."""
    if (base := buffer_base(t.uop)) is None: return
    if (refs := self._of.get(base)) is None: refs = self._of[base] = ViewRefs()
    refs.add(t)

  def others(self, base: UOp, t: Any) -> bool:
    """Whether a live tensor other than `t` views `base` now."""
    if (refs := self._of.get(base)) is None: return False
    for r in refs.refs:
      if (v := r()) is not None and v is not t and buffer_base(v.uop) is base: return True
    return False


views = Views()
_LEAVES, _PARAM, _FUNCTION = (Ops.BUFFER, Ops.CONST), Ops.PARAM, Ops.FUNCTION
_RESHAPE, _BUFFER = Ops.RESHAPE, Ops.BUFFER


def is_value(u: UOp) -> bool:
  """A node that is no buffer and no view of one (a realized tensor is one of those: a model's
  hundreds of weights, asked on every TinyJit replay, are mostly a RESHAPE of their BUFFER)."""
  op = u.op
  if op in _LEAVES or (op is _RESHAPE and u.src[0].op is _BUFFER): return False
  return buffer_base(u) is None


def stale_readers(candidates: Iterable[UOp], written: dict[UOp, None],
                  afters: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp]]:
  """(stale, snapshots).
  - `stale`: the nodes of `candidates` that read a buffer of `written` as it is before the
    writes (not through one of the writes' AFTER nodes) and are values, not views of the buffer
    (a view shows the write).
  - `snapshots`: where a candidate, or the value a write stores, reads both old contents (of a
    buffer other than the one it writes) and a write's result (a value made before an optimizer
    step, added to the weights after it), the largest values inside it that read only old
    contents, each with that candidate or write's AFTER. No one kernel can read a buffer both
    before and after its write: those are computed before the writes, the rest after.
  The graphs are walked once together: a training step's gradients share one."""
  roots = [u for u in dict.fromkeys(candidates) if is_value(u)]
  stores = {a.src[1].src[1]: a for a in afters if len(a.src) > 1 and a.src[1].op is Ops.STORE}
  if not roots and not stores: return [], {}
  stop = set(afters)
  sink = UOp(Ops.SINK, dtypes.void, (*roots, *stores))
  # per node, bits: 1 reads an old buffer, 2 reads a free PARAM (a function's placeholder while
  # it is traced: such a value cannot be realized on its own, it stays lazy), 4 reads a write's
  # result (its AFTER). A FUNCTION's body is its own world (its PARAMs are its arguments).
  state: dict[UOp, int] = {}
  mixed = False
  for u in sink.toposort(bodies=False):
    if u in stop:
      state[u] = 4
      continue
    st = 1 if u in written else 2 if u.op is _PARAM else 0
    for s in (u.src[1:] if u.op is _FUNCTION else u.src): st |= state[s]
    state[u] = st
    if (st & 5) == 5 and u is not sink: mixed = True
  stale = [u for u in roots if state[u] == 1]
  if not mixed: return stale, {}
  snapshots: dict[UOp, UOp] = {}
  for r in roots: _snapshots(r, r, None, state, written, snapshots)
  for value, a in stores.items():  # a write reads its own buffer's old contents in its kernel
    _snapshots(value, a, buffer_base(a.src[0]), state, written, snapshots)
  return stale, snapshots


def _snapshots(root: UOp, owner: UOp, own: UOp | None, state: dict[UOp, int],
               written: dict[UOp, None], out: dict[UOp, UOp]) -> None:
  """Into `out` (node -> `owner`), the largest values under `root` that read old contents only
  (of a buffer other than `own`), found by descending through the nodes that read both old
  contents and a write's result."""
  seen: set[UOp] = set()
  todo = [root]
  while todo:
    u = todo.pop()
    if u in seen or (state[u] & 5) != 5: continue
    seen.add(u)
    for s in (u.src[1:] if u.op is _FUNCTION else u.src):
      if state[s] != 1: todo.append(s)
      elif is_value(s) and (own is None or any(b in written and b is not own
                                                for b in s.toposort(bodies=False))):
        out.setdefault(s, owner)
