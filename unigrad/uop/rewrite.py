"""graph_rewrite: apply a PatternMatcher over a whole graph, with an explicit stack.

Modes (the names follow draft 002; the sink is drawn at the bottom, so "bottom-up" starts there):
- default: a node's sources are rewritten first, the node is rebuilt from them, then `pm` runs on
  it; a replacement is itself fully processed again, so the result is a fixed point.
- `bpm`: a pre-pass applied when a node is first reached from its consumer, before its sources,
  repeated until it stops changing; then the node's sources are processed.
- `bottom_up=True`: `pm` is used as that pre-pass (and there is no post-order pass).
Every node is processed at most once per call (a memo maps original to final node).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad.knobs import REWRITE_STACK_LIMIT, TRACK_MATCH_STATS
from unigrad.uop.ops import Ops
from unigrad.uop.upat import PatternMatcher, active_traces

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

BPM_LOOP_LIMIT = 1000
_DESCEND, _REBUILD, _LINK = 0, 1, 2


class RewriteError(RuntimeError):
  """A rewrite did not terminate (a rule loop) or a rule produced something that is not a UOp."""


def _rewriter(pm: PatternMatcher | None) -> Callable[[UOp, Any], Any] | None:
  if pm is None: return None
  return pm.rewrite_tracked if (active_traces or TRACK_MATCH_STATS) else pm.rewrite


def _fixed_point(fn: Callable[[UOp, Any], Any], u: UOp, ctx: Any) -> UOp:
  for _ in range(BPM_LOOP_LIMIT):
    r = fn(u, ctx)
    if r is None: return u
    if not hasattr(r, "op"): raise RewriteError(f"a rule returned {type(r).__name__}, not a UOp, for {u.op!r}")
    u = r
  raise RewriteError(f"pre-order rewrite of {u.op!r} did not reach a fixed point in {BPM_LOOP_LIMIT} steps")


def graph_rewrite(sink: UOp, pm: PatternMatcher | None, ctx: Any = None, bottom_up: bool = False,
                  name: str | None = None, bpm: PatternMatcher | None = None,
                  enter_calls: bool = True) -> UOp:
  """Rewrite the graph below `sink` with `pm` (see the module docstring for the modes).

  `ctx` is passed to every callback that takes one. With `enter_calls=False` the bodies
  (first source) of FUNCTION and CALL nodes are left untouched.
  """
  pre = _rewriter(pm if bottom_up else bpm)
  post = None if bottom_up else _rewriter(pm)
  memo: dict[UOp, UOp] = {}
  busy: set[UOp] = set()
  limit = int(REWRITE_STACK_LIMIT)
  stack: list[tuple[UOp, int, UOp | None]] = [(sink, _DESCEND, None)]
  while stack:
    if len(stack) > limit: raise RewriteError(f"graph_rewrite{' ' + name if name else ''}: stack over {limit}")
    n, stage, other = stack.pop()
    if stage == _DESCEND:
      if n in memo or n in busy: continue
      new = _fixed_point(pre, n, ctx) if pre is not None else n
      busy.add(n)
      if new is not n:
        stack.append((n, _LINK, new))
        stack.append((new, _DESCEND, None))
        continue
      stack.append((n, _REBUILD, None))
      skip_body = not enter_calls and n.op in (Ops.FUNCTION, Ops.CALL)
      stack.extend((s, _DESCEND, None) for s in (n.src[1:] if skip_body else n.src) if s not in memo)
    elif stage == _REBUILD:
      new_src = tuple(memo.get(s, s) for s in n.src)
      x = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
      r = post(x, ctx) if post is not None else None
      if r is None:
        memo[n] = x
        busy.discard(n)
        continue
      if not hasattr(r, "op"): raise RewriteError(f"a rule returned {type(r).__name__}, not a UOp, for {n.op!r}")
      stack.append((n, _LINK, r))
      stack.append((r, _DESCEND, None))
    else:
      assert other is not None
      memo[n] = memo.get(other, other)
      busy.discard(n)
  return memo.get(sink, sink)


def substitute(root: UOp, dvars: dict[UOp, UOp], extra_pm: PatternMatcher | None = None) -> UOp:
  """Replace every key of `dvars` below `root` by its value. Values are not looked into, so
  `{x: x + 1}` replaces x once. `extra_pm` then rewrites the result to a fixed point."""
  memo: dict[UOp, UOp] = {}
  stack: list[tuple[UOp, bool]] = [(root, False)]
  while stack:
    n, ready = stack.pop()
    if n in memo: continue
    if (v := dvars.get(n)) is not None:
      memo[n] = v
      continue
    if not ready:
      stack.append((n, True))
      stack.extend((s, False) for s in n.src if s not in memo)
      continue
    new_src = tuple(memo.get(s, s) for s in n.src)
    memo[n] = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
  out = memo[root]
  return graph_rewrite(out, extra_pm) if extra_pm is not None else out
