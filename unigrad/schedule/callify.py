"""Callify: turn the tensor graph to realize into one stateless function over PARAMs.

Consumes: the UOps of the tensors to realize (they reference BUFFERs, hold CONTIGUOUS markers and
pending assigns `AFTER(buf, STORE(buf, x))`).
Produces: `CALL(SINK(STORE...), *buffers)` whose body sees only PARAMs (slot i is the CALL's i-th
buffer), and a map from each realized tensor-graph node to the buffer view that will hold it.
Invariants: every value to materialize is a STORE into a buffer (CONTIGUOUS became
`AFTER(buf, STORE(buf, x))`); PARAMs are numbered in discovery order, so the same program on other
buffers gives the same body node (the schedule cache key).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.uop import Ops, ParamArg, UOp, shape_uop
from unigrad.uop.properties import as_shape

_slots = itertools.count()


def new_buffer(device: str, dtype: DType, shape: tuple[int, ...]) -> UOp:
  """A fresh BUFFER (unique slot: never merged with another) viewed with `shape`."""
  numel = 1
  for s in shape: numel *= s
  arg = ParamArg(next(_slots), dtype, device, AddrSpace.GLOBAL)
  buf = UOp(Ops.BUFFER, dtype, (shape_uop((numel,)),), arg)
  return buf if tuple(shape) == (numel,) else UOp(Ops.RESHAPE, dtype, (buf, shape_uop(shape)))


def buffer_base(u: UOp) -> UOp | None:
  """The BUFFER under a chain of movement ops, or None."""
  while u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP):
    u = u.src[0]
  return u if u.op is Ops.BUFFER else None


def is_plain_buffer(u: UOp) -> bool:
  """A BUFFER, or a RESHAPE of one: data already laid out row-major in its own buffer."""
  return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)


@dataclass
class CallifyResult:
  call: UOp
  becomes: dict[UOp, UOp] = field(default_factory=dict)


def _materialize_contiguous(root: UOp, device: str, becomes: dict[UOp, UOp]) -> UOp:
  """CONTIGUOUS(x) -> AFTER(buf, STORE(buf, x)) with a new buffer; records x -> buf."""
  out: dict[UOp, UOp] = {}
  for u in root.toposort():
    new_src = tuple(out.get(s, s) for s in u.src)
    v = u if all(a is b for a, b in zip(new_src, u.src)) else u.replace(src=new_src)
    if v.op is Ops.CONTIGUOUS and not is_plain_buffer(v.src[0]):
      buf = new_buffer(v.src[0].device or device, v.dtype, tuple(v.shape))
      becomes[u] = buf
      v = UOp(Ops.AFTER, v.dtype, (buf, UOp(Ops.STORE, dtypes.void, (buf, v.src[0]))))
    elif v.op is Ops.CONTIGUOUS: v = v.src[0]
    out[u] = v
  return out[root]


def _to_params(sink: UOp) -> tuple[UOp, list[UOp]]:
  """Replace each BUFFER by PARAM(slot) in discovery order."""
  bufs = [u for u in sink.toposort() if u.op is Ops.BUFFER]
  params = {b: UOp(Ops.PARAM, b.dtype, b.src, ParamArg(i, b.dtype, b.arg.device, b.arg.addrspace))
            for i, b in enumerate(bufs)}
  return sink.substitute(params), bufs


def callify(targets: list[UOp], devices: list[str]) -> CallifyResult:
  """The stateless function that computes `targets` (see the module docstring)."""
  becomes: dict[UOp, UOp] = {}
  stores: list[UOp] = []
  for u, dev in zip(targets, devices):
    if u.op is Ops.AFTER and all(s.op is Ops.STORE for s in u.src[1:]):
      stores.extend(u.src[1:])
      becomes[u] = u.src[0]
      continue
    buf = new_buffer(dev, u.dtype, tuple(as_shape(shape_uop(u.shape))))
    value = u.src[0] if u.op is Ops.CONTIGUOUS else u  # the output buffer is the contiguous copy
    stores.append(UOp(Ops.STORE, dtypes.void, (buf, value)))
    becomes[u] = buf
  sink = _materialize_contiguous(UOp(Ops.SINK, dtypes.void, tuple(stores)), devices[0], becomes)
  for u in sink.toposort():
    if u.op is Ops.AFTER and u.src[0].op in (Ops.BUFFER, Ops.RESHAPE):
      becomes.setdefault(u, u.src[0])
  body, bufs = _to_params(sink)
  return CallifyResult(UOp(Ops.CALL, dtypes.void, (body, *bufs)), becomes)
