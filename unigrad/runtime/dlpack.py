"""DLPack: sharing device memory with other libraries (PyTorch, numpy, JAX, CuPy) without a copy.

The DLPack C structs are declared with ctypes and travel in PyCapsules made through the Python C
API (ctypes.pythonapi), so no package is needed. `export_capsule` wraps a unigrad Buffer: the
capsule's managed tensor keeps the Buffer alive until the consumer calls its deleter (or until
an unconsumed capsule is collected). `import_capsule` takes a producer's capsule, renames it
"used_..." as the protocol asks, and wraps the memory in a Buffer whose owner calls the
producer's deleter when the last unigrad reference goes. Both the DLPack 1.x versioned struct
("dltensor_versioned") and the legacy one ("dltensor") are read and written. Either side may
still be alive while the interpreter tears its modules down (a torch tensor kept in a global):
the callbacks a consumer calls are never freed, and neither they nor `_Owner.__del__` read module
globals, which are cleared by then.

Devices: host memory (CPU, PYTHON) is kDLCPU, CUDA:n is (kDLCUDA, n); others cannot be shared.
"""
from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes
from unigrad.runtime.device import Buffer, Device

__all__ = ["KDL_CPU", "KDL_CUDA", "dlpack_device", "is_host_device", "export_capsule",
           "import_capsule", "Imported"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_OPENCL = 1, 2, 3, 4
READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_DEVICE_TYPES = {"CPU": KDL_CPU, "PYTHON": KDL_CPU, "CUDA": KDL_CUDA, "CL": KDL_OPENCL}
_SHAREABLE = (KDL_CPU, KDL_CUDA)
# (type code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
_DTYPES: dict[DType, tuple[int, int]] = {
  dtypes.bool: (6, 8), dtypes.int8: (0, 8), dtypes.int16: (0, 16), dtypes.int32: (0, 32),
  dtypes.int64: (0, 64), dtypes.uint8: (1, 8), dtypes.uint16: (1, 16), dtypes.uint32: (1, 32),
  dtypes.uint64: (1, 64), dtypes.float16: (2, 16), dtypes.float32: (2, 32),
  dtypes.float64: (2, 64), dtypes.bfloat16: (4, 16)}
_FROM_CODE = {v: k for k, v in _DTYPES.items()}


class DLDevice(ctypes.Structure):
  _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
              ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
              ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
  _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
  _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
  _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
              ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# the Python C API, typed for capsules (the raw-pointer forms run inside a capsule's destructor,
# where the capsule must not gain a reference)
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", _api))
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
  ("PyCapsule_IsValid", _api))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
  ("PyCapsule_GetPointer", _api))
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
  ("PyCapsule_SetName", _api))
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
  ("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
  ("PyCapsule_GetPointer", _api))

# capsule names: module constants, because a capsule keeps a pointer to its name
_NAME, _USED = b"dltensor", b"used_dltensor"
_NAME_V, _USED_V = b"dltensor_versioned", b"used_dltensor_versioned"


def dlpack_device(device: str) -> tuple[int, int]:
  """(DLPack device type, device id) of a unigrad device; BufferError for one without."""
  name, _, idx = device.partition(":")
  kind = _DEVICE_TYPES.get(name)
  if kind is None: raise BufferError(f"{device} memory has no DLPack device type")
  return kind, int(idx or 0)


def is_host_device(device: str) -> bool:
  """Whether `device`'s buffers are host memory that numpy can read in place."""
  try: return dlpack_device(device)[0] == KDL_CPU
  except BufferError: return False


# ---- export ----

@dataclass
class _Export:
  """What a consumer's managed tensor points into: kept here until its deleter runs."""
  buffer: Buffer
  managed: Any
  shape: Any
  strides: Any


_exports: dict[int, _Export] = {}  # managed-struct address -> its export
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _immortal(callback: Any) -> Any:
  """`callback`, never freed: a consumer alive at interpreter exit (a module-level torch tensor)
  calls its deleter while the modules are torn down, after this module's globals are cleared;
  a freed ctypes callback is a jump into freed memory (a segfault at exit)."""
  _api.Py_IncRef(ctypes.py_object(callback))
  return callback


def _export_callbacks(exports: dict[int, _Export]) -> tuple[Any, Any]:
  """The managed tensors' deleter and the capsules' destructor. They read no module globals
  (cleared at exit, when a consumer may still call them): what they use is bound here."""
  is_valid, get_pointer, names = _raw_is_valid, _raw_get_pointer, (_NAME, _NAME_V)

  def release(managed: int | None) -> None:
    if managed is not None: exports.pop(managed, None)

  def destroy_capsule(capsule: int | None) -> None:
    """An unconsumed capsule frees its managed tensor (a consumer renames what it takes)."""
    for name in names:
      if is_valid(capsule, name): release(get_pointer(capsule, name))
  return _immortal(_Deleter(release)), _immortal(_Destructor(destroy_capsule))


_release_export, _capsule_destructor = _export_callbacks(_exports)


def export_capsule(buf: Buffer, shape: Sequence[int], strides: Sequence[int], offset: int,
                   versioned: bool) -> Any:
  """A capsule sharing `buf`'s memory as an array of `shape` and element `strides`, starting
  `offset` elements in (all non-negative). BufferError if the device or dtype cannot be shared."""
  kind, dev_id = dlpack_device(buf.device)
  if kind not in _SHAREABLE: raise BufferError(f"{buf.device} memory cannot be shared via DLPack")
  code = _DTYPES.get(buf.dtype)
  if code is None: raise BufferError(f"{buf.dtype!r} has no DLPack type")
  ndim = len(shape)
  c_shape, c_strides = (ctypes.c_int64 * max(ndim, 1))(*shape), (ctypes.c_int64 * max(ndim, 1))(
    *strides)
  managed: Any = DLManagedTensorVersioned() if versioned else DLManagedTensor()
  if versioned: managed.version = DLPackVersion(1, 0)
  t = managed.dl_tensor
  t.data = buf.address() + offset * buf.dtype.itemsize if buf.nbytes else None
  t.device, t.ndim, t.dtype = DLDevice(kind, dev_id), ndim, DLDataType(code[0], code[1], 1)
  t.shape, t.strides, t.byte_offset = c_shape, c_strides, 0
  managed.deleter = _release_export
  address = ctypes.addressof(managed)
  _exports[address] = _Export(buf, managed, c_shape, c_strides)
  destructor = ctypes.cast(_capsule_destructor, ctypes.c_void_p)
  return _capsule_new(address, _NAME_V if versioned else _NAME, destructor)


# ---- import ----

class _Owner:
  """Holds an imported managed tensor; its producer's deleter runs when this goes (at exit too:
  `__del__` reads no module globals, which are cleared by then)."""

  def __init__(self, managed: Any) -> None:
    self.managed, self.address = managed, ctypes.addressof(managed)

  def __del__(self) -> None:
    managed = getattr(self, "managed", None)
    if managed is not None and managed.deleter: managed.deleter(self.address)


@dataclass
class Imported:
  """A producer's array wrapped without a copy: `buffer` spans every element it reads, and
  element i is at buffer position `offset + sum(i_k * strides[k])`."""
  buffer: Buffer
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  offset: int
  read_only: bool


def _unigrad_device(kind: int, dev_id: int) -> str:
  if kind in (KDL_CPU, KDL_CUDA_HOST):
    return Device.DEFAULT if Device.DEFAULT in ("CPU", "PYTHON") else "CPU"
  if kind == KDL_CUDA: return "CUDA" if dev_id == 0 else f"CUDA:{dev_id}"
  raise RuntimeError(f"from_dlpack: unsupported device type {kind} (unigrad reads kDLCPU, "
                     "kDLCUDAHost and kDLCUDA memory)")


def _unigrad_dtype(t: DLTensor) -> DType:
  code = (t.dtype.code, t.dtype.bits)
  if t.dtype.lanes != 1: raise RuntimeError(f"from_dlpack: lanes {t.dtype.lanes} != 1")
  dt = _FROM_CODE.get(code)
  if dt is None: raise RuntimeError(f"from_dlpack: unsupported DLPack dtype (code {code[0]}, "
                                    f"{code[1]} bits)")
  return dt


def _managed_of(capsule: Any) -> tuple[Any, bytes]:
  for name, used, cls in ((_NAME_V, _USED_V, DLManagedTensorVersioned),
                          (_NAME, _USED, DLManagedTensor)):
    if _is_valid(capsule, name): return cls.from_address(_get_pointer(capsule, name)), used
  raise RuntimeError("from_dlpack received an invalid capsule. Note that DLTensor capsules can "
                     "be consumed only once, so you might have already constructed a tensor "
                     "from it once.")


def import_capsule(capsule: Any) -> Imported:
  """Take a producer's capsule (consuming it) and wrap its memory in a Buffer, no copy.
  RuntimeError for a device, dtype or DLPack version unigrad cannot read (nothing consumed)."""
  managed, used = _managed_of(capsule)
  if isinstance(managed, DLManagedTensorVersioned) and managed.version.major != 1:
    raise RuntimeError(f"from_dlpack: DLPack version {managed.version.major} is not supported")
  t = managed.dl_tensor
  device, dt = _unigrad_device(t.device.device_type, t.device.device_id), _unigrad_dtype(t)
  shape = tuple(t.shape[k] for k in range(t.ndim))
  strides = tuple(t.strides[k] for k in range(t.ndim)) if t.strides else _row_major(shape)
  read_only = isinstance(managed, DLManagedTensorVersioned) and bool(managed.flags & READ_ONLY)
  _set_name(capsule, used)  # consumed: from here on, the deleter is ours to call
  owner = _Owner(managed)
  if math.prod(shape) == 0: return Imported(Buffer(device, 0, dt), shape, strides, 0, read_only)
  lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
  hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
  address = (t.data or 0) + t.byte_offset + lo * dt.itemsize
  buf = Buffer.wrap(device, hi - lo + 1, dt, address, owner)
  return Imported(buf, shape, strides, -lo, read_only)


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= s
  return tuple(reversed(out))
