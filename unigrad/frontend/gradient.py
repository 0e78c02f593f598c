"""Gradient: reverse-mode autodiff on the tensor graph, and the autograd methods of Tensor.

consumes: a tensor-graph root, the gradient flowing into it, and target nodes.
produces: target -> gradient, as lazy tensor-graph UOps that fuse and schedule like any others.
invariants: a gradient has its source's shape and dtype; only nodes on a path from the root to a
  target are visited; DETACH stops gradients; gradients flow only into floating-point nodes (as in
  PyTorch: comparisons, integer ops and casts to integers carry none).

The rules are `pm_gradient`, one per op. A rule's callback gets the upstream gradient as `ctx` and
returns one gradient per source of the node (None where none flows), forward and backward side by
side: `y = a*b` gives `(g*b, g*a)`. A node with an override (`override_gradient`: the frontend's
sliding-window view) hands its gradient straight to a node below it instead.

Tensor side (`GradientMixin`): `requires_grad` / `requires_grad_()`, `backward()`, `gradient()`,
`contiguous_backward()`, `Tensor.no_grad` and `Tensor.train()`. A tensor that requires grad gets its
own identity: unless it is already a buffer, its value is stored lazily into a fresh buffer
(`AFTER(buf, STORE(buf, value))`), so two parameters holding equal values are never merged by
hash-consing (merged leaves would get summed gradients).
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from unigrad.dtype import DType, dtypes
from unigrad import engine
from unigrad.frontend import implicit_grads
from unigrad.frontend.elementwise import compose_cos
from unigrad.frontend.live import all_tensors
from unigrad.knobs import TRAINING
from unigrad.schedule.function import body_params, param_like
from unigrad.uop import NodeMap, Ops, PatternMatcher, ReduceArg, UOp, UPat, shape_uop, sint

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

Grads = tuple[UOp | None, ...]


class GradientError(RuntimeError):
  """An op on the path from the root to a target has no gradient rule."""


# ---- tensor-graph builders on UOps ----

def _reshape(u: UOp, shape: tuple[sint, ...]) -> UOp:
  if tuple(u.shape) == tuple(shape): return u
  return UOp(Ops.RESHAPE, u.dtype, (u, shape_uop(shape)))


def _expand(u: UOp, shape: tuple[sint, ...]) -> UOp:
  """`u` broadcast to `shape` (leading axes added first)."""
  if tuple(u.shape) == tuple(shape): return u
  u = _reshape(u, (1,) * (len(shape) - len(u.shape)) + tuple(u.shape))
  return UOp(Ops.EXPAND, u.dtype, (u, shape_uop(shape)))


def _full(shape: tuple[sint, ...], dtype: DType, value: Any) -> UOp:
  return _expand(UOp.const(dtype, value), shape)


def _sum(u: UOp, axes: tuple[int, ...]) -> UOp:
  """REDUCE ADD over `axes` (kept as 1); 16-bit floats accumulate in float32."""
  if not axes: return u
  acc = dtypes.float32 if dtypes.is_float(u.dtype) and u.dtype.itemsize < 4 else u.dtype
  return UOp(Ops.REDUCE, acc, (u.cast(acc),), ReduceArg(Ops.ADD, axes)).cast(u.dtype)


def _sum_to(g: UOp, shape: tuple[sint, ...]) -> UOp:
  """A broadcast gradient summed back to `shape` (the axes `shape` broadcasts along)."""
  if len(g.shape) < len(shape): g = _expand(g, shape)
  lead = len(g.shape) - len(shape)
  axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                    if s == 1 and g.shape[lead + i] != 1)
  return _expand(_reshape(_sum(g, axes), tuple(shape)) if axes or lead else g, shape)


def _eq(a: UOp, b: UOp | float) -> UOp: return a.ne(b).logical_not()


# ---- the rules ----

def _max_grad(ctx: UOp, a: UOp, b: UOp) -> Grads:
  """maximum(a, b): the larger side gets g, ties split it 50/50 (like PyTorch)."""
  half, zero = UOp.const(ctx.dtype, 0.5), UOp.const(ctx.dtype, 0.0)
  tie = _eq(a, b)
  return (ctx * tie.where(half, (a < b).where(zero, 1.0)),
          ctx * tie.where(half, (b < a).where(zero, 1.0)))


def _pow_grad(ctx: UOp, y: UOp, a: UOp, b: UOp) -> Grads:
  """y = a**b: b*a**(b-1) (0 where b == 0) and y*ln(a) (0 where a == 0 and b >= 0), as PyTorch."""
  da = _eq(b, 0.0).where(0.0, b * a.pow(b - 1.0))
  db = (_eq(a, 0.0) & (b >= 0.0)).where(0.0, y * a.log2() * math.log(2))
  return (ctx * da, ctx * db)


def _reduce_add_grad(ctx: UOp, r: UOp) -> Grads:
  return (_expand(ctx, r.src[0].shape),)


def _reduce_max_grad(ctx: UOp, r: UOp) -> Grads:
  """Every maximal element gets g divided by the number of ties."""
  x = r.src[0]
  mask = _eq(x, _expand(r, x.shape)).cast(x.dtype)
  count = _sum(mask, r.arg.axes)
  return (mask * _expand(ctx * count.recip(), x.shape),)


def _reduce_mul_grad(ctx: UOp, r: UOp) -> Grads:
  """The product of the others, without dividing by zero: with no zero it is prod/x; with one
  zero only the zero gets the product of the nonzeros; with more every gradient is 0."""
  x, axes = r.src[0], r.arg.axes
  is_zero = _eq(x, 0.0)
  nonzero = is_zero.where(1.0, x)
  zeros = _expand(_sum(is_zero.cast(x.dtype), axes), x.shape)
  prod = _expand(UOp(Ops.REDUCE, x.dtype, (nonzero,), ReduceArg(Ops.MUL, axes)), x.shape)
  others = is_zero.where(_eq(zeros, 1.0).where(prod, 0.0),
                         _eq(zeros, 0.0).where(prod * nonzero.recip(), 0.0))
  return (others * _expand(ctx, x.shape),)


_REDUCE_GRADS: dict[Ops, Callable[[UOp, UOp], Grads]] = {
  Ops.ADD: _reduce_add_grad, Ops.MAX: _reduce_max_grad, Ops.MUL: _reduce_mul_grad}


def _permute_grad(ctx: UOp, p: UOp) -> Grads:
  inverse = tuple(sorted(range(len(p.arg)), key=lambda i: p.arg[i]))
  return (UOp(Ops.PERMUTE, ctx.dtype, (ctx,), inverse),)


def _after_grad(ctx: UOp, a: UOp) -> Grads:
  """AFTER(target, STORE(target, value)): the value read is the value stored."""
  return (None, *(ctx if s.op is Ops.STORE else None for s in a.src[1:]))


_x, _any = UPat.var("x"), UPat()
_NO_GRAD_OPS = (Ops.CMPLT, Ops.CMPNE, Ops.IDIV, Ops.MOD, Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR,
                Ops.THREEFRY)

pm_gradient = PatternMatcher([
  # y = a+b: (g, g)
  (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
  # y = a*b: (g*b, g*a)
  (UPat(Ops.MUL, src=(UPat.var("a"), UPat.var("b"))), lambda ctx, a, b: (ctx * b, ctx * a)),
  # y = maximum(a, b): to the larger, ties 50/50
  (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b"))), _max_grad),
  # y = 1/x: -g*y*y
  (UPat(Ops.RECIP, name="y"), lambda ctx, y: (-ctx * y * y,)),
  # y = sqrt(x): g/(2y)
  (UPat(Ops.SQRT, name="y"), lambda ctx, y: (ctx * (y * 2.0).recip(),)),
  # y = 2**x: g*y*ln2
  (UPat(Ops.EXP2, name="y"), lambda ctx, y: (ctx * y * math.log(2),)),
  # y = log2(x): g/(x*ln2)
  (UPat(Ops.LOG2, src=(_x,)), lambda ctx, x: (ctx * (x * math.log(2)).recip(),)),
  # y = sin(x): g*cos(x), cos from exact-argument sines (sin(pi/2 - x) rounds pi/2 - x)
  (UPat(Ops.SIN, src=(_x,)), lambda ctx, x: (ctx * compose_cos(x),)),
  # y = a**b: both partials, with PyTorch's zero special cases
  (UPat(Ops.POW, name="y", src=(UPat.var("a"), UPat.var("b"))), _pow_grad),
  # y = where(c, a, b): g routed by the condition
  (UPat(Ops.WHERE, src=(UPat.var("c"), _any, _any)),
   lambda ctx, c: (None, c.where(ctx, 0.0), c.where(0.0, ctx))),
  # comparisons, integer division and bitwise ops: no gradient
  (UPat(_NO_GRAD_OPS), lambda: (None, None)),
  # y = trunc(x): piecewise constant, gradient 0
  (UPat(Ops.TRUNC, src=(_x,)), lambda x: (_full(x.shape, x.dtype, 0.0),)),
  # y = cast(x): g cast back
  (UPat(Ops.CAST, src=(_x,)), lambda ctx, x: (ctx.cast(x.dtype),)),
  # y = bitcast(x): no gradient
  (UPat(Ops.BITCAST), lambda: (None,)),
  # y = reduce(x): ADD broadcasts g, MAX masks ties, MUL takes the product of the others
  (UPat(Ops.REDUCE, name="r"), lambda ctx, r: _REDUCE_GRADS[r.arg.op](ctx, r)),
  # movement ops: the inverse view of g (EXPAND sums over the broadcast axes)
  (UPat(Ops.RESHAPE, src=(_x, _any)), lambda ctx, x: (_reshape(ctx, x.shape), None)),
  (UPat(Ops.PERMUTE, name="p"), _permute_grad),
  (UPat(Ops.EXPAND, src=(_x, _any)), lambda ctx, x: (_sum_to(ctx, x.shape), None)),
  (UPat(Ops.PAD, src=(_x, UPat.var("off"), _any)),
   lambda ctx, x, off: (UOp(Ops.SHRINK, ctx.dtype, (ctx, off, shape_uop(x.shape))), None, None)),
  (UPat(Ops.SHRINK, src=(_x, UPat.var("off"), _any)),
   lambda ctx, x, off: (UOp(Ops.PAD, ctx.dtype, (ctx, off, shape_uop(x.shape))), None, None)),
  (UPat(Ops.FLIP, name="f"), lambda ctx, f: (UOp(Ops.FLIP, ctx.dtype, (ctx,), f.arg),)),
  # markers: CONTIGUOUS passes g, CONTIGUOUSBACKWARD materializes it, DETACH stops it
  (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
  (UPat(Ops.CONTIGUOUSBACKWARD), lambda ctx: (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),)),
  (UPat(Ops.DETACH), lambda: (None,)),
  # y = copy(x) to another device: g copied back
  (UPat(Ops.COPY, src=(_x,)), lambda ctx, x: (UOp(Ops.COPY, ctx.dtype, (ctx,), x.device),)),
  # collectives between processes (a value equal on every rank is one value, as a replicated
  # multi-device tensor is): see _collective_grad
  (UPat(Ops.COLLECTIVE, name="c"), lambda ctx, c: (_collective_grad(ctx, c),)),
  # REPLICATED keeps one of n equal slices: the first slice gets the gradient, the others none
  (UPat(Ops.REPLICATED, src=(_x,)), lambda ctx, x: (
    UOp(Ops.PAD, ctx.dtype, (ctx, shape_uop((0,) * len(x.shape)), shape_uop(x.shape))),)),
  # assign: the value of AFTER(target, STORE(target, value)) is the stored value
  (UPat(Ops.AFTER, name="a"), _after_grad),
  (UPat(Ops.STORE, name="st"), lambda ctx, st: (None, ctx, *(None,) * (len(st.src) - 2))),
])


def _collective_grad(g: UOp, c: UOp) -> UOp | None:
  """The local gradient of a collective, with a value equal on every rank counted once (the
  multi-process form of a replicated tensor): all_reduce(sum) passes g (each rank's share of
  the sum gets the same g), mean scales it, max/min give it to the ranks holding the extreme;
  all_gather keeps this rank's rows of g; reduce_scatter gathers g; a broadcast gives g to its
  root; a send passes g to its local copy; a recv has no gradient."""
  x, a = c.src[0], c.arg
  if a.kind == "all_reduce" and a.reduce == "sum": return g
  if a.kind == "all_reduce": return _eq(x, c).where(g, UOp.const(g.dtype, 0.0))
  if a.kind == "all_gather":
    rows = x.shape[0]
    start = shape_uop((a.rank * rows, *(0 for _ in x.shape[1:])))
    return UOp(Ops.SHRINK, g.dtype, (g, start, shape_uop(x.shape)))
  if a.kind == "reduce_scatter" and a.reduce == "sum":
    return UOp(Ops.COLLECTIVE, g.dtype, (g,), replace(a, kind="all_gather", reduce=None))
  if a.kind == "broadcast": return g if a.rank == a.peer else g.const_like(0.0)
  if a.kind == "send": return g
  if a.kind == "recv": return None
  raise GradientError(f"gradient: no rule for {a.kind}({a.reduce}): detach() its input")


# ---- gradient overrides ----

# a view -> ((a node below it that gets the view's gradient, that gradient from the view's), ...);
# kept on the view: an entry lives as long as its view (backward asks of every node it passes)
Override = tuple[tuple[UOp, Callable[[UOp], UOp]], ...]
gradient_overrides: NodeMap[Override] = NodeMap("gradient_override")


def override_gradient(view: UOp, src: UOp, fn: Callable[[UOp], UOp]) -> None:
  """When `g` flows into `view`, give `src` (a node below it) the gradient `fn(g)` instead of
  passing `g` down the ops between them rule by rule. `fn` must be that exact gradient: hash-
  consing shares `view` with every equal view. Several sources of one view each get their own
  (calling again for a source replaces its entry); together they must be every path below the
  view. For chains of movement ops whose rule-by-rule gradient compiles badly: the sliding-window
  view of a convolution (frontend/nnops.py `pool`) gets a reduce over repeated copies with
  div/mod indexing from the rules, a sum of shifted pads from its override."""
  others = tuple(p for p in gradient_overrides.get(view) or () if p[0] is not src)
  gradient_overrides[view] = (*others, (src, fn))


def _overridden(u: UOp, g: UOp, path: dict[UOp, None]) -> tuple[tuple[UOp, UOp], ...] | None:
  """(src, gradient) for each source of `u`'s override on the path; None when there is none."""
  pairs = tuple((src, fn(g)) for src, fn in gradient_overrides.get(u) or () if src in path)
  return pairs or None


# ---- the walk ----

def _path_to_targets(root: UOp, targets: dict[UOp, None]) -> dict[UOp, None]:
  """The nodes below `root` with a path to a target that crosses no DETACH, sources first."""
  on: dict[UOp, bool] = {}
  for u in root.toposort():
    on[u] = u in targets or (u.op is not Ops.DETACH and any(on[s] for s in u.src))
  return {u: None for u, v in on.items() if v}


def _local_grads(u: UOp, g: UOp) -> Grads:
  ret = pm_gradient.rewrite(u, g)
  if ret is None:
    raise GradientError(f"gradient: no rule for {u.op.name} (dtype {u.dtype!r}, shape {u.shape}) "
                        "on the path to a target: add one to pm_gradient or detach() the input")
  if len(ret) != len(u.src):
    raise GradientError(f"gradient: the {u.op.name} rule gave {len(ret)} gradients for "
                        f"{len(u.src)} sources")
  return ret


def _fit(g: UOp, s: UOp) -> UOp:
  """The gradient shaped and typed like its source (void STOREs take it as it is)."""
  if s.dtype == dtypes.void: return g
  if tuple(g.shape) != tuple(s.shape): g = _sum_to(g, s.shape)
  return g.cast(s.dtype)


def _carries_grad(s: UOp) -> bool: return s.dtype == dtypes.void or dtypes.is_float(s.dtype)


def _reached(root: UOp, path: dict[UOp, None]) -> set[UOp]:
  """The nodes of `path` that `root` reaches through its sources without crossing a DETACH."""
  seen = {root}
  for u in reversed(path):
    if u in seen and u.op is not Ops.DETACH: seen.update(s for s in u.src if s in path)
  return seen


def compute_gradient(root: UOp, root_grad: UOp, targets: Iterable[UOp],
                     materialize: bool = False) -> dict[UOp, UOp]:
  """The gradient of each target reached from `root`, when `root_grad` flows into `root`.

  Visits, in reverse topological order and without recursion, only the nodes on a path from
  `root` to a target; several contributions to one node are added. A target the gradient does not
  reach (unused, behind DETACH or only through non-differentiable ops) is left out of the result.
  `compute_gradient(y, ones, [x])[x]` is dy/dx as a lazy UOp graph. With `materialize`, when no
  target gets a gradient, those reached only through ops without one (comparisons) get zeros, as
  in tinygrad's backward, where PyTorch raises."""
  wanted = dict.fromkeys(targets)
  path = _path_to_targets(root, wanted)
  if root not in path or not dtypes.is_float(root.dtype): return {}
  grads: dict[UOp, UOp] = {root: _fit(root_grad, root)}
  results: dict[UOp, dict[int, UOp]] = {}  # FUNCTION -> gradient of each result reached
  for u in reversed(path):
    if u.op is Ops.FUNCTION:
      if (outs := results.get(u)) is None: continue
      pairs = tuple(zip(u.src, function_grads(u, outs)))
    elif (g := grads.get(u)) is None or not any(s in path for s in u.src): continue
    elif u.op is Ops.GETTUPLE and u.src[0].op is Ops.FUNCTION:
      outs = results.setdefault(u.src[0], {})
      outs[u.arg] = outs[u.arg] + g if u.arg in outs else g
      continue
    elif (over := _overridden(u, g, path)) is not None:
      pairs = over
    else: pairs = tuple(zip(u.src, _local_grads(u, g)))
    for s, sg in pairs:
      if sg is None or s not in path or not _carries_grad(s): continue
      sg = _fit(sg, s)
      grads[s] = grads[s] + sg if s in grads else sg
  if materialize and not any(t in grads for t in wanted):
    zero = [t for t in _reached(root, path) & wanted.keys()]
    for t in zero:
      if dtypes.is_float(t.dtype): grads[t] = _full(t.shape, t.dtype, 0.0)
  return {t: grads[t] for t in wanted if t in grads}


# ---- functions ----

def function_grads(f: UOp, outs: dict[int, UOp]) -> Grads:
  """The gradients of FUNCTION `f`'s sources when `outs[i]` flows into its result i: one
  backward FUNCTION over the same arguments and the incoming gradients, a GETTUPLE per argument
  that gets a gradient (None for the body and the others)."""
  order = tuple(sorted(outs))
  bw, which = backward_body(f.src[0], len(f.src) - 1, order)
  res: list[UOp | None] = [None] * len(f.src)
  if bw is None: return tuple(res)
  call = UOp(Ops.FUNCTION, dtypes.void, (bw, *f.src[1:], *(outs[i] for i in order)))
  for j, k in enumerate(which): res[1 + k] = UOp(Ops.GETTUPLE, None, (call,), j)
  return tuple(res)


@functools.lru_cache(maxsize=256)
def backward_body(body: UOp, nargs: int, order: tuple[int, ...]) -> tuple[UOp | None, tuple]:
  """The TUPLE body of the backward of `body` (a FUNCTION body over PARAM 0..nargs-1) when the
  results in `order` get gradients (PARAMs nargs.. in that order), and the argument slots it
  returns gradients for."""
  params = body_params(body, nargs)
  total: dict[UOp, UOp] = {}
  for j, i in enumerate(order):
    incoming = param_like(nargs + j, body.src[i])
    for p, g in compute_gradient(body.src[i], incoming, params.values()).items():
      total[p] = total[p] + g if p in total else g
  which = tuple(k for k in sorted(params) if params[k] in total)
  if not which: return None, ()
  return UOp(Ops.TUPLE, dtypes.void, tuple(total[params[k]] for k in which)), which


# ---- no_grad and train ----

class _GradMode(threading.local):
  """Whether ops record gradients: `Tensor.no_grad` reads and sets `disabled`. Per thread, like
  PyTorch's grad mode: a new thread records gradients whatever other threads do."""
  disabled: bool = False

  def __init__(self) -> None: self.saved: list[bool] = []  # the states `with` blocks restore


_grad_mode = _GradMode()


class NoGrad(contextlib.ContextDecorator):
  """`Tensor.no_grad`: true while gradients are off. Ops built while it is on give detached
  results (views of buffers stay views, so assigning through them still writes the buffer).

  `with Tensor.no_grad():`, `with Tensor.no_grad:` and `@Tensor.no_grad()` turn it on for a block
  (nesting restores the previous state); `Tensor.no_grad = True` turns it on until set False."""

  def __bool__(self) -> bool: return _grad_mode.disabled
  def __repr__(self) -> str: return f"<Tensor.no_grad {'on' if _grad_mode.disabled else 'off'}>"

  def __call__(self, func: Callable | None = None) -> Any:  # type: ignore[override]
    return NoGrad() if func is None else super().__call__(func)

  def __enter__(self) -> NoGrad:
    _grad_mode.saved.append(_grad_mode.disabled)
    _grad_mode.disabled = True
    return self

  def __exit__(self, *exc: object) -> None: _grad_mode.disabled = _grad_mode.saved.pop()


_NO_GRAD = NoGrad()


def is_grad_enabled() -> bool:
  """Whether ops record gradients in this thread (`Tensor.no_grad` off; torch.is_grad_enabled)."""
  return not _grad_mode.disabled


class TensorMeta(type):
  """Tensor's metaclass: makes `Tensor.no_grad` both a flag and a context manager."""

  @property
  def no_grad(cls) -> NoGrad: return _NO_GRAD

  @no_grad.setter
  def no_grad(cls, value: bool) -> None: _grad_mode.disabled = bool(value)

  @property
  def training(cls) -> bool:
    """Training mode: the TRAINING knob (`Context(TRAINING=1)` and `Tensor.train()` set it)."""
    return bool(TRAINING.value)

  @training.setter
  def training(cls, value: bool) -> None: TRAINING.value = bool(value)

  @training.deleter
  def training(cls) -> None: TRAINING.value = TRAINING.default  # back to the default (eval)


class Train(contextlib.ContextDecorator):
  """`with Tensor.train():` sets `Tensor.training` (default True) for a block, then restores it."""

  def __init__(self, cls: type, mode: bool) -> None:
    self.cls, self.mode, self._saved = cls, mode, []

  def __enter__(self) -> Train:
    self._saved.append(self.cls.training)
    self.cls.training = self.mode
    return self

  def __exit__(self, *exc: object) -> None: self.cls.training = self._saved.pop()


def detach_if_no_grad(u: UOp) -> UOp:
  """`u`, detached while `Tensor.no_grad` is on (buffer views stay views: see NoGrad; a node no
  gradient can flow through, such as an op on detached values, needs no DETACH)."""
  if not _grad_mode.disabled or u.op is Ops.DETACH or u.grad_free or engine.is_buffer_view(u):
    return u
  return u.detach()


# ---- the Tensor methods ----

# live tensors with requires_grad True, by id (a WeakSet would compare Tensors with their __eq__)
_leaves: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_leaves_lock = threading.Lock()  # other threads add leaves while backward() lists them


def _implicit_targets(nodes: dict[UOp, None]) -> list[Tensor]:
  """The live float tensors in `nodes` whose requires_grad is None (tinygrad's default; a
  realized one is in `nodes` only without a history, as an input batch: the backward reaches
  the graph that computed one with a history, and that graph's tensors)."""
  return [t for t in all_tensors.alive() if t.uop in nodes and
          t.__dict__.get("_requires_grad") is None and dtypes.is_float(t.uop.dtype)]


def in_autograd_graph(u: UOp) -> bool:
  """Whether a gradient can flow from `u` to a live tensor that requires grad (in PyTorch's
  words: `u` has a grad_fn or is such a leaf): never under no_grad, for a detached or non-float
  value, or while no tensor requires grad."""
  if _grad_mode.disabled or u.grad_free: return False
  with _leaves_lock: live = [t.uop for t in _leaves.values()]
  if not live: return False
  nodes = engine.with_history(u).toposort()
  return any(leaf in nodes for leaf in live)


def own_identity(u: UOp, device: str) -> UOp:
  """`u` if it already is a buffer of its own, else its value stored lazily into a fresh buffer
  (a unique slot), so equal parameters stay distinct nodes."""
  if engine.is_realized(u) or (u.op is Ops.AFTER and engine.is_buffer_view(u.src[0])): return u
  buf = engine.new_buffer(device, u.dtype, tuple(u.shape))
  return UOp(Ops.AFTER, u.dtype, (buf, UOp(Ops.STORE, dtypes.void, (buf, u))))


def _creator(name: str) -> classmethod:
  """The class constructor `name` of the next base, also taking `requires_grad=`."""
  def create(cls: type, *args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    t = getattr(super(GradientMixin, cls), name)(*args, **kwargs)
    return t if requires_grad is None else t.requires_grad_(requires_grad)
  create.__name__ = create.__qualname__ = name
  create.__doc__ = f"Tensor.{name}(...), also taking requires_grad= (PyTorch's keyword)."
  return classmethod(create)


def _like_creator(name: str) -> Callable[..., Tensor]:
  """The `*_like` constructor `name` of the next base, also taking `requires_grad=`."""
  def create(self: Tensor, *args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    t = getattr(super(GradientMixin, self), name)(*args, **kwargs)
    return t if requires_grad is None else t.requires_grad_(requires_grad)
  create.__name__ = create.__qualname__ = name
  create.__doc__ = f"t.{name}(...), also taking requires_grad= (PyTorch's keyword)."
  return create


class GradientMixin:
  """Autograd: requires_grad, backward, gradient, contiguous_backward, no_grad, train."""
  uop: UOp
  grad: Tensor | None = implicit_grads.ImplicitGrad(compute_gradient)  # type: ignore[assignment]

  @property
  def training(self) -> bool: return bool(TRAINING.value)

  @property
  def shape(self) -> tuple[sint, ...]: raise NotImplementedError
  @property
  def dtype(self) -> DType: raise NotImplementedError
  @property
  def device(self) -> str: raise NotImplementedError
  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError
  def numel(self) -> sint: raise NotImplementedError

  # constructors that also take requires_grad= (PyTorch's keyword)
  empty, full, zeros = _creator("empty"), _creator("full"), _creator("zeros")
  ones, arange, eye = _creator("ones"), _creator("arange"), _creator("eye")
  full_like, zeros_like = _like_creator("full_like"), _like_creator("zeros_like")
  ones_like = _like_creator("ones_like")

  @property
  def requires_grad(self) -> bool | None:
    """True for a leaf whose `.grad` `backward()` fills; None (unset) or False otherwise."""
    return self.__dict__.get("_requires_grad")

  @requires_grad.setter
  def requires_grad(self, value: bool | None) -> None:
    if value is not None and not isinstance(value, bool):
      raise TypeError(f"requires_grad must be a bool or None, got {type(value).__name__} {value!r}")
    if value and not dtypes.is_float(self.dtype):
      raise RuntimeError("only Tensors of floating point dtype can require gradients, "
                         f"got {self.dtype!r}")
    if value:
      self.uop = own_identity(self.uop, self.device)
      with _leaves_lock: _leaves[id(self)] = self  # type: ignore[assignment]
    elif self.requires_grad:
      with _leaves_lock: _leaves.pop(id(self), None)
    self.__dict__["_requires_grad"] = value

  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    """Set `requires_grad` in place; returns self. `w = Tensor.zeros(3).requires_grad_()`"""
    self.requires_grad = requires_grad
    return self  # type: ignore[return-value]

  def contiguous_backward(self) -> Tensor:
    """The same values; in backward, the gradient flowing through is made contiguous."""
    return self._wrap(UOp(Ops.CONTIGUOUSBACKWARD, self.dtype, (self.uop,)))

  def _root_grad(self, gradient: Tensor | None) -> UOp:
    if gradient is None:
      if self.numel() != 1:
        raise RuntimeError("grad can be implicitly created only for scalar outputs")
      return _full(self.shape, self.dtype, 1.0)
    if tuple(gradient.shape) != tuple(self.shape):
      raise RuntimeError(f"Mismatch in shape: gradient has a shape of {gradient.shape} and the "
                         f"output has a shape of {self.shape}")
    return gradient.uop.cast(self.dtype)

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None,
               materialize_grads: bool = False) -> list[Tensor]:
    """d(self)/d(target) for each target, as lazy tensors (`gradient` is the upstream gradient,
    ones for a one-element self). An unreached target raises unless `materialize_grads` (zeros).
    `dx, = (x * x).sum().gradient(x)`"""
    for t in targets:
      if not dtypes.is_float(t.dtype):
        raise RuntimeError(f"gradient: only floating point tensors have gradients, got {t.dtype!r}")
    root = engine.with_history(self.uop, {t.uop: None for t in targets})
    grads = compute_gradient(root, self._root_grad(gradient), [t.uop for t in targets])
    out = []
    for i, t in enumerate(targets):
      g = grads.get(t.uop)
      if g is None and not materialize_grads:
        raise RuntimeError(f"gradient: target {i} ({t!r}) is not reached from this tensor by a "
                           "differentiable path; pass materialize_grads=True for zeros")
      out.append(t._wrap(g if g is not None else _full(t.shape, t.dtype, 0.0)))
    return out

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into `.grad` (a lazy sum, like PyTorch's accumulation) of every
    live tensor self depends on whose `requires_grad` is True (PyTorch's rule), and give one to
    every float tensor it depends on whose `requires_grad` is None (tinygrad's default), kept
    lazily until `.grad` is read (frontend/implicit_grads.py); False gets none. When the only
    paths are through comparisons, the tensors get zeros (tinygrad) where PyTorch raises. A
    `.grad` nobody reads is never computed. Returns self. `loss.backward(); w.grad.numpy()`"""
    with _leaves_lock: live = list(_leaves.values())
    root = engine.with_history(self.uop, {t.uop: None for t in live})
    nodes = root.toposort()
    targets = [t for t in live if t.uop in nodes]
    implicit = [t for t in _implicit_targets(nodes) if t is not self]
    root_grad = self._root_grad(gradient)
    grads = compute_gradient(root, root_grad, [t.uop for t in targets], True)
    if not grads and not implicit:
      raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn: "
                         "no float tensor whose requires_grad is not False is reached by a "
                         "differentiable path")
    for t in targets:
      if (g := grads.get(t.uop)) is None: continue
      if t.grad is None: t.grad = t._wrap(g)
      else: t.grad.uop = detach_if_no_grad(t.grad.uop + g)
    for t in implicit:  # differentiated when `.grad` is read (frontend/implicit_grads.py)
      if (own := t.__dict__.get("grad")) is None:
        implicit_grads.keep(t, implicit_grads.Recipe(root, root_grad, t.uop))
      elif (g := compute_gradient(root, root_grad, [t.uop]).get(t.uop)) is not None:
        own.uop = detach_if_no_grad(own.uop + g)  # a .grad read before: accumulated now
    return self  # type: ignore[return-value]

  @classmethod
  def train(cls, mode: bool = True) -> Train:
    """`with Tensor.train():` sets `Tensor.training` for a block (`Tensor.train(False)`: eval)."""
    return Train(cls, mode)
