"""Tensor: a mutable, lazy handle on an immutable UOp graph.

Operations only build UOps (nothing runs) until `realize()`, `numpy()`, `tolist()` or `item()`.
Realizing runs the pipeline (callify, rangeify, schedule, codegen, run) and then replaces the
realized subgraph, in every live Tensor that refers to it, by the buffer now holding it.
"""
from __future__ import annotations

import weakref

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from unigrad.dtype import (FP8S, DType, dtypes, from_bytes, from_numpy_name, least_upper_dtype,
                           to_bytes, to_dtype, to_numpy_name)
from unigrad import engine
from unigrad.engine.interrupts import deferred_interrupts
from unigrad.engine.capture import outside_capture
from unigrad.frontend.activations import ActivationsMixin
from unigrad.frontend.composite import CompositeMixin
from unigrad.frontend.creation import CreationMixin
from unigrad.frontend.dtypes import check_int_value
from unigrad.frontend.elementwise import ElementwiseMixin
from unigrad.frontend.gradient import GradientMixin, TensorMeta, detach_if_no_grad
from unigrad.frontend.indexing import IndexingMixin
from unigrad.frontend.interop import InteropMixin, shared_numpy
from unigrad.frontend.linalg import LinalgMixin
from unigrad.frontend.live import LiveTensors, all_tensors  # noqa: F401 (re-exported)
from unigrad.frontend.movement import MovementMixin
from unigrad.frontend.multi import MultiMixin
from unigrad.frontend.nnops import NNOpsMixin
from unigrad.frontend.random import RandomMixin
from unigrad.frontend.reduce import ReduceMixin
from unigrad.frontend.resample import ResampleMixin
from unigrad.frontend.select import SelectMixin
from unigrad.frontend.strided import StridedMixin
from unigrad.frontend import writes
from unigrad.runtime.device import Device
from unigrad.schedule.callify import buffer_base, is_plain_buffer
from unigrad.uop import GroupOp, Ops, UOp, sint
from unigrad.uop.variable import concrete_shape, shape_str

_storage_ids = itertools.count()  # tags that give CONTIGUOUS nodes their own storage


_new_tensor = object.__new__


class Tensor(MultiMixin, ActivationsMixin, LinalgMixin, SelectMixin, IndexingMixin, CompositeMixin,
             NNOpsMixin, ResampleMixin, MovementMixin, ElementwiseMixin, ReduceMixin, GradientMixin,
             CreationMixin, RandomMixin, StridedMixin, InteropMixin, metaclass=TensorMeta):
  """A lazy n-dimensional array. `Tensor([[1, 2], [3, 4]]) @ Tensor.ones(2, 2)`"""

  def __init__(self, data: Any, device: str | tuple[str, ...] | None = None, dtype: Any = None,
               requires_grad: bool | None = None) -> None:
    # (`uop` set in the dict: the tensor is not registered yet, nothing to count, see __setattr__)
    if isinstance(device, (tuple, list)):  # replicated on each device (frontend/multi.py)
      on_all = Tensor(data, None, dtype).to(device)
      self._device, self.__dict__["uop"] = on_all.device, on_all.uop
    else:
      dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
      self._device = dev
      dt = to_dtype(dtype) if dtype is not None else None
      self.__dict__["uop"] = _uop_from_data(data, dev, dt)
    self.requires_grad = requires_grad
    self.grad: Tensor | None = None
    all_tensors.add(self)
    if self.uop.op in _VIEWS: writes.views.note(self)

  def __setattr__(self, name: str, value: Any) -> None:
    # a new node for a registered tensor may make it a lazy value: realize_stale_values looks at
    # every live tensor again (realizes set theirs in the dict: they only turn values into buffers)
    if name == "uop": all_tensors.rebinds += 1
    object.__setattr__(self, name, value)

  @staticmethod
  def _from_uop(u: UOp, device: str, requires_grad: bool | None = None) -> Tensor:
    """A Tensor holding `u` (the hot path of every op: the fields are set directly)."""
    t = _new_tensor(Tensor)
    d = t.__dict__
    d["uop"], d["_device"] = u, device
    d["grad"] = d["_requires_grad"] = None
    if requires_grad is not None: t.requires_grad = requires_grad
    all_tensors.add(t)
    if u.op in _VIEWS: writes.views.note(t)
    return t

  def _wrap(self, u: UOp) -> Tensor:
    """A Tensor on this one's device holding `u` (detached under no_grad): `_from_uop` inlined,
    as every op ends here."""
    t = _new_tensor(Tensor)
    d = t.__dict__
    d["uop"], d["_device"] = detach_if_no_grad(u), self._device
    d["grad"] = d["_requires_grad"] = None
    all_tensors.add(t)
    if u.op in _VIEWS: writes.views.note(t)
    return t

  # `u` as `_wrap` would hold it (detached under no_grad), without making a Tensor
  _node = staticmethod(detach_if_no_grad)

  def _const(self, value: Any, dtype: DType) -> Tensor:
    return Tensor._from_uop(UOp.const(dtype, value), self._device)

  # ---- properties ----
  @property
  def shape(self) -> tuple[sint, ...]: return self.uop.shape

  @property
  def dtype(self) -> DType: return self.uop.dtype

  @property
  def device(self) -> str: return self._device

  def numel(self) -> sint: return math.prod(self.shape)

  @property
  def max_shape(self) -> tuple[int, ...]:
    """The shape with each symbolic size at its upper bound (the shape memory is planned for)."""
    return tuple(s if isinstance(s, int) else int(s.vmax) for s in self.shape)

  def max_numel(self) -> int:
    """The element count at the symbolic sizes' upper bounds (`numel()` for a concrete shape)."""
    return math.prod(self.max_shape)

  @property
  def is_param(self) -> bool:
    """tinygrad's flag for trainable tensors: requires_grad is not False (optimizers take these)."""
    return self.requires_grad is not False

  def is_param_(self, is_param: bool = True) -> Tensor:
    """Set `is_param` in place (False is requires_grad=False). Returns self."""
    if not is_param: self.requires_grad = False
    elif self.requires_grad is False: self.requires_grad = None
    return self

  @staticmethod
  def const(value: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """A 0-d tensor holding `value` as a CONST node (no buffer); dtype from the value unless
    given. `Tensor.const(2.5)`"""
    if not isinstance(value, (bool, int, float)):
      raise TypeError(f"Tensor.const needs a Python bool, int or float, got {type(value).__name__}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(value)
    dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
    check_int_value(value, dt)
    return Tensor._from_uop(UOp.const(dt, value), dev)

  def element_size(self) -> int: return self.dtype.itemsize

  def nbytes(self) -> int: return self.numel() * self.element_size()

  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)

  def size(self, dim: int | None = None) -> Any:
    return self.shape if dim is None else self.shape[dim if dim >= 0 else dim + self.ndim]

  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    if not isinstance(n := self.shape[0], int):
      raise TypeError(f"len() of a tensor whose length is symbolic (shape "
                      f"{shape_str(self.shape)}): len() needs an int; use .shape[0] (a size) or "
                      ".concrete_shape[0]")
    return n

  def __iter__(self) -> Iterator[Tensor]:
    """The sub-tensors along the first axis (like PyTorch, a 0-d tensor cannot be iterated)."""
    if not self.shape: raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))

  def __repr__(self) -> str:
    op, dt = self.uop.op.name, self.dtype
    return f"<Tensor {op} shape={shape_str(self.shape)} dtype={dt!r} device={self.device}>"

  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(self.item())

  # ---- realization ----
  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`) into device buffers. Returns self."""
    if others:
      Tensor.realize_all(self, *others)
      return self
    # realize_all for one tensor (the eager hot path); a Ctrl-C waits until the tensors point at
    # what the launches wrote (engine/interrupts.py)
    with engine.realize_lock, deferred_interrupts():
      if writes.pending: _realize_with_writes([self])
      elif not engine.is_realized(u := self.uop): _apply_map(engine.realize([u], [self._device]))
      else: _check_bound(u)
    return self

  @staticmethod
  def realize_all(*tensors: Tensor) -> None:
    """Realize `tensors` together, with every write still pending (frontend/writes.py). Threads
    realize one at a time (the engine's lock)."""
    with engine.realize_lock, deferred_interrupts():
      if writes.pending: return _realize_with_writes(list(tensors))
      todo = []
      for t in tensors:
        if engine.is_realized(t.uop): _check_bound(t.uop)
        else: todo.append(t)
      if not todo: return
      mapping = engine.realize([t.uop for t in todo], [t.device for t in todo])
      _apply_map(mapping)

  def schedule(self, *others: Tensor) -> UOp:
    """The command buffer (a LINEAR of kernel CALLs) that realizing would run; nothing runs."""
    return engine.schedule([t.uop for t in (self, *others)], [t.device for t in (self, *others)])

  def linear_with_vars(self, *others: Tensor) -> tuple[UOp, dict[str, int]]:
    """tinygrad's name: the command buffer realizing this tensor (and `others`) would run, and
    the values of the bound variables it reads (name -> int); nothing runs."""
    ts = (self, *others)
    return engine.schedule_with_vars([t.uop for t in ts], [t.device for t in ts])

  def schedule_linear(self, *others: Tensor) -> UOp:
    """tinygrad's name for `schedule`, for programs without bound variables."""
    linear, var_vals = self.linear_with_vars(*others)
    if var_vals:
      raise ValueError(f"schedule_linear: the schedule reads bound variables {sorted(var_vals)}; "
                       "use linear_with_vars")
    return linear

  def contiguous(self) -> Tensor:
    """A tensor that will be materialized in its own new buffer, in row-major order. Each call
    gets its own storage (a unique tag), like PyTorch: two equal expressions made contiguous are
    never one buffer that an in-place write to one would change for the other."""
    return self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), tag=next(_storage_ids)))

  def replace(self, x: Tensor) -> Tensor:
    """Make this tensor refer to `x`'s value (same shape and dtype); no data is copied."""
    if x.shape != self.shape or x.dtype != self.dtype:
      raise ValueError(f"replace: {x.shape} {x.dtype!r} does not match {self.shape} {self.dtype!r}")
    self.uop, self._device = x.uop, x.device
    writes.views.note(self)
    return self

  def to(self, device: str | tuple[str, ...]) -> Tensor:
    """This tensor on `device` (a lazy COPY; the same tensor if it is already there). A tuple of
    devices replicates it on each (see frontend/multi.py)."""
    if isinstance(device, (tuple, list)): return self._to_devices(device)
    dev = Device.canonicalize(device)
    Device[dev]  # unknown devices fail here, at the call
    if dev == self.device: return self
    return Tensor._from_uop(UOp(Ops.COPY, self.dtype, (self.uop,), dev), dev, self.requires_grad)

  def to_(self, device: str) -> Tensor:
    """Move this tensor to `device` in place."""
    moved = self.to(device)
    self.uop, self._device = moved.uop, moved._device
    return self

  def detach(self) -> Tensor: return self._wrap(self.uop.detach())

  def clone(self) -> Tensor: return self.contiguous()

  def assign(self, x: Any) -> Tensor:
    """Write `x` (a Tensor, a number, or array data such as a numpy array or nested lists, as in
    tinygrad) into this tensor's buffer (STORE then AFTER); later reads see the new values."""
    if not isinstance(x, Tensor): x = _assigned_value(x, self)
    if x.shape != self.shape:
      raise ValueError(f"assign: shape {x.shape} does not match {self.shape}")
    if x.dtype != self.dtype:
      raise TypeError(f"assign: dtype {x.dtype!r} does not match {self.dtype!r}")
    if x.device != self.device:
      raise RuntimeError(f"assign: device {x.device} does not match {self.device}")
    if writes.tracing.stack:  # in @function: recorded, assigned by each call (frontend/function.py)
      writes.tracing.stack[-1].record(self, x.uop)
      return self
    if writes.pending and not engine.is_buffer_view(self.uop):
      Tensor.realize_all()  # a view of a pending write (or the write itself) is the buffer after it
    if not engine.is_buffer_view(self.uop):  # give this tensor storage of its own, then write it
      self.uop = UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), tag=next(_storage_ids))
      self.realize()
    target = self.uop
    self.uop = UOp(Ops.AFTER, self.dtype, (target, UOp(Ops.STORE, dtypes.void, (target, x.uop))))
    if (base := buffer_base(target)) is None:  # several devices: their buffers, written now
      for b in target.toposort():
        if b.op is _BUFFER: writes.pending.add(b, self.uop, self._device)
      return self.realize()
    writes.pending.add(base, self.uop, self._device)
    # another tensor viewing the buffer does not hold the write: it runs now (frontend/writes.py)
    if not is_plain_buffer(target) or writes.views.others(base, self): self.realize()
    return self

  # ---- data out ----
  def _bytes(self) -> memoryview:
    with engine.realize_lock:  # no other thread's realize may swap self.uop in between
      if not engine.is_realized(self.uop) and engine.is_buffer_view(self.uop):
        # a view of a buffer stays one (it may share memory with numpy or DLPack): read a copy
        return engine.copyout(self.contiguous().realize().uop)
      self.realize()
      return engine.copyout(self.uop)

  def numpy(self) -> Any:
    """The values as a numpy array that, like PyTorch's, shares this tensor's memory on a host
    device (CPU, PYTHON): a transpose, slice or broadcast of a realized buffer is read in place
    without a kernel, any other tensor is realized first. Writes through either side show in
    the other, and the buffer lives as long as the array (`.copy()` for a snapshot). bfloat16
    and the 8-bit floats (returned as float32), other devices and symbolic shapes give a copy."""
    import numpy as np  # noqa: PLC0415 (numpy is optional: only needed here)
    with engine.realize_lock:  # no other thread's realize may swap self.uop in between
      shared = shared_numpy(self)
    if shared is not None: return shared
    shape = self.concrete_shape
    if self.dtype in FP8S: return self.cast(dtypes.float32).numpy()  # exact, on the device
    if self.dtype == dtypes.bfloat16:
      return np.array(self.tolist(), dtype=np.float32).reshape(shape)
    return np.frombuffer(self._bytes(), dtype=to_numpy_name(self.dtype)).reshape(shape).copy()

  def tolist(self) -> Any:
    """The values as (nested) Python lists."""
    shape = self.concrete_shape
    flat = from_bytes(self.dtype, self._bytes()) if math.prod(shape) else []
    if self.dtype == dtypes.bool: flat = [bool(v) for v in flat]
    return _nest(flat, shape)

  @property
  def concrete_shape(self) -> tuple[int, ...]:
    """The shape with each symbolic size evaluated for its bound variables; an unbound one
    raises UnboundVariableError naming it."""
    return concrete_shape(self.shape)

  def item(self) -> Any:
    """The single value of a one-element tensor as a Python number."""
    if self.numel() != 1:
      n = self.numel()
      raise RuntimeError(f"a Tensor with {n} elements cannot be converted to a Python scalar")
    v = self.tolist()
    while isinstance(v, list): v = v[0]
    return v

  @property
  def data(self) -> Any: return self.numpy()


def _realize_with_writes(tensors: list[Tensor]) -> None:
  """Realize `tensors` and run every pending write, computing first (in the same command buffer)
  each live lazy value that reads the old contents of a written buffer: it keeps the values it
  was made from (frontend/writes.py). A target that is a view of a written buffer is read after
  the writes, in a realize of its own. Where a value (a target, a live tensor, or what a write
  stores) reads both a buffer's old contents and a write's result, its old-contents parts are
  computed first, in a realize of their own, and it reads them from there. Under a TinyJit
  capture, the stale values made before the capture began are computed outside it: a replay
  must not recompute them."""
  live = all_tensors.alive()
  # a write no live tensor holds any more is gone with it (a failed @function trace put its
  # tensors back): what still reads it runs it
  written, afters, devices = writes.pending.take({t.uop: None for t in live})
  for t in tensors:
    if engine.is_realized(t.uop): _check_bound(t.uop)
  todo = [t for t in tensors if not engine.is_realized(t.uop)]
  stale, snapshots = writes.stale_readers([t.uop for t in live], written, afters)
  device_of = _devices_of(live) | dict(zip(afters, devices)) if stale or snapshots else {}
  before = {u: device_of[u] for u in stale}
  cap = engine.capturing[-1] if engine.capturing else None
  if cap is not None:
    cap.written.update(written)
    outside = {u: d for u, d in before.items() if u in cap.before}
    with outside_capture(): _realize_values(outside)
    before = {u: d for u, d in before.items() if u not in outside}
  later = [t for t in todo if buffer_base(t.uop) in written]
  if snapshots:
    # computed on their own: then the values holding them read their buffers (_apply_map
    # substitutes them), the writes' AFTERs included (their tensors hold the new ones)
    holders = [next(t for t in live if t.uop is a) for a in afters]
    _realize_values({**before, **{u: device_of[r] for u, r in snapshots.items()}})
    before, afters = {}, [t.uop for t in holders]
  if later: todo = [t for t in todo if not any(t is x for x in later)]
  _realize_values({**{t.uop: t.device for t in todo}, **dict(zip(afters, devices)), **before})
  engine.mark_written(written)
  if later: Tensor.realize_all(*later)


def _realize_values(targets: dict[UOp, str]) -> None:
  """Realize the nodes `targets` (node -> device) and point the live tensors at the results."""
  if targets: _apply_map(engine.realize(list(targets), list(targets.values())))


def realize_stale_values(written: dict[UOp, None]) -> None:
  """Compute every live lazy value that reads a buffer of `written`, before something that is no
  realize (a TinyJit replay) overwrites those buffers."""
  with engine.realize_lock:
    if written and (values := _live_values()) and \
        (stale := writes.stale_readers([t.uop for t in values], written, [])[0]):
      device_of = _devices_of(values)
      _realize_values({u: device_of[u] for u in stale})


def _devices_of(tensors: list[Tensor]) -> dict[UOp, str]:
  return {t.uop: t.device for t in tensors}


class _ValueScan:
  """What the last _live_values found: the live values (weakly) and the rebind count then."""
  values: list[weakref.ref] = []
  rebinds = -1


def _live_values() -> list[Tensor]:
  """The live tensors whose node is a value (no buffer and no view of one). Only those added
  since the last call and those that were values then are looked at, unless a tensor got a new
  node meanwhile (LiveTensors.rebinds; a realize only turns values into buffers): a model's
  hundreds of weights were looked at on every TinyJit replay, 0.4-0.9 ms of SmolLM2's 9 ms
  decode step (its kernels had pushed them out of the caches)."""
  rebinds = all_tensors.rebinds
  new = all_tensors.since_mark()
  if new is None or rebinds != _ValueScan.rebinds: candidates = all_tensors.alive()
  else: candidates = [t for r in _ValueScan.values if (t := r()) is not None] + new
  values = [t for t in candidates if writes.is_value(t.uop)]
  _ValueScan.values, _ValueScan.rebinds = [weakref.ref(t) for t in values], rebinds
  return values


def _assigned_value(x: Any, target: Tensor) -> Tensor:
  """A non-Tensor `assign` argument as a Tensor like `target`: a number fills it, array data
  (numpy, lists) becomes a tensor of target's dtype and device."""
  if isinstance(x, (bool, int, float)) or getattr(x, "ndim", None) == 0:
    return Tensor.full(target.shape, x.item() if hasattr(x, "item") else x, target.dtype,
                       target.device)
  return Tensor(x, device=target.device, dtype=target.dtype)


def _check_bound(u: UOp) -> None:
  """A buffer-backed tensor (`Tensor.empty(n, 4)`) realizes to nothing, but its symbolic sizes
  need values as anything computed would: an unbound one raises UnboundVariableError naming it."""
  if not all(type(s) is int for s in u.shape): concrete_shape(u.shape)


def _apply_map(mapping: dict[UOp, UOp]) -> None:
  """Point every live tensor that uses a realized node at the buffer now holding it, and remember
  what computed each buffer (not for writes, never behind a requires_grad leaf, not for a value
  no gradient can flow through). A realized
  `contiguous()` or `clone()` is a value like any other: its history is the copy of its graph, so
  a backward through it reaches that graph (a CONTIGUOUS target always gets a new buffer: its
  history never reads the buffer it explains). The graphs are substituted in one walk each for
  the tensors and the histories (a training step's gradients and optimizer targets share one
  graph: a walk per tensor walked it tens of times)."""
  leaves: set[UOp] = set()
  live = all_tensors.alive()
  olds = [t.uop for t in live]
  # the lazy graphs that may hold a realized node: not a target itself, a BUFFER or CONST, or an
  # unrealized buffer's reshape (a weight's view; inlined: realize asks it of every live tensor)
  lazy = list(dict.fromkeys([u for u in olds if u not in mapping and u.op not in _LEAVES and not (
    u.op is _RESHAPE and (s := u.src[0]).op is _BUFFER and s not in mapping)]))
  new_of = {**mapping, **dict(zip(lazy, _substitute_all(lazy, mapping)))} if lazy else mapping
  for t, u in zip(live, olds):
    # another thread may have pointed t elsewhere meanwhile (an assign): keep its value then
    if (new := new_of.get(u)) is not None and t.uop is u:
      t.__dict__["uop"] = new  # no rebind to count (see Tensor.__setattr__)
      if new.op in _VIEWS: writes.views.note(t)
    if t.__dict__.get("_requires_grad"): leaves.add(t.uop)
  # no history where no gradient can flow (a value computed under no_grad: detached): it would
  # keep every buffer its graph reads alive (an inference forward's every layer's output)
  kept = [old for old, new in mapping.items()
          if old.op is not _AFTER and new not in leaves and not old.grad_free]
  # a target's history: its graph with every other target in it read from that one's buffer
  if len(mapping) == 1:  # no other target: the graph as it is
    for old in kept: engine.history.record(mapping[old], old)
    return
  srcs = iter(_substitute_all([s for old in kept for s in old.src], mapping))
  for old in kept:
    engine.history.record(mapping[old], old.with_src(tuple(next(srcs) for _ in old.src)))


def _substitute_all(roots: list[UOp], mapping: dict[UOp, UOp]) -> list[UOp]:
  """[r.substitute(mapping) for r in roots] in one walk (a shared memo)."""
  if not roots: return []
  return list(UOp(Ops.SINK, dtypes.void, tuple(roots)).substitute(mapping).src)


# looked up once: `Ops.X` is slow on Python 3.11, and realize asks these of every live tensor
_AFTER, _LEAVES = Ops.AFTER, (Ops.BUFFER, Ops.CONST)
_RESHAPE, _BUFFER = Ops.RESHAPE, Ops.BUFFER
_VIEWS = frozenset((Ops.BUFFER, *GroupOp.Movement))  # the ops a view of a buffer can end in


def _nest(flat: list, shape: Sequence[int]) -> Any:
  if not shape: return flat[0]
  if len(shape) == 1: return flat
  step = math.prod(shape[1:])
  return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _is_numpy(x: Any) -> bool: return type(x).__module__ == "numpy"  # an array or a scalar


def _infer_shape(data: Any) -> tuple[int, ...]:
  shape: list[int] = []
  x = data
  while isinstance(x, (list, tuple)):
    shape.append(len(x))
    if not x: break
    x = x[0]
  if _is_numpy(x) and data is not x: shape.extend(getattr(x, "shape", ()))  # rows of arrays
  return tuple(shape)


def _flatten(data: Any, shape: tuple[int, ...], depth: int = 0,
             np_dtypes: set[DType] | None = None) -> list:
  """The values of nested lists and tuples, row-major; numpy arrays and scalars among them (a
  list of rows from numpy, as an RL replay buffer is) give their values, and their dtypes to
  `np_dtypes`."""
  if np_dtypes is not None and _is_numpy(data):
    if tuple(getattr(data, "shape", ())) != shape[depth:]:
      raise ValueError(f"ragged nested sequence: expected shape {shape[depth:]} at depth {depth}"
                       f", got a numpy array of shape {data.shape}")
    np_dtypes.add(from_numpy_name(data.dtype))
    return data.ravel().tolist() if depth < len(shape) else [data.item()]
  if depth == len(shape):
    if isinstance(data, (list, tuple)):
      raise ValueError("ragged nested sequence: every row must have the same length")
    if not isinstance(data, (bool, int, float)):
      raise TypeError(f"cannot make a Tensor from {type(data).__name__}")
    return [data]
  if not isinstance(data, (list, tuple)) or len(data) != shape[depth]:
    raise ValueError(f"ragged nested sequence: expected length {shape[depth]} at depth {depth}")
  return [v for d in data for v in _flatten(d, shape, depth + 1, np_dtypes)]


def _python_leaves(data: Any) -> list:
  """The Python numbers of nested lists, numpy arrays and scalars left out."""
  if isinstance(data, (list, tuple)): return [v for d in data for v in _python_leaves(d)]
  return [] if _is_numpy(data) else [data]


def _dtype_of_values(data: Any, flat: list, np_dtypes: set[DType]) -> DType:
  """PyTorch's dtype for nested data: every Python number's (`dtypes.from_py`) and every numpy
  array's or scalar's own, promoted together (`torch.tensor([np.float32(1), 2])` is float32)."""
  if not np_dtypes: return dtypes.from_py(flat) if flat else dtypes.default_float
  py = _python_leaves(data)
  return least_upper_dtype(*np_dtypes, *([dtypes.from_py(py)] if py else []))


def _uop_from_data(data: Any, device: str, dtype: DType | None) -> UOp:
  if isinstance(data, UOp): return data if dtype is None else data.cast(dtype)
  if isinstance(data, (bytes, bytearray, memoryview)):
    dt = dtype or dtypes.uint8
    raw = bytes(data)
    return engine.buffer_with_data(device, dt, raw, (len(raw) // dt.itemsize,))
  if hasattr(data, "__array_interface__") or type(data).__module__ == "numpy":
    return _uop_from_numpy(data, device, dtype)
  shape = _infer_shape(data)
  flat = _flatten(data, shape, np_dtypes=(np_dtypes := set()))
  dt = dtype or _dtype_of_values(data, flat, np_dtypes)
  if dtypes.is_int(dt): _check_int_values(flat, dt)
  return engine.buffer_with_data(device, dt, to_bytes(dt, flat), shape)


def _check_int_values(flat: list, dt: DType) -> None:
  """OverflowError for a Python int that `dt` cannot hold (PyTorch raises; a negative int64 for
  an unsigned dtype wraps, as in PyTorch)."""
  lo = dt.min if not dtypes.is_unsigned(dt) else -2 ** 63
  for v in flat:
    if type(v) is int and not lo <= v <= dt.max:
      raise OverflowError(f"value {v} cannot be converted to {dt!r} without overflow "
                          f"(range {dt.min}..{dt.max})")


def _uop_from_numpy(arr: Any, device: str, dtype: DType | None) -> UOp:
  import numpy as np  # noqa: PLC0415 (numpy is optional: only needed for numpy input)
  a = np.ascontiguousarray(arr)  # note: 0-d arrays come back 1-d, so keep the original shape
  dt = from_numpy_name(a.dtype)
  u = engine.buffer_with_data(device, dt, a.tobytes(), np.shape(arr))
  return u if dtype is None or dtype == dt else u.cast(dtype)

