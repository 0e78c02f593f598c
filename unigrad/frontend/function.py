"""`@function`: a Python function on Tensors traced once into the spec's FUNCTION node.

Calling a decorated function on Tensors (spec 000, "The @function Decorator"):
1. finds every Tensor in the arguments (lists, tuples and dicts are walked), deduplicated by
   identity: the explicit inputs;
2. on the first call with a given signature (shapes, dtypes, devices, the non-Tensor arguments,
   `Tensor.training`), runs the function lazily on placeholders whose UOps are PARAM(k), and lifts
   what the body captured from outside (live tensors such as model weights, and buffers) into
   extra PARAMs, so the body mentions no concrete buffer;
3. builds `FUNCTION(TUPLE(results...), *inputs, *captured)` and returns one `GETTUPLE(i)` tensor
   per result.

Later calls with the same signature reuse the traced body: no Python code of the function runs,
only the FUNCTION node is rebuilt over the new arguments, and its kernels come from the schedule
and program caches. Realizing inlines each FUNCTION (schedule/function.py); gradients flow through
it, and the backward of a FUNCTION is itself a FUNCTION (frontend/gradient.py).

A traced function must not read values (item, numpy): that raises. An `assign` inside it to a
tensor from outside (BatchNorm's running statistics in training mode) is not run while tracing:
the tensor holds the new value for the rest of the body, and the value becomes an extra result of
the FUNCTION that every call assigns to the tensor (frontend/writes.py, `TracedWrites`), so the
body stays pure and a cached trace still writes. Any other change of an outside tensor inside
the function (`t.uop = ...`, not through assign) raises `FunctionError`.
"""
from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad.helpers import bounded_put
from unigrad import engine
from unigrad.frontend import writes
from unigrad.frontend.tensor import Tensor, all_tensors
from unigrad.schedule.function import param_like
from unigrad.uop import Ops, UOp, sint
from unigrad.uop.alu import float_bits

__all__ = ["function", "FunctionError", "flatten_tensors", "unflatten_tensors", "structure_key"]


class FunctionError(RuntimeError):
  """A traced function did something a FUNCTION body cannot hold."""


def flatten_tensors(tree: Any, out: dict[int, Tensor]) -> Any:
  """The structure of `tree` with each Tensor replaced by its input index (a `TensorLeaf`);
  fills `out` (id -> Tensor, first-seen order). Lists, tuples and dicts are walked."""
  if isinstance(tree, Tensor):
    out.setdefault(id(tree), tree)
    return _leaf(list(out).index(id(tree)))
  if isinstance(tree, (list, tuple)): return type(tree)(flatten_tensors(x, out) for x in tree)
  if isinstance(tree, dict): return {k: flatten_tensors(v, out) for k, v in tree.items()}
  return tree


def unflatten_tensors(tree: Any, leaves: list[Any]) -> Any:
  """`flatten_tensors` undone with `leaves[i]` in place of input i."""
  if isinstance(tree, TensorLeaf): return leaves[tree.index]
  if isinstance(tree, (list, tuple)): return type(tree)(unflatten_tensors(x, leaves) for x in tree)
  if isinstance(tree, dict): return {k: unflatten_tensors(v, leaves) for k, v in tree.items()}
  return tree


@dataclass(frozen=True)
class TensorLeaf:
  """Where input `index` sat in the arguments."""
  index: int


@functools.lru_cache(maxsize=256)
def _leaf(index: int) -> TensorLeaf: return TensorLeaf(index)  # (every jitted call makes them)


def structure_key(tree: Any) -> Any:
  """A hashable key of the non-Tensor part of the arguments: floats by their bits (0.0 and -0.0
  trace apart, a nan finds its trace again), numpy arrays by their value (a trace holds what the
  array held), other unhashable objects by identity (kept alive by the key)."""
  if isinstance(tree, (list, tuple)): return (type(tree).__name__, *map(structure_key, tree))
  if isinstance(tree, dict): return ("dict", *((k, structure_key(v)) for k, v in tree.items()))
  if type(tree) is float: return ("float", float_bits(tree))
  if type(tree).__name__ == "ndarray" and type(tree).__module__ == "numpy" and \
      not tree.dtype.hasobject:
    return ("ndarray", tree.dtype.str, tree.shape, _digest(tree))
  try:
    hash(tree)
    return (type(tree).__name__, tree)
  except TypeError: return ("id", ByIdentity(tree))


def _digest(arr: Any) -> bytes:
  """A digest of a numpy array's bytes (row-major)."""
  data = arr if arr.flags.c_contiguous else arr.tobytes()
  return hashlib.blake2b(data, digest_size=16).digest()


class ByIdentity:
  """An unhashable argument in a key: equal only to itself. The key holds it, so while a trace
  is kept no other object can take its address (keyed by `id()` alone, a new object at a
  recycled address found the old one's trace)."""
  __slots__ = ("obj",)

  def __init__(self, obj: Any) -> None: self.obj = obj
  def __hash__(self) -> int: return id(self.obj)
  def __eq__(self, other: object) -> bool:
    return isinstance(other, ByIdentity) and other.obj is self.obj


def tensor_signature(t: Tensor) -> tuple[tuple[sint, ...], DType, Any]:
  return (tuple(t.shape), t.dtype, t.device)


@dataclass
class Traced:
  """A traced body: FUNCTION's TUPLE over PARAM 0..n-1 (inputs), then n.. (captured values),
  the captured values (a live tensor's current value is read at each call), and the results'
  structure and devices."""
  body: UOp
  captured: tuple[tuple[UOp, weakref.ref | None], ...]
  out_tree: Any
  out_devices: tuple[Any, ...]
  writes: Traced | None = None  # the new values of the tensors the body assigned, ...
  written: tuple[weakref.ref, ...] = ()  # ... and those tensors


_FUNCTION, _GETTUPLE = Ops.FUNCTION, Ops.GETTUPLE  # `Ops.X` is a slow lookup on Python 3.11


class function:  # noqa: N801 (the spec's decorator name)
  """Trace a function on Tensors into one reusable FUNCTION node.

  >>> @function
  ... def f(a, b): return (a * b).sum(), a + b
  >>> s, t = f(Tensor.ones(3), Tensor.ones(3))
  """

  def __init__(self, fn: Callable[..., Any], allow_writes: bool = True) -> None:
    """`allow_writes=False`: an assign to an outside tensor raises FunctionError (export)."""
    self.fn, self.allow_writes = fn, allow_writes
    self.traces: dict[Any, Traced] = {}
    self.trace_count = 0
    functools.update_wrapper(self, fn)

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    return self if obj is None else functools.partial(self.__call__, obj)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    found: dict[int, Tensor] = {}
    tree = flatten_tensors((args, kwargs), found)
    inputs = list(found.values())
    key = (structure_key(tree), tuple(map(tensor_signature, inputs)), Tensor.training,
           bool(Tensor.no_grad))
    traced = self.traces.get(key)
    if traced is None: traced = self.traces[key] = self._trace(tree, inputs)
    return self._apply(traced, inputs)

  def _trace(self, tree: Any, inputs: list[Tensor], check_pure: bool = True) -> Traced:
    self.trace_count += 1
    params = [param_like(k, t.uop) for k, t in enumerate(inputs)]
    holders = [Tensor._from_uop(p, t.device) for p, t in zip(params, inputs)]
    # every tensor alive now, held (not only its id) until the trace ends: one that died during
    # the trace (a garbage collection) could give its id to a tensor made in it, which then
    # looked like an outside tensor written by the body (an order-dependent FunctionError)
    before = {id(t): (t, t.uop) for t in list(all_tensors)} if check_pure else {}
    args, kwargs = unflatten_tensors(tree, holders)
    recorder = writes.TracedWrites(before)
    if check_pure: writes.tracing.stack.append(recorder)
    try: result = self.fn(*args, **kwargs)
    finally:
      if check_pure: writes.tracing.stack.pop()
      new_values = []
      for t, old in recorder.written.values():  # the writes become results; the tensors unchanged
        new_values.append(t.uop)
        t.uop = old
    found: dict[int, Tensor] = {}
    out_tree = flatten_tensors(result, found)
    outs = list(found.values())
    if not outs: raise FunctionError(f"@function {self.fn.__name__} returned no Tensor")
    if check_pure: _check_pure(self.fn.__name__, before, set(params))
    if recorder.written and not self.allow_writes:
      raise FunctionError(f"@function {self.fn.__name__} assigned to a tensor from outside the "
                          "function; this function must be pure")
    body = UOp(Ops.TUPLE, dtypes.void, tuple(t.uop for t in outs))
    body, captured = _lift_captured(body, set(params), len(params))
    traced = Traced(body, captured, out_tree, tuple(t.device for t in outs))
    if recorder.written:  # a FUNCTION of their own: the results do not read what is written
      written = [t for t, _ in recorder.written.values()]
      wbody = UOp(Ops.TUPLE, dtypes.void, tuple(new_values))
      wbody, wcaptured = _lift_captured(wbody, set(params), len(params))
      traced.writes = Traced(wbody, wcaptured, None, tuple(t.device for t in written))
      traced.written = tuple(weakref.ref(t) for t in written)
    return traced

  def _apply(self, traced: Traced, inputs: list[Tensor]) -> Any:
    outs = _results(traced, inputs)
    if traced.writes is not None:  # the writes made in the body, each assigned now (lazily)
      for ref, value in zip(traced.written, _results(traced.writes, inputs)):
        if (t := ref()) is not None: t.assign(value.detach())
    return unflatten_tensors(traced.out_tree, outs)


def _results(traced: Traced, inputs: list[Tensor]) -> list[Tensor]:
  """One GETTUPLE tensor per result of a FUNCTION of `traced` over `inputs` (and the captured
  values as they are now)."""
  args = [t.uop for t in inputs] + [_current(u, ref) for u, ref in traced.captured]
  f = UOp(_FUNCTION, dtypes.void, (traced.body, *args))
  # each result's dtype is its body value's (given: not derived again at every call)
  return [Tensor._from_uop(UOp(_GETTUPLE, r.dtype, (f,), i), dev)
          for i, (r, dev) in enumerate(zip(traced.body.src, traced.out_devices))]


class op_function(function):  # noqa: N801 (a decorator, like `function`)
  """`function` for the library's own composite ops (the `traced` decorator of
  frontend/traced.py): an eager call builds one FUNCTION node over its inputs where the op built
  tens of nodes (GELU's erf: about 60), and realizing a graph alike the last one (the next step of
  an eager loop) then matches it call by call. Differences from `function`: tensors it cannot
  trace (several devices, symbolic shapes) take the op itself; the results are detached under
  no_grad, as every op's; no purity check (the ops are pure: they neither assign nor read values);
  at most MAX_TRACES signatures are kept, the oldest dropped first."""

  MAX_TRACES = 64

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if (flat := _flat_call(args, kwargs)) is None: return self.fn(*args, **kwargs)
    parts, inputs = flat
    no_grad = bool(Tensor.no_grad)
    key = (parts, Tensor.training, no_grad)
    traced = self.traces.get(key)
    if traced is None:
      traced = self._trace(flatten_tensors((args, kwargs), {}), inputs, check_pure=False)
      with _traces_lock:  # threads tracing at once: the oldest is dropped once
        bounded_put(self.traces, key, traced, self.MAX_TRACES)
    out = self._apply(traced, inputs)
    if no_grad:
      for t in flatten_results(out): t.uop = t.uop.detach()
    return out


_PLAIN = frozenset({int, float, bool, str, type(None)})
_static_shapes: dict[tuple, bool] = {}  # shape -> all its sizes are ints (a few hundred shapes)


def _static(shape: tuple) -> bool:
  if (known := _static_shapes.get(shape)) is not None: return known
  static = all(type(d) is int for d in shape)
  if static and len(_static_shapes) < 4096: _static_shapes[shape] = True
  return static
_traces_lock = threading.Lock()


def _flat_call(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, list[Tensor]] | None:
  """(key, inputs) of a call of an op: each argument a Tensor or a plain value (a number, string,
  None, or a tuple of them), the tensors on one device with static shapes. None for any other
  call: the op then runs itself."""
  inputs: list[Tensor] = []
  parts: list[Any] = [tuple(kwargs)]
  for a in (*args, *kwargs.values()):
    if isinstance(a, Tensor):
      u, dev, shape = a.uop, a._device, a.uop.shape
      if type(dev) is not str or not _static(shape): return None
      for i, t in enumerate(inputs):
        if t is a:
          parts.append(i)
          break
      else:
        parts.append((shape, u.dtype, dev))
        inputs.append(a)
    elif type(a) is tuple:
      if not all(type(x) in _PLAIN for x in a): return None
      parts.append(structure_key(a))
    elif type(a) in _PLAIN: parts.append(structure_key(a))
    else: return None
  return (tuple(parts), inputs) if inputs else None


def flatten_results(tree: Any) -> list[Tensor]:
  """The Tensors in a function's results, first-seen order."""
  found: dict[int, Tensor] = {}
  flatten_tensors(tree, found)
  return list(found.values())


# ---- tracing ----

def _check_pure(name: str, before: dict[int, tuple[Any, UOp]], params: set[UOp]) -> None:
  """A tensor that existed before the trace and now refers to a placeholder was written."""
  for t in list(all_tensors):
    entry = before.get(id(t))
    if entry is None or entry[0] is not t or t.uop is (old := entry[1]): continue
    if any(u in params for u in t.uop.toposort()):
      t.uop = old
      raise FunctionError(f"@function {name} wrote to a tensor from outside the function "
                          f"({t!r}); a FUNCTION body must be pure (use TinyJit for steps with "
                          "assigns)")


def _lift_captured(body: UOp, params: set[UOp], first: int) -> tuple[UOp, tuple]:
  """Replace what the body reads from outside (values of live tensors, buffers) by PARAMs
  numbered from `first`; returns the new body and (captured node, owning tensor ref) pairs."""
  inner: dict[UOp, bool] = {}  # node -> depends on a placeholder
  for u in body.toposort(): inner[u] = u in params or any(inner[s] for s in u.src)
  owners = {t.uop: t for t in list(all_tensors) if t.uop in inner and not inner[t.uop]}
  lifted: dict[UOp, None] = {}
  stack, seen = [body], set()
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if not inner[u] and (u in owners or u.op is Ops.BUFFER or engine.is_realized(u)):
      lifted[u] = None
      continue
    stack.extend(reversed(u.src))
  sub = {u: param_like(first + i, u) for i, u in enumerate(lifted)}
  captured = tuple((u, weakref.ref(owners[u]) if u in owners else None) for u in lifted)
  return body.substitute(sub), captured


def _current(u: UOp, ref: weakref.ref | None) -> UOp:
  """The captured value now: its tensor's current UOp while that tensor lives with the same
  shape and dtype (a pending assign is then seen, as without @function), else the node."""
  t = ref() if ref is not None else None
  if t is None or t.dtype != u.dtype or tuple(t.shape) != tuple(u.shape): return u
  return t.uop
