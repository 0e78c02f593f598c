"""Spec verifiers of the kernel stages: `spec_kernel` (rangeify's output, codegen's input) and
`spec_linear` (linearize's output, the renderers' input).

spec_kernel: every value is scalar-shaped, memory is read through INDEX(PARAM|BUFFER|AFTER, i)
with an index-typed i, every RANGE is closed by an END or a REDUCE, and the SINK has no open range.
spec_linear: sources come before their consumers, RANGE/END and IF/ENDIF nest, no `index` dtype or
Invalid remains, and LOAD/STORE take their (gated) forms.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from unigrad.dtype import dtypes
from unigrad.uop.ops import GroupOp, InvalidType, KernelInfo, Ops, ParamArg, RangeArg, ReduceArg
from unigrad.uop.spec import Check, Spec, SpecError, arg_is, min_src, nsrc

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp


def _scalar(u: UOp) -> str | None:
  return None if u.shape in ((), None) else f"kernel values are scalar-shaped, got shape {u.shape}"


def _index_ok(u: UOp) -> str | None:
  if u.src[0].op not in (Ops.PARAM, Ops.BUFFER, Ops.AFTER, Ops.RESHAPE):
    return f"INDEX must address a buffer, got {u.src[0].op.name}"
  bad = [s.dtype for s in u.src[1:] if s.dtype not in (dtypes.index, dtypes.int32, dtypes.int64)]
  return f"index sources must be integers, got {bad}" if bad else None


def _range_bound(u: UOp) -> str | None:
  if dtypes.is_int(u.src[0].dtype): return None
  return f"RANGE bound must be an integer, got {u.src[0].dtype!r}"


def _closes_ranges(u: UOp) -> str | None:
  bad = [r.op.name for r in u.src[1:] if r.op is not Ops.RANGE]
  return f"closes non-RANGE sources {bad}" if bad else None


def _no_open_ranges(u: UOp) -> str | None:
  open_ids = sorted(r.arg.id for r in u.ranges)
  return f"ranges {open_ids} are never closed by an END or REDUCE" if open_ids else None


def _reduce_arg(u: UOp) -> str | None:
  ok = isinstance(u.arg, ReduceArg) and u.arg.op in GroupOp.Reduce
  return None if ok else f"arg must be ReduceArg(ADD|MUL|MAX), got {u.arg!r}"


def _sink_arg(u: UOp) -> str | None:
  if u.arg is None or isinstance(u.arg, KernelInfo): return None
  return f"arg must be KernelInfo, got {u.arg!r}"


_ALU: tuple[tuple[str, Check], ...] = (("scalar", _scalar),)
_kernel_checks: dict[Ops, tuple[tuple[str, Check], ...]] = {
  Ops.SINK: (("KernelInfo", _sink_arg), ("closed ranges", _no_open_ranges)),
  Ops.END: (("sources", nsrc(2)), ("closes a RANGE", _closes_ranges)),
  Ops.STORE: (("sources", nsrc(2, 3)),),
  Ops.INDEX: (("sources", min_src(2)), ("addresses memory", _index_ok)),
  Ops.PARAM: (("ParamArg", arg_is(ParamArg, "a ParamArg")),),
  Ops.BUFFER: (("ParamArg", arg_is(ParamArg, "a ParamArg")),),
  Ops.RANGE: (("sources", nsrc(1)), ("RangeArg", arg_is(RangeArg, "a RangeArg")),
              ("bound", _range_bound)),
  Ops.REDUCE: (("sources", min_src(1)), ("ReduceArg", _reduce_arg),
               ("closes RANGEs", _closes_ranges)),
  Ops.CONST: (("sources", nsrc(0)),),
  Ops.VCONST: (("sources", nsrc(0)),),
  Ops.RESHAPE: (("sources", nsrc(2)),),
  Ops.AFTER: (("sources", min_src(1)),),
  Ops.GROUP: (),
  Ops.SPECIAL: (("sources", nsrc(1)),),
  Ops.BARRIER: (("sources", nsrc(1)),),  # waits for the work group after its source (a STORE)
  # GEP(x, r): lane of the vector x becomes over range r; GEP(x): a lane of a WMMA's result
  Ops.GEP: (("sources", nsrc(1, 2)),),
  Ops.STACK: (("lanes", min_src(1)),),  # a WMMA's operand fragments
  Ops.WMMA: (("sources", nsrc(3)),),
  **{op: _ALU for op in GroupOp.Elementwise},
}
spec_kernel = Spec("kernel", _kernel_checks)


# ---- LINEAR ----

def _no_index_dtype(u: UOp) -> str | None:
  if u.dtype == dtypes.index:
    return "index dtype must be lowered to int32/int64 before linearize"
  if u.op is Ops.CONST and isinstance(u.arg, InvalidType):
    return "Invalid must be gone (gated) after isel"
  return None


def _one_lane(u: UOp) -> str | None:
  ok = isinstance(u.arg, tuple) and len(u.arg) == 1 and 0 <= u.arg[0] < u.src[0].dtype.count
  return None if ok else f"GEP reads one lane of a {u.src[0].dtype!r}, got {u.arg!r}"


def _load_form(u: UOp) -> str | None:
  if len(u.src) not in (1, 3):
    return f"LOAD takes (index) or (index, alt, gate), got {len(u.src)} sources"
  if u.src[0].op is not Ops.INDEX: return f"LOAD reads an INDEX, got {u.src[0].op.name}"
  return None


_L = (("lowered dtypes", _no_index_dtype),)
_linear_checks: dict[Ops, tuple[tuple[str, Check], ...]] = {
  op: _L for op in (GroupOp.Elementwise | {Ops.PARAM, Ops.BUFFER, Ops.CONST, Ops.RANGE, Ops.END,
                                           Ops.IF, Ops.ENDIF, Ops.INDEX, Ops.AFTER, Ops.SPECIAL,
                                           Ops.STORE, Ops.BARRIER, Ops.WMMA})}
_linear_checks[Ops.LOAD] = _L + (("gated form", _load_form),)
_linear_checks[Ops.STACK] = _L + (("lanes", min_src(2)),)
_linear_checks[Ops.GEP] = _L + (("sources", nsrc(1)), ("one lane", _one_lane))


def _order(linear: UOp) -> None:
  seen: set[UOp] = set()
  loops: list[UOp] = []
  for u in linear.src:
    for s in u.src:
      if s.op in (Ops.VCONST,): continue
      if u.op in (Ops.PARAM, Ops.BUFFER, Ops.END, Ops.AFTER, Ops.ENDIF): continue
      if s not in seen and s.op is not Ops.CONST:
        raise SpecError("linear", u, "order", f"source {s.op.name} is used before it is computed")
    if u.op in (Ops.RANGE, Ops.IF): loops.append(u)
    if u.op in (Ops.END, Ops.ENDIF):
      opener = u.src[1] if u.op is Ops.END else u.src[0]
      if not loops or loops[-1] is not opener:
        raise SpecError("linear", u, "nesting", "closes a block that is not the innermost open one")
      loops.pop()
    seen.add(u)
  if loops: raise SpecError("linear", loops[-1], "nesting", "block is never closed")


class LinearSpec(Spec):
  """spec_linear: per-node checks plus the order and nesting of the instruction list."""

  def verify(self, root: UOp) -> UOp:
    for u in root.src: self.verify_node(u)
    _order(root)
    return root


spec_linear = LinearSpec("linear", _linear_checks)
