"""Indexing: movement ops become index arithmetic on RANGEs (the rules of rangeify).

Consumes: `INDEX(x, *idx)` over a tensor-graph node x (PARAMs, movement ops, ALU, tensor-graph
REDUCE(axes), AFTER, CONTIGUOUS) with one index expression per axis of x.
Produces: x's scalar value at idx, one step closer to buffers and constants (`pm_rangeify`, run
bottom-up until no INDEX of a tensor-graph node is left): a RESHAPE/PERMUTE/EXPAND/FLIP/SHRINK
rewrites the index, a PAD gates it (`WHERE(valid, idx, Invalid)`) and the value
(`WHERE(valid, x, 0)`), an elementwise op indexes its sources, a REDUCE opens fresh REDUCE
ranges (`REDUCE(value, *ranges)`), a realized node reads its buffer.
Invariants: a realized node is read from the buffer that holds it, and that buffer's kernel was
built before (schedule/rangeify.py builds kernels sources first): indexing never builds a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from unigrad.codegen.expand import identity_element
from unigrad.dtype import dtypes
from unigrad.schedule.callify import buffer_view
from unigrad.uop import AxisType, GroupOp, Invalid, Ops, PatternMatcher, ReduceArg, UOp, UPat
from unigrad.uop import graph_rewrite
from unigrad.uop.properties import as_shape
from unigrad.uop.symbolic import pm_invalid

VIEW_OPS = GroupOp.Movement


@dataclass
class Kernel:
  """One kernel: its AST (over body PARAMs and intermediates) and what it reads and writes."""
  ast: UOp
  key: UOp  # the realized node (or STORE) this kernel computes
  writes: UOp  # the PARAM written
  reads: set[UOp] = field(default_factory=set)  # PARAMs read
  deps: set[int] = field(default_factory=set)  # kernels whose results it reads (RAW)


@dataclass
class RangeifyCtx:
  """State of one rangeify run: realized nodes, their buffers, the kernels made so far."""
  nargs: int
  device: str
  realize: set[UOp] = field(default_factory=set)
  buffers: dict[UOp, UOp] = field(default_factory=dict)  # realized node -> PARAM holding it
  producer: dict[UOp, int] = field(default_factory=dict)  # realized node / STORE -> kernel index
  kernels: list[Kernel] = field(default_factory=list)
  next_range: int = 0
  current: Kernel | None = None

  def new_range(self, size: int, axis_type: AxisType) -> UOp:
    self.next_range += 1
    return UOp.range(size, self.next_range, axis_type)


def _strides(shape: tuple[int, ...]) -> list[int]:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= s
  return out[::-1]


def _flat(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  out: UOp = UOp.const(dtypes.index, 0)
  for i, st in zip(idx, _strides(shape)): out = out + i * st
  return out


def index_reshape(r: UOp, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Flatten the output index row-major, then peel the source dims off with // and %."""
  src_shape = tuple(r.src[0].shape)
  flat = _flat(idx, tuple(r.shape))
  out: list[UOp] = []
  for k, (st, s) in enumerate(zip(_strides(src_shape), src_shape)):
    if s == 1:
      out.append(UOp.const(dtypes.index, 0))
      continue
    v = flat // st if st != 1 else flat
    out.append(v % s if k > 0 else v)
  return tuple(out)


def index_movement(x: UOp, idx: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], UOp | None]:
  """The source index for output index `idx` of movement op `x`, and a validity (for PAD)."""
  src_shape = x.src[0].shape
  if x.op is Ops.RESHAPE: return index_reshape(x, idx), None
  if x.op is Ops.PERMUTE:
    out: list[UOp] = [idx[0]] * len(idx)
    for k, p in enumerate(x.arg): out[p] = idx[k]
    return tuple(out), None
  if x.op is Ops.EXPAND:
    zero = UOp.const(dtypes.index, 0)
    return tuple(zero if a == 1 and b != 1 else i for i, a, b in zip(idx, src_shape, x.shape)), None
  if x.op is Ops.FLIP:
    return tuple((s - 1 - i) if f else i for i, s, f in zip(idx, src_shape, x.arg)), None
  offs = as_shape(x.src[1])
  if x.op is Ops.SHRINK: return tuple(i + o if o else i for i, o in zip(idx, offs)), None
  assert x.op is Ops.PAD
  valid: UOp | None = None
  new: list[UOp] = []
  for i, o, s, n in zip(idx, offs, src_shape, x.shape):
    if o == 0 and s == n:
      new.append(i)
      continue
    gate, raw = _ungate(i)
    v = (raw < o).logical_not() & (raw < o + s)
    if gate is not None: v = gate & v  # an index already padded outside stays invalid
    valid = v if valid is None else valid & v
    new.append(v.where(raw - o, UOp.const(dtypes.index, Invalid)))
  return tuple(new), valid


def _ungate(i: UOp) -> tuple[UOp | None, UOp]:
  """(gate, raw index) of an index that may be WHERE(gate, raw, Invalid) after simplification."""
  i = graph_rewrite(i, pm_invalid, name="ungate")
  if i.op is Ops.WHERE and i.src[2].op is Ops.CONST and isinstance(i.src[2].arg, type(Invalid)):
    return i.src[0], i.src[1]
  return None, i


def index(x: UOp, idx: tuple[UOp, ...]) -> UOp:
  return UOp(Ops.INDEX, x.dtype, (x, *idx))


def _broadcast_idx(src: UOp, out_shape: tuple, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Index into a source that broadcasts implicitly (fewer or size-1 axes)."""
  ss = tuple(src.shape)
  tail = idx[len(idx) - len(ss):] if ss else ()
  zero = UOp.const(dtypes.index, 0)
  out_tail = out_shape[len(out_shape) - len(ss):]
  return tuple(zero if s == 1 and o != 1 else i for i, s, o in zip(tail, ss, out_tail))


def push_index(ctx: RangeifyCtx, ix: UOp) -> UOp | None:
  """INDEX(x, *idx) -> x's value at idx, one step closer to buffers and constants."""
  x, idx = ix.src[0], ix.src[1:]
  if x.op is Ops.PARAM and x.arg.name is not None: return x  # a variable: a value, not memory
  if x.op in (Ops.PARAM, Ops.BUFFER) or len(idx) != len(x.shape): return None
  if x in ctx.realize and (ctx.current is None or x is not ctx.current.key):
    return _read_realized(ctx, x, idx)
  if x.op is Ops.CONST: return x
  if x.op is Ops.AFTER: return _read_after(ctx, x, idx)
  if x.op in VIEW_OPS:
    new_idx, valid = index_movement(x, idx)
    inner = index(x.src[0], new_idx)
    return inner if valid is None else valid.where(inner, UOp.const(x.dtype, 0))
  if x.op in GroupOp.Elementwise:
    shape = tuple(x.shape)
    return x.replace(src=tuple(index(s, _broadcast_idx(s, shape, idx)) for s in x.src))
  if x.op is Ops.REDUCE: return _index_reduce(ctx, x, idx)
  if x.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUSBACKWARD): return index(x.src[0], idx)
  raise NotImplementedError(f"rangeify: no rule to index a {x.op.name} node")


def _index_reduce(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  src_shape = x.src[0].shape
  if any(src_shape[a] == 0 for a in x.arg.axes):  # an empty reduction is its identity
    return UOp.const(x.dtype, identity_element(x.arg.op, x.dtype))
  rngs = {a: ctx.new_range(src_shape[a], AxisType.REDUCE) for a in x.arg.axes}
  new_idx = tuple(rngs.get(a, i) for a, i in enumerate(idx))
  return UOp(Ops.REDUCE, x.dtype, (index(x.src[0], new_idx), *rngs.values()), ReduceArg(x.arg.op))


def _read_after(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  for dep in x.src[1:]:
    if dep in ctx.producer and ctx.current is not None: ctx.current.deps.add(ctx.producer[dep])
  return index(x.src[0], idx)


def _read_realized(ctx: RangeifyCtx, x: UOp, idx: tuple[UOp, ...]) -> UOp:
  """A realized node read from its buffer (built before: see the module docstring)."""
  buf = ctx.buffers.get(x)
  assert buf is not None, f"rangeify: realized {x.op.name} read before its kernel was built"
  if ctx.current is not None: ctx.current.deps.add(ctx.producer[x])
  return index(view(buf, x.shape), idx)


def view(buf: UOp, shape: tuple) -> UOp:
  return buffer_view(buf, shape)  # a symbolic shape: the buffer's prefix


pm_rangeify = PatternMatcher([
  (UPat(Ops.INDEX, name="ix"), push_index),  # x[idx] -> value of x at idx
])
