"""Multi: lower a tensor graph that uses n-tuple devices to one graph per device.

Consumes: the tensor-graph nodes to realize and their devices, where some nodes live on an n-tuple
device D = (d_0, ..., d_{n-1}): BUFFERs on D, COPY to D, REPLICATED, and any op on such values.
Produces: the same computation over single-device nodes only. A node u on D with shard axis
a = `u.axis` becomes n "locals": local j lives on d_j and is d_j's part of u, its j-th chunk of
size shape[a]/n along a (all of u when a is None: replicated). Collectives become COPYs between the
d_j (copy calls in the command buffer) plus elementwise combining on the receiving device. A
`MultiPlan` maps the buffers the locals are realized into back to the original nodes.
Invariants: no output node is on a tuple device; every local of a node on D is on its own d_j;
the locals of a replicated value hold the same bits on every device (a reduction over the shard
axis realizes each partial result once and combines the partials in device order everywhere).

Lowering rules, one per op (the spec's axis table says which axis each result has):
  BUFFER on D         its n per-device buffers ("shards")
  COPY to D           reshard with axis 0: chunk j of the source (gathered if need be) to d_j
  COPY to one device  gather: the locals copied there and joined along the shard axis
  RESHAPE, PERMUTE, EXPAND   the same view of each local, with local sizes (the shard axis is
                      remapped so that chunks stay whole)
  PAD, SHRINK, FLIP   local when they leave the shard axis alone; on it, device j assembles its
                      chunk of the result from the parts that hold it (copies of only those)
  elementwise         each source brought to the result's axis (a replicated source is chunked
                      where it is read, a differently split one is resharded all-to-all)
  REDUCE              local; over the shard axis, partial reduces then an allreduce
  REPLICATED          local (the slice every device already holds)
  STORE, AFTER, markers   local

Storage and the views of shards: schedule/sharding.py.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from unigrad.dtype import dtypes
from unigrad.knobs import SPEC
from unigrad.schedule.callify import is_assign, is_plain_buffer
from unigrad.schedule.sharding import (Locals, MultiDeviceError, assemble, at, chunk, concat,
                                      copy_to, full, gather_range, is_multi_view, local_shape,
                                      multi_view, new_multi_buffer, pad, permute, reshape,
                                      shards, shards_of, shrink)
from unigrad.uop import GroupOp, Ops, UOp, shape_uop
from unigrad.uop.properties import as_shape

Device = str | tuple[str, ...]

__all__ = ["MultiDeviceError", "MultiPlan", "lower_multi", "new_multi_buffer", "is_multi_view",
           "multi_view", "shards", "shards_of", "local_shape", "verify_lowered"]


# ---- the lowering ----

@dataclass
class MultiCtx:
  """State of one lowering: rewritten single-device nodes, locals of tuple-device nodes, and the
  reshards and gathers built so far (each built once)."""
  single: dict[UOp, UOp] = field(default_factory=dict)
  local: dict[UOp, Locals] = field(default_factory=dict)
  reshards: dict[tuple[UOp, int | None, tuple[str, ...]], Locals] = field(default_factory=dict)
  gathers: dict[tuple[UOp, str], UOp] = field(default_factory=dict)

  def reshard(self, s: UOp, axis: int | None, devices: tuple[str, ...]) -> Locals:
    """`s` (on a tuple device) as locals on `devices` split along `axis` (None: replicated)."""
    key = (s, axis, devices)
    if key not in self.reshards: self.reshards[key] = _reshard(self, s, axis, devices)
    return self.reshards[key]

  def gather(self, s: UOp, device: str) -> UOp:
    """All of `s` (on a tuple device) on `device`."""
    key = (s, device)
    if key not in self.gathers:
      a, locs = shard_axis(s), self.local[s]
      if a is None: self.gathers[key] = copy_to(_nearest(locs, device), device)
      else: self.gathers[key] = gather_range(locs, a, 0, s.shape[a], device)
    return self.gathers[key]


def _nearest(locs: Locals, device: str) -> UOp:
  """The local already on `device` if there is one, else the first."""
  return next((x for x in locs if x.device == device), locs[0])


def shard_axis(u: UOp) -> int | None:
  """`u.axis`, with a graph whose shard boundary cannot be kept reported as MultiDeviceError."""
  try: return u.axis
  except ValueError as e:
    raise MultiDeviceError(f"{e} (a tensor on {u.device} is split across devices along that "
                           "axis: gather it with .to(device), or shard another axis)") from e


def _reshard(ctx: MultiCtx, s: UOp, axis: int | None, devices: tuple[str, ...]) -> Locals:
  a, locs, n = shard_axis(s), ctx.local[s], len(devices)
  if axis is None: return tuple(ctx.gather(s, d) for d in devices)
  if axis >= len(s.shape) or s.shape[axis] % n:
    raise MultiDeviceError(f"axis {axis} of shape {tuple(s.shape)} does not split evenly across "
                           f"{n} devices")
  c = s.shape[axis] // n
  if a is None: return tuple(copy_to(chunk(_nearest(locs, d), axis, j, n), d)
                             for j, d in enumerate(devices))
  if a == axis:  # the same split onto the same devices gives each device its own part back
    return tuple(gather_range(locs, a, j * c, (j + 1) * c, d) for j, d in enumerate(devices))
  # all-to-all: device j receives chunk j (along the new axis) of every device's part
  return tuple(concat([copy_to(chunk(x, axis, j, n), d) for x in locs], a)
               for j, d in enumerate(devices))


def _localize(ctx: MultiCtx, s: UOp, out: UOp, axis: int | None, j: int) -> UOp:
  """Source `s` of `out` (on a tuple device) as device j needs it: split along `axis` like the
  result (a source with fewer axes broadcasts from the right)."""
  devices = out.device
  if s.device is None:
    x, lead = ctx.single[s], len(out.shape) - len(s.shape)
    if axis is None or axis < lead or s.shape[axis - lead] == 1: return x
    return chunk(x, axis - lead, j, len(devices))
  if s.device != devices:
    raise MultiDeviceError(f"expected all sources of {out.op.name} on one device, got {devices} "
                           f"and {s.device}")
  if len(s.shape) != len(out.shape) and shard_axis(s) is not None:
    raise MultiDeviceError(f"{out.op.name}: a split source must have the result's rank "
                           f"{len(out.shape)}, got shape {tuple(s.shape)}")
  return ctx.reshard(s, axis, devices)[j]


def _elementwise(ctx: MultiCtx, u: UOp) -> Locals:
  axis = shard_axis(u)
  return tuple(u.replace(src=tuple(_localize(ctx, s, u, axis, j) for s in u.src))
               for j in range(len(u.device)))


def _view_locals(ctx: MultiCtx, u: UOp, build: Callable[[UOp], UOp]) -> Locals:
  return tuple(build(x) for x in ctx.local[u.src[0]])


def _lower_reshape(ctx: MultiCtx, u: UOp) -> Locals:
  shape = local_shape(u.shape, shard_axis(u), len(u.device))
  return _view_locals(ctx, u, lambda x: reshape(x, shape))


def _lower_expand(ctx: MultiCtx, u: UOp) -> Locals:
  shape = local_shape(u.shape, shard_axis(u), len(u.device))
  return _view_locals(ctx, u, lambda x: UOp(Ops.EXPAND, x.dtype, (x, shape_uop(shape))))


def _lower_pad_shrink(ctx: MultiCtx, u: UOp) -> Locals:
  """The part off the shard axis is applied to each local; on the shard axis, device j assembles
  its chunk of the result from the parts that hold it (padding where none does)."""
  src, n = u.src[0], len(u.device)
  a, locs = shard_axis(src), ctx.local[src]
  offs, new = as_shape(u.src[1]), as_shape(u.src[2])
  view = pad if u.op is Ops.PAD else shrink
  if a is None: return tuple(view(x, offs, new) for x in locs)
  size = locs[0].shape[a]
  locs = tuple(view(x, at(offs, a, 0), at(new, a, size)) for x in locs)
  if offs[a] == 0 and new[a] == src.shape[a]: return locs
  if not isinstance(size_a := new[a], int) or size_a % n:  # (a symbolic size: never even)
    raise MultiDeviceError(f"{u.op.name} to shape {tuple(new)} leaves {new[a]} elements on the "
                           f"shard axis {a}, which {n} devices cannot split evenly: gather it "
                           "with .to(device) first")
  # the offset on the shard axis is an int here: a symbolic one fails gather_range's
  # comparisons (TypeError), as it always has
  c, o = size_a // n, cast(int, offs[a])
  if u.op is Ops.SHRINK:
    return tuple(gather_range(locs, a, o + j * c, o + (j + 1) * c, d)
                 for j, d in enumerate(u.device))
  out = []
  for j, d in enumerate(u.device):  # padded chunk j holds source elements [j*c - o, (j+1)*c - o)
    lo, hi = max(0, j * c - o), min(src.shape[a], (j + 1) * c - o)
    chunk_shape = at(locs[0].shape, a, c)
    if lo >= hi: out.append(full(u.dtype, 0, chunk_shape))  # all padding: reads as 0, like PAD
    else: out.append(pad(gather_range(locs, a, lo, hi, d),
                          at([0] * len(chunk_shape), a, lo + o - j * c), chunk_shape))
  return tuple(out)


def _lower_flip(ctx: MultiCtx, u: UOp) -> Locals:
  a, locs = shard_axis(u.src[0]), ctx.local[u.src[0]]
  flipped = tuple(UOp(Ops.FLIP, x.dtype, (x,), u.arg) for x in locs)
  if a is None or not u.arg[a]: return flipped
  # chunk j of the flipped value is the flipped chunk n-1-j
  return tuple(copy_to(flipped[len(locs) - 1 - j], d) for j, d in enumerate(u.device))


def _lower_reduce(ctx: MultiCtx, u: UOp) -> Locals:
  src = u.src[0]
  a = shard_axis(src)
  parts = tuple(u.replace(src=(x,)) for x in ctx.local[src])
  if a is None or a not in u.arg.axes: return parts
  # allreduce: each partial realized once on its device, combined in device order everywhere
  parts = tuple(UOp(Ops.CONTIGUOUS, p.dtype, (p,)) for p in parts)
  out = []
  for d in u.device:
    acc = copy_to(parts[0], d)
    for p in parts[1:]: acc = UOp(u.arg.op, acc.dtype, (acc, copy_to(p, d)))
    out.append(acc)
  return tuple(out)


def _lower_replicated(ctx: MultiCtx, u: UOp) -> Locals:
  def first_slice(x: UOp) -> UOp:
    return shrink(x, [0] * len(x.shape), [1 if i in u.arg else s for i, s in enumerate(x.shape)])
  return _view_locals(ctx, u, first_slice)


def _lower_copy(ctx: MultiCtx, u: UOp) -> Locals:
  """COPY to an n-tuple device reshards with axis 0."""
  src, devices = u.src[0], u.arg
  n = len(devices)
  if not u.shape or u.shape[0] % n:
    raise MultiDeviceError(f"COPY to {devices} splits axis 0 evenly, but the shape is "
                           f"{tuple(u.shape)}")
  if isinstance(src.device, tuple): return ctx.reshard(src, 0, devices)
  x = ctx.single[src]
  return tuple(copy_to(chunk(x, 0, j, n), d) for j, d in enumerate(devices))


def _lower_store(ctx: MultiCtx, u: UOp) -> Locals:
  target = u.src[0]
  axis = shard_axis(target)
  return tuple(u.replace(src=(ctx.local[target][j],
                              *(_localize(ctx, s, target, axis, j) for s in u.src[1:])))
               for j in range(len(u.device)))


def _lower_after(ctx: MultiCtx, u: UOp) -> Locals:
  def dep(s: UOp, j: int) -> UOp: return ctx.local[s][j] if s in ctx.local else ctx.single[s]
  return tuple(u.replace(src=(x, *(dep(s, j) for s in u.src[1:])))
               for j, x in enumerate(ctx.local[u.src[0]]))


def _same_op(ctx: MultiCtx, u: UOp) -> Locals:
  return _view_locals(ctx, u, lambda x: u.replace(src=(x,)))


_LOWER: dict[Ops, Callable[[MultiCtx, UOp], Locals]] = {
  Ops.BUFFER: lambda ctx, u: shards_of(u),
  Ops.COPY: _lower_copy,
  Ops.RESHAPE: _lower_reshape,
  Ops.EXPAND: _lower_expand,
  Ops.PERMUTE: lambda ctx, u: _view_locals(ctx, u, lambda x: permute(x, u.arg)),
  Ops.PAD: _lower_pad_shrink,
  Ops.SHRINK: _lower_pad_shrink,
  Ops.FLIP: _lower_flip,
  Ops.REDUCE: _lower_reduce,
  Ops.REPLICATED: _lower_replicated,
  Ops.STORE: _lower_store,
  Ops.AFTER: _lower_after,
  **{op: _same_op for op in GroupOp.Marker},
  **{op: _elementwise for op in GroupOp.Elementwise},
}


def _lower_single(ctx: MultiCtx, u: UOp) -> UOp:
  """A node on one device (or none): a gather for a COPY from a tuple device, else rebuilt on
  its rewritten sources."""
  if u.op is Ops.COPY and isinstance(u.src[0].device, tuple): return ctx.gather(u.src[0], u.arg)
  if (bad := next((s for s in u.src if isinstance(s.device, tuple)), None)) is not None:
    raise MultiDeviceError(f"{u.op.name} on {u.device} reads a value on {bad.device}: expected all "
                           "tensors on one device (move one with .to(...))")
  new_src = tuple(ctx.single[s] for s in u.src)
  return u if all(a is b for a, b in zip(new_src, u.src)) else u.replace(src=new_src)


def _lower(ctx: MultiCtx, u: UOp) -> None:
  if not isinstance(u.device, tuple):
    ctx.single[u] = _lower_single(ctx, u)
    return
  rule = _LOWER.get(u.op)
  if rule is None:
    raise MultiDeviceError(f"{u.op.name} on the tuple device {u.device} is not supported")
  ctx.local[u] = rule(ctx, u)


# ---- targets ----

@dataclass
class MultiPlan:
  """Single-device targets (`uops`, `devices`) computing the original targets, and what maps the
  buffers they are realized into back to the original nodes (`finish`)."""
  ctx: MultiCtx
  uops: list[UOp]
  devices: list[str]
  targets: dict[UOp, tuple[tuple[str, ...], Locals]]  # tuple-device target -> devices, locals

  def finish(self, becomes: dict[UOp, UOp]) -> dict[UOp, UOp]:
    """Original node -> the buffer view holding it, from callify's map of the lowered nodes."""
    out = {u: becomes[new] for u, new in self.ctx.single.items() if new in becomes}
    for u, locs in self.ctx.local.items():
      if is_assign(u): out[u] = u.src[0]
      elif u.op is Ops.CONTIGUOUS and all(is_plain_buffer(becomes.get(x, x)) for x in locs):
        out[u] = assemble(u, u.device, [becomes[x] for x in locs])
    for u, (devices, locs) in self.targets.items():
      if u not in out: out[u] = assemble(u, devices, [becomes[x] for x in locs])
    return out


def uses_tuple_devices(uops: Sequence[UOp], devices: Sequence[Device],
                       nodes: dict[UOp, None] | None = None) -> bool:
  """Whether any target is on a tuple device or reads a BUFFER on one or a COPY to one (every
  value on a tuple device comes from one of those). `nodes`: the toposort of the targets' SINK,
  when the caller has it."""
  if any(isinstance(d, tuple) for d in devices): return True
  if nodes is None: nodes = UOp(Ops.SINK, dtypes.void, tuple(uops)).toposort()
  copy, buffer = Ops.COPY, Ops.BUFFER  # looked up once: `Ops.X` is slow on Python 3.11
  for u in nodes:
    op = u.op
    if op is copy and isinstance(u.arg, tuple): return True
    if op is buffer and isinstance(u.arg.device, tuple): return True
  return False


def lower_multi(uops: Sequence[UOp], devices: Sequence[Device],
                nodes: dict[UOp, None] | None = None) -> MultiPlan | None:
  """The single-device targets computing `uops` on `devices` (see the module docstring), or None
  when nothing is on a tuple device. `nodes`: the toposort of the targets' SINK, if known."""
  if not uses_tuple_devices(uops, devices, nodes): return None
  if nodes is None: nodes = UOp(Ops.SINK, dtypes.void, tuple(uops)).toposort()
  ctx = MultiCtx()
  for u in nodes:
    if u.op is not Ops.SINK: _lower(ctx, u)
  plan = MultiPlan(ctx, [], [], {})
  for u, dev in zip(uops, devices):
    if not isinstance(dev, tuple):
      if isinstance(u.device, tuple):
        raise MultiDeviceError(f"a value on {u.device} cannot be realized on {dev}")
      plan.uops.append(ctx.single[u])
      plan.devices.append(dev)
      continue
    if u.device is None: locs = tuple(copy_to(ctx.single[u], d) for d in dev)  # replicated
    elif u.device == dev: locs = ctx.local[u]
    else: raise MultiDeviceError(f"a value on {u.device} cannot be realized on {dev}")
    if not is_assign(u): plan.targets[u] = (dev, locs)
    plan.uops.extend(locs)
    plan.devices.extend(dev)
  if SPEC >= 1: verify_lowered(plan.uops)
  return plan


def verify_lowered(uops: Sequence[UOp]) -> None:
  """The stage's invariant: no node of the lowered graph is on a tuple device."""
  for u in UOp(Ops.SINK, dtypes.void, tuple(uops)).toposort():
    if u.op is not Ops.SINK and isinstance(u.device, tuple):
      raise MultiDeviceError(f"multi: {u.op.name} is still on {u.device} after lowering")
