"""The CUDA device: CUDA C kernels through the driver API (ctypes on libcuda, no Python package).

Kernels come from the CUDA dialect of the C renderer (renderer/gpu.py): raw device pointers, then
the int32 variables. The compiler turns the source into a cubin (SASS, through PTX) for the GPU's
architecture with NVRTC when its library is found (an optional extra: the PyPI
`nvidia-cuda-nvrtc` wheel or the system's), else with `nvcc -cubin`; errors carry the compiler's
log and the numbered source. Launches take `global_size` blocks of `local_size` threads (None: one
thread per block) on the default stream; `wait` times the launch with two events.

Without a GPU, opening CUDA raises a clear error, unless the `CUDA_COMPILE_ONLY` knob is set:
then the device compiles every kernel for `CUDA_ARCH` (sm_90 by default) and runs none, with
size-only memory (like NULL), so a CUDA renderer bug fails a test on any machine with a compiler.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import math
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unigrad.knobs import CUDA_ARCH, CUDA_COMPILE_ONLY
from unigrad.renderer.gpu import CUDARenderer
from unigrad.runtime.device import Buffer, Compiled, CompileError, Compiler, LRUAllocator
from unigrad.runtime.ops_null import NullAllocator, NullProgram

__all__ = ["CUDADevice", "CUDAAllocator", "CUDACompiler", "CUDAProgram", "CUDAError",
           "find_cuda_compiler"]

c_void_p, c_int, c_uint, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
c_u64 = ctypes.c_uint64
ATTR = {"max_threads": 1, "shared": 8, "grid_x": 5, "grid_y": 6, "grid_z": 7, "major": 75,
        "minor": 76}
DEFAULT_ARCH = "sm_90"
TOOLKIT_INCLUDES = ("/usr/local/cuda/include", "/opt/cuda/include", "/usr/include")


class CUDAError(RuntimeError):
  """A CUDA driver call failed: the call, the error code and the driver's description."""

  def __init__(self, call: str, code: int, what: str) -> None:
    self.call, self.code = call, code
    super().__init__(f"CUDA {call} failed: {what} ({code})")


# *** libraries ***

@functools.cache
def _cuda() -> ctypes.CDLL:
  """The driver library, with the signatures this module calls."""
  try: lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
  except OSError as e:
    raise RuntimeError(f"no CUDA driver (libcuda): {e}; this machine has no NVIDIA GPU driver. "
                       "Set CUDA_COMPILE_ONLY=1 to compile CUDA kernels without a GPU") from e
  ptr, i32 = ctypes.POINTER(c_void_p), ctypes.POINTER(c_int)
  sigs: dict[str, list[Any]] = {
    "cuInit": [c_uint], "cuDeviceGetCount": [i32], "cuDeviceGet": [i32, c_int],
    "cuDeviceGetAttribute": [i32, c_int, c_int], "cuDevicePrimaryCtxRetain": [ptr, c_int],
    "cuCtxSetCurrent": [c_void_p], "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [ctypes.POINTER(c_u64), c_size_t], "cuMemFree_v2": [c_u64],
    "cuMemcpyHtoD_v2": [c_u64, c_void_p, c_size_t], "cuMemcpyDtoH_v2": [c_void_p, c_u64, c_size_t],
    "cuModuleLoadData": [ptr, c_void_p], "cuModuleUnload": [c_void_p],
    "cuModuleGetFunction": [ptr, c_void_p, ctypes.c_char_p],
    "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p,
                       c_void_p, c_void_p],
    "cuEventCreate": [ptr, c_uint], "cuEventRecord": [c_void_p, c_void_p],
    "cuEventSynchronize": [c_void_p], "cuEventDestroy_v2": [c_void_p],
    "cuEventElapsedTime_v2": [ctypes.POINTER(ctypes.c_float), c_void_p, c_void_p],
    "cuGetErrorString": [c_int, ctypes.POINTER(ctypes.c_char_p)],
  }
  for name, args in sigs.items():
    # cuda.h maps some names to _v2 symbols; older drivers export only the plain one
    fn = getattr(lib, name) if hasattr(lib, name) else getattr(lib, name.removesuffix("_v2"))
    fn.restype, fn.argtypes = c_int, args
    setattr(lib, name, fn)
  return lib


def _check(call: str, code: int) -> None:
  if code == 0: return
  what = ctypes.c_char_p()
  _cuda().cuGetErrorString(code, ctypes.byref(what))
  raise CUDAError(call, code, (what.value or b"unknown error").decode())


def _call(name: str, *args: Any) -> None: _check(name, getattr(_cuda(), name)(*args))


@functools.cache
def _nvrtc() -> ctypes.CDLL | None:
  """NVRTC if its library is found (optional), else None."""
  path = ctypes.util.find_library("nvrtc")
  if path is None: return None
  try: lib = ctypes.CDLL(path)
  except OSError: return None
  ptr, size = ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)
  sigs: dict[str, list[Any]] = {
    "nvrtcCreateProgram": [ptr, ctypes.c_char_p, ctypes.c_char_p, c_int, c_void_p, c_void_p],
    "nvrtcCompileProgram": [c_void_p, c_int, ctypes.POINTER(ctypes.c_char_p)],
    "nvrtcGetProgramLogSize": [c_void_p, size], "nvrtcGetProgramLog": [c_void_p, ctypes.c_char_p],
    "nvrtcGetCUBINSize": [c_void_p, size], "nvrtcGetCUBIN": [c_void_p, ctypes.c_char_p],
    "nvrtcDestroyProgram": [ptr], "nvrtcVersion": [ctypes.POINTER(c_int), ctypes.POINTER(c_int)],
  }
  for name, args in sigs.items():
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = c_int, args
  return lib


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
  """Directories holding cuda_fp16.h for NVRTC (nvcc finds its own): next to nvcc, the usual
  toolkit places, and the PyPI wheels' (nvidia-cuda-runtime)."""
  cands = [pathlib.Path(p).resolve().parent.parent / "include" for p in [shutil.which("nvcc")] if p]
  cands += [pathlib.Path(p) for p in TOOLKIT_INCLUDES]
  cands += [pathlib.Path(p) / "cuda_runtime" / "include" for p in _nvidia_wheel_dirs()]
  return tuple(dict.fromkeys(str(d) for d in cands if (d / "cuda_fp16.h").is_file()))


def _nvidia_wheel_dirs() -> list[str]:
  spec = importlib.util.find_spec("nvidia")
  return list(spec.submodule_search_locations or []) if spec is not None else []


def find_cuda_compiler() -> str | None:
  """"nvrtc" when its library is found, else the path of nvcc, else None."""
  return "nvrtc" if _nvrtc() is not None else shutil.which("nvcc")


# *** compiler ***

class CUDACompiler(Compiler):
  """CUDA C to a cubin for `arch` (e.g. sm_90): NVRTC in-process, else nvcc in a subprocess."""

  def __init__(self, arch: str) -> None:
    self.arch, self.tool = arch, find_cuda_compiler()
    if self.tool is None:
      raise RuntimeError("no CUDA compiler: install NVRTC (e.g. pip install nvidia-cuda-nvrtc) "
                         "or the CUDA toolkit's nvcc")

  @property
  def cache_key(self) -> str | None: return f"cuda|{self.arch}|{_tool_version(self.tool or '')}"

  def compile(self, src: str) -> bytes:
    return self._nvrtc(src) if self.tool == "nvrtc" else self._nvcc(src)

  def _nvcc(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="unigrad-cuda-") as tmp:
      cu, out = pathlib.Path(tmp) / "kernel.cu", pathlib.Path(tmp) / "kernel.cubin"
      cu.write_text(src)
      proc = subprocess.run([str(self.tool), f"-arch={self.arch}", "-cubin", "-o", str(out),
                             str(cu)], capture_output=True, text=True, timeout=300)
      if proc.returncode != 0: raise CompileError("nvcc", proc.stderr + proc.stdout, src)
      return out.read_bytes()

  def _nvrtc(self, src: str) -> bytes:
    lib, prog = _nvrtc(), c_void_p()
    assert lib is not None
    if (code := lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None,
                                       None)) != 0:
      raise CompileError("nvrtc", f"nvrtcCreateProgram failed ({code})", src)
    try:
      args = [f"--gpu-architecture={self.arch}", *(f"-I{d}" for d in cuda_include_dirs())]
      opts = (ctypes.c_char_p * len(args))(*(a.encode() for a in args))
      if lib.nvrtcCompileProgram(prog, len(args), opts) != 0:
        size = c_size_t(0)
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(prog, log)
        raise CompileError("nvrtc", log.value.decode(errors="replace"), src)
      size = c_size_t(0)
      lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
      cubin = ctypes.create_string_buffer(size.value)
      lib.nvrtcGetCUBIN(prog, cubin)
      return cubin.raw
    finally: lib.nvrtcDestroyProgram(ctypes.byref(prog))


@functools.cache
def _tool_version(tool: str) -> str:
  if tool == "nvrtc":
    lib, major, minor = _nvrtc(), c_int(0), c_int(0)
    if lib is not None: lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"nvrtc {major.value}.{minor.value}"
  out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
  return out.strip().splitlines()[-1] if out.strip() else tool


# *** memory ***

@dataclass(frozen=True, eq=False)
class CUDAHandle:
  """A device address (views are addresses inside their base's allocation)."""
  ptr: int


class CUDAAllocator(LRUAllocator):
  """Device memory from cuMemAlloc; copies are synchronous."""

  def __init__(self, dev: CUDADevice) -> None:
    super().__init__()
    self.dev = dev

  def _alloc(self, nbytes: int) -> CUDAHandle:
    self.dev.activate()
    ptr = c_u64(0)
    code = _cuda().cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1))
    if code == 2: raise MemoryError(f"{self.dev.name}: out of memory allocating {nbytes} bytes")
    _check("cuMemAlloc", code)
    return CUDAHandle(ptr.value)

  def _free(self, handle: CUDAHandle, nbytes: int) -> None: _cuda().cuMemFree_v2(handle.ptr)

  def copyin(self, handle: CUDAHandle, src: memoryview) -> None:
    if src.nbytes == 0: return
    self.dev.activate()
    host = (ctypes.c_char * src.nbytes).from_buffer_copy(src)
    _call("cuMemcpyHtoD_v2", handle.ptr, host, src.nbytes)

  def copyout(self, dst: memoryview, handle: CUDAHandle) -> None:
    if dst.nbytes == 0: return
    self.dev.activate()
    _call("cuMemcpyDtoH_v2", (ctypes.c_char * dst.nbytes).from_buffer(dst), handle.ptr, dst.nbytes)

  def offset(self, handle: CUDAHandle, byte_offset: int, nbytes: int) -> CUDAHandle:
    return CUDAHandle(handle.ptr + byte_offset)

  def address(self, handle: CUDAHandle) -> int: return handle.ptr

  def from_address(self, address: int, nbytes: int) -> CUDAHandle: return CUDAHandle(address)


# *** programs ***

class CUDAProgram:
  """Kernel `name` of a cubin, loaded on one GPU."""

  def __init__(self, dev: CUDADevice, name: str, lib: bytes) -> None:
    self.dev, self.name, self._image = dev, name, ctypes.create_string_buffer(lib)
    dev.activate()
    self.module, self.fn = c_void_p(), c_void_p()
    _call("cuModuleLoadData", ctypes.byref(self.module), self._image)
    _call("cuModuleGetFunction", ctypes.byref(self.fn), self.module, name.encode())

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    """Run `global_size` blocks of `local_size` threads (None: one thread per block)."""
    grid = (tuple(global_size) + (1, 1))[:3]
    block = (tuple(local_size) + (1, 1))[:3] if local_size is not None else (1, 1, 1)
    if math.prod(block) > self.dev.max_threads:
      raise ValueError(f"{self.dev.name}: a block of {math.prod(block)} threads {block} is above "
                       f"the device limit of {self.dev.max_threads}")
    args = [c_u64(b.handle.ptr if isinstance(b, Buffer) else int(b)) for b in bufs]
    args += [ctypes.c_int32(v) for v in vals]
    params = (c_void_p * max(1, len(args)))(*(ctypes.addressof(a) for a in args))
    self.dev.activate()
    start, end = (self.dev.event(), self.dev.event()) if wait else (None, None)
    if start is not None: _call("cuEventRecord", start, None)
    _call("cuLaunchKernel", self.fn, *grid, *block, 0, None, params, None)
    if end is None: return None
    _call("cuEventRecord", end, None)
    _call("cuEventSynchronize", end)
    ms = ctypes.c_float(0)
    _call("cuEventElapsedTime_v2", ctypes.byref(ms), start, end)
    for ev in (start, end): _cuda().cuEventDestroy_v2(ev)
    return ms.value * 1e-3

  def __del__(self) -> None:
    try: _cuda().cuModuleUnload(self.module)
    except Exception:  # noqa: BLE001 (interpreter shutdown, or a failed constructor)
      pass


# *** the device ***

class CUDADevice(Compiled):
  """One NVIDIA GPU (`CUDA:n` is GPU n), or, with CUDA_COMPILE_ONLY, a compiler with no GPU."""

  def __init__(self, name: str = "CUDA") -> None:
    if CUDA_COMPILE_ONLY:
      arch = CUDA_ARCH.value or DEFAULT_ARCH
      super().__init__(name, NullAllocator(), CUDACompiler(arch), NullProgram, CUDARenderer(name))
      return
    _call("cuInit", 0)
    count, index = c_int(0), int(name.split(":")[1]) if ":" in name else 0
    _call("cuDeviceGetCount", ctypes.byref(count))
    if index >= count.value:
      raise RuntimeError(f"{name}: this machine has {count.value} CUDA GPUs")
    self.device, self.context = c_int(0), c_void_p()
    _call("cuDeviceGet", ctypes.byref(self.device), index)
    _call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
    attrs = {k: self._attribute(v) for k, v in ATTR.items()}
    self.max_threads = attrs["max_threads"]
    arch = CUDA_ARCH.value or f"sm_{attrs['major']}{attrs['minor']}"
    renderer = CUDARenderer(name, (attrs["grid_x"], attrs["grid_y"], attrs["grid_z"]),
                            min(1024, self.max_threads), attrs["shared"])
    super().__init__(name, CUDAAllocator(self), CUDACompiler(arch),
                     functools.partial(CUDAProgram, self), renderer)  # type: ignore[arg-type]

  def _attribute(self, attr: int) -> int:
    out = c_int(0)
    _call("cuDeviceGetAttribute", ctypes.byref(out), attr, self.device)
    return out.value

  def activate(self) -> None: _call("cuCtxSetCurrent", self.context)

  def event(self) -> c_void_p:
    ev = c_void_p()
    _call("cuEventCreate", ctypes.byref(ev), 0)
    return ev

  @classmethod
  def is_available(cls) -> bool:
    try:
      _call("cuInit", 0)
      return True
    except RuntimeError: return False

  def synchronize(self) -> None:
    if CUDA_COMPILE_ONLY and not hasattr(self, "context"): return
    self.activate()
    _call("cuCtxSynchronize")
