"""rewrite.py: graph_rewrite (modes, fixed point, loops, deep graphs), substitute and tracking."""
import os

import pytest

from unigrad.knobs import Context
from unigrad.uop import (CallInfo, Ops, PatternMatcher, RewriteError, TrackedPatternMatcher, UOp,
                         UPat, dtypes, graph_rewrite, match_stats, track_rewrites, traces)
from unigrad.uop import upat as upat_module
from unigrad.uop.rewrite import BPM_LOOP_LIMIT, rebuild, substitute_each

idx = dtypes.index
a, b, z = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10), UOp.variable("z", 0, 10)


times_one = UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(idx, 1)))


def c(v: int) -> UOp: return UOp.const(idx, v)


def recorder(seen: list, op: Ops = Ops.ADD) -> PatternMatcher:
  """A table that never rewrites and records the nodes of `op` it is asked about."""
  return PatternMatcher([(UPat(op, name="x"), lambda x: seen.append(x))])


# ---- default mode: sources first, rewrite to a fixed point ----

def test_leaves_first_order() -> None:
  seen: list = []
  inner = a + b
  graph_rewrite((inner + 1) + inner, recorder(seen))
  assert seen == [inner, inner + 1, (inner + 1) + inner]  # each node once, sources first


def test_a_rewritten_node_is_processed_again() -> None:
  # x*2 -> x+x, then x+x (a new node) -> the sink of x: two rules fire in sequence
  pm = PatternMatcher([
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(idx, 2))), lambda x: x + x),  # x*2 -> x+x
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: UOp.sink(x)),  # x+x -> sink(x)
  ])
  assert graph_rewrite(a * 2, pm) is UOp.sink(a)
  assert graph_rewrite(UOp.sink(a * 2, b * 3), pm) is UOp.sink(UOp.sink(a), b * 3)


def test_rewrites_in_sources_rebuild_the_consumers() -> None:
  pm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda p: b if p is a else None)])  # a -> b
  assert graph_rewrite((a + 1) * (a + 2), pm) is (b + 1) * (b + 2)
  assert graph_rewrite((z + 1) * 3, pm) is (z + 1) * 3  # nothing to do: the same object


def test_fixed_point_through_a_chain_of_rewrites() -> None:
  # x+1 -> x while the constant is positive: a+5 reaches a in steps of one rewrite each
  def dec(x: UOp, k: UOp) -> UOp | None: return x + (k.arg - 1) if k.arg > 1 else x
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), dec)])
  assert graph_rewrite(UOp(Ops.ADD, idx, (a, c(5))), pm) is a
  assert graph_rewrite(a * 3, pm) is a * 3


def test_ctx_is_passed_to_callbacks() -> None:
  pm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda ctx, p: ctx.get(p))])
  assert graph_rewrite(a + b, pm, ctx={a: z}) is z + b
  assert graph_rewrite(a + b, pm, ctx={}) is a + b


def test_name_is_accepted_and_pm_may_be_none() -> None:
  assert graph_rewrite(a + b, None, name="nothing") is a + b


# ---- bottom_up=True: pre-order, a pre-pass to a fixed point ----

def test_bottom_up_visits_the_root_first() -> None:
  seen: list = []
  graph_rewrite((a + b) + 1, recorder(seen), bottom_up=True)
  assert seen == [(a + b) + 1, a + b]


def test_bottom_up_rewrites_before_looking_at_sources() -> None:
  # (x+y) -> sink(x, y) seen from the root: the inner ADD is reached only as a source of the sink
  add = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y")))
  pm = PatternMatcher([(add, lambda x, y: UOp.sink(x, y))])
  assert graph_rewrite((a + b) + 1, pm, bottom_up=True) is UOp.sink(UOp.sink(a, b), c(1))


def test_bottom_up_repeats_on_a_node_until_it_settles() -> None:
  def dec(x: UOp, k: UOp) -> UOp | None: return x + (k.arg - 1) if k.arg > 1 else x
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), dec)])
  assert graph_rewrite(UOp(Ops.ADD, idx, (a, c(4))) * 2, pm, bottom_up=True) is a * 2


def test_bottom_up_does_not_look_inside_a_replacement_of_itself() -> None:
  # a -> a+1 in pre-order: the new node's source a is in progress, so it is left alone
  pm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda p: p + 1 if p is a else None)])
  assert graph_rewrite(a * 2, pm, bottom_up=True) is (a + 1) * 2


# ---- bpm: a pre-order pass, then pm after the sources ----

def test_bpm_then_pm() -> None:
  order: list = []
  bpm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: order.append(("bpm", x)))])
  pm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: order.append(("pm", x)))])
  graph_rewrite((a * 2) * 3, pm, bpm=bpm)
  assert order == [("bpm", (a * 2) * 3), ("bpm", a * 2), ("pm", a * 2), ("pm", (a * 2) * 3)]


def test_bpm_and_pm_both_rewrite() -> None:
  bpm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda p: b if p is a else None)])  # a -> b
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: x * 2)])  # x+x
  assert graph_rewrite(a + b, pm, bpm=bpm) is b * 2
  assert graph_rewrite(a + z, pm, bpm=bpm) is b + z


# ---- enter_calls ----

def _call(body: UOp, *args: UOp) -> UOp:
  return UOp(Ops.CALL, dtypes.void, (body, *args), CallInfo("f"))


def test_enter_calls_false_leaves_function_bodies_alone() -> None:
  pm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda p: z if p is a else None)])  # a -> z
  call = _call(UOp.sink(a + 1), a)
  assert graph_rewrite(call, pm, enter_calls=False) is _call(UOp.sink(a + 1), z)
  assert graph_rewrite(call, pm) is _call(UOp.sink(z + 1), z)
  fn = UOp(Ops.FUNCTION, dtypes.void, (UOp.sink(a), a), CallInfo("g"))
  assert graph_rewrite(fn, pm, enter_calls=False).src == (UOp.sink(a), z)


# ---- rule loops are errors, not hangs ----

def test_a_growing_rule_loop_raises() -> None:
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x + 1)])  # x -> x+1 forever
  with Context(REWRITE_STACK_LIMIT=5000), pytest.raises(RewriteError, match="loop"):
    graph_rewrite(a + b, pm, name="grow")


def test_a_two_cycle_raises() -> None:
  # x+y <-> y+x: the rewrite comes back to a node whose rewrite is in progress
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: y + x)])
  with pytest.raises(RewriteError, match="loop"): graph_rewrite(a + b, pm)


def test_a_pre_order_loop_raises() -> None:
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x + 1)])
  with pytest.raises(RewriteError, match=f"{BPM_LOOP_LIMIT} steps"):
    graph_rewrite(a + b, pm, bottom_up=True)


def test_a_rule_returning_a_non_uop_raises() -> None:
  pm = PatternMatcher([(UPat(Ops.ADD), lambda: 3)])
  with pytest.raises(RewriteError, match="int, not a UOp"): graph_rewrite(a + b, pm)
  with pytest.raises(RewriteError, match="int, not a UOp"): graph_rewrite(a + b, pm, bottom_up=True)


# ---- deep graphs ----

DEPTH = 100_000


@pytest.fixture(scope="module")
def chain() -> UOp:
  """(((a*2+0)*2+1)*2+2)...: DEPTH ALU nodes deep."""
  x = a
  for i in range(DEPTH // 2): x = x * 2 + i
  return x


def _leaf(u: UOp) -> UOp:
  while u.op is not Ops.PARAM: u = u.src[0]
  return u


def test_deep_chains_without_recursion_errors(chain: UOp) -> None:
  swap = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda p: z if p is a else None)])
  out = graph_rewrite(chain, swap)
  assert out is not chain and _leaf(out) is z and out.src[1] is chain.src[1]
  assert graph_rewrite(chain, swap, bottom_up=True) is out
  assert chain.substitute({a: z}) is out
  never = PatternMatcher([(UPat(Ops.SINK), lambda: None)])
  assert graph_rewrite(chain, never) is chain


def test_deep_chain_where_every_other_node_rewrites() -> None:
  x = a
  for i in range(DEPTH // 2): x = (x + i) * 1
  pm = PatternMatcher([(times_one, lambda x: x)])  # x*1
  out = graph_rewrite(x, pm)
  assert out.op is Ops.ADD and out.src[1] is c(DEPTH // 2 - 1) and out.src[0].op is Ops.ADD
  assert not out.op_in_backward_slice_with_self(Ops.MUL) and _leaf(out) is a


# ---- substitute ----

def test_substitute() -> None:
  e = (a + b) * a
  assert e.substitute({a: z}) is (z + b) * z
  assert e.substitute({a + b: z}) is z * a
  assert e.substitute({}) is e
  assert e.substitute({a: a + 1}) is ((a + 1) + b) * (a + 1)  # values are not looked into
  assert e.substitute({a: b, b: a}) is (b + a) * b  # simultaneous


def test_substitute_with_extra_pm() -> None:
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: x * 2)])
  assert (a + b).substitute({b: a}, extra_pm=pm) is a * 2
  assert (a + b).substitute({b: z}, extra_pm=pm) is a + z


def test_rebuild_keeps_the_node_when_its_sources_are_its_own() -> None:
  e = (a + b).replace(tag="t")
  assert rebuild(e, (a, b)) is e
  assert rebuild(e, (a, z)) is (a + z).replace(tag="t")  # op, dtype, arg and tag kept
  assert rebuild(e, tuple([a, b])) is e  # equal sources, another tuple


def test_substitute_each_is_substitute_for_each_value() -> None:
  shared = (a * 4 + b) // 2
  roots = [shared * shared + a, (shared + z).maximum(a), b + z, a, UOp.sink(shared, b + 1)]
  values = [c(0), c(3), z + 1, b]
  for root in roots:
    assert substitute_each(root, a, values) == [root.substitute({a: v}) for v in values]
  assert substitute_each(b + z, a, values) == [b + z] * 4  # no node depends on the key


# ---- tracking ----

def _line_of(fragment: str) -> str:
  path = os.path.abspath(__file__)
  for i, line in enumerate(open(path).read().splitlines(), 1):
    if fragment in line and "_line_of" not in line: return f"{path}:{i}"
  raise AssertionError(fragment)


def test_tracked_pattern_matcher_records_rule_location_before_and_after() -> None:
  pm = TrackedPatternMatcher([
    (times_one, lambda x: x),  # TRACK-MUL
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(idx, 0))), lambda x: x),  # TRACK-ADD
  ])

  @track_rewrites("unit")
  def run(u: UOp) -> UOp: return graph_rewrite(u, pm)
  e = UOp(Ops.ADD, idx, (a * 1, c(0)))
  assert run(e) is a
  trace = traces[-1]
  assert trace.name == "unit"
  assert [(r.location, r.before, r.after) for r in trace.records] == [
    (_line_of("# TRACK-MUL"), a * 1, a), (_line_of("# TRACK-ADD"), UOp(Ops.ADD, idx, (a, c(0))), a)]
  stats = match_stats[_line_of("# TRACK-MUL")]
  assert stats.hits >= 1 and stats.tries >= stats.hits and stats.seconds >= 0


def test_track_rewrites_records_plain_pattern_matchers_too() -> None:
  pm = PatternMatcher([(times_one, lambda x: x)])  # PLAIN

  @track_rewrites
  def plain(u: UOp) -> UOp: return graph_rewrite(u, pm)
  assert plain(a * 1 + b) is a + b
  assert traces[-1].name == "plain"
  records = [(r.location, r.before, r.after) for r in traces[-1].records]
  assert records == [(_line_of("# PLAIN"), a * 1, a)]
  graph_rewrite(z * 1, pm)  # outside a tracked function: not recorded
  assert len(traces[-1].records) == 1


def test_match_stats_count_tries_and_hits_with_the_knob() -> None:
  pm = PatternMatcher([(times_one, lambda x: x)])  # STATS
  loc = _line_of("# STATS")
  match_stats.pop(loc, None)
  with Context(TRACK_MATCH_STATS=1): graph_rewrite((a * 1) * (b * 2), pm)
  assert (match_stats[loc].tries, match_stats[loc].hits) == (3, 1)
  graph_rewrite(a * 1, pm)  # knob off: not counted
  assert match_stats[loc].tries == 3


def test_tracked_rewrite_gives_the_same_result() -> None:
  rules = [(UPat(Ops.ADD, src=[UPat.var("x"), UPat.const(idx, 0)]), lambda x: x),
           (UPat(Ops.MUL, src=[UPat.var("x"), UPat.const(idx, 1)]), lambda x: x)]
  e = UOp.sink((a + 0) * 1, UOp(Ops.MUL, idx, (c(1), b)), a * 2)
  assert graph_rewrite(e, TrackedPatternMatcher(rules)) is graph_rewrite(e, PatternMatcher(rules))
  assert upat_module.active_traces == []
