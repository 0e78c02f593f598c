"""Printers: `pyrender` (repr: Python that rebuilds the graph) and `render` (a readable expression).

`pyrender` writes each node shared by several consumers once, as `x3:=UOp(...)`, and refers to it
as `x3` afterwards, so `eval(repr(u), vars(unigrad.uop))` rebuilds `u` (the same object, by
hash-consing). Both printers walk the graph with explicit stacks.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from unigrad.uop.ops import Ops, RangeArg

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

MAX_INDENT = 40
NEST_LEVELS = 32


def arg_repr(arg: Any) -> str:
  """repr() that evaluates back: inf and nan become float('inf') / float('nan')."""
  if isinstance(arg, float) and not math.isfinite(arg): return f"float('{arg}')"
  if isinstance(arg, tuple):
    inner = ", ".join(arg_repr(a) for a in arg)
    return f"({inner},)" if len(arg) == 1 else f"({inner})"
  return repr(arg)


def _head(u: UOp) -> str:
  fields = f"{u.op!r}, {u.dtype!r}"
  if u.arg is not None: fields += f", arg={arg_repr(u.arg)}"
  if u.tag is not None: fields += f", tag={arg_repr(u.tag)}"
  return f"UOp({fields}"


def pyrender(root: UOp) -> str:
  """Python source that rebuilds `root`; shared nodes appear once.

  A graph deeper than NEST_LEVELS is cut into bands of NEST_LEVELS levels (by height above the
  leaves) so that Python's parser, which allows 200 nested parentheses, can read it back: the
  top node of each lower band is defined first, in `(x7:=UOp(...), ..., root)[-1]`."""
  topo = list(root.toposort())
  consumers: dict[UOp, int] = {}
  height: dict[UOp, int] = {}
  for u in topo:
    height[u] = 1 + max((height[s] for s in u.src), default=-1)
    for s in u.src: consumers[s] = consumers.get(s, 0) + 1
  cut = {s for u in topo for s in u.src if height[s] // NEST_LEVELS != height[u] // NEST_LEVELS}
  names = {u: f"x{i}" for i, u in enumerate(topo) if consumers.get(u, 0) > 1 or u in cut}
  emitted: set[UOp] = set()
  parts = [_emit(u, names, emitted) for u in topo if u in cut] + [_emit(root, names, emitted)]
  return parts[0] if len(parts) == 1 else "(" + ",\n".join(parts) + ")[-1]"


def _emit(top: UOp, names: dict[UOp, str], emitted: set[UOp]) -> str:
  """`top` as nested UOp(...) calls; nodes in `emitted` (printed before) appear by name."""
  out: list[str] = []
  # each item: a node to open at a depth, or a closing string
  stack: list[tuple[UOp | str, int]] = [(top, 0)]
  while stack:
    item, depth = stack.pop()
    pad = " " * min(depth, MAX_INDENT)
    if isinstance(item, str):
      out.append(item)
      continue
    if item in emitted:
      out.append(f"{pad}{names[item]},")
      continue
    emitted.add(item)
    prefix = f"{pad}{names[item]}:=" if item in names else pad
    sep = "," if depth else ""
    if not item.src:
      out.append(f"{prefix}{_head(item)}){sep}")
      continue
    out.append(f"{prefix}{_head(item)}, src=(")
    stack.append((f"{pad}))" + sep, 0))
    stack.extend((s, depth + 2) for s in reversed(item.src))
  return "\n".join(out)


_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>", Ops.SUB: "-",
          Ops.DIV: "/", Ops.CMPGT: ">", Ops.CMPGE: ">=", Ops.CMPLE: "<=", Ops.CMPEQ: "==",
          Ops.CDIV: "/", Ops.CMOD: "%"}


def _render_one(u: UOp, s: list[str]) -> str:
  op = u.op
  if op in (Ops.CONST, Ops.VCONST): return repr(u.arg)
  if op is Ops.RANGE and isinstance(u.arg, RangeArg): return f"r{u.arg.id}"
  if op is Ops.PARAM: return u.arg.name if u.arg.name else f"param{u.arg.slot}"
  if op is Ops.BUFFER: return f"buf{u.arg.slot}"
  if op is Ops.SPECIAL: return str(u.arg)
  if op in _INFIX: return f"({s[0]}{_INFIX[op]}{s[1]})"
  if op is Ops.WHERE: return f"({s[1]} if {s[0]} else {s[2]})"
  if op is Ops.NEG: return f"(-{s[0]})"
  if op is Ops.MAX: return f"max({s[0]}, {s[1]})"
  if op is Ops.CAST: return f"({u.dtype.name}){s[0]}"
  if op is Ops.INDEX: return f"{s[0]}[{', '.join(s[1:])}]"
  return f"{op.name.lower()}({', '.join(s)})"


def render(root: UOp, pm: Any = None) -> str:
  """A readable expression. `pm`, a PatternMatcher given the rendered sources as ctx (a dict from
  node to string), may render any node its own way."""
  strs: dict[UOp, str] = {}
  for u in root.toposort():
    custom = pm.rewrite(u, ctx=strs) if pm is not None else None
    strs[u] = custom if isinstance(custom, str) else _render_one(u, [strs[s] for s in u.src])
  return strs[root]
