"""Tensor creation: empty, zeros, ones, full, arange (the spec's prefix-sum composition), eye,
from_blob (memory at a raw address, wrapped without a copy)."""
from __future__ import annotations

import ctypes
import math
import operator
from typing import TYPE_CHECKING, Any

from unigrad.dtype import DType, PtrDType, buffer_nbytes, dtypes, to_dtype
from unigrad.helpers import bounded_put
from unigrad import engine
from unigrad.frontend.dtypes import check_int_value
from unigrad.runtime.device import Buffer, Device
from unigrad.uop import UOp, sint
from unigrad.uop.variable import is_size, simplify_size

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


def _shape(args: tuple) -> tuple[sint, ...]:
  """A shape of non-negative ints and symbolic sizes (index UOps, e.g. a bound Variable)."""
  shape = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)
  if any(not is_size(s) or (isinstance(s, int) and s < 0) for s in shape):
    raise ValueError(f"a shape needs non-negative ints or symbolic sizes, got {shape}")
  return tuple(simplify_size(s) for s in shape)


def _device(device: str | None) -> str:
  """The canonical device name; an unknown device raises RuntimeError here, at the call, even for
  constants that allocate no buffer."""
  if device is None: return Device.DEFAULT
  Device.device_class(device)
  return Device.canonicalize(device)


class CreationMixin:
  """Static constructors of Tensor."""

  @classmethod
  def empty(cls, *shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """An uninitialized tensor backed by a new buffer."""
    dims, dev = _shape(shape), _device(device)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    buffer_nbytes(math.prod(s if isinstance(s, int) else int(s.vmax) for s in dims), dt, dev)
    return cls._from_uop(engine.new_buffer(dev, dt, dims), dev)

  @classmethod
  def full(cls, shape: Any, fill_value: Any, dtype: Any = None,
           device: str | None = None) -> Tensor:
    """A tensor of `shape` holding `fill_value` everywhere (a broadcast constant: no memory).
    `Tensor.full((2, 2), 7)` is `[[7, 7], [7, 7]]` (int64, like PyTorch)."""
    dims, dev = _shape((shape,) if isinstance(shape, int) else (tuple(shape),)), _device(device)
    dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
    check_int_value(fill_value, dt)
    const = cls._from_uop(UOp.const(dt, fill_value), dev)
    return const.reshape(*(1,) * len(dims)).expand(dims) if dims else const

  @classmethod
  def zeros(cls, *shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    return cls.full(_shape(shape), 0, dtype or dtypes.default_float, device)

  @classmethod
  def ones(cls, *shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    return cls.full(_shape(shape), 1, dtype or dtypes.default_float, device)

  @classmethod
  def arange(cls, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None,
             device: str | None = None) -> Tensor:
    """[start, stop) by step, built as the spec's prefix sum of ones: element i is
    start + i*step, computed in int64 (float64 when an argument is a float) and then cast, like
    PyTorch. `Tensor.arange(1, 7, 2)` is `[1, 3, 5]`."""
    if stop is None: start, stop = 0, start
    if isinstance(stop, UOp) and not isinstance(start, (UOp, float)) and type(step) is int \
        and step > 0:
      # a symbolic stop (a bound Variable): the arange of its largest value, shrunk to its count
      largest = max(start, math.ceil((int(stop.vmax) - start) / step) * step + start)
      return cls.arange(start, largest, step, dtype, device)[:(stop - start + step - 1) // step]
    if any(isinstance(v, UOp) for v in (start, stop, step)):
      raise TypeError("arange: only the stop may be symbolic, with an int start and a positive "
                      f"int step; got start={start!r}, stop={stop!r}, step={step!r}")
    if step == 0: raise ValueError("arange: step must be nonzero")
    if (stop - start) * step < 0:
      raise ValueError(f"arange: bounds [{start}, {stop}) and step {step} have opposite directions")
    n = math.ceil((stop - start) / step)
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    dt = dtypes.default_float if is_float else dtypes.default_int
    if dtype is not None: dt = to_dtype(dtype)
    if n == 0: return cls.full((0,), 0, dt, device)
    if not isinstance(device, (str, type(None))):  # a tuple of devices (frontend/multi.py)
      return _arange(cls, n, start, step, is_float, dt, device)
    dev = _device(device)
    probe = UOp.const(dtypes.int64, 0)
    # the graph depends on the bounds (their types too), dtype, device and whether no_grad
    # detaches each step; an eager model asks for the same few every call
    key = (*((v.hex() if type(v) is float else v, type(v)) for v in (start, stop, step)), dt, dev,
           cls._node(probe) is probe)
    if (u := _arange_graphs.get(key)) is not None: return cls._from_uop(u, dev)
    out = _arange(cls, n, start, step, is_float, dt, device)
    bounded_put(_arange_graphs, key, out.uop, ARANGE_CACHE_SIZE)
    return out

  @classmethod
  def linspace(cls, start: float, stop: float, steps: int, dtype: Any = None,
               device: str | None = None) -> Tensor:
    """`steps` evenly spaced values from start to stop (both included), like torch.linspace."""
    if not isinstance(steps, int) or steps < 0:
      raise ValueError(f"linspace: steps must be a non-negative int, got {steps!r}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if steps <= 1: return cls.full((steps,), start, dt, device)
    step = (stop - start) / (steps - 1)
    i = cls.arange(steps, dtype=dtypes.float64, device=device)
    return (i * step + start).cast(dt)

  @classmethod
  def eye(cls, n: int, m: int | None = None, dtype: Any = None,
          device: str | None = None) -> Tensor:
    """The identity matrix (n x m). `Tensor.eye(2)` is `[[1., 0.], [0., 1.]]`."""
    m = n if m is None else m
    rows, cols = _shape((n, m))
    r = cls.arange(rows, device=device).reshape(rows, 1)
    c = cls.arange(cols, device=device).reshape(1, cols)
    return r.eq(c).cast(dtype or dtypes.default_float)

  @classmethod
  def from_blob(cls, ptr: int, shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """A tensor of `shape` and `dtype` (default float32) over the prod(shape) elements stored
    contiguously (C order) at address `ptr` of `device`'s memory (a host address such as
    `arr.ctypes.data` on CPU and PYTHON, a device pointer on CUDA), without a copy: writes
    through either side show in the other. The memory must stay valid while the tensor (or
    anything computed lazily from it) is in use; unigrad never frees it.
    `Tensor.from_blob(a.ctypes.data, a.shape, dtypes.int32)`"""
    if isinstance(ptr, bool) or not hasattr(ptr, "__index__"):
      raise TypeError(f"from_blob: ptr must be an int address, got {type(ptr).__name__}")
    if (ptr := operator.index(ptr)) <= 0:
      raise ValueError(f"from_blob: ptr must be a positive address, got {ptr}")
    if not isinstance(shape, (int, tuple, list)):
      raise TypeError(f"from_blob: shape must be an int or a tuple of ints, got {shape!r}")
    dims, dev = _shape((shape,) if isinstance(shape, int) else (tuple(shape),)), _device(device)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if dt.itemsize == 0 or dt.count != 1 or dt == dtypes.index or isinstance(dt, PtrDType):
      raise TypeError(f"from_blob: {dt!r} has no memory layout; use a scalar dtype")
    if not all(isinstance(d, int) for d in dims):
      raise TypeError(f"from_blob: the shape must be concrete, got {dims}")
    numel = math.prod(dims)
    if ptr + numel * dt.itemsize > 1 << (8 * ctypes.sizeof(ctypes.c_void_p)):
      raise ValueError(f"from_blob: {numel * dt.itemsize} bytes at address {ptr:#x} leave the "
                       "address space")
    try: buf = Buffer.wrap(dev, numel, dt, ptr)
    except NotImplementedError as e:
      raise RuntimeError(f"from_blob: {dev} cannot use memory at a raw address ({e})") from e
    return cls._from_uop(engine.buffer_from(buf), dev).reshape(dims)

  def full_like(self, fill_value: Any, dtype: Any = None) -> Tensor:
    return type(self).full(self.shape, fill_value, dtype or self.dtype, self.device)

  def zeros_like(self, dtype: Any = None) -> Tensor: return self.full_like(0, dtype)

  def empty_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """An uninitialized tensor with this tensor's shape (and dtype and device unless given)."""
    dt = to_dtype(dtype) if dtype is not None else self.dtype
    return type(self).empty(*self.shape, dtype=dt, device=device or self.device)

  def ones_like(self, dtype: Any = None) -> Tensor: return self.full_like(1, dtype)


def _arange(cls: Any, n: int, start: Any, step: Any, is_float: bool, dt: DType,
            device: Any) -> Tensor:
  """n values start + i*step as arange builds them: a prefix sum of ones."""
  index = _prefix_sum(cls.full((n,), 1, dtypes.int64, device)).sub(1)
  if is_float: index = index.cast(dtypes.float64)
  return index.mul(step).add(start).cast(dt)


ARANGE_CACHE_SIZE = 64
_arange_graphs: dict[tuple, UOp] = {}  # arange's arguments -> the graph it built


def _prefix_sum(t: Tensor) -> Tensor:
  """Cumulative sum of a 1-D tensor by the spec's sliding-window composition."""
  n = t.shape[0]
  x = t.pad(((n - 1, 0),))
  x = x.reshape(1, 2 * n - 1).expand(n + 1, 2 * n - 1)
  x = x.reshape((n + 1) * (2 * n - 1)).shrink_to(2 * n * n)
  return x.reshape(n, 2 * n).shrink_to(n, n).sum(-1, dtype=t.dtype)
