"""Derived properties of a UOp: dtype, shape, device, addrspace, min_max, axis and ranges.

One function per property, one case per row of the spec's "Derived Properties" table, in the
spec's order. Each function reads only the node's op, arg and its sources' (already cached)
properties; `UOp` caches the results per node and evaluates them iteratively, so deep graphs never
recurse. Where the table says "dtype range" for IDIV, MOD, AND and SHR, min_max uses a tighter
sound bound: the symbolic simplifier needs it to fold index arithmetic.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from unigrad.dtype import AddrSpace, DType, dtypes, truncate
from unigrad.uop.ops import GroupOp, InvalidType, Ops

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp, sint

Shape = tuple["sint", ...]

# ops whose dtype is void: effects and structure
VOID_OPS = GroupOp.Void
MEMORY_PASSTHROUGH = GroupOp.Movement | {Ops.INDEX, Ops.AFTER, Ops.STORE, Ops.BUFFER_VIEW}


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
  if op in GroupOp.Comparison: return dtypes.bool
  if op in (Ops.RANGE, Ops.SPECIAL, Ops.GETADDR): return dtypes.index
  if op is Ops.WHERE: return src[1].dtype
  if op is Ops.GETTUPLE: return src[0].src[0].src[arg].dtype
  if op is Ops.WMMA: return src[2].dtype
  if not src: raise TypeError(f"{op!r} has no sources to take a dtype from")
  return src[0].dtype


# ---- shape ----

def as_shape(u: UOp) -> Shape:
  """Read a (k,)-shaped index UOp (VCONST or STACK of scalars) as a shape tuple."""
  if u.op is Ops.VCONST: return tuple(u.arg)
  if u.op is Ops.STACK: return tuple(s.sintify() for s in u.src)
  if u.op is Ops.CONST and isinstance(u.arg, int): return (u.arg,)
  raise ValueError(f"expected a shape (VCONST or STACK of index values), got {u.op!r}")


def broadcast_shapes(*shapes: Shape) -> Shape:
  """Right-align the shapes and take the element-wise max; each axis must be equal or 1."""
  n = max(len(s) for s in shapes)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
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


def _bitcast_shape(u: UOp) -> Shape | None:
  s, src_size, dst_size = u.src[0].shape, u.src[0].dtype.itemsize, u.dtype.itemsize
  if s is None or src_size == dst_size or not s: return s
  return (*s[:-1], s[-1] * src_size // dst_size)


def _index_shape(u: UOp) -> Shape | None:
  base = u.src[0].shape
  if base is None: return None
  idx_shapes = [i.shape for i in u.src[1:]]
  if len(idx_shapes) > len(base) and base: return None
  out: list[sint] = []
  for s in idx_shapes: out.extend(s or ())
  return (*out, *base[len(idx_shapes):]) if base else ()


def derive_shape(u: UOp) -> Shape | None:
  """The shape of a node, or None for nodes that are not values (SINK, TUPLE, ...)."""
  op, src = u.op, u.src
  if op in (Ops.BUFFER, Ops.PARAM): return as_shape(src[0]) if src else ()
  if op is Ops.BUFFER_VIEW: return (u.arg[0],)
  if op in (Ops.CONST, Ops.RANGE, Ops.SPECIAL, Ops.GETADDR): return ()
  if op is Ops.VCONST: return (len(u.arg),)
  if op is Ops.BINARY: return (len(u.arg),)
  if op is Ops.PERMUTE: return tuple(src[0].shape[i] for i in u.arg)
  if op is Ops.FLIP: return src[0].shape
  if op in (Ops.RESHAPE, Ops.EXPAND): return as_shape(src[1])
  if op in (Ops.PAD, Ops.SHRINK): return as_shape(src[2])
  if op is Ops.INDEX: return _index_shape(u)
  if op is Ops.STACK: return (len(src), *src[0].shape) if src[0].shape is not None else None
  if op is Ops.REPLICATED: return tuple(1 if i in u.arg else d for i, d in enumerate(src[0].shape))
  if op is Ops.REDUCE: return _reduce_shape(u)
  if op is Ops.BITCAST: return _bitcast_shape(u)
  if op in (Ops.CAST, Ops.COPY, Ops.AFTER, Ops.LOAD, Ops.DETACH, Ops.CONTIGUOUS,
            Ops.CONTIGUOUSBACKWARD, Ops.GEP): return src[0].shape if op is not Ops.GEP else ()
  if op in GroupOp.ALU: return _alu_shape(u)
  if op is Ops.GETTUPLE: return src[0].src[0].src[u.arg].shape
  if op is Ops.STORE: return ()
  if op is Ops.WMMA: return src[2].shape
  return None


def _alu_shape(u: UOp) -> Shape | None:
  shapes = [s.shape for s in u.src]
  if any(s is None for s in shapes): return None
  if all(s == shapes[0] for s in shapes[1:]): return shapes[0]
  return broadcast_shapes(*shapes)


# ---- device ----

def derive_device(u: UOp) -> str | tuple[str, ...] | None:
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return u.arg.device
  if op in (Ops.CONST, Ops.VCONST, Ops.RANGE, Ops.BINARY, Ops.SPECIAL): return None
  if op is Ops.COPY: return u.arg
  if op in (Ops.FUNCTION, Ops.CALL): return next((s.device for s in u.src[1:] if s.device), None)
  return next((s.device for s in u.src if s.device is not None), None)


# ---- addrspace ----

def derive_addrspace(u: UOp) -> AddrSpace:
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return u.arg.addrspace
  if op is Ops.LOAD: return u.arg if isinstance(u.arg, AddrSpace) else AddrSpace.REG
  if op in MEMORY_PASSTHROUGH: return u.src[0].addrspace
  return AddrSpace.REG


# ---- min_max ----

def dtype_range(dt: DType) -> tuple[Any, Any]:
  if dt == dtypes.void or dt.count > 1 or dt.fmt is None and dt not in (dtypes.index, dtypes.bfloat16):
    return (-math.inf, math.inf)
  return (dt.min, dt.max)


def _fit(dt: DType, lo: Any, hi: Any) -> tuple[Any, Any]:
  """(lo, hi) if it is a valid interval inside dt's range, else dt's whole range."""
  if dt == dtypes.bool: return (bool(lo), bool(hi))
  full = dtype_range(dt)
  if isinstance(lo, float) and math.isnan(lo) or isinstance(hi, float) and math.isnan(hi): return full
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


def _mm_cmp(op: Ops, a: tuple, b: tuple) -> tuple[bool, bool]:
  if op is Ops.CMPLT:
    if a[1] < b[0]: return (True, True)
    if a[0] >= b[1]: return (False, False)
  elif op is Ops.CMPNE:
    if a[1] < b[0] or b[1] < a[0]: return (True, True)
    if a[0] == a[1] == b[0] == b[1]: return (False, False)
  return (False, True)


def _mm_alu(u: UOp) -> tuple:
  op, src = u.op, u.src
  if op is not Ops.WHERE and any(dtypes.is_float(s.dtype) for s in src): return dtype_range(u.dtype)
  mm = [s.min_max for s in src]
  if op in (Ops.CMPLT, Ops.CMPNE): return _mm_cmp(op, mm[0], mm[1])
  if op is Ops.WHERE:
    c = mm[0]
    if c[0] == c[1]: return mm[1] if c[0] else mm[2]
    if _is_invalid(src[2]): return mm[1]
    if _is_invalid(src[1]): return mm[2]
    return (min(mm[1][0], mm[2][0]), max(mm[1][1], mm[2][1]))
  ret: tuple | None = None
  if op is Ops.ADD: ret = (mm[0][0] + mm[1][0], mm[0][1] + mm[1][1])
  elif op is Ops.MUL: ret = _mm_mul(mm[0], mm[1])
  elif op is Ops.MAX: ret = (max(mm[0][0], mm[1][0]), max(mm[0][1], mm[1][1]))
  elif op is Ops.NEG: ret = (-mm[0][1], -mm[0][0])
  elif op is Ops.IDIV and dtypes.is_int(u.dtype): ret = _mm_idiv(mm[0], mm[1])
  elif op is Ops.MOD and dtypes.is_int(u.dtype): ret = _mm_mod(mm[0], mm[1])
  elif op is Ops.AND and dtypes.is_int(u.dtype) and mm[1][0] == mm[1][1] and mm[1][0] >= 0:
    ret = (0, mm[1][0]) if mm[0][0] < 0 or mm[1][0] < mm[0][1] else mm[0]
  elif op is Ops.SHR and dtypes.is_int(u.dtype) and mm[1][0] == mm[1][1] and mm[0][0] >= 0:
    ret = (mm[0][0] >> mm[1][0], mm[0][1] >> mm[1][0])
  if ret is None: return dtype_range(u.dtype)
  return _fit(u.dtype, *ret)


def _mm_cast(u: UOp) -> tuple:
  lo, hi = u.src[0].min_max
  if u.dtype == dtypes.bool: return (False, True) if lo <= 0 <= hi and lo != hi else (bool(lo), bool(hi))
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
  if op in GroupOp.Movement or op in (Ops.INDEX, Ops.AFTER, Ops.COPY, Ops.DETACH, Ops.CONTIGUOUS,
                                      Ops.CONTIGUOUSBACKWARD):
    return u.src[0].min_max
  if op is Ops.STACK:
    mms = [s.min_max for s in u.src]
    return (min(m[0] for m in mms), max(m[1] for m in mms))
  if op is Ops.CAST: return _mm_cast(u)
  if op in (Ops.RANGE, Ops.SPECIAL): return (0, max(0, u.src[0].min_max[1] - 1))
  if op in GroupOp.ALU: return _mm_alu(u)
  return dtype_range(u.dtype)


# ---- axis (multi-device shard axis) ----

def _reshape_axis(u: UOp) -> int | None:
  ax, old, new = u.src[0].axis, u.src[0].shape, u.shape
  if ax is None: return None
  before = math.prod(old[:ax])
  acc = 1
  for i, d in enumerate(new):
    if acc == before and d == old[ax]: return i
    acc *= d
  raise ValueError(f"reshape {old} -> {new} moves the shard boundary of axis {ax}")


def derive_axis(u: UOp) -> int | None:
  op = u.op
  if op in (Ops.BUFFER, Ops.PARAM): return 0 if isinstance(u.arg.device, tuple) else None
  if op is Ops.COPY: return 0 if isinstance(u.arg, tuple) else None
  if op is Ops.RESHAPE: return _reshape_axis(u)
  if op is Ops.PERMUTE:
    ax = u.src[0].axis
    return None if ax is None else u.arg.index(ax)
  if op is Ops.REDUCE:
    ax = u.src[0].axis
    return None if ax is None or ax in u.arg.axes else ax
  if op is Ops.REPLICATED:
    ax = u.src[0].axis
    return None if ax is None or ax in u.arg else ax
  if op in GroupOp.Elementwise or op in GroupOp.Movement or op in (Ops.CONTIGUOUS, Ops.DETACH,
                                                                   Ops.AFTER, Ops.INDEX):
    return next((s.axis for s in u.src if s.axis is not None), None)
  return None


# ---- ranges ----

# where the closed ranges start in src, for ops that close loops
RANGE_START = {Ops.END: 1, Ops.REDUCE: 1}


def derive_ranges(u: UOp) -> dict[UOp, None]:
  """The RANGEs open at this node: those of its sources, minus the ones it closes."""
  if u.op is Ops.RANGE: return {u: None}
  out: dict[UOp, None] = {}
  start = RANGE_START.get(u.op)
  for s in u.src if start is None else u.src[:start]: out.update(s.ranges)
  if start is not None:
    for r in u.src[start:]:
      if r.op is Ops.RANGE: out.pop(r, None)
  return out


def _is_invalid(u: UOp) -> bool: return u.op is Ops.CONST and isinstance(u.arg, InvalidType)
