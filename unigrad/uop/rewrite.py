"""graph_rewrite: apply a PatternMatcher over a whole graph, with an explicit stack.

Modes (the names follow draft 002; the sink is drawn at the bottom, so "bottom-up" starts there):
- default: a node's sources are rewritten first, the node is rebuilt from them, then `pm` runs on
  it; a replacement is itself fully processed again, so the result is a fixed point.
- `bpm`: a pre-pass applied when a node is first reached from its consumer, before its sources,
  repeated until it stops changing; then the node's sources are processed.
- `bottom_up=True`: `pm` is used as that pre-pass (and there is no post-order pass).
Every node is processed at most once per call (a memo maps original to final node).

A rule loop is an error (RewriteError): a node rewritten back to one whose rewrite is still in
progress, a pre-pass that does not settle in BPM_LOOP_LIMIT steps, or rewrites nesting deeper than
REWRITE_STACK_LIMIT pending nodes (a loop that keeps building new nodes).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad.knobs import REWRITE_STACK_LIMIT, TRACK_MATCH_STATS
from unigrad.uop.ops import Ops
from unigrad.uop.upat import PatternMatcher, active_traces, begin_step, end_step

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

BPM_LOOP_LIMIT = 1000
_CALLS = (Ops.FUNCTION, Ops.CALL)
_DESCEND, _REBUILD, _LINK = 0, 1, 2


class RewriteError(RuntimeError):
  """A rewrite did not terminate (a rule loop) or a rule produced something that is not a UOp."""


def _rewriter(pm: PatternMatcher | None) -> Callable[[UOp, Any], Any] | None:
  if pm is None: return None
  return pm.rewrite_tracked if (active_traces or TRACK_MATCH_STATS) else pm.rewrite


def _not_a_uop(r: Any, u: UOp) -> RewriteError:
  return RewriteError(f"a rule returned {type(r).__name__}, not a UOp, for {u.op!r}")


def _too_deep(name: str | None, limit: int) -> RewriteError:
  return RewriteError(f"graph_rewrite{' ' + name if name else ''}: more than {limit} nodes pending "
                      "(a rule loop? REWRITE_STACK_LIMIT raises the limit)")


def _cycle(name: str | None, u: UOp) -> RewriteError:
  return RewriteError(f"graph_rewrite{' ' + name if name else ''}: {u.op!r} was rewritten to a "
                      "node whose own rewrite is still in progress (a rule loop)")


def _fixed_point(fn: Callable[[UOp, Any], Any], u: UOp, ctx: Any) -> UOp:
  for _ in range(BPM_LOOP_LIMIT):
    r = fn(u, ctx)
    if r is None: return u
    if not hasattr(r, "op"): raise _not_a_uop(r, u)
    u = r
  raise RewriteError(f"pre-order rewrite of {u.op!r} did not reach a fixed point in "
                     f"{BPM_LOOP_LIMIT} steps (a rule loop?)")


def graph_rewrite(sink: UOp, pm: PatternMatcher | None, ctx: Any = None, bottom_up: bool = False,
                  name: str | None = None, bpm: PatternMatcher | None = None,
                  enter_calls: bool = True) -> UOp:
  """Rewrite the graph below `sink` with `pm` (see the module docstring for the modes).

  `ctx` is passed to every callback that takes one. With `enter_calls=False` the bodies
  (first source) of FUNCTION and CALL nodes are left untouched. Inside a tracked function
  (`track_rewrites`) the call is recorded as a step of the trace.
  """
  if not active_traces: return _graph_rewrite(sink, pm, ctx, bottom_up, name, bpm, enter_calls)
  begin_step(name, sink)
  ret = _graph_rewrite(sink, pm, ctx, bottom_up, name, bpm, enter_calls)
  end_step(ret)
  return ret


def _graph_rewrite(sink: UOp, pm: PatternMatcher | None, ctx: Any, bottom_up: bool,
                   name: str | None, bpm: PatternMatcher | None, enter_calls: bool) -> UOp:
  pre = _rewriter(pm if bottom_up else bpm)
  post = None if bottom_up else _rewriter(pm)
  memo: dict[UOp, UOp] = {}
  busy: set[UOp] = set()
  limit = int(REWRITE_STACK_LIMIT)
  stack: list[tuple[UOp, int, UOp | None]] = [(sink, _DESCEND, None)]
  push, pop = stack.append, stack.pop
  while stack:
    n, stage, other = pop()
    if stage == _DESCEND:
      if n in memo or n in busy: continue
      busy.add(n)
      new = _fixed_point(pre, n, ctx) if pre is not None else n
      if new is not n:
        if len(stack) > limit: raise _too_deep(name, limit)
        if new in busy: raise _cycle(name, n)
        push((n, _LINK, new))
        push((new, _DESCEND, None))
        continue
      push((n, _REBUILD, None))
      srcs = n.src[1:] if not enter_calls and n.op in _CALLS else n.src
      stack += [(s, _DESCEND, None) for s in srcs if s not in memo]
    elif stage == _REBUILD:
      src = n.src
      new_src = tuple(map(memo.get, src, src))
      x = n if new_src == src else type(n)(n.op, n.dtype, new_src, n.arg, n.tag)
      r = post(x, ctx) if post is not None else None
      if r is None:
        memo[n] = x
        busy.discard(n)
        continue
      if not hasattr(r, "op"): raise _not_a_uop(r, n)
      if len(stack) > limit: raise _too_deep(name, limit)
      if r in busy: raise _cycle(name, n)
      push((n, _LINK, r))
      push((r, _DESCEND, None))
    else:
      assert other is not None  # a link entry holds the node `n` was rewritten to
      memo[n] = memo.get(other, other)
      busy.discard(n)
  return memo.get(sink, sink)


def rebuild(u: UOp, src: tuple[UOp, ...]) -> UOp:
  """`u` with the sources `src`, or `u` itself when they are its own: the step of the memo loops
  that rebuild a graph, without `replace`'s keyword handling (a tenth of a stage's time)."""
  return u if src == u.src else type(u)(u.op, u.dtype, src, u.arg, u.tag)


def substitute(root: UOp, dvars: dict[UOp, UOp], extra_pm: PatternMatcher | None = None) -> UOp:
  """Replace every key of `dvars` below `root` by its value. Values are not looked into, so
  `{x: x + 1}` replaces x once. `extra_pm` then rewrites the result to a fixed point."""
  out = _substitute(root, dvars) if dvars else root
  return graph_rewrite(out, extra_pm) if extra_pm is not None else out


def substitute_each(root: UOp, key: UOp, values: list[UOp]) -> list[UOp]:
  """`[root.substitute({key: v}) for v in values]`, walking the graph once: the nodes that
  depend on `key` are found first and only they are rebuilt for each value (unrolling a loop
  `k` times walked its whole body `k` times)."""
  order: list[UOp] = []
  dep: set[UOp] = {key}
  for u in root.toposort():
    if u is not key and not dep.isdisjoint(u.src):
      dep.add(u)
      order.append(u)
  if root not in dep: return [root] * len(values)
  out = []
  for v in values:
    memo = {key: v}
    for u in order: memo[u] = rebuild(u, tuple([memo.get(s, s) for s in u.src]))
    out.append(memo[root])
  return out


def _substitute(root: UOp, dvars: dict[UOp, UOp]) -> UOp:
  """The substitution itself: nodes are rebuilt only where a source changed."""
  memo: dict[UOp, UOp] = {}
  stack: list[tuple[UOp, bool]] = [(root, False)]
  push, pop, get = stack.append, stack.pop, memo.get
  while stack:
    n, ready = pop()
    if ready:
      src = n.src
      new_src = tuple([memo[s] for s in src])
      memo[n] = n if new_src == src else type(n)(n.op, n.dtype, new_src, n.arg, n.tag)
      continue
    if n in memo: continue
    if (v := dvars.get(n)) is not None:
      memo[n] = v
      continue
    push((n, True))
    for s in n.src:
      if get(s) is None: push((s, False))
  return memo[root]
