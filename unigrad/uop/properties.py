"""Derived properties of a UOp: dtype, shape, device, addrspace, min_max, axis and ranges.

One function per property, one case per row of the spec's "Derived Properties" table, in the
spec's order. Each function reads only the node's op, arg and its sources' (already cached)
properties; `UOp` caches the results per node and evaluates them iteratively, so deep graphs never
recurse. Where the table says "dtype range" for SUB, IDIV, MOD, AND and SHR, min_max uses a
tighter sound bound: the symbolic simplifier needs it to fold index arithmetic. Interval rules that
do arithmetic (ADD, MUL, MAX, comparisons) apply to integers and bools only: a float value may be
nan (inf*0, inf-inf), which no interval holds, so float arithmetic gets the dtype range. An
integer interval that leaves its dtype (the value may wrap) becomes the dtype range.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad.dtype import AddrSpace, DType, PtrDType, dtypes, truncate
from unigrad.uop.ops import GroupOp, InvalidType, Ops

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp, sint

Shape = tuple["sint", ...]

# ops whose dtype is void: effects and structure
VOID_OPS = GroupOp.Void
MEMORY_PASSTHROUGH = GroupOp.Movement | GroupOp.Marker | {Ops.INDEX, Ops.AFTER, Ops.STORE,
                                                          Ops.BUFFER_VIEW, Ops.REPLICATED}


# ---- dtype ----

def derive_dtype(op: Ops, src: tuple[UOp, ...], arg: Any) -> DType:
  """The dtype a node gets when the constructor is not given one."""
  if op in VOID_OPS: return dtypes.void
  if op in (Ops.BUFFER, Ops.PARAM): return arg.dtype
  if op is Ops.CAST or op is Ops.BITCAST:
    if isinstance(arg, DType): return arg
    raise TypeError(f"{op!r} needs its target dtype: UOp({op!r}, dtype, (x,))")
  if op in (Ops.CONST, Ops.VCONST, Ops.SOURCE, Ops.CUSTOM, Ops.INS, Ops.CUSTOMFUNCTION):
    raise TypeError(f"{op!r} needs an explicit dtype")
  if op is Ops.BINARY: return dtypes.uint8
  if op is Ops.BUFFER_VIEW and isinstance(arg, tuple) and isinstance(arg[1], DType): return arg[1]
  if op in GroupOp.Comparison: return dtypes.bool.vec(src[0].dtype.count) if src else dtypes.bool
  if op in (Ops.RANGE, Ops.SPECIAL):  # index until lowered, then the bound's integer type
    return src[0].dtype if src else dtypes.index
  if op is Ops.GETADDR: return dtypes.index
  if op is Ops.WHERE: return src[1].dtype
  if op is Ops.GETTUPLE: return tuple_element(src[0], arg).dtype
  if op is Ops.WMMA: return src[2].dtype
  if op is Ops.GEP: return src[0].dtype.scalar().vec(len(arg) if isinstance(arg, tuple) else 1)
  if not src: raise TypeError(f"{op!r} has no sources to take a dtype from")
  return src[0].dtype


def tuple_element(t: UOp, i: int) -> UOp:
  """Element `i` of a TUPLE, or of the TUPLE body of a FUNCTION or CALL (GETTUPLE's source)."""
  body = t.src[0] if t.op in GroupOp.Call else t
  if body.op is not Ops.TUPLE:
    raise ValueError(f"GETTUPLE needs a TUPLE (or a call of one), got {body.op!r}")
  if not isinstance(i, int) or not 0 <= i < len(body.src):
    raise ValueError(f"GETTUPLE index {i!r} out of range for {len(body.src)} elements")
  return body.src[i]


# ---- shape ----

def as_shape(u: UOp) -> Shape:
  """Read a (k,)-shaped index UOp (VCONST or STACK of scalars) as a shape tuple."""
  if u.op is Ops.VCONST: return tuple(u.arg)
  if u.op is Ops.STACK: return tuple(s.sintify() for s in u.src)
  if u.op is Ops.CONST and isinstance(u.arg, int): return (u.arg,)
  raise ValueError(f"expected a shape (VCONST or STACK of index values), got {u.op!r}")


_INT = frozenset({int})


def broadcast_shapes(*shapes: Shape) -> Shape:
  """Right-align the shapes and take the element-wise max; each axis must be equal or 1."""
  if shapes and all(s == shapes[0] for s in shapes[1:]): return tuple(shapes[0])  # the usual case
  arrays = [s for s in shapes if len(s)]  # the others are scalars: they broadcast to anything
  if arrays and len(arrays) < len(shapes) and all(s == arrays[0] for s in arrays[1:]):
    return tuple(arrays[0])
  n = max(len(s) for s in shapes)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
  if all(set(map(type, s)) <= _INT for s in padded):  # static sizes: each axis's max, if it fits
    out_static = tuple(map(max, *padded)) if len(padded) > 1 else padded[0]
    if all(d == o or d == 1 for s in padded for d, o in zip(s, out_static)): return out_static
  out: list[sint] = []
  for axis, dims in enumerate(zip(*padded)):
    sizes = {d for d in dims if not (isinstance(d, int) and d == 1)}
    if len(sizes) > 1:
      raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast: "
                       f"axis {axis - n} has sizes {sorted(map(str, sizes))}")
    out.append(sizes.pop() if sizes else 1)
  return tuple(out)


def _reduce_shape(u: UOp) -> Shape | None:
  if len(u.src) > 1: return u.src[0].shape  # kernel form: REDUCE(value, *ranges)
  s = u.src[0].shape
  return tuple(1 if i in u.arg.axes else d for i, d in enumerate(s))


def _collective_shape(u: UOp) -> Shape | None:
  """all_gather joins the ranks' tensors along axis 0, reduce_scatter keeps this rank's part of
  axis 0; the other collectives keep the shape."""
  shape, arg = u.src[0].shape, u.arg
  if arg.kind == "all_gather": return (shape[0] * arg.nranks, *shape[1:])
  if arg.kind == "reduce_scatter": return (shape[0] // arg.nranks, *shape[1:])
  return shape


def _bitcast_shape(u: UOp) -> Shape | None:
  s, src_size, dst_size = u.src[0].shape, u.src[0].dtype.itemsize, u.dtype.itemsize
  if s is None or src_size == dst_size or not s: return s
  return (*s[:-1], s[-1] * src_size // dst_size)


def _call_shape(call: UOp, shape: Shape | None) -> Shape | None:
  """`shape` (from a FUNCTION/CALL body) with each PARAM k it mentions replaced by argument k."""
  if shape is None or all(isinstance(d, int) for d in shape): return shape
  args = call.src[1:]
  out: list[sint] = []
  for d in shape:
    if isinstance(d, int):
      out.append(d)
      continue
    params = {p: args[p.arg.slot] for p in d.toposort()
              if p.op is Ops.PARAM and 0 <= p.arg.slot < len(args)}
    out.append(d.substitute(params).simplify().sintify() if params else d)
  return tuple(out)


def _index_shape(u: UOp) -> Shape | None:
  base = u.src[0].shape
  if base is None: return None
  idx_shapes = [i.shape for i in u.src[1:]]
  if len(idx_shapes) > len(base) and base: return None
  out: list[sint] = []
  for s in idx_shapes: out.extend(s or ())
  return (*out, *base[len(idx_shapes):]) if base else ()


def _alu_shape(u: UOp) -> Shape | None:
  src = u.src
  first = src[0].shape
  if first is not None:
    for s in src[1:]:  # a loop, not all(...): a generator per node was a third of the rule
      if s.shape != first: break
    else: return first
  shapes = [s.shape for s in u.src]
  if any(s is None for s in shapes): return None
  return broadcast_shapes(*shapes)


def _source_shape(u: UOp) -> Shape | None: return u.src[0].shape


def _no_axes(u: UOp) -> Shape: return ()


def _stack_shape(u: UOp) -> Shape | None:
  inner = u.src[0].shape
  return (len(u.src), *inner) if inner is not None else None


def _gettuple_shape(u: UOp) -> Shape | None:
  t = u.src[0]
  shape = tuple_element(t, u.arg).shape
  return _call_shape(t, shape) if t.op in GroupOp.Call else shape


# op -> its shape rule, the rows of the spec table in its order (a table: one dict lookup per node,
# where a chain of `op is Ops.X` tests paid a slow enum attribute lookup per row on Python 3.11)
SHAPE_RULES: dict[Ops, Callable[[UOp], Shape | None]] = {
  Ops.BUFFER: lambda u: as_shape(u.src[0]) if u.src else (),
  Ops.PARAM: lambda u: as_shape(u.src[0]) if u.src else (),
  Ops.BUFFER_VIEW: lambda u: (u.arg[0],),
  **dict.fromkeys((Ops.CONST, Ops.RANGE, Ops.SPECIAL, Ops.GETADDR), _no_axes),
  Ops.VCONST: lambda u: (len(u.arg),),
  Ops.BINARY: lambda u: (len(u.arg),),
  Ops.PERMUTE: lambda u: tuple(u.src[0].shape[i] for i in u.arg),
  Ops.FLIP: _source_shape,
  Ops.RESHAPE: lambda u: as_shape(u.src[1]),
  Ops.EXPAND: lambda u: as_shape(u.src[1]),
  Ops.PAD: lambda u: as_shape(u.src[2]),
  Ops.SHRINK: lambda u: as_shape(u.src[2]),
  Ops.INDEX: _index_shape,
  Ops.STACK: _stack_shape,
  Ops.REPLICATED: lambda u: tuple(1 if i in u.arg else d for i, d in enumerate(u.src[0].shape)),
  Ops.REDUCE: _reduce_shape,
  Ops.BITCAST: _bitcast_shape,
  Ops.COLLECTIVE: _collective_shape,
  **dict.fromkeys((Ops.CAST, Ops.COPY, Ops.AFTER, Ops.LOAD, Ops.DETACH, Ops.CONTIGUOUS,
                   Ops.CONTIGUOUSBACKWARD), _source_shape),
  Ops.GEP: _no_axes,
  **dict.fromkeys(GroupOp.ALU, _alu_shape),
  Ops.GETTUPLE: _gettuple_shape,
  **dict.fromkeys(GroupOp.Call, lambda u: _call_shape(u, u.src[0].shape)),
  Ops.STORE: _no_axes,
  Ops.WMMA: lambda u: u.src[2].shape,
}


def derive_shape(u: UOp) -> Shape | None:
  """The shape of a node, or None for nodes that are not values (SINK, TUPLE, ...)."""
  rule = SHAPE_RULES.get(u.op)
  return None if rule is None else rule(u)


# ---- device ----

def _load_arg(arg: Any) -> tuple[Any, AddrSpace | None]:
  """LOAD's arg read as (device or None, addrspace or None): a device, an AddrSpace, or both."""
  if isinstance(arg, AddrSpace): return (None, arg)
  if isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[1], AddrSpace): return arg
  if isinstance(arg, str) or isinstance(arg, tuple) and all(isinstance(d, str) for d in arg):
    return (arg, None)
  return (None, None)


def derive_device(u: UOp) -> str | tuple[str, ...] | None:
  """BUFFER/PARAM/COPY/LOAD from the arg, constants and ranges None, calls the first argument
  with a device, anything else the first source with a device."""
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return u.arg.device
  if op in (Ops.CONST, Ops.VCONST, Ops.RANGE, Ops.BINARY, Ops.SPECIAL): return None
  if op is Ops.COPY: return u.arg
  if op is Ops.LOAD and (dev := _load_arg(u.arg)[0]) is not None: return dev
  if op in GroupOp.Call: return next((s.device for s in u.src[1:] if s.device), None)
  return next((s.device for s in u.src if s.device is not None), None)


# ---- addrspace ----

def derive_addrspace(u: UOp) -> AddrSpace:
  """Where the value lives: BUFFER/PARAM/LOAD from the arg, COPY in GLOBAL memory, views and
  markers where their source lives, computed values in REG."""
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return u.arg.addrspace
  if op is Ops.LOAD: return _load_arg(u.arg)[1] or AddrSpace.REG
  if op in (Ops.COPY, Ops.COLLECTIVE): return AddrSpace.GLOBAL
  if op in MEMORY_PASSTHROUGH: return u.src[0].addrspace
  return AddrSpace.REG


# ---- grad_free ----

_GRAD_LEAVES = frozenset({Ops.BUFFER, Ops.PARAM})  # leaves a gradient can be asked of


def derive_grad_free(u: UOp) -> bool:
  """Whether no gradient can flow from this node to a buffer or placeholder: a DETACH, a value
  that is not a float, a constant, or a node made only of such. Ops built under no_grad need no
  DETACH of their own then (an optimizer step's chain of updates made one per op)."""
  if u.op is Ops.DETACH or not (u.dtype == dtypes.void or dtypes.is_float(u.dtype)): return True
  if u.op in _GRAD_LEAVES: return False
  return all(s.grad_free for s in u.src)


# ---- min_max ----

# ops whose values are some of their first source's values
MIN_MAX_PASSTHROUGH = GroupOp.Movement | GroupOp.Marker | {Ops.INDEX, Ops.REPLICATED, Ops.AFTER,
                                                           Ops.COPY}

def dtype_range(dt: DType) -> tuple[Any, Any]:
  """[dtype_min, dtype_max] (of each lane for a vector); (-inf, inf) for void and pointers."""
  if isinstance(dt, PtrDType) or dt.scalar() == dtypes.void: return (-math.inf, math.inf)
  return (dt.min, dt.max)


def _fit(dt: DType, lo: Any, hi: Any) -> tuple[Any, Any]:
  """(lo, hi) if it is a valid interval inside dt's range, else dt's whole range."""
  if dt == dtypes.bool: return (bool(lo), bool(hi))
  full = dtype_range(dt)
  if _is_nan(lo) or _is_nan(hi): return full
  if lo > hi or lo < full[0] or hi > full[1]: return full
  return (lo, hi)


def _mm_mul(a: tuple, b: tuple) -> tuple:
  corners = []
  for x in a:
    for y in b:
      corners.append(0 if (x == 0 or y == 0) else x * y)
  return (min(corners), max(corners))


def _mm_idiv(x: tuple, d: tuple) -> tuple | None:
  if d[0] != d[1] or d[0] == 0: return None
  c = d[0]
  lo, hi = (x[0] // c, x[1] // c)
  return (min(lo, hi), max(lo, hi))


def _mm_mod(x: tuple, d: tuple) -> tuple | None:
  if d[0] != d[1] or d[0] == 0: return None
  c = d[0]
  if c > 0 and x[0] // c == x[1] // c: return (x[0] % c, x[1] % c)
  return (0, c - 1) if c > 0 else (c + 1, 0)


def _mm_and(x: tuple, m: tuple) -> tuple | None:
  """x & m for a constant mask m >= 0: inside [0, min(x, m)]; x itself when m is all ones
  above x."""
  if m[0] != m[1] or m[0] < 0: return None
  c = m[0]
  if x[0] == x[1]: return (x[0] & c, x[0] & c)
  if x[0] < 0: return (0, c)
  if x[1] <= c and c & (c + 1) == 0: return x
  return (0, min(c, x[1]))


# decomposed comparisons as (primitive, swap operands, negate)
_CMP_FORM = {Ops.CMPLT: (Ops.CMPLT, False, False), Ops.CMPNE: (Ops.CMPNE, False, False),
             Ops.CMPGT: (Ops.CMPLT, True, False), Ops.CMPGE: (Ops.CMPLT, False, True),
             Ops.CMPLE: (Ops.CMPLT, True, True), Ops.CMPEQ: (Ops.CMPNE, False, True)}


def _mm_cmp(op: Ops, a: tuple, b: tuple) -> tuple[bool, bool]:
  prim, swap, negate = _CMP_FORM[op]
  if swap: a, b = b, a
  out = (False, True)
  if prim is Ops.CMPLT:
    if a[1] < b[0]: out = (True, True)
    elif a[0] >= b[1]: out = (False, False)
  elif a[1] < b[0] or b[1] < a[0]: out = (True, True)
  elif a[0] == a[1] == b[0] == b[1]: out = (False, False)
  return (not out[1], not out[0]) if negate else out


def _mm_alu(u: UOp) -> tuple:
  op, src = u.op, u.src
  if op is not Ops.WHERE and any(dtypes.is_float(s.dtype) for s in src): return dtype_range(u.dtype)
  mm = [s.min_max for s in src]
  if op in GroupOp.Comparison: return _mm_cmp(op, mm[0], mm[1])
  if op is Ops.WHERE:
    c = mm[0]
    if c[0] == c[1]: return mm[1] if c[0] else mm[2]
    if _is_invalid(src[2]): return mm[1]
    if _is_invalid(src[1]): return mm[2]
    return (min(mm[1][0], mm[2][0]), max(mm[1][1], mm[2][1]))
  ret: tuple | None = None
  if op is Ops.ADD: ret = (mm[0][0] + mm[1][0], mm[0][1] + mm[1][1])
  elif op is Ops.SUB: ret = (mm[0][0] - mm[1][1], mm[0][1] - mm[1][0])
  elif op is Ops.MUL: ret = _mm_mul(mm[0], mm[1])
  elif op is Ops.MAX: ret = (max(mm[0][0], mm[1][0]), max(mm[0][1], mm[1][1]))
  elif op is Ops.NEG: ret = (-mm[0][1], -mm[0][0])
  elif op is Ops.IDIV and dtypes.is_int(u.dtype): ret = _mm_idiv(mm[0], mm[1])
  elif op is Ops.MOD and dtypes.is_int(u.dtype): ret = _mm_mod(mm[0], mm[1])
  elif op in (Ops.CDIV, Ops.CMOD) and dtypes.is_int(u.dtype) and mm[0][0] >= 0 and mm[1][0] > 0:
    ret = (_mm_idiv if op is Ops.CDIV else _mm_mod)(mm[0], mm[1])  # C and floor forms agree here
  elif op is Ops.AND and dtypes.is_int(u.dtype): ret = _mm_and(mm[0], mm[1])
  elif op is Ops.SHR and dtypes.is_int(u.dtype): ret = _mm_shr(mm[0], mm[1])
  if ret is None: return dtype_range(u.dtype)
  return _fit(u.dtype, *ret)


def _mm_shr(x: tuple, s: tuple) -> tuple | None:
  """x >> s for x >= 0 and a constant shift s >= 0 (monotone in x)."""
  if s[0] != s[1] or s[0] < 0 or x[0] < 0: return None
  return (x[0] >> s[0], x[1] >> s[0])


def _mm_cast(u: UOp) -> tuple:
  lo, hi = u.src[0].min_max
  if u.dtype == dtypes.bool:
    return (False, True) if lo <= 0 <= hi and lo != hi else (bool(lo), bool(hi))
  full = dtype_range(u.dtype)
  if dtypes.is_float(u.dtype): return (truncate(u.dtype, lo), truncate(u.dtype, hi))
  if not (math.isfinite(lo) and math.isfinite(hi)) or lo < full[0] or hi > full[1]: return full
  return (math.trunc(lo), math.trunc(hi))


def derive_min_max(u: UOp) -> tuple[Any, Any]:
  """The interval every value of the node lies in (inclusive)."""
  op = u.op
  if op is Ops.CONST:
    return dtype_range(u.dtype) if isinstance(u.arg, InvalidType) else (u.arg, u.arg)
  if op is Ops.VCONST: return (min(u.arg), max(u.arg)) if u.arg else dtype_range(u.dtype)
  if op is Ops.PARAM and len(u.src) >= 3: return (u.src[1].min_max[0], u.src[2].min_max[1])
  if op in MIN_MAX_PASSTHROUGH: return u.src[0].min_max
  if op is Ops.STACK:
    mms = [s.min_max for s in u.src]
    return (min(m[0] for m in mms), max(m[1] for m in mms))
  if op is Ops.CAST: return _mm_cast(u)
  if op in (Ops.RANGE, Ops.SPECIAL): return (0, max(0, u.src[0].min_max[1] - 1))
  if op in GroupOp.ALU: return _mm_alu(u)
  return dtype_range(u.dtype)


# ---- axis (multi-device shard axis) ----

def _reshape_axis(u: UOp) -> int | None:
  """The new axis that splits the elements like the old shard axis did: the same number of
  elements before it, and a size the devices divide (merging the shard axis with inner axes,
  as `reduce_scatter` does, is fine)."""
  ax, old, new = u.src[0].axis, u.src[0].shape, u.shape
  if ax is None: return None
  if not all(isinstance(d, int) for d in (*old, *new)):
    return next((i for i, d in enumerate(new) if d is old[ax] and new[:i] == old[:ax]), None)
  ndev = len(u.device) if isinstance(u.device, tuple) else old[ax]
  before = math.prod(old[:ax])
  acc = 1
  for i, d in enumerate(new):
    if acc == before and d != 0 and d % ndev == 0: return i
    acc *= d
  raise ValueError(f"reshape {old} -> {new} moves the shard boundary of axis {ax}")


def derive_axis(u: UOp) -> int | None:
  """The axis a multi-device value is split along (None: whole on each device, or one device)."""
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return 0 if isinstance(u.arg.device, tuple) else None
  if op is Ops.COPY: return 0 if isinstance(u.arg, tuple) else None
  if op is Ops.RESHAPE: return _reshape_axis(u)
  if op is Ops.PERMUTE:
    ax = u.src[0].axis
    return None if ax is None else u.arg.index(ax)
  if op is Ops.INDEX: return _index_axis(u)
  if op is Ops.STACK:
    ax = u.src[0].axis
    return None if ax is None else ax + 1
  if op is Ops.REDUCE:
    ax = u.src[0].axis
    return None if ax is None or ax in u.arg.axes else ax
  if op is Ops.REPLICATED:
    ax = u.src[0].axis
    return None if ax is None or ax in u.arg else ax
  if op in GroupOp.Elementwise or op in GroupOp.Movement or op in GroupOp.Marker or op is Ops.AFTER:
    return next((s.axis for s in u.src if s.axis is not None), None)
  return None


def _index_axis(u: UOp) -> int | None:
  """Indexing the shard axis loses it; indices before it shift it by the dims they leave."""
  ax, idx = u.src[0].axis, u.src[1:]
  if ax is None or ax < len(idx): return None
  return ax - len(idx) + sum(len(i.shape or ()) for i in idx)


# ---- ranges ----

# where the closed ranges start in src, for ops that close loops
RANGE_START = {Ops.END: 1, Ops.REDUCE: 1, Ops.GEP: 1}  # GEP(x, r): a lane of x's vector range r


def derive_ranges(u: UOp) -> dict[UOp, None]:
  """The RANGEs open at this node: those of its sources, minus the ones it closes (`UOp.ranges`
  adds a RANGE itself)."""
  out: dict[UOp, None] = {}
  start = RANGE_START.get(u.op)
  for s in u.src if start is None else u.src[:start]: out.update(s.ranges)
  if start is not None:
    for r in u.src[start:]:
      if r.op is Ops.RANGE: out.pop(r, None)
  return out


def _is_invalid(u: UOp) -> bool: return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


def _is_nan(x: Any) -> bool: return isinstance(x, float) and math.isnan(x)
