"""Vmap: map a function over a batch axis by rewriting its traced graph, traced once.

`vmap(fn, in_axes=0)(*xs)` is `stack([fn(*(x[i] ...)) for i in range(batch)])` computed as one
program: `fn` is traced once per example signature (by the function layer, `unigrad.function`,
so captured weights become PARAMs), and its FUNCTION body is rewritten into the batched body by
one rule per op (`batch_body`): the mapped inputs get a leading batch axis, and every op that
depends on them keeps it in front (elementwise ops broadcast the unbatched operands, movement
ops get the batch axis prepended to their arguments, reductions shift their axes). The batched
body is cached per batch size; the Python function never runs again.

`svmap(fn, in_axes=0)` is the same map whose batch size is a runtime value once exported:
`NumericalFunction(svmap(fn), *examples)` writes `void NAME(int batch, ...)`. On this branch it
loops over the examples in C around the per-example kernels; with symbolic shapes (a bound
`Variable` as the batch size), `batch_body` takes the variable as `batch` unchanged and the
loop becomes one launch per kernel.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from unigrad.dtype import AddrSpace, dtypes
from unigrad.frontend.function import flatten_tensors, function, unflatten_tensors
from unigrad.frontend.tensor import Tensor
from unigrad.schedule.function import inline_functions
from unigrad.uop import GroupOp, Ops, ParamArg, ReduceArg, UOp, shape_uop, sint

__all__ = ["vmap", "svmap", "VmapError", "batch_body"]

# ops that keep their operand's shape: batched in, batched out, arg unchanged
SHAPE_PRESERVING = frozenset({Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.CONTIGUOUSBACKWARD,
                              Ops.DETACH, Ops.COPY, Ops.NOOP})


class VmapError(ValueError):
  """A function or argument that vmap cannot map."""


def _batched_movement(u: UOp, src: tuple[UOp, ...], batch: sint) -> UOp:
  """A movement op on a batched operand: the batch axis prepended to its arguments."""
  x = src[0]
  if u.op in (Ops.RESHAPE, Ops.EXPAND):
    return UOp(u.op, u.dtype, (x, shape_uop((batch, *u.shape))))
  if u.op is Ops.PERMUTE: return UOp(u.op, u.dtype, (x,), (0, *(a + 1 for a in u.arg)))
  if u.op is Ops.FLIP: return UOp(u.op, u.dtype, (x,), (False, *u.arg))
  # PAD and SHRINK: (T, offsets, new shape)
  return UOp(u.op, u.dtype, (x, shape_uop((0, *_shape_of(u.src[1]))), shape_uop((batch, *u.shape))))


def _shape_of(s: UOp) -> tuple[sint, ...]:
  if s.op is Ops.VCONST: return tuple(s.arg)
  return tuple(x.sintify() for x in s.src)


def _batched_alu(u: UOp, src: tuple[UOp, ...], batched: list[bool], batch: sint) -> UOp:
  """An elementwise op: batched operands lined up to the result's rank (batch axis first),
  unbatched ones broadcast from the right as before."""
  rank = len(u.shape)
  new = []
  for s, old, b in zip(src, u.src, batched):
    if b and len(old.shape) < rank:
      s = UOp(Ops.RESHAPE, s.dtype, (s, shape_uop((batch, *(1,) * (rank - len(old.shape)),
                                                   *old.shape))))
    new.append(s)
  return UOp(u.op, u.dtype, tuple(new), u.arg, u.tag)


def batch_body(body: UOp, mapped: Sequence[int], batch: sint) -> UOp:
  """`body` (a FUNCTION's TUPLE over PARAMs) with PARAM slots `mapped` given a leading axis of
  size `batch` and every result batched (see the module docstring)."""
  body = body.replace(src=tuple(inline_functions(list(body.src))))
  memo: dict[UOp, UOp] = {}
  is_batched: dict[UOp, bool] = {}
  for u in body.toposort():
    src = tuple(memo[s] for s in u.src)
    flags = [is_batched[s] for s in u.src]
    is_batched[u] = any(flags) or (u.op is Ops.PARAM and u.arg.name is None
                                   and u.arg.slot in mapped)
    if u is body: memo[u] = u.replace(src=tuple(_lead(s, b, batch) for s, b in zip(src, flags)))
    elif not is_batched[u]: memo[u] = u if src == u.src else u.replace(src=src)
    else: memo[u] = _batched(u, src, flags, batch)
  return memo[body]


def _batched(u: UOp, src: tuple[UOp, ...], flags: list[bool], batch: sint) -> UOp:
  """The batched form of one op whose operands (some of them) are batched."""
  if u.op is Ops.PARAM:
    a = u.arg
    return UOp(Ops.PARAM, u.dtype, (shape_uop((batch, *u.shape)),),
               ParamArg(a.slot, a.dtype, a.device, AddrSpace.GLOBAL))
  if u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.FLIP, Ops.PAD, Ops.SHRINK):
    if flags[1:] and any(flags[1:]):
      raise VmapError(f"{u.op.name} by a size computed from a mapped input cannot be batched")
    return _batched_movement(u, src, batch)
  if u.op is Ops.REDUCE:
    return UOp(Ops.REDUCE, u.dtype, src, ReduceArg(u.arg.op, tuple(a + 1 for a in u.arg.axes)))
  if u.op in GroupOp.ALU: return _batched_alu(u, src, flags, batch)
  if u.op in SHAPE_PRESERVING: return u.replace(src=src)
  raise VmapError(f"vmap has no batching rule for {u.op.name} (shape {u.shape}); the function "
                  "uses an op that cannot be mapped over a batch axis here")


def _lead(u: UOp, batched: bool, batch: sint) -> UOp:
  """A result with the batch axis in front (an unbatched result is broadcast)."""
  if batched: return u
  shape = tuple(u.shape)
  r = UOp(Ops.RESHAPE, u.dtype, (u, shape_uop((1, *shape))))
  return UOp(Ops.EXPAND, u.dtype, (r, shape_uop((batch, *shape))))


class vmap:  # noqa: N801 (the functional-transform name, as in JAX)
  """Map `fn` over axis `in_axes` of its inputs (an int for all, or one int or None per input:
  None passes that input unmapped); results have the batch axis first.

  >>> f = vmap(lambda x, w: x @ w, in_axes=(0, None))
  >>> f(Tensor.ones(5, 3), Tensor.ones(3, 2)).shape
  (5, 2)
  """
  runtime_batch = False  # svmap: the exported batch size is a C argument

  def __init__(self, fn: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0):
    if not callable(fn): raise TypeError(f"vmap needs a function, got {fn!r}")
    _check_axes(in_axes)
    self.fn, self.in_axes = fn, in_axes
    self.traced = function(fn, allow_writes=False)  # a mapped body writes nothing
    self._bodies: dict[tuple, UOp] = {}
    self.__name__ = getattr(fn, "__name__", "fn")

  def axes(self, n: int) -> tuple[int | None, ...]:
    """The mapped axis of each of `n` inputs."""
    if not isinstance(self.in_axes, (tuple, list)): return (self.in_axes,) * n
    if len(self.in_axes) != n:
      raise VmapError(f"in_axes {tuple(self.in_axes)} has {len(self.in_axes)} entries for {n} "
                      "inputs")
    return tuple(self.in_axes)

  def __call__(self, *xs: Tensor) -> Any:
    if not all(isinstance(x, Tensor) for x in xs):
      raise VmapError("vmap'd functions take Tensors only (bind other arguments with a closure)")
    axes = self.axes(len(xs))
    moved = [x if a is None else _axis_first(x, a, i) for i, (x, a) in enumerate(zip(xs, axes))]
    sizes = {x.shape[0] for x, a in zip(moved, axes) if a is not None}
    if not sizes: raise VmapError("vmap needs at least one mapped input (in_axes all None)")
    if len(sizes) > 1: raise VmapError(f"mapped inputs disagree on the batch size: {sizes}")
    batch = sizes.pop()
    examples = [Tensor.empty(*(x.shape[1:] if a is not None else x.shape), dtype=x.dtype,
                             device=x.device) for x, a in zip(moved, axes)]
    result = self.traced(*examples)  # traced once per example signature
    found: dict[int, Tensor] = {}
    tree = flatten_tensors(result, found)
    f = next(iter(found.values())).uop.src[0]
    mapped = tuple(i for i, a in enumerate(axes) if a is not None)
    key = (f.src[0], mapped, batch)
    if (body := self._bodies.get(key)) is None: body = self._bodies[key] = batch_body(*key)
    call = UOp(Ops.FUNCTION, dtypes.void, (body, *(x.uop for x in moved), *f.src[1 + len(xs):]))
    outs = [Tensor._from_uop(UOp(Ops.GETTUPLE, None, (call,), t.uop.arg), t.device)
            for t in found.values()]
    return unflatten_tensors(tree, outs)


class svmap(vmap):  # noqa: N801
  """`vmap` whose batch size stays a runtime argument of the exported C function
  (`void NAME(int batch, ...)`); in_axes must be 0 or None per input."""
  runtime_batch = True

  def __init__(self, fn: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0):
    super().__init__(fn, in_axes)
    flat = self.in_axes if isinstance(self.in_axes, (tuple, list)) else (self.in_axes,)
    if any(a not in (0, None) for a in flat):
      raise VmapError(f"svmap maps axis 0 (or None) of each input, got in_axes={self.in_axes}")


def _check_axes(in_axes: Any) -> None:
  flat = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,)
  for a in flat:
    if a is not None and (not isinstance(a, int) or isinstance(a, bool)):
      raise VmapError(f"in_axes entries must be ints or None, got {a!r}")


def _axis_first(x: Tensor, axis: int, i: int) -> Tensor:
  if not -x.ndim <= axis < x.ndim:
    raise VmapError(f"input {i} of shape {tuple(x.shape)} has no axis {axis} to map over")
  axis %= x.ndim
  return x if axis == 0 else x.permute(axis, *(d for d in range(x.ndim) if d != axis))
