"""What the viewer shows, as JSON-ready pages built from the recorded rewrite traces.

The viewer loads an index first (every schedule and kernel, its steps, the script's error if it
raised) and then one page at a time: a step's graphs and `PAGE_RECORDS` of its rewrites. A page
holds a node table (each node once, however many graphs of the page share it: `[op, group,
dtype, arg, [source ids], kind, tag]`, see `NodeTable.kind`) and graphs as root ids, so a graph
is the nodes reachable from its root. The graph after each single rewrite is rebuilt in the
browser by replaying the rewrites so far over the step's input graph, the way graph_rewrite
applied them (`_replay`); a later page also lists the earlier pages' rewrites (as node pairs)
and its start graph.
"""
from __future__ import annotations

import functools
import linecache
import pathlib
from dataclasses import dataclass, field
from typing import Any

from unigrad.uop import GroupOp, Ops, PatternMatcher, RewriteError, UOp, UPat, graph_rewrite
from unigrad.uop.upat import RewriteTrace, TraceStep

__all__ = ["PAGE_RECORDS", "NodeTable", "op_group", "build_index", "build_page",
           "build_trace_info", "page_count", "step_list", "is_shown"]

PAGE_RECORDS = 100  # rewrites per page
ARG_CHARS = 160  # an arg's repr is cut to this length
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]

_GROUPS: tuple[tuple[str, frozenset[Ops]], ...] = (
  ("source", GroupOp.Source),
  ("movement", GroupOp.Movement),
  ("reduce", frozenset({Ops.REDUCE, Ops.WMMA})),
  ("memory", frozenset({Ops.LOAD, Ops.STORE, Ops.INDEX, Ops.COPY, Ops.COLLECTIVE, Ops.ATOMICADD,
                        Ops.GETADDR})),
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
  kinds: dict[Any, int] = field(default_factory=dict)

  def kind(self, u: UOp) -> int:
    """A number for the node's op, dtype, arg and tag: two nodes with the same kind and the same
    sources are one node (the viewer's replay builds nodes and finds them by this)."""
    try: key: Any = (u.op, u.dtype, u.arg, u.tag)
    except TypeError: key = (u.op, u.dtype, repr(u.arg), repr(u.tag))
    try: return self.kinds.setdefault(key, len(self.kinds))
    except TypeError: return self.kinds.setdefault(repr(key), len(self.kinds))

  def add(self, root: UOp | None) -> int | None:
    """The id of `root`, adding it and every node below it not yet in the table."""
    if root is None: return None
    if (i := self.ids.get(root)) is not None: return i
    for u in root.toposort(gate=lambda n: n not in self.ids):
      if u in self.ids: continue
      self.ids[u] = len(self.rows)
      self.rows.append([u.op.name, op_group(u.op), str(u.dtype), _arg_text(u),
                        [self.ids[s] for s in u.src], self.kind(u),
                        "" if u.tag is None else repr(u.tag)])
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


def is_shown(step: TraceStep) -> bool:
  """Stages, and nested rewrites that changed something or raised (a nested graph_rewrite that
  neither fired a rule nor changed the graph, say a `simplify()` on an index, is left out)."""
  return step.depth == 0 or bool(step.records) or step.after is not step.before


def step_list(trace: RewriteTrace) -> list[TraceStep]:
  """The trace's shown steps, and its result (the schedule or the kernel's program) last."""
  steps = [s for s in trace.steps if is_shown(s)]
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
              "failed": s.after is None} for s in step_list(t)]
    out.append({"id": i, "name": t.name, "kind": t.kind or "trace", "steps": steps,
                "device": t.info.get("device", ""), "records": len(t.records),
                "has_source": "src" in t.info})
  return {"title": title, "error": error, "traces": out, "profile": has_profile,
          "page_records": PAGE_RECORDS}


# the recorded rewrites as a rule table: a node that a rule rewrote becomes what the rule gave
_pm_replay = PatternMatcher([(UPat(name="x"), lambda ctx, x: ctx.get(x))])


def _replay(before: UOp, done: dict[UOp, UOp]) -> UOp | None:
  """`before` with the rewrites in `done` (node -> replacement) applied again by graph_rewrite,
  as they were first applied: to a node when it is reached (pre-order rewrites) and to it
  rebuilt over its rewritten sources (post-order ones); replacements are rewritten in turn.
  With every rewrite of a step, this gives the step's output. None if the rewrites loop."""
  try: return graph_rewrite(before, _pm_replay, ctx=done, bpm=_pm_replay, name="replay")
  except RewriteError: return None


def build_page(trace: RewriteTrace, step_index: int, page: int) -> dict[str, Any]:
  """Step `step_index` of `trace`: its graphs before and after, the earlier pages' rewrites
  (`prior`, node pairs), the graph this page starts from (`start`: the input with those
  replayed; None if they do not replay) and the page's rewrites (rule, source line, node before
  and after). The viewer replays the rewrites up to each one over the input to draw it."""
  step = step_list(trace)[step_index]
  table = NodeTable()
  first = page * PAGE_RECORDS
  done = {r.before: r.after for r in step.records[:first]}
  start = _replay(step.before, done) if done else step.before
  before, after = table.add(step.before), table.add(step.after)
  prior = [[table.add(r.before), table.add(r.after)] for r in step.records[:first]]
  records = [{**rule_location(r.location), "before": table.add(r.before),
              "after": table.add(r.after)} for r in step.records[first:first + PAGE_RECORDS]]
  return {"name": step.name, "before": before, "after": after, "start": table.add(start),
          "prior": prior, "first": first, "total": len(step.records), "records": records,
          "nodes": table.rows}


def build_trace_info(trace: RewriteTrace) -> dict[str, Any]:
  """A trace's kernel source and opts (kernels), the error of a step that raised."""
  opts = [repr(o) for o in trace.info.get("opts", ())]
  failed = [s.name for s in trace.steps if s.after is None]
  return {"name": trace.name, "kind": trace.kind, "src": trace.info.get("src"), "opts": opts,
          "device": trace.info.get("device", ""), "failed_steps": failed}
