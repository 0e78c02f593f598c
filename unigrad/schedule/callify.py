"""Callify: turn the tensor graph to realize into one stateless function over PARAMs.

Consumes: the UOps of the tensors to realize (they reference BUFFERs, hold CONTIGUOUS markers and
pending assigns `AFTER(buf, STORE(buf, x))`).
Produces: `CALL(SINK(STORE...), *buffers)` whose body sees only PARAMs (slot i is the CALL's i-th
buffer), and a map from each realized tensor-graph node to the buffer view that will hold it.
Invariants: every value to materialize is a STORE into a buffer (CONTIGUOUS became
`AFTER(buf, STORE(buf, x))`); PARAMs are numbered in discovery order (the output buffers, then
the graph's buffers in toposort order), so the same program on other buffers gives the same body
node (the schedule cache key). Bound symbolic variables become their unbound variable and their
values are returned beside the body (`var_vals`), so the key holds no value; an unbound variable
raises UnboundVariableError. FUNCTION calls are resolved in the same walk: each result is its
body over the rewritten arguments (`call_result`), where a separate pass resolving them would
rebuild every node above a call once more. One walk over the graph does all of it.
"""
from __future__ import annotations

import functools
import itertools
import math
import weakref
from dataclasses import dataclass, field
from typing import cast

from unigrad.dtype import AddrSpace, DType, buffer_nbytes, dtypes
from unigrad.schedule.function import call_result, graph_nodes
from unigrad.uop import GroupOp, NodeMap, Ops, ParamArg, UOp, shape_uop, sint
from unigrad.uop.properties import as_shape
from unigrad.uop.uop import fresh_node
from unigrad.uop.variable import UnboundVariableError, VariableBindError

_slots = itertools.count()


def new_buffer(device: str | tuple[str, ...], dtype: DType, shape: tuple[sint, ...]) -> UOp:
  """A fresh BUFFER (unique slot: never merged with another) viewed with `shape` (see
  `buffer_view` for a symbolic shape)."""
  arg = ParamArg(next(_slots), dtype, device, AddrSpace.GLOBAL)
  for s in shape:
    if type(s) is not int: break
  else:  # a static shape (every eager realize's output): buffer_view's work, straight
    buffer_nbytes(numel := math.prod(cast(tuple[int, ...], shape)), dtype, device)
    buf = fresh_node(Ops.BUFFER, dtype, (shape_uop((numel,)),), arg)
    return buf if len(shape) == 1 else fresh_node(Ops.RESHAPE, dtype, (buf, shape_uop(shape)))
  buffer_nbytes(numel := max_numel(shape), dtype, device)
  buf = UOp(Ops.BUFFER, dtype, (shape_uop((numel,)),), arg)
  return buffer_view(buf, shape)


def max_numel(shape: tuple[sint, ...]) -> int:
  """The number of elements of a shape, for the largest value of each variable in it."""
  numel = 1
  for s in shape: numel *= s if isinstance(s, int) else int(s.vmax)
  return numel


def buffer_view(buf: UOp, shape: tuple[sint, ...]) -> UOp:
  """A flat buffer (BUFFER or PARAM) viewed with `shape`. A symbolic shape is the buffer's
  row-major prefix `RESHAPE(SHRINK(buf, 0, numel), shape)`: a buffer for the largest values
  serves every bound value."""
  numel: sint = 1
  for s in shape: numel = numel * s if isinstance(numel, UOp) or isinstance(s, int) else s * numel
  if tuple(shape) == tuple(buf.shape): return buf
  if not isinstance(numel, int):
    numel = numel.simplify().sintify()
    buf = UOp(Ops.SHRINK, buf.dtype, (buf, shape_uop((0,)), shape_uop((numel,))))
  return buf if tuple(shape) == (numel,) else UOp(Ops.RESHAPE, buf.dtype, (buf, shape_uop(shape)))


_MOVEMENT, _BUFFER = GroupOp.Movement, Ops.BUFFER  # looked up once: `Ops.X` is slow (3.11)


def buffer_base(u: UOp) -> UOp | None:
  """The BUFFER under a chain of movement ops, or None."""
  while u.op in _MOVEMENT: u = u.src[0]
  return u if u.op is _BUFFER else None


def is_plain_buffer(u: UOp) -> bool:
  """A BUFFER, or a RESHAPE of one: data already laid out row-major in its own buffer (for a
  symbolic shape, its row-major prefix: see `new_buffer`)."""
  if u.op is _RESHAPE: u = u.src[0]
  if u.op is _SHRINK and u.src[2].op is Ops.STACK and u.src[1].arg == (0,): u = u.src[0]
  return u.op is _BUFFER


_RESHAPE, _SHRINK = Ops.RESHAPE, Ops.SHRINK  # (every realize asks of its targets)


class CallifyError(RuntimeError):
  """The graph to realize holds a FUNCTION placeholder outside its FUNCTION."""

  def __init__(self, u: UOp) -> None:
    super().__init__(f"cannot realize a value that depends on a placeholder of a function being "
                     f"traced (PARAM {u.arg.slot}, shape {u.shape}): inside @function, tensors "
                     "are lazy (no realize, item, numpy or assign to outside tensors); return "
                     "the value instead")


@dataclass(frozen=True)
class Fresh:
  """A buffer callify made: for `node` (a target or a CONTIGUOUS), `view` = new_buffer(device,
  dtype, shape)."""
  node: UOp
  view: UOp
  device: str
  dtype: DType
  shape: tuple[sint, ...]


@dataclass
class CallifyResult:
  """The function body over PARAMs, the buffers for its slots and the realized-node map."""
  body: UOp
  bufs: tuple[UOp, ...]
  becomes: dict[UOp, UOp] = field(default_factory=dict)
  var_vals: dict[str, int] = field(default_factory=dict)  # bound variable name -> value
  fresh: list[Fresh] = field(default_factory=list)  # the new buffers it made

  @property
  def call(self) -> UOp:
    """`CALL(body, *bufs)` (built on demand: realizing needs only the parts)."""
    return UOp(Ops.CALL, dtypes.void, (self.body, *self.bufs))


def is_assign(u: UOp) -> bool:
  """AFTER(target, STORE...): once realized, its value is the target buffer."""
  return u.op is Ops.AFTER and all(s.op is Ops.STORE for s in u.src[1:])


@functools.lru_cache(maxsize=4096)
def _param(slot: int, dtype: DType, device: str | None, addrspace: AddrSpace,
           src: tuple[UOp, ...]) -> UOp:
  """PARAM(slot) for a buffer (cached: the same few PARAMs are asked for on every call)."""
  return UOp(Ops.PARAM, dtype, src, ParamArg(slot, dtype, device, addrspace))


@dataclass
class CallifyCtx:
  """What one callify pass collects: the buffers in slot order and the realized-node map."""
  device: str
  bufs: list[UOp] = field(default_factory=list)
  params: dict[UOp, UOp] = field(default_factory=dict)  # BUFFER -> its PARAM
  made: set[UOp] = field(default_factory=set)  # the PARAMs above
  becomes: dict[UOp, UOp] = field(default_factory=dict)
  var_vals: dict[str, int] = field(default_factory=dict)
  variables: dict[str, UOp] = field(default_factory=dict)  # name -> the unbound variable
  fresh: list[Fresh] = field(default_factory=list)

  def new_buffer(self, node: UOp, device: str, dtype: DType, shape: tuple[sint, ...]) -> UOp:
    """A new buffer's view that `node` becomes (recorded)."""
    view = self.becomes[node] = new_buffer(device, dtype, shape)
    self.fresh.append(Fresh(node, view, device, dtype, shape))
    return view

  def unbind(self, v: UOp) -> UOp:
    """The unbound variable of a bound one, its value recorded (one value, one variable a name)."""
    if v.arg.value is None:
      raise UnboundVariableError(f"variable {v.arg.name!r} in [{v.vmin}, {v.vmax}] has no value "
                                 f"where one is needed (realizing): bind it with "
                                 f"`{v.arg.name}.bind(k)`")
    var, val = v.unbind()
    if self.variables.setdefault(var.arg.name, var) is not var:
      raise VariableBindError(f"two different variables are named {var.arg.name!r}")
    if self.var_vals.setdefault(var.arg.name, val) != val:
      raise VariableBindError(f"variable {var.arg.name!r} is bound to both "
                              f"{self.var_vals[var.arg.name]} and {val} in one program")
    return var

  def param(self, b: UOp) -> UOp:
    """The PARAM standing for BUFFER `b` (the next slot on first sight)."""
    if (p := self.params.get(b)) is not None: return p
    p = self.params[b] = _param(len(self.bufs), b.dtype, b.arg.device, b.arg.addrspace, b.src)
    self.bufs.append(b)
    self.made.add(p)
    return p

  def param_view(self, view: UOp) -> UOp:
    """A new buffer's view (BUFFER, RESHAPE(BUFFER) or a symbolic prefix) over its PARAM."""
    if view.op is Ops.BUFFER: return self.param(view)
    if view.op is Ops.RESHAPE and view.src[0].op is Ops.BUFFER and view.src[1].op is Ops.VCONST:
      return UOp(Ops.RESHAPE, view.dtype, (self.param(view.src[0]), view.src[1]))
    nodes = view.toposort()
    return _rewrite(self, nodes, None)[view]

  def is_plain(self, v: UOp) -> bool:
    """Whether a rewritten node reads a buffer row-major (is_plain_buffer, over PARAMs)."""
    return v in self.made or (v.op is Ops.RESHAPE and v.src[0] in self.made)


def _rewrite_marker(ctx: CallifyCtx, u: UOp, v: UOp) -> UOp:
  """AFTER(buf, ...) records that it becomes buf; CONTIGUOUS(x) -> AFTER(buf, STORE(buf, x))
  with a new buffer (records u -> buf), or x itself when x already is a plain buffer."""
  if u.op is Ops.AFTER:
    if u.src[0].op in (Ops.BUFFER, Ops.RESHAPE): ctx.becomes.setdefault(u, u.src[0])
    return v
  if ctx.is_plain(v.src[0]): return v.src[0]
  buf = ctx.new_buffer(u, u.src[0].device or ctx.device, u.dtype, tuple(u.shape))
  p = ctx.param_view(buf)
  return UOp(Ops.AFTER, u.dtype, (p, UOp(Ops.STORE, dtypes.void, (p, v.src[0]))))


def _rewrite(ctx: CallifyCtx, nodes: dict[UOp, None], skip: UOp | None) -> dict[UOp, UOp]:
  """Each node of a toposort (but `skip`) -> its body node: BUFFER -> PARAM, markers by
  `_rewrite_marker`, anything else rebuilt on its rewritten sources (itself if none changed)."""
  out: dict[UOp, UOp] = {}
  get = out.__getitem__
  # `Ops.X` is a slow lookup on Python 3.11 (EnumType.__getattr__): once per walk, not per node
  buffer, param, markers = Ops.BUFFER, Ops.PARAM, (Ops.AFTER, Ops.CONTIGUOUS)
  function, gettuple = Ops.FUNCTION, Ops.GETTUPLE
  for u in nodes:
    if u is skip: continue
    op = u.op
    if op is buffer:
      out[u] = ctx.param(u)
      continue
    if op is param:
      if u.arg.name is None: raise CallifyError(u)
      out[u] = ctx.unbind(u)
      continue
    if op is function:  # its results are made at its GETTUPLEs (`nodes` holds no call's body)
      out[u] = u
      continue
    src = u.src
    if op is gettuple and src[0].op is function:
      f = src[0]
      res = call_result(f.src[0], u.arg, tuple(map(get, f.src[1:])))
      if res is None: raise ValueError(f"callify: a call whose body holds buffers, markers or "
                                       f"variables ({f.src[0]!r}): inline_functions first")
      out[u] = res
      continue
    new_src = tuple(map(get, src))
    v = u if new_src == src else u.with_src(new_src)
    out[u] = _rewrite_marker(ctx, u, v) if op in markers else v
  return out


def callify(targets: list[UOp], devices: list[str],
            nodes: dict[UOp, None] | None = None) -> CallifyResult:
  """The stateless function that computes `targets` (see the module docstring). `nodes`, the
  toposort of `SINK(*targets)` when the caller has it, saves a walk over the graph."""
  ctx = CallifyCtx(devices[0])
  stored: list[tuple[UOp | None, UOp]] = []  # (output view over its PARAM or None, value)
  for u, dev in zip(targets, devices):
    if is_assign(u):  # its STOREs are the values
      ctx.becomes[u] = u.src[0]
      stored += [(None, s) for s in u.src[1:]]
      continue
    buf = ctx.new_buffer(u, dev, u.dtype, _static_shape(u.shape))
    value = u.src[0] if u.op is Ops.CONTIGUOUS else u  # the output buffer is the contiguous copy
    stored.append((ctx.param_view(buf), value))
  roots = tuple(v for _, v in stored)
  if nodes is None or len(roots) != len(targets) or any(r is not t for r, t in zip(roots, targets)):
    nodes = graph_nodes(UOp(Ops.SINK, dtypes.void, roots))
  out = _rewrite(ctx, nodes, next(reversed(nodes)))  # the roots' SINK (last) is not in the body
  stores = (out[v] if p is None else UOp(Ops.STORE, dtypes.void, (p, out[v])) for p, v in stored)
  body = UOp(Ops.SINK, dtypes.void, tuple(stores))
  return CallifyResult(body, tuple(ctx.bufs), ctx.becomes, ctx.var_vals, ctx.fresh)


# ---- the same graph again ----

@dataclass(frozen=True)
class CallifyTemplate:
  """What callify gave for one target graph, less its new buffers: a realize of the very same
  graph (an eager loop realizing the same expression of the same buffers: the graph is rebuilt
  from the hash-cons cache while the previous result's history holds it) makes new buffers of
  the same kinds and reuses the rest without walking the graph. Holds the graph's nodes weakly
  (its key is the graph's root) and its buffers, which the graph holds anyway."""
  device: str
  body: UOp
  bufs: tuple[UOp | None, ...]  # None at the slots of new buffers
  fresh: tuple[tuple[weakref.ref, str, DType, tuple, int], ...]  # node, kind, slot
  aliases: tuple[tuple[weakref.ref, weakref.ref], ...]  # becomes entries to existing nodes
  var_vals: tuple[tuple[str, int], ...]


_templates: NodeMap[CallifyTemplate] = NodeMap("callify_template")  # target -> its template


def remember(target: UOp, device: str, res: CallifyResult) -> None:
  """Keep `res` (callify's result for the one target `target` on `device`) for `recallify`."""
  fresh = tuple((weakref.ref(f.node), f.device, f.dtype, f.shape,
                 res.bufs.index(_base(f.view))) for f in res.fresh)
  bufs: list[UOp | None] = list(res.bufs)
  for *_, slot in fresh: bufs[slot] = None
  aliases: tuple[tuple[weakref.ref, weakref.ref], ...] = ()
  if len(res.becomes) > len(fresh):  # assigns: becomes entries to nodes of the graph
    news = {f.node for f in res.fresh}
    aliases = tuple((weakref.ref(k), weakref.ref(v)) for k, v in res.becomes.items()
                    if k not in news)
  _templates[target] = CallifyTemplate(device, res.body, tuple(bufs), fresh, aliases,
                                       tuple(res.var_vals.items()))


def recallify(target: UOp, device: str) -> CallifyResult | None:
  """callify([target], [device]) when that graph was callified before (`remember`): the same
  body and buffers, new buffers made for what becomes new ones; None when it was not."""
  t = _templates.get(target)
  if t is None or t.device != device: return None
  bufs, becomes = list(t.bufs), {}
  for node, dev, dtype, shape, slot in t.fresh:
    view = becomes[node()] = new_buffer(dev, dtype, shape)
    bufs[slot] = _base(view)
  for k, v in t.aliases: becomes[k()] = v()
  return CallifyResult(t.body, tuple(bufs), becomes, dict(t.var_vals))  # every None filled


def recallify_alike(nodes: dict[UOp, None], device: str, last: UOp,
                    last_nodes: tuple[UOp, ...]) -> CallifyResult | None:
  """callify of one target on `device` when its graph (toposort `nodes`) is shaped exactly like
  the graph of `last` (toposort `last_nodes`, callified before: `remember`) but for its BUFFERs
  (other buffers of the same kinds: an eager step on new inputs): the same body, the new graph's
  buffers in the old ones' slots. One walk of both toposorts side by side, comparing each pair of
  nodes, where callify rebuilt every node; None at the first difference."""
  t = _templates.get(last)
  if t is None or t.device != device or len(nodes) != len(last_nodes): return None
  alike: dict[UOp, UOp] = {}  # old node -> new node
  get, buffer, function = alike.get, Ops.BUFFER, Ops.FUNCTION
  for v, u in zip(last_nodes, nodes):
    if v is not u:
      if v.op is buffer:
        if u.op is not buffer or u.src is not v.src and u.src != v.src or u.tag is not None or \
            v.tag is not None or not _same_kind(v.arg, u.arg): return None
      elif len(v.src) != len(u.src) or not (v.is_like(u) or _fresh_storage(v, u)): return None
    src_v, src_u = v.src, u.src
    if v.op is function:  # the toposorts leave calls' bodies out: the same body, the same call
      if src_v[0] is not src_u[0]: return None
      src_v, src_u = src_v[1:], src_u[1:]
    for a, b in zip(src_v, src_u):  # also where v is u: its sources must stand for themselves
      if get(a) is not b: return None
    alike[v] = u
  bufs = [None if b is None else get(b) for b in t.bufs]
  if sum(b is None for b in bufs) != len(t.fresh): return None  # a buffer not in the graph
  becomes, fresh = {}, []
  for node, dev, dtype, shape, slot in t.fresh:
    if (new := get(node())) is None: return None
    view = becomes[new] = new_buffer(dev, dtype, shape)
    bufs[slot] = _base(view)
    fresh.append(Fresh(new, view, dev, dtype, shape))
  for k, v in t.aliases:
    if (new := get(k())) is None: return None
    becomes[new] = get(v(), v())
  # every None slot got a fresh buffer (counted above): mypy cannot see it
  return CallifyResult(t.body, tuple(bufs), becomes, dict(t.var_vals), fresh)  # type: ignore[arg-type]


def _fresh_storage(v: UOp, u: UOp) -> bool:
  """Two `.contiguous()` nodes alike but for their storage tags (each call's own: callify gives
  either a new buffer and leaves the tag out of the body)."""
  return v.op is u.op is Ops.CONTIGUOUS and v.dtype == u.dtype and v.arg == u.arg and \
    type(v.tag) is int and type(u.tag) is int


def _same_kind(a: ParamArg, b: ParamArg) -> bool:
  """Two BUFFERs' args alike but for their slot: dtype, device, address space, no name."""
  return a.dtype == b.dtype and a.device == b.device and a.addrspace is b.addrspace and \
    a.name is None and b.name is None and a.value is None and b.value is None


def _base(view: UOp) -> UOp:
  """The BUFFER of a new buffer's view."""
  base = buffer_base(view)
  assert base is not None, "new_buffer gives a view of a BUFFER"
  return base


def _static_shape(shape: tuple) -> tuple:
  """The shape with sizes that simplify to constants as ints."""
  if all(type(s) is int for s in shape): return shape
  return tuple(as_shape(shape_uop(shape)))
