"""Autograd history of realized values, and the write epochs that make a history stale.

A realized buffer view remembers the graph that computed it, so autograd can differentiate
through a tensor realized before `backward()` (`with_history` puts the graphs back). An in-place
write to a buffer makes every history that reads it describe values the buffer no longer holds:
each write starts a new epoch (`mark_written`), and a history older than a write to a buffer it
reads is not used (that value is a constant from then on).
One `History` per process (`history`); its entries live as long as their nodes (NodeMaps).
"""
from __future__ import annotations

from unigrad.schedule.callify import buffer_base
from unigrad.uop import NodeMap, Ops, UOp

__all__ = ["History", "history"]


class History:
  """view -> (graph that computed it, epoch it was computed in); BUFFER -> epoch of its last
  write; the current epoch (see the module docstring)."""

  def __init__(self) -> None:
    self.graphs: NodeMap[tuple[UOp, int]] = NodeMap("history")
    self.written_at: NodeMap[int] = NodeMap("written_at")
    self.epoch = 0

  def __contains__(self, u: UOp) -> bool: return u in self.graphs
  def __getitem__(self, u: UOp) -> tuple[UOp, int]: return self.graphs[u]

  def record(self, view: UOp, graph: UOp) -> None:
    """`view` holds the value `graph` computes, as of now."""
    self.graphs[view] = (graph, self.epoch)

  def forget(self, view: UOp) -> None:
    """`view` keeps no history (the graph, and the buffers it reads, may go)."""
    self.graphs.pop(view)

  def mark_written(self, bases: dict[UOp, None] | list[UOp]) -> None:
    """The buffers `bases` were just overwritten: histories computed before now are stale."""
    self.epoch += 1
    for b in bases: self.written_at[b] = self.epoch

  def current(self, entry: tuple[UOp, int]) -> UOp | None:
    """A history's graph, or None when a buffer it reads was written after it was computed."""
    graph, epoch = entry
    for u in graph.toposort():
      if u.op is Ops.BUFFER and self.written_at.get(u, 0) > epoch: return None
    return graph

  def with_history(self, root: UOp, leaves: dict[UOp, None] | None = None) -> UOp:
    """`root` with each realized buffer it reads replaced by the graph that computed it, through
    any number of realizations (histories are older than what they explain: no cycles). A stale
    history is not used: that value is a constant. Neither is the history of a view whose own
    buffer was overwritten since (or is written in `root`, a pending assign): it holds other
    values now. The graphs of `leaves` (autograd's targets, which may be pending writes) are
    kept as they are."""
    keep = leaves or {}
    while True:
      nodes = root.toposort(gate=lambda n: n not in keep)
      written = {buffer_base(u.src[0]) for u in nodes if u.op is Ops.AFTER}
      sub = {u: g for u in nodes if (h := self.graphs.get(u)) is not None
             and not self.overwritten(u, h[1], written) and (g := self.current(h)) is not None}
      if not sub: return root
      root = root.substitute({**sub, **{k: k for k in keep}})

  def overwritten(self, view: UOp, epoch: int, written: set[UOp | None]) -> bool:
    """Whether the buffer under `view` was written after `epoch`, or is in `written`."""
    base = buffer_base(view)
    return base is not None and (base in written or self.written_at.get(base, 0) > epoch)


history = History()
