"""Spec verifiers: per-stage legality checks of a UOp graph, named `spec_<stage>`.

A verifier is a table from op to check functions. Each check looks at one node and returns None
when the node obeys its rule, or a message saying what is wrong; `Spec.verify` raises `SpecError`
naming the stage, the op, the rule and a short repr of the node. Every verifier also checks that a
node's stored dtype equals the dtype the spec derives for it. Later stages add their own tables.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from unigrad.dtype import DType, dtypes, truncate
from unigrad.uop.ops import (ARITY, COLLECTIVE_KINDS, COLLECTIVE_PHASES, COLLECTIVE_REDUCES,
                             CollectiveArg, GroupOp, InvalidType, Ops, ParamArg, ReduceArg)
from unigrad.uop.properties import derive_dtype

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

Check = Callable[["UOp"], "str | None"]


class SpecError(TypeError, ValueError):
  """A node breaks a rule of a stage's spec. Both a TypeError and a ValueError."""

  def __init__(self, stage: str, node: UOp, rule: str, message: str) -> None:
    self.stage, self.node, self.rule = stage, node, rule
    super().__init__(f"{stage}: {node.op.name} breaks rule '{rule}': {message}\n"
                     f"  node: {short_repr(node)}")


def short_repr(u: UOp) -> str:
  """One line: op, dtype, arg and the ops of the sources."""
  srcs = ", ".join(f"{s.op.name}:{s.dtype.name}" for s in u.src)
  arg = "" if u.arg is None else f", arg={u.arg!r}"[:80]
  return f"UOp({u.op!r}, {u.dtype!r}{arg}, src=({srcs}))"


@dataclass(frozen=True)
class Spec:
  """A stage's rules: for each op allowed in the stage, the checks it must pass."""
  stage: str
  checks: dict[Ops, tuple[tuple[str, Check], ...]]

  def verify(self, root: UOp) -> UOp:
    """Check every node below `root`; returns `root` so stages can chain it."""
    for u in root.toposort(): self.verify_node(u)
    return root

  def verify_node(self, u: UOp) -> None:
    rules = self.checks.get(u.op)
    if rules is None:
      raise SpecError(self.stage, u, "allowed ops",
                      f"{u.op.name} may not appear in the {self.stage} stage")
    for rule, check in ((("stored dtype", _check_dtype),) + rules):
      msg: str | None
      try: msg = check(u)
      except (ValueError, TypeError, IndexError, AttributeError) as e:
        msg = f"{type(e).__name__}: {e}"
      if msg is not None: raise SpecError(self.stage, u, rule, msg)


# ---- generic checks ----

# ops whose dtype is whatever the constructor was given
# (a STACK is a shape-(k,) tensor of its sources' dtype, or in codegen a k-lane vector value)
EXPLICIT_DTYPE = frozenset({Ops.CONST, Ops.VCONST, Ops.CAST, Ops.BITCAST, Ops.SOURCE, Ops.CUSTOM,
                            Ops.INS, Ops.LOAD, Ops.STACK})


def _check_dtype(u: UOp) -> str | None:
  if u.op in EXPLICIT_DTYPE: return None
  want = derive_dtype(u.op, u.src, u.arg)
  return None if want == u.dtype else f"stored dtype {u.dtype!r}, derived {want!r}"


def nsrc(*counts: int) -> Check:
  def check(u: UOp) -> str | None:
    if len(u.src) in counts: return None
    return f"takes {' or '.join(map(str, counts))} source(s), got {len(u.src)}"
  return check


def min_src(n: int) -> Check:
  return lambda u: None if len(u.src) >= n else f"takes at least {n} source(s), got {len(u.src)}"


def arg_is(kind: type | tuple[type, ...], what: str) -> Check:
  return lambda u: None if isinstance(u.arg, kind) else f"arg must be {what}, got {u.arg!r}"


def is_shape_uop(u: UOp) -> bool:
  return u.dtype == dtypes.index and u.shape is not None and len(u.shape) == 1


def src_is_shape(*idx: int) -> Check:
  def check(u: UOp) -> str | None:
    bad = [i for i in idx if not is_shape_uop(u.src[i])]
    return f"source(s) {bad} must be (k,)-shaped index UOps" if bad else None
  return check


def sizes_at(i: int) -> Check:
  """Source `i` holds sizes: its static entries are >= 0."""
  def check(u: UOp) -> str | None:
    s = u.src[i]
    if s.op is not Ops.VCONST or all(d >= 0 for d in s.arg): return None
    return f"negative size in {s.arg}"
  return check


def has_shape(u: UOp) -> str | None:
  return None if u.shape is not None else "has no derivable shape"


# ---- elementwise ----

def _same_dtypes(u: UOp) -> str | None:
  srcs = u.src[1:] if u.op is Ops.WHERE else u.src
  dts = {s.dtype for s in srcs}
  if len(dts) == 1: return None
  return f"sources must share a dtype, got {sorted(dt.name for dt in dts)}"


def _where_cond(u: UOp) -> str | None:
  if u.src[0].dtype.scalar() == dtypes.bool: return None
  return f"condition must be bool, got {u.src[0].dtype!r}"


def _int_or_bool(u: UOp) -> str | None:
  ok = all(dtypes.is_int(s.dtype) or s.dtype == dtypes.bool for s in u.src)
  return None if ok else f"{u.op.name} needs integer or bool sources"


def _float_only(u: UOp) -> str | None:
  return None if dtypes.is_float(u.dtype) else f"{u.op.name} needs a float dtype, got {u.dtype!r}"


def _arity(u: UOp) -> str | None:
  n = ARITY[u.op]
  return None if len(u.src) == n else f"takes {n} source(s), got {len(u.src)}"


def _bitcast_size(u: UOp) -> str | None:
  a, b = u.src[0].dtype.itemsize, u.dtype.itemsize
  if a == b: return None
  shape = u.src[0].shape
  if shape and isinstance(shape[-1], int) and (shape[-1] * a) % b == 0: return None
  return f"cannot reinterpret {u.src[0].dtype!r} as {u.dtype!r}: the byte count changes"


def _value_dtype(u: UOp) -> str | None:
  ok = u.dtype.scalar() != dtypes.void and u.dtype is u.dtype.base
  return None if ok else f"cannot {u.op.name.lower()} to {u.dtype!r}: not a value dtype"


INT_ONLY = frozenset({Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.CDIV, Ops.CMOD,
                      Ops.THREEFRY, Ops.DOT4})
FLOAT_ONLY = frozenset({Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.DIV})


def _elementwise_checks(op: Ops) -> tuple[tuple[str, Check], ...]:
  rules: list[tuple[str, Check]] = [("arity", _arity)]
  if op is Ops.WHERE: rules += [("bool condition", _where_cond)]
  if op in GroupOp.Binary or op in GroupOp.Ternary: rules += [("matching dtypes", _same_dtypes)]
  if op in INT_ONLY: rules += [("integer operands", _int_or_bool)]
  if op in FLOAT_ONLY: rules += [("float dtype", _float_only)]
  if op in (Ops.CAST, Ops.BITCAST): rules += [("value dtype", _value_dtype)]
  if op is Ops.BITCAST: rules += [("byte size", _bitcast_size)]
  return tuple(rules + [("broadcastable shapes", has_shape)])


# ---- sources and movement ----

def value_fits(dt: DType, a: object) -> bool:
  """`a` is a Python value a `dt` register holds exactly (bool, in-range int, rounded float)."""
  if dt == dtypes.bool: return isinstance(a, bool)
  if dtypes.is_int(dt): return type(a) is int and dt.min <= a <= dt.max
  if dtypes.is_float(dt):
    return isinstance(a, float) and (math.isnan(a) or truncate(dt, a) == a)
  return False


def _const_arg(u: UOp) -> str | None:
  a, dt = u.arg, u.dtype
  if isinstance(a, InvalidType): return None if dt == dtypes.index else "Invalid is an index value"
  if dt.count > 1: return f"CONST is scalar, got the vector dtype {dt!r}: use STACK"
  if value_fits(dt, a): return None
  return f"value {a!r} ({type(a).__name__}) does not fit {dt!r}: build it with UOp.const"


def _vconst_arg(u: UOp) -> str | None:
  if not isinstance(u.arg, tuple): return f"arg must be a tuple of values, got {u.arg!r}"
  bad = [a for a in u.arg if not value_fits(u.dtype.scalar(), a)]
  return f"values {bad} do not fit {u.dtype.scalar()!r}" if bad else None


def _param_bounds(u: UOp) -> str | None:
  if len(u.src) == 1: return None
  if u.src[0].op is not Ops.VCONST or u.src[0].arg != (): return "a bounded PARAM has shape ()"
  lo, hi = u.src[1], u.src[2]
  if lo.shape != () or hi.shape != () or lo.dtype != u.dtype or hi.dtype != u.dtype:
    return f"bounds must be ()-shaped {u.dtype!r} values"
  if lo.vmin > hi.vmax: return f"empty bounds [{lo.vmin}, {hi.vmax}]"
  value = u.arg.value if isinstance(u.arg, ParamArg) else None
  if value is None or lo.vmin <= value <= hi.vmax: return None
  return f"bound value {value} outside [{lo.vmin}, {hi.vmax}]"


def _param_dtype(u: UOp) -> str | None:
  if not isinstance(u.arg, ParamArg): return f"arg must be a ParamArg, got {u.arg!r}"
  return None if u.arg.dtype == u.dtype else f"arg dtype {u.arg.dtype!r} differs from {u.dtype!r}"


def _static(xs: tuple) -> bool: return all(isinstance(x, int) for x in xs)


def _reshape_size(u: UOp) -> str | None:
  old, new = u.src[0].shape, u.shape
  if _static(old) and _static(new) and math.prod(old) != math.prod(new):
    return f"cannot reshape {old} ({math.prod(old)} elements) to {new} ({math.prod(new)} elements)"
  return None


def _expand_rule(u: UOp) -> str | None:
  old, new = u.src[0].shape, u.shape
  if len(old) != len(new): return f"cannot expand {old} to {new}: ranks differ"
  bad = [i for i, (a, b) in enumerate(zip(old, new)) if not (a is b or a == b or a == 1)]
  return f"cannot expand {old} to {new}: axes {bad} are not 1 or equal" if bad else None


def _permute_rule(u: UOp) -> str | None:
  n = len(u.src[0].shape)
  ok = all(type(a) is int for a in u.arg) and sorted(u.arg) == list(range(n))
  return None if ok else f"{u.arg} is not a permutation of {n} axes"


def _flip_rule(u: UOp) -> str | None:
  ok = len(u.arg) == len(u.src[0].shape) and all(isinstance(f, bool) for f in u.arg)
  return None if ok else f"arg must be one bool per axis ({len(u.src[0].shape)}), got {u.arg!r}"


def _pad_shrink_rule(u: UOp) -> str | None:
  old, offs, new = u.src[0].shape, u.src[1].shape, u.shape
  if len(old) != len(new) or offs != (len(old),):
    return f"offsets and new shape must have one entry per axis of {old}"
  off = u.src[1].arg if u.src[1].op is Ops.VCONST else None
  if off is None or not (_static(old) and _static(new)): return None
  inner, outer = (new, old) if u.op is Ops.SHRINK else (old, new)
  bad = [i for i, (o, a, b) in enumerate(zip(off, inner, outer)) if o < 0 or o + a > b]
  return f"offsets {off} with {inner} do not fit in {outer} at axes {bad}" if bad else None


def _reduce_rule(u: UOp) -> str | None:
  a = u.arg
  if not isinstance(a, ReduceArg) or a.op not in GroupOp.Reduce:
    return f"arg must be ReduceArg(op in ADD/MUL/MAX, axes), got {a!r}"
  n = len(u.src[0].shape)
  bad = [x for x in a.axes if not 0 <= x < n]
  return f"axes {bad} out of range for {n} dims" if bad else None


def _index_rule(u: UOp) -> str | None:
  bad = [i for i, s in enumerate(u.src[1:], 1) if not dtypes.is_int(s.dtype)]
  return f"indices {bad} must be integers, got {[u.src[i].dtype for i in bad]}" if bad else None


def _stack_rule(u: UOp) -> str | None:
  if len({s.dtype for s in u.src}) > 1: return "sources must share a dtype"
  shapes = [s.shape for s in u.src]
  if all(s == shapes[0] for s in shapes): return None
  return f"sources must share a shape, got {shapes}"


def _axes_rule(u: UOp) -> str | None:
  n = len(u.src[0].shape)
  ok = isinstance(u.arg, tuple) and all(type(a) is int and 0 <= a < n for a in u.arg)
  return None if ok else f"arg must be a tuple of axes of {n} dims, got {u.arg!r}"


def _store_rule(u: UOp) -> str | None:
  if len(u.src) == 3 and u.src[2].dtype != dtypes.bool: return "the gate must be bool"
  if u.src[0].dtype != u.src[1].dtype:
    return f"buffer dtype {u.src[0].dtype!r} differs from value dtype {u.src[1].dtype!r}"
  a, b = u.src[0].shape, u.src[1].shape
  return None if a == b else f"buffer shape {a} differs from value shape {b}"


def _function_body(u: UOp) -> str | None:
  return None if u.src[0].op is Ops.TUPLE else f"body must be a TUPLE, got {u.src[0].op.name}"


def _gettuple_rule(u: UOp) -> str | None:
  f = u.src[0]
  if f.op is not Ops.FUNCTION: return f"source must be a FUNCTION, got {f.op.name}"
  ok = isinstance(u.arg, int) and 0 <= u.arg < len(f.src[0].src)
  return None if ok else f"index {u.arg!r} out of range for {len(f.src[0].src)} results"


def _dtype_is(dt: DType) -> Check:
  return lambda u: None if u.dtype == dt else f"dtype must be {dt!r}"


def _collective_rule(u: UOp) -> str | None:
  a = u.arg
  if not isinstance(a, CollectiveArg): return "arg must be a CollectiveArg"
  if a.kind not in COLLECTIVE_KINDS: return f"kind must be one of {COLLECTIVE_KINDS}"
  if (a.reduce is not None) != (a.kind in ("all_reduce", "reduce_scatter")):
    return "all_reduce and reduce_scatter (only) take a reduce op"
  if a.reduce is not None and a.reduce not in COLLECTIVE_REDUCES:
    return f"reduce must be one of {COLLECTIVE_REDUCES}"
  if not 0 <= a.rank < a.nranks: return "rank must lie in [0, nranks)"
  if a.phase not in COLLECTIVE_PHASES: return f"phase must be one of {COLLECTIVE_PHASES}"
  if a.phase and a.kind in ("send", "recv"): return "a send or recv has no start and wait phases"
  if len(u.src[0].shape) == 0: return "the source must have an axis 0"
  if a.kind == "reduce_scatter" and u.src[0].shape[0] % a.nranks:
    return "reduce_scatter needs axis 0 divisible by nranks"
  return None


_SHAPE1 = (("sources", nsrc(1)), ("shape", has_shape))
_tensor_checks: dict[Ops, tuple[tuple[str, Check], ...]] = {
  Ops.CONST: (("sources", nsrc(0)), ("value fits dtype", _const_arg)),
  Ops.VCONST: (("sources", nsrc(0)), ("values fit dtype", _vconst_arg)),
  Ops.BINARY: (("sources", nsrc(0)), ("bytes arg", arg_is(bytes, "bytes"))),
  Ops.BUFFER: (("sources", nsrc(1)), ("ParamArg", _param_dtype), ("shape", src_is_shape(0)),
               ("sizes", sizes_at(0))),
  Ops.PARAM: (("sources", nsrc(1, 3)), ("ParamArg", _param_dtype), ("shape", src_is_shape(0)),
              ("sizes", sizes_at(0)), ("bounds", _param_bounds)),
  Ops.BUFFER_VIEW: (("sources", nsrc(1)),),
  Ops.RESHAPE: (("sources", nsrc(2)), ("shape", src_is_shape(1)), ("sizes", sizes_at(1)),
                ("same size", _reshape_size)),
  Ops.EXPAND: (("sources", nsrc(2)), ("shape", src_is_shape(1)), ("sizes", sizes_at(1)),
               ("broadcast", _expand_rule)),
  Ops.PERMUTE: (("sources", nsrc(1)), ("tuple arg", arg_is(tuple, "a tuple of axes")),
                ("permutation", _permute_rule)),
  Ops.FLIP: (("sources", nsrc(1)), ("tuple arg", arg_is(tuple, "a tuple of bools")),
             ("flags", _flip_rule)),
  Ops.PAD: (("sources", nsrc(3)), ("shape", src_is_shape(1, 2)), ("sizes", sizes_at(2)),
            ("fits", _pad_shrink_rule)),
  Ops.SHRINK: (("sources", nsrc(3)), ("shape", src_is_shape(1, 2)), ("sizes", sizes_at(2)),
               ("fits", _pad_shrink_rule)),
  Ops.INDEX: (("sources", min_src(1)), ("integer indices", _index_rule), ("shape", has_shape)),
  Ops.STACK: (("sources", min_src(1)), ("same shapes", _stack_rule), ("shape", has_shape)),
  Ops.REPLICATED: (*_SHAPE1, ("axes", _axes_rule)),
  Ops.REDUCE: (("sources", nsrc(1)), ("ReduceArg", _reduce_rule)),
  Ops.FUNCTION: (("sources", min_src(1)), ("TUPLE body", _function_body)),
  Ops.CALL: (("sources", min_src(1)),),
  Ops.TUPLE: (),
  Ops.GETTUPLE: (("sources", nsrc(1)), ("index", _gettuple_rule)),
  Ops.COPY: (("sources", nsrc(1)),
             ("device arg", arg_is((str, tuple), "a device name or tuple of names"))),
  Ops.COLLECTIVE: (*_SHAPE1, ("CollectiveArg", _collective_rule)),
  Ops.STORE: (("sources", nsrc(2, 3)), ("void", _dtype_is(dtypes.void)), ("shapes", _store_rule)),
  Ops.AFTER: (("sources", min_src(1)),),
  Ops.GROUP: (("void", _dtype_is(dtypes.void)),),
  Ops.SINK: (("void", _dtype_is(dtypes.void)),),
  Ops.CONTIGUOUS: _SHAPE1, Ops.CONTIGUOUSBACKWARD: _SHAPE1, Ops.DETACH: _SHAPE1,
  Ops.NOOP: (),
  **{op: _elementwise_checks(op) for op in GroupOp.Elementwise},
}

spec_tensor = Spec("tensor", _tensor_checks)
