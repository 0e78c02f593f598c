"""The CL device: OpenCL C kernels through the system's OpenCL library (ctypes, no Python package).

`CL` is the first device of the first platform, `CL:n` the n-th device over all platforms (on this
machine PoCL's CPU device); past the last one, `CL:n` is a context of its own on device n modulo
their number (how multi-device code is tested on one device). Kernels come from the OpenCL
dialect of the C renderer (renderer/gpu.py): a buffer argument is its `cl_mem` and a byte offset
(ABI in that module). The compiler builds the source for the device (the build log and the
source in a `CompileError`) and returns the program binary, which the disk cache keeps; a Program
rebuilds it from the binary.
A launch takes `global_size` work groups of `local_size` work items per dimension (None: one item
per group). Commands go to one in-order queue with profiling on: a launch with `wait` returns the
kernel's own time from its event; `synchronize` waits for the queue.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unigrad.renderer.gpu import OpenCLRenderer
from unigrad.runtime.device import Buffer, Compiled, CompileError, Compiler, LRUAllocator

__all__ = ["CLDevice", "CLAllocator", "CLCompiler", "CLProgram", "CLError", "CLHandle",
           "opencl_devices"]

c_void_p, c_size_t, c_uint, c_int, c_ulong = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32,
                                              ctypes.c_int32, ctypes.c_uint64)
DEVICE_TYPE_ALL = 0xFFFFFFFF
QUEUE_PROFILING_ENABLE = 1 << 1
MEM_READ_WRITE = 1 << 0
PROGRAM_BUILD_LOG, PROGRAM_BINARY_SIZES, PROGRAM_BINARIES = 0x1183, 0x1165, 0x1166
PROFILING_START, PROFILING_END = 0x1282, 0x1283
INFO = {"name": 0x102B, "driver": 0x102D, "version": 0x102F, "max_group": 0x1004,
        "max_alloc": 0x1010, "local_mem": 0x1023, "max_items": 0x1005}
ERRORS = {-1: "DEVICE_NOT_FOUND", -2: "DEVICE_NOT_AVAILABLE", -4: "MEM_OBJECT_ALLOCATION_FAILURE",
          -5: "OUT_OF_RESOURCES", -6: "OUT_OF_HOST_MEMORY", -11: "BUILD_PROGRAM_FAILURE",
          -30: "INVALID_VALUE", -38: "INVALID_MEM_OBJECT", -42: "INVALID_BINARY",
          -46: "INVALID_KERNEL_NAME", -48: "INVALID_KERNEL", -51: "INVALID_ARG_SIZE",
          -52: "INVALID_KERNEL_ARGS", -54: "INVALID_WORK_GROUP_SIZE", -55: "INVALID_WORK_ITEM_SIZE",
          -61: "INVALID_BUFFER_SIZE", -63: "INVALID_GLOBAL_WORK_SIZE",
          -1001: "PLATFORM_NOT_FOUND_KHR"}


class CLError(RuntimeError):
  """An OpenCL call failed: the call, the error code and its name."""

  def __init__(self, call: str, code: int, hint: str = "") -> None:
    self.call, self.code = call, code
    super().__init__(f"OpenCL {call} failed: CL_{ERRORS.get(code, 'ERROR')} ({code}){hint}")


@functools.cache
def _lib() -> ctypes.CDLL:
  """The OpenCL ICD loader (libOpenCL), with the signatures this module calls."""
  path = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
  try: lib = ctypes.CDLL(path)
  except OSError as e:
    raise RuntimeError(f"no OpenCL library ({e}); install an ICD loader and a driver, e.g. "
                       "Debian's ocl-icd-libopencl1 and pocl-opencl-icd") from e
  sigs: dict[str, tuple[Any, list[Any]]] = {
    "clGetPlatformIDs": (c_int, [c_uint, c_void_p, ctypes.POINTER(c_uint)]),
    "clGetDeviceIDs": (c_int, [c_void_p, c_ulong, c_uint, c_void_p, ctypes.POINTER(c_uint)]),
    "clGetDeviceInfo": (c_int, [c_void_p, c_uint, c_size_t, c_void_p, ctypes.POINTER(c_size_t)]),
    "clCreateContext": (c_void_p, [c_void_p, c_uint, c_void_p, c_void_p, c_void_p,
                                   ctypes.POINTER(c_int)]),
    "clCreateCommandQueue": (c_void_p, [c_void_p, c_void_p, c_ulong, ctypes.POINTER(c_int)]),
    "clCreateBuffer": (c_void_p, [c_void_p, c_ulong, c_size_t, c_void_p, ctypes.POINTER(c_int)]),
    "clReleaseMemObject": (c_int, [c_void_p]),
    "clEnqueueWriteBuffer": (c_int, [c_void_p, c_void_p, c_uint, c_size_t, c_size_t, c_void_p,
                                     c_uint, c_void_p, c_void_p]),
    "clEnqueueReadBuffer": (c_int, [c_void_p, c_void_p, c_uint, c_size_t, c_size_t, c_void_p,
                                    c_uint, c_void_p, c_void_p]),
    "clCreateProgramWithSource": (c_void_p, [c_void_p, c_uint, ctypes.POINTER(ctypes.c_char_p),
                                             ctypes.POINTER(c_size_t), ctypes.POINTER(c_int)]),
    "clCreateProgramWithBinary": (c_void_p, [c_void_p, c_uint, c_void_p, ctypes.POINTER(c_size_t),
                                             ctypes.POINTER(ctypes.c_char_p),
                                             ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
    "clBuildProgram": (c_int, [c_void_p, c_uint, c_void_p, ctypes.c_char_p, c_void_p, c_void_p]),
    "clGetProgramBuildInfo": (c_int, [c_void_p, c_void_p, c_uint, c_size_t, c_void_p,
                                      ctypes.POINTER(c_size_t)]),
    "clGetProgramInfo": (c_int, [c_void_p, c_uint, c_size_t, c_void_p, ctypes.POINTER(c_size_t)]),
    "clReleaseProgram": (c_int, [c_void_p]),
    "clCreateKernel": (c_void_p, [c_void_p, ctypes.c_char_p, ctypes.POINTER(c_int)]),
    "clReleaseKernel": (c_int, [c_void_p]),
    "clSetKernelArg": (c_int, [c_void_p, c_uint, c_size_t, c_void_p]),
    "clEnqueueNDRangeKernel": (c_int, [c_void_p, c_void_p, c_uint, c_void_p,
                                       ctypes.POINTER(c_size_t), ctypes.POINTER(c_size_t),
                                       c_uint, c_void_p, c_void_p]),
    "clWaitForEvents": (c_int, [c_uint, c_void_p]),
    "clGetEventProfilingInfo": (c_int, [c_void_p, c_uint, c_size_t, c_void_p,
                                        ctypes.POINTER(c_size_t)]),
    "clReleaseEvent": (c_int, [c_void_p]),
    "clFinish": (c_int, [c_void_p]),
  }
  for name, (res, args) in sigs.items():
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, args
  return lib


def _check(call: str, code: int, hint: str = "") -> None:
  if code != 0: raise CLError(call, code, hint)


def _create(call: str, *args: Any) -> Any:
  """Call an OpenCL constructor (its last argument the error code); returns the handle."""
  err = c_int(0)
  out = getattr(_lib(), call)(*args, ctypes.byref(err))
  _check(call, err.value)
  return out


@functools.cache
def opencl_devices() -> tuple[int, ...]:
  """Every OpenCL device id of every platform, in platform order (empty without a platform)."""
  lib = _lib()
  n = c_uint(0)
  if lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or n.value == 0: return ()
  platforms = (c_void_p * n.value)()
  _check("clGetPlatformIDs", lib.clGetPlatformIDs(n.value, platforms, None))
  out: list[int] = []
  for p in platforms:
    k = c_uint(0)
    if lib.clGetDeviceIDs(p, DEVICE_TYPE_ALL, 0, None, ctypes.byref(k)) != 0: continue
    devs = (c_void_p * k.value)()
    _check("clGetDeviceIDs", lib.clGetDeviceIDs(p, DEVICE_TYPE_ALL, k.value, devs, None))
    out.extend(int(d) for d in devs)
  return tuple(out)


def _info(device: int, key: str, kind: Any) -> Any:
  """A device property: a str for `kind` str, else a ctypes value or array."""
  lib = _lib()
  if kind is str:
    size = c_size_t(0)
    _check("clGetDeviceInfo", lib.clGetDeviceInfo(device, INFO[key], 0, None, ctypes.byref(size)))
    buf = ctypes.create_string_buffer(size.value)
    _check("clGetDeviceInfo", lib.clGetDeviceInfo(device, INFO[key], size, buf, None))
    return buf.value.decode(errors="replace")
  val = kind()
  _check("clGetDeviceInfo", lib.clGetDeviceInfo(device, INFO[key], ctypes.sizeof(val),
                                                ctypes.byref(val), None))
  return val


# *** memory ***

@dataclass(frozen=True, eq=False)
class CLHandle:
  """A `cl_mem` and a byte offset into it (views of an arena share the memory object)."""
  mem: int
  offset: int = 0


class CLAllocator(LRUAllocator):
  """Device memory as OpenCL buffers; copies are blocking reads and writes on the queue."""

  def __init__(self, dev: CLDevice) -> None:
    super().__init__()
    self.dev = dev

  def _alloc(self, nbytes: int) -> CLHandle:
    if nbytes > self.dev.max_alloc:
      raise MemoryError(f"{self.dev.name}: a buffer of {nbytes} bytes is larger than the device "
                        f"allows ({self.dev.max_alloc} bytes, CL_DEVICE_MAX_MEM_ALLOC_SIZE)")
    try: mem = _create("clCreateBuffer", self.dev.context, MEM_READ_WRITE, max(nbytes, 1), None)
    except CLError as e:
      raise MemoryError(f"{self.dev.name}: cannot allocate {nbytes} bytes: {e}") from e
    return CLHandle(mem)

  def _free(self, handle: CLHandle, nbytes: int) -> None: _lib().clReleaseMemObject(handle.mem)

  def copyin(self, handle: CLHandle, src: memoryview) -> None:
    if src.nbytes == 0: return
    host = (ctypes.c_char * src.nbytes).from_buffer_copy(src) if src.readonly else \
      (ctypes.c_char * src.nbytes).from_buffer(src)
    _check("clEnqueueWriteBuffer", _lib().clEnqueueWriteBuffer(
      self.dev.queue, handle.mem, 1, handle.offset, src.nbytes, host, 0, None, None))

  def copyout(self, dst: memoryview, handle: CLHandle) -> None:
    if dst.nbytes == 0: return
    host = (ctypes.c_char * dst.nbytes).from_buffer(dst)
    _check("clEnqueueReadBuffer", _lib().clEnqueueReadBuffer(
      self.dev.queue, handle.mem, 1, handle.offset, dst.nbytes, host, 0, None, None))

  def offset(self, handle: CLHandle, byte_offset: int, nbytes: int) -> CLHandle:
    return CLHandle(handle.mem, handle.offset + byte_offset)


# *** compiler and programs ***

def _build(dev: CLDevice, program: int, src: str) -> None:
  """Build `program` for the device; a failure raises CompileError with the build log."""
  device = c_void_p(dev.device)
  code = _lib().clBuildProgram(program, 1, ctypes.byref(device), b"", None, None)
  if code == 0: return
  size = c_size_t(0)
  _lib().clGetProgramBuildInfo(program, dev.device, PROGRAM_BUILD_LOG, 0, None, ctypes.byref(size))
  log = ctypes.create_string_buffer(size.value + 1)
  _lib().clGetProgramBuildInfo(program, dev.device, PROGRAM_BUILD_LOG, size, log, None)
  _lib().clReleaseProgram(program)
  raise CompileError(f"OpenCL ({dev.device_name})", log.value.decode(errors="replace") or
                     f"CL_{ERRORS.get(code, 'ERROR')} ({code})", src)


class CLCompiler(Compiler):
  """OpenCL C to the device's program binary."""

  def __init__(self, dev: CLDevice) -> None:
    self.dev = dev

  @property
  def cache_key(self) -> str | None:
    # a PoCL program binary is not self-contained: it names entries of PoCL's own kernel cache
    # (~/.cache/pocl), and one loaded in a later process after that cache changed aborted the
    # process in clBuildProgram (pocl_binary.c: "len > 0"); PoCL keeps its own compile cache
    if self.dev.is_pocl: return None
    return f"opencl|{self.dev.device_name}|{self.dev.driver}"

  def compile(self, src: str) -> bytes:
    data = src.encode()
    program = _create("clCreateProgramWithSource", self.dev.context, 1,
                      (ctypes.c_char_p * 1)(data), (c_size_t * 1)(len(data)))
    _build(self.dev, program, src)
    try:
      size = c_size_t(0)
      _check("clGetProgramInfo", _lib().clGetProgramInfo(
        program, PROGRAM_BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size), None))
      binary = ctypes.create_string_buffer(size.value)
      ptrs = (c_void_p * 1)(ctypes.cast(binary, c_void_p).value)
      _check("clGetProgramInfo", _lib().clGetProgramInfo(
        program, PROGRAM_BINARIES, ctypes.sizeof(ptrs), ptrs, None))
      return binary.raw
    finally: _lib().clReleaseProgram(program)


class CLProgram:
  """Kernel `name` of a program binary, on one CL device."""

  def __init__(self, dev: CLDevice, name: str, lib: bytes) -> None:
    self.dev, self.name = dev, name
    status = c_int(0)
    device = c_void_p(dev.device)
    self.program = _create("clCreateProgramWithBinary", dev.context, 1, ctypes.byref(device),
                           (c_size_t * 1)(len(lib)), (ctypes.c_char_p * 1)(lib),
                           ctypes.byref(status))
    _build(dev, self.program, f"<program binary of {name}>")
    self.kernel = _create("clCreateKernel", self.program, name.encode())

  def _set_args(self, bufs: Sequence[Any], vals: Sequence[int]) -> None:
    lib, i = _lib(), 0
    for b in bufs:
      if not isinstance(b, Buffer):
        raise TypeError(f"CL kernels take Buffers, got {type(b).__name__}")
      h = b.handle
      _check("clSetKernelArg", lib.clSetKernelArg(self.kernel, i, 8, ctypes.byref(c_void_p(h.mem))))
      _check("clSetKernelArg", lib.clSetKernelArg(self.kernel, i + 1, 8,
                                                  ctypes.byref(c_ulong(h.offset))))
      i += 2
    for v in vals:
      _check("clSetKernelArg", lib.clSetKernelArg(self.kernel, i, 4, ctypes.byref(c_int(v))))
      i += 1

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    """Run `global_size` work groups of `local_size` work items (None: one item per group)."""
    local = tuple(local_size) if local_size is not None else (1,) * len(global_size)
    if len(local) != len(global_size) or not 1 <= len(local) <= 3:
      raise ValueError(f"CL launches take 1 to 3 dimensions, got global {tuple(global_size)} "
                       f"and local {local}")
    if math.prod(local) > self.dev.max_group:
      raise ValueError(f"{self.dev.name}: a work group of {math.prod(local)} items {local} is "
                       f"above the device limit of {self.dev.max_group} "
                       "(CL_DEVICE_MAX_WORK_GROUP_SIZE)")
    self._set_args(bufs, vals)
    n = len(local)
    total = (c_size_t * n)(*(g * lo for g, lo in zip(global_size, local)))
    event = c_void_p()
    _check("clEnqueueNDRangeKernel", _lib().clEnqueueNDRangeKernel(
      self.dev.queue, self.kernel, n, None, total, (c_size_t * n)(*local), 0, None,
      ctypes.byref(event) if wait else None), f" launching {self.name}")
    if not wait: return None
    try:
      _check("clWaitForEvents", _lib().clWaitForEvents(1, ctypes.byref(event)))
      start, end = c_ulong(0), c_ulong(0)
      for key, val in ((PROFILING_START, start), (PROFILING_END, end)):
        _check("clGetEventProfilingInfo", _lib().clGetEventProfilingInfo(
          event, key, 8, ctypes.byref(val), None))
      return (end.value - start.value) * 1e-9
    finally: _lib().clReleaseEvent(event)

  def __del__(self) -> None:
    try:
      _lib().clReleaseKernel(self.kernel)
      _lib().clReleaseProgram(self.program)
    except Exception:  # noqa: BLE001 (interpreter shutdown, or a failed constructor)
      pass


class CLDevice(Compiled):
  """One OpenCL device: a context and an in-order, profiling command queue."""

  def __init__(self, name: str = "CL") -> None:
    index = int(name.split(":")[1]) if ":" in name else 0
    devices = opencl_devices()
    if not devices:
      raise RuntimeError("no OpenCL platform or device found; install a driver, e.g. Debian's "
                         "pocl-opencl-icd (runs OpenCL on the CPU)")
    # like CPU:n, CL:n past the last device is another context on a device (multi-device tests)
    self.device = devices[index % len(devices)]
    self.device_name = _info(self.device, "name", str)
    self.driver = _info(self.device, "driver", str)
    self.is_pocl = "PoCL" in _info(self.device, "version", str)
    self.max_group = _info(self.device, "max_group", c_size_t).value
    self.max_alloc = _info(self.device, "max_alloc", c_ulong).value
    local_mem = _info(self.device, "local_mem", c_ulong).value
    dev = c_void_p(self.device)
    self.context = _create("clCreateContext", None, 1, ctypes.byref(dev), None, None)
    self.queue = _create("clCreateCommandQueue", self.context, self.device, QUEUE_PROFILING_ENABLE)
    renderer = OpenCLRenderer(name, local_max=min(256, self.max_group),
                              shared_bytes=int(local_mem))
    super().__init__(name, CLAllocator(self), CLCompiler(self),
                     functools.partial(CLProgram, self), renderer)  # type: ignore[arg-type]

  @classmethod
  def is_available(cls) -> bool:
    try: return bool(opencl_devices())
    except RuntimeError: return False

  def synchronize(self) -> None: _check("clFinish", _lib().clFinish(self.queue))
