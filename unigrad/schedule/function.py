"""Function: resolve FUNCTION calls in a tensor graph by substituting their arguments.

Consumes: tensor-graph roots that may hold `GETTUPLE(FUNCTION(TUPLE(results...), a_0, a_1...), i)`
(spec 000, "Call Ops": "Substitute each PARAM k in TUPLE body with a_k").
Produces: the same roots with every such GETTUPLE replaced by result i of the body over the
actual arguments; nested functions are resolved too (inner bodies after their arguments).
Invariants: no FUNCTION or GETTUPLE of one is left; the body's placeholder PARAMs (unnamed,
slot k < number of arguments) are all substituted; symbolic variables (named PARAMs) are kept.

Two ways: `inline_functions` is a pass of its own, rebuilding every node above a call;
`call_result` gives one call's result over arguments another walk has already rebuilt, so
callify resolves the calls of a graph (`graph_nodes`: its toposort without the bodies) in the walk
it makes anyway. Eager models call traced ops (frontend/traced.py) in every layer, and a training
step's whole backward lies above them.
"""
from __future__ import annotations

import functools

from unigrad.dtype import AddrSpace
from unigrad.uop import Ops, ParamArg, UOp, shape_uop

__all__ = ["inline_functions", "has_function", "param_like", "body_params", "graph_nodes",
           "call_result", "resolvable_calls"]


def param_like(slot: int, u: UOp) -> UOp:
  """PARAM(slot): a placeholder shaped, typed and placed like `u` (a FUNCTION body's input)."""
  arg = ParamArg(slot, u.dtype, u.device, AddrSpace.GLOBAL)
  return UOp(Ops.PARAM, u.dtype, (shape_uop(tuple(u.shape)),), arg)


def body_params(body: UOp, nargs: int) -> dict[int, UOp]:
  """The placeholders of a FUNCTION body over `nargs` arguments, by slot: its own PARAMs, not
  those of the bodies of calls nested in it (they have slots of their own and may be reached
  first)."""
  found: dict[int, UOp] = {}
  stack, seen = [body], set()
  param, function = Ops.PARAM, Ops.FUNCTION
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u.op is param:
      if u.arg.name is None and u.arg.slot < nargs: found[u.arg.slot] = u
      continue
    stack.extend(u.src[1:] if u.op is function else u.src)
  return found


def has_function(nodes: dict[UOp, None]) -> bool:
  """Whether a toposort holds a FUNCTION call."""
  function = Ops.FUNCTION  # looked up once: `Ops.X` is slow on Python 3.11
  return any(u.op is function for u in nodes)


def resolvable_calls(nodes: dict[UOp, None]) -> bool:
  """Whether callify can resolve every call of a graph (`graph_nodes`) in its walk."""
  gettuple, function = Ops.GETTUPLE, Ops.FUNCTION
  return all(call_steps(u.src[0].src[0], u.arg, len(u.src[0].src) - 1) is not None
             for u in nodes if u.op is gettuple and u.src[0].op is function)


def _result(f: UOp, i: int) -> UOp:
  """Result `i` of FUNCTION `f` over its arguments (`f`'s body has no calls left: the walk in
  `inline_functions` resolves them before it reaches `f`)."""
  body, args = f.src[0], f.src[1:]
  value = body.src[i]
  sub = {p: args[p.arg.slot] for p in value.toposort()
         if p.op is Ops.PARAM and p.arg.name is None and p.arg.slot < len(args)}
  return value.substitute(sub)


def inline_functions(roots: list[UOp]) -> list[UOp]:
  """`roots` with every FUNCTION call resolved (see the module docstring)."""
  memo: dict[UOp, UOp] = {}
  gettuple, function = Ops.GETTUPLE, Ops.FUNCTION
  for u in UOp(Ops.SINK, None, tuple(roots)).toposort():
    src = tuple(memo.get(s, s) for s in u.src)
    if u.op is gettuple and src[0].op is function: memo[u] = _result(src[0], u.arg)
    elif src != u.src: memo[u] = u.replace(src=src)
  return [memo.get(r, r) for r in roots]


# ---- calls resolved while another walk rebuilds the graph (callify) ----

def graph_nodes(root: UOp) -> dict[UOp, None]:
  """`root.toposort()` without the bodies of its calls (a FUNCTION's first source): the graph a
  walk that resolves each call by `call_result` visits."""
  return root.toposort(bodies=False)


# what a body must not hold for `call_result`: a walk rebuilding the graph must see these itself
# (buffers, markers; a copy may go to several devices, which realize lowers before callify)
_REWRITTEN = frozenset({Ops.BUFFER, Ops.CONTIGUOUS, Ops.AFTER, Ops.COPY, Ops.COLLECTIVE})


@functools.lru_cache(maxsize=4096)
def call_steps(body: UOp, i: int, nargs: int) -> tuple | None:
  """Result `i` of a FUNCTION body over `nargs` arguments as steps for `call_result`: each node
  that depends on a placeholder, in order, with its sources as references (-1-k: argument k,
  j >= 0: step j's node, else the node itself); calls nested in the body are resolved first.
  None where the body holds buffers, contiguous or assign markers or symbolic variables (the
  caller resolves such calls by `inline_functions`)."""
  value = body.src[i]
  order = value.toposort()
  if has_function(order):
    value = inline_functions([value])[0]
    order = value.toposort()
  steps: list[tuple[UOp, tuple]] = []
  ref: dict[UOp, int] = {}
  for u in order:
    if u.op is Ops.PARAM:
      if u.arg.name is not None or u.arg.slot >= nargs: return None
      ref[u] = -1 - u.arg.slot
      continue
    if u.op in _REWRITTEN: return None
    if not any(s in ref for s in u.src): continue
    ref[u] = len(steps)
    steps.append((u, tuple(ref.get(s, s) for s in u.src)))
  return ref.get(value, value), tuple(steps)


def call_result(body: UOp, i: int, args: tuple[UOp, ...]) -> UOp | None:
  """Result `i` of `body` over `args` (what resolving the call gives, without a walk over the
  body), or None where `call_steps` is."""
  plan = call_steps(body, i, len(args))
  if plan is None: return None
  out, steps = plan
  made: list[UOp] = []
  for node, refs in steps:
    src = tuple(r if type(r) is not int else made[r] if r >= 0 else args[-1 - r] for r in refs)
    made.append(node.with_src(src))
  if type(out) is not int: return out
  return made[out] if out >= 0 else args[-1 - out]
