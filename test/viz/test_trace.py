"""Rewrite traces for the viewer: steps per graph_rewrite call and codegen stage, the VIZ knob,
and the pages built from them (node tables, rule locations, replay, paging)."""
import pytest

from unigrad import Tensor
from unigrad.knobs import Context
from unigrad.uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite, track_rewrites
from unigrad.uop import upat as upat_module
from unigrad.uop.upat import traced_call, traces
from unigrad.viz import data
from unigrad.viz.data import build_index, build_page, op_group

idx = dtypes.index
x = UOp.variable("x", 0, 10)
y = UOp.variable("y", 0, 10)
pm_fold = PatternMatcher([
  (UPat(Ops.MUL, src=[UPat.var("a"), UPat.const(idx, 1)]), lambda a: a),  # FOLD-MUL
  (UPat(Ops.ADD, src=[UPat.var("a"), UPat.const(idx, 0)]), lambda a: a),  # FOLD-ADD
])


def _line_of(fragment: str) -> int:
  with open(__file__) as f:
    return next(i for i, line in enumerate(f, 1) if fragment in line and "_line_of" not in line)


def _run(name: str, sink: UOp, pm: PatternMatcher = pm_fold) -> upat_module.RewriteTrace:
  @track_rewrites(name)
  def run() -> UOp:
    return graph_rewrite(graph_rewrite(sink, pm, name="fold"), pm, name="again")
  run()
  return traces[-1]


def test_graph_rewrite_in_a_tracked_function_records_a_step_per_call() -> None:
  e = UOp.sink((x * 1 + 0) * (y + 0))
  t = _run("steps", e)
  assert [s.name for s in t.steps] == ["fold", "again"]
  fold = t.steps[0]
  assert fold.before is e and fold.after is UOp.sink(x * y) and fold.depth == 0
  assert {r.before: r.after for r in fold.records} == {x * 1: x, x + 0: x, y + 0: y}
  assert t.steps[1].records == [] and t.steps[1].before is t.steps[1].after
  assert t.records == fold.records  # the flat list keeps every record


def test_nested_steps_and_unnamed_rewrites_take_their_parents_name() -> None:
  @track_rewrites("nested")
  def run() -> UOp:
    upat_module.begin_step("stage", x)
    out = graph_rewrite(x * 1, pm_fold)
    graph_rewrite(y + 1, pm_fold, name="no-op")
    upat_module.end_step(out)
    return out
  run()
  steps = traces[-1].steps
  assert [(s.name, s.depth) for s in steps] == [("stage", 0), ("stage", 1), ("no-op", 1)]
  assert steps[0].records == [] and len(steps[1].records) == 1
  # a nested rewrite that fired nothing and changed nothing is not shown
  assert [s.name for s in data.step_list(traces[-1])] == ["stage", "stage"]


def test_untracked_graph_rewrite_records_no_step() -> None:
  before = len(traces)
  graph_rewrite(x * 1, pm_fold, name="untracked")
  assert len(traces) == before and upat_module.active_traces == []


def test_a_raising_step_is_kept_without_an_output() -> None:
  def boom(a: UOp) -> UOp: raise ValueError("rule failed")
  pm = PatternMatcher([(UPat(Ops.MUL, name="a"), boom)])
  with pytest.raises(ValueError): _run("raises", x * 2, pm)
  t = traces[-1]
  assert t.name == "raises" and t.steps[0].after is None and t.open == []
  assert build_index([t], "ValueError", "t", False)["traces"][0]["steps"][0]["failed"]


def test_traced_call_records_only_with_viz() -> None:
  before = len(traces)
  assert traced_call("kernel", graph_rewrite, x * 1, pm_fold) == (x, None)
  assert len(traces) == before
  with Context(VIZ=1): out, trace = traced_call("kernel", graph_rewrite, x * 1, pm_fold)
  assert out is x and trace is traces[-1] and len(traces) == before + 1
  assert trace.kind == "kernel" and len(trace.steps) == 1


def test_viz_traces_schedules_and_kernels_with_codegen_stages_and_source() -> None:
  before = len(traces)
  with Context(VIZ=1, CACHELEVEL=0, DEV="CPU"):
    (Tensor.ones(7, 5).contiguous() * 0.318309 + 0.271828).realize()
  new = traces[before:]
  kinds = [t.kind for t in new]
  assert "schedule" in kinds and "kernel" in kinds
  sched = next(t for t in new if t.kind == "schedule")
  assert sched.name.startswith("schedule ") and sched.info["graph"].op is Ops.LINEAR
  kern = next(t for t in new if t.kind == "kernel" and "0.318309" in t.info["src"])
  top = [s.name for s in kern.steps if s.depth == 0]
  assert top[:2] == ["simplify", "optimize"] and top[-2:] == ["linearize", "render"]
  assert any(s.depth == 1 and s.records for s in kern.steps)  # graph_rewrite calls in stages
  assert kern.info["graph"].op is Ops.LINEAR and isinstance(kern.info["opts"], list)


def test_page_replay_of_all_rewrites_gives_the_step_output() -> None:
  e = UOp.sink((x * 1 + 0) * (y + 0), (x + 0) * 1)
  t = _run("replay", e)
  step = t.steps[0]
  done = {r.before: r.after for r in step.records}
  assert data._replay(step.before, done) is step.after
  page = build_page(t, 0, 0)
  assert page["start"] == page["before"] and page["prior"] == []
  nodes = page["nodes"]
  assert nodes[page["after"]][0] == "SINK" and len(page["records"]) == len(step.records)
  assert all(src < i for i, row in enumerate(nodes) for src in row[4])  # sources first
  recs = page["records"]
  assert all(r["file"].endswith("test/viz/test_trace.py") for r in recs)
  assert {r["line"] for r in recs} == {_line_of("FOLD-MUL"), _line_of("FOLD-ADD")}
  assert all(("FOLD-MUL" if r["line"] == _line_of("FOLD-MUL") else "FOLD-ADD") in r["code"]
             for r in recs)


def test_shared_nodes_are_in_a_page_once() -> None:
  shared = x * 3
  root = UOp.sink(shared + shared * 1, shared * 2)
  table = data.NodeTable()
  assert table.add(root) == len(root.toposort()) - 1  # every node once, the root last
  sid = table.ids[shared]
  assert sum(sid in row[4] for row in table.rows) == 3  # its three consumers point at one row
  assert table.add(shared) == sid and len(table.rows) == len(root.toposort())
  t = _run("shared", root)
  rows = build_page(t, 0, 0)["nodes"]
  keys = [(r[5], tuple(r[4])) for r in rows]
  assert len(keys) == len(set(keys))  # no node twice across the page's graphs


def test_long_steps_are_paged_and_later_pages_start_from_the_replayed_graph(monkeypatch) -> None:
  monkeypatch.setattr(data, "PAGE_RECORDS", 2)
  e = UOp.sink(x * 1 + 0, y * 1 + 0, (x + y) * 1)
  t = _run("paged", e)
  step = t.steps[0]
  assert len(step.records) == 5
  index = build_index([t], None, "paged", False)
  assert index["traces"][0]["steps"][0]["pages"] == 3
  pages = [build_page(t, 0, p) for p in range(3)]
  assert [len(p["records"]) for p in pages] == [2, 2, 1]
  assert [p["first"] for p in pages] == [0, 2, 4]
  assert len(pages[2]["prior"]) == 4
  done = {r.before: r.after for r in step.records[:4]}
  start = data._replay(step.before, done)
  nodes = pages[2]["nodes"]
  got = nodes[pages[2]["start"]]
  assert got[0] == "SINK" and len(got[4]) == len(start.src)


def test_op_groups_colour_every_op() -> None:
  assert op_group(Ops.ADD) == "alu" and op_group(Ops.RESHAPE) == "movement"
  assert op_group(Ops.CONST) == "source" and op_group(Ops.RANGE) == "control"
  assert op_group(Ops.LOAD) == "memory" and op_group(Ops.SINK) == "call"
  assert all(isinstance(op_group(op), str) for op in Ops)
