"""What the viewer shows, as JSON-ready pages built from the recorded rewrite traces.

The viewer loads an index first (every schedule and kernel, its steps, the script's error if it
raised) and then one page at a time: a step's graphs and `PAGE_RECORDS` of its rewrites. A page
holds a node table (each node once, however many graphs of the page share it: `[op, group,
dtype, arg, [source ids]]`) and graphs as root ids, so a graph is the nodes reachable from its
root. The graph after each single rewrite is rebuilt in the browser by replaying the page's
rewrites in order from the page's start graph; the start graph of a later page is the step's
input with the rewrites of the pages before replayed here (a node that a rule rewrote, as it was
or rebuilt over rewritten sources, is replaced by the rule's result).
"""
from __future__ import annotations

import functools
import linecache
import pathlib
from dataclasses import dataclass, field
from typing import Any

from unigrad.uop import GroupOp, Ops, RewriteError, UOp
from unigrad.uop.upat import RewriteTrace, TraceStep

__all__ = ["PAGE_RECORDS", "NodeTable", "op_group", "build_index", "build_page",
           "build_trace_info", "page_count"]

PAGE_RECORDS = 100  # rewrites per page
REPLAY_CHAIN = 1000  # a rewrite of a rewrite of ... longer than this is a loop
ARG_CHARS = 160  # an arg's repr is cut to this length
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]

_GROUPS: tuple[tuple[str, frozenset[Ops]], ...] = (
  ("source", GroupOp.Source),
  ("movement", GroupOp.Movement),
  ("reduce", frozenset({Ops.REDUCE, Ops.WMMA})),
  ("memory", frozenset({Ops.LOAD, Ops.STORE, Ops.INDEX, Ops.COPY, Ops.ATOMICADD, Ops.GETADDR})),
  ("control", frozenset({Ops.RANGE, Ops.END, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.SPECIAL,
                         Ops.AFTER, Ops.GROUP})),
  ("call", frozenset({Ops.SINK, Ops.LINEAR, Ops.CALL, Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE,
                      Ops.PROGRAM, Ops.SOURCE})),
  ("alu", GroupOp.Elementwise),
  ("vector", frozenset({Ops.STACK, Ops.GEP, Ops.VCONST})),
)


def op_group(op: Ops) -> str:
  """The colour group of an op in the drawn graph."""
  return _OP_GROUP[op]


_OP_GROUP = {op: next((name for name, ops in _GROUPS if op in ops), "other") for op in Ops}


def _arg_text(u: UOp) -> str:
  if u.arg is None: return ""
  text = repr(u.arg)
  return text if len(text) <= ARG_CHARS else text[:ARG_CHARS - 3] + "..."


@dataclass
class NodeTable:
  """Nodes numbered in the order they are first added (sources before their consumers)."""
  ids: dict[UOp, int] = field(default_factory=dict)
  rows: list[list[Any]] = field(default_factory=list)

  def add(self, root: UOp | None) -> int | None:
    """The id of `root`, adding it and every node below it not yet in the table."""
    if root is None: return None
    if (i := self.ids.get(root)) is not None: return i
    for u in root.toposort(gate=lambda n: n not in self.ids):
      if u in self.ids: continue
      self.ids[u] = len(self.rows)
      self.rows.append([u.op.name, op_group(u.op), str(u.dtype), _arg_text(u),
                        [self.ids[s] for s in u.src]])
    return self.ids[root]


@functools.lru_cache(maxsize=4096)
def rule_location(location: str) -> dict[str, Any]:
  """A rule's `file:line` made relative to the package, with the text of that line."""
  path, _, line = location.rpartition(":")
  if not line.isdigit(): return {"file": location, "line": 0, "code": ""}
  code = linecache.getline(path, int(line)).strip()
  try: rel = str(pathlib.Path(path).resolve().relative_to(PACKAGE_ROOT.parent))
  except ValueError: rel = path
  return {"file": rel, "line": int(line), "code": code}


def _step_graphs(trace: RewriteTrace) -> list[TraceStep]:
  """The trace's steps, and its result (the schedule or the kernel's final program) last."""
  steps = list(trace.steps)
  graph = trace.info.get("graph")
  if graph is not None: steps.append(TraceStep("result", 0, graph, graph))
  return steps


def page_count(step: TraceStep) -> int:
  return max(1, -(-len(step.records) // PAGE_RECORDS))


def build_index(trace_list: list[RewriteTrace], error: str | None, title: str,
                has_profile: bool) -> dict[str, Any]:
  """The first thing the viewer loads: every trace and its steps (no graphs)."""
  out = []
  for i, t in enumerate(trace_list):
    steps = [{"name": s.name, "depth": s.depth, "records": len(s.records), "pages": page_count(s),
              "failed": s.after is None} for s in _step_graphs(t)]
    out.append({"id": i, "name": t.name, "kind": t.kind or "trace", "steps": steps,
                "device": t.info.get("device", ""), "records": len(t.records),
                "has_source": "src" in t.info})
  return {"title": title, "error": error, "traces": out, "profile": has_profile}


def _resolve(u: UOp, done: dict[UOp, UOp]) -> UOp:
  for _ in range(REPLAY_CHAIN):
    if (nxt := done.get(u)) is None: return u
    u = nxt
  raise RewriteError("the recorded rewrites loop")


def _replay(before: UOp, done: dict[UOp, UOp]) -> UOp | None:
  """`before` with the rewrites in `done` (before -> after) applied again, sources first: a node
  that a rule rewrote, as it was or rebuilt over rewritten sources, is replaced by the rule's
  result. None if the rewrites loop."""
  memo: dict[UOp, UOp] = {}
  try:
    for u in before.toposort():
      if u in done:
        memo[u] = _resolve(u, done)
        continue
      src = tuple([memo[s] for s in u.src])
      x = u if src == u.src else u.replace(src=src)
      memo[u] = _resolve(x, done)
  except RewriteError: return None
  return memo[before]


def build_page(trace: RewriteTrace, step_index: int, page: int) -> dict[str, Any]:
  """Step `step_index` of `trace`: its graphs before and after, the graph this page of rewrites
  starts from (`start`: the step's input with the earlier pages' rewrites replayed; None if they
  do not replay) and the page's rewrites (rule, source line, node before and after). The viewer
  replays the page's rewrites one by one from `start` to draw the graph around each."""
  step = _step_graphs(trace)[step_index]
  table = NodeTable()
  first = page * PAGE_RECORDS
  done = {r.before: r.after for r in step.records[:first]}
  start = _replay(step.before, done) if done else step.before
  before, after = table.add(step.before), table.add(step.after)
  records = [{**rule_location(r.location), "before": table.add(r.before),
              "after": table.add(r.after)} for r in step.records[first:first + PAGE_RECORDS]]
  return {"name": step.name, "before": before, "after": after, "start": table.add(start),
          "first": first, "total": len(step.records), "records": records, "nodes": table.rows}


def build_trace_info(trace: RewriteTrace) -> dict[str, Any]:
  """A trace's kernel source and opts (kernels), the error of a step that raised."""
  opts = [repr(o) for o in trace.info.get("opts", ())]
  failed = [s.name for s in trace.steps if s.after is None]
  return {"name": trace.name, "kind": trace.kind, "src": trace.info.get("src"), "opts": opts,
          "device": trace.info.get("device", ""), "failed_steps": failed}
