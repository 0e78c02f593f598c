"""Function: resolve FUNCTION calls in a tensor graph by substituting their arguments.

Consumes: tensor-graph roots that may hold `GETTUPLE(FUNCTION(TUPLE(results...), a_0, a_1...), i)`
(spec 000, "Call Ops": "Substitute each PARAM k in TUPLE body with a_k").
Produces: the same roots with every such GETTUPLE replaced by result i of the body over the
actual arguments; nested functions are resolved too (inner bodies after their arguments).
Invariants: no FUNCTION or GETTUPLE of one is left; the body's placeholder PARAMs (unnamed,
slot k < number of arguments) are all substituted; symbolic variables (named PARAMs) are kept.
"""
from __future__ import annotations

from unigrad.dtype import AddrSpace
from unigrad.uop import Ops, ParamArg, UOp, shape_uop

__all__ = ["inline_functions", "has_function", "param_like"]


def param_like(slot: int, u: UOp) -> UOp:
  """PARAM(slot): a placeholder shaped, typed and placed like `u` (a FUNCTION body's input)."""
  arg = ParamArg(slot, u.dtype, u.device, AddrSpace.GLOBAL)
  return UOp(Ops.PARAM, u.dtype, (shape_uop(tuple(u.shape)),), arg)


def has_function(nodes: dict[UOp, None]) -> bool:
  """Whether a toposort holds a FUNCTION call."""
  function = Ops.FUNCTION  # looked up once: `Ops.X` is slow on Python 3.11
  return any(u.op is function for u in nodes)


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
  for u in UOp(Ops.SINK, None, tuple(roots)).toposort():
    src = tuple(memo.get(s, s) for s in u.src)
    if u.op is Ops.GETTUPLE and src[0].op is Ops.FUNCTION: memo[u] = _result(src[0], u.arg)
    elif src != u.src: memo[u] = u.replace(src=src)
  return [memo.get(r, r) for r in roots]
