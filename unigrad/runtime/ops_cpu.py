"""The CPU device: C source compiled to a shared object by clang or gcc, run in-process.

Kernel ABI: `void name(T0* data0, ..., int var0, ..., int core_id)`: buffer pointers in order,
then the int32 variables, then always `core_id`. A launch with `global_size[0] == n` calls the
kernel n times with core_id 0..n-1; with n > 1 the calls run in parallel on a pool of OS threads
(ctypes releases the GIL during the call), the launching thread taking chunks too. The pool is
sized by the `THREADS` knob (0: every core this process may run on) and reused across launches.

Memory is 64-byte aligned host memory, zero-copy visible as a memoryview.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import itertools
import mmap
import os
import pathlib
import platform
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from unigrad.knobs import CC, THREADS
from unigrad.runtime.device import Buffer, Compiled, CompileError, Compiler, LRUAllocator

__all__ = ["CPUDevice", "CPUAllocator", "ClangCompiler", "CPUProgram", "ChunkPool",
           "find_c_compiler", "cpu_threads", "chunk_pool", "native_vector_bytes",
           "last_level_cache_bytes", "CFLAGS"]

# compile flags, both accepted by clang 14 and gcc 12; the source is read from stdin
CFLAGS: tuple[str, ...] = ("-shared", "-fPIC", "-O2", "-march=native", "-fno-math-errno", "-fwrapv",
                           "-mprefer-vector-width=512", "-ffp-contract=off")
LIBS: tuple[str, ...] = ("-lm",)
ALIGN = 64  # bytes: one cache line, one AVX-512 register
_MMAP_MIN = 1 << 16  # buffers this big come from mmap (page aligned, zeroed lazily by the OS)


# *** memory ***

class CPUAllocator(LRUAllocator):
  """Host memory. A handle is a ctypes `c_uint8` array, 64-byte aligned; it owns its memory."""

  def _alloc(self, nbytes: int) -> Any:
    if nbytes >= _MMAP_MIN:
      try: mem: Any = mmap.mmap(-1, nbytes)
      except OSError as e: raise MemoryError(f"CPU: cannot map {nbytes} bytes: {e}") from e
      return (ctypes.c_uint8 * nbytes).from_buffer(mem)
    raw = (ctypes.c_uint8 * (nbytes + ALIGN - 1))()
    pad = -ctypes.addressof(raw) % ALIGN
    return (ctypes.c_uint8 * nbytes).from_buffer(raw, pad)  # keeps `raw` alive

  def copyin(self, handle: Any, src: memoryview) -> None: memoryview(handle).cast("B")[:] = src

  def copyout(self, dst: memoryview, handle: Any) -> None: dst[:] = memoryview(handle).cast("B")

  def offset(self, handle: Any, byte_offset: int, nbytes: int) -> Any:
    return (ctypes.c_uint8 * nbytes).from_buffer(handle, byte_offset)

  def as_memoryview(self, handle: Any, nbytes: int) -> memoryview:
    return memoryview(handle).cast("B")

  def address(self, handle: Any) -> int: return ctypes.addressof(handle)


# *** compiler ***

@functools.cache
def _which_cc(cc: str) -> str | None:
  if cc: return shutil.which(cc)
  return shutil.which("clang") or shutil.which("gcc")


def find_c_compiler() -> str | None:
  """The path of the C compiler: the `CC` knob, else clang, else gcc; None if none is found."""
  return _which_cc(CC.value)


@functools.cache
def _compiler_identity(cc: str) -> str:
  """The compiler's version line and the host CPU (`-march=native` depends on both)."""
  out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
  cpu = platform.machine()
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    wanted = [ln for ln in info if ln.startswith(("model name", "flags"))]
    cpu += "|" + "|".join(dict.fromkeys(wanted))
  except OSError:
    cpu += "|" + platform.processor()
  return f"{out.splitlines()[0] if out else ''}|{cpu}"


@functools.cache
def _predefined_macros(cc: str) -> frozenset[str]:
  proc = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "-"], input="",
                        capture_output=True, text=True, timeout=30)
  return frozenset(ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("#define "))


def native_vector_bytes() -> int:
  """The widest vector register the compiler targets with `-march=native` (64 with AVX-512,
  32 with AVX, 16 with SSE or NEON; 0 without a compiler): the CPU renderer's vector width."""
  cc = find_c_compiler()
  if cc is None: return 0
  macros = _predefined_macros(cc)
  if "__AVX512F__" in macros: return 64
  if "__AVX__" in macros: return 32
  return 16 if macros & {"__SSE2__", "__ARM_NEON", "__ARM_NEON__"} else 0


@functools.cache
def last_level_cache_bytes() -> int:
  """The size of the largest CPU cache (Linux sysfs), 32 MiB where it cannot be read: outputs at
  least this big get streaming stores."""
  sizes = []
  for f in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
    try: text = open(f).read().strip()
    except OSError: continue
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    if (num := text.rstrip("KMG")).isdigit(): sizes.append(int(num) * unit)
  return max(sizes, default=32 << 20)


class ClangCompiler(Compiler):
  """C source to a shared object: `<cc> <CFLAGS> -x c - -o lib.so -lm`. Despite the name, any
  gcc-compatible compiler works (the `CC` knob); by default clang, else gcc."""

  def __init__(self, cc: str | None = None, flags: Sequence[str] = CFLAGS) -> None:
    path = _which_cc(cc) if cc else find_c_compiler()
    if path is None:
      raise RuntimeError(f"no C compiler found (CC={cc or CC.value!r}); install clang or gcc, or "
                         "set CC to a compiler on PATH")
    self.cc, self.flags = path, tuple(flags)

  @property
  def cache_key(self) -> str | None:
    return f"cpu|{self.cc}|{_compiler_identity(self.cc)}|{' '.join(self.flags + LIBS)}"

  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="unigrad-cc-") as tmp:
      out = pathlib.Path(tmp) / "lib.so"
      cmd = [self.cc, *self.flags, "-x", "c", "-", "-x", "none", "-o", str(out), *LIBS]
      proc = subprocess.run(cmd, input=src.encode(), capture_output=True)
      if proc.returncode != 0 or not out.exists():
        raise CompileError(" ".join(cmd), proc.stderr.decode(errors="replace"), src)
      return out.read_bytes()


# *** programs and the thread pool ***

def cpu_threads() -> int:
  """How many OS threads run a kernel's chunks: the `THREADS` knob, 0 meaning every usable core."""
  if THREADS.value > 0: return int(THREADS.value)
  if hasattr(os, "sched_getaffinity"): return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


class _Launch:
  """One parallel launch: chunks are claimed from a shared counter until all n are taken."""

  def __init__(self, fxn: Callable[..., None], args: list[int], n: int) -> None:
    self.fxn, self.args, self.n = fxn, args, n
    self.next = itertools.count()  # next() is atomic under the GIL
    self.remaining, self.lock, self.done = n, threading.Lock(), threading.Event()
    self.error: BaseException | None = None

  def work(self) -> None:
    while (i := next(self.next)) < self.n:
      try: self.fxn(*self.args, i)
      except BaseException as e:  # noqa: BLE001 (re-raised in the launching thread)
        self.error = self.error or e
      with self.lock:
        self.remaining -= 1
        if self.remaining == 0: self.done.set()


class ChunkPool:
  """`nthreads - 1` daemon worker threads; with the launching thread, `nthreads` run chunks."""

  def __init__(self, nthreads: int) -> None:
    self.nthreads, self.pid = max(1, nthreads), os.getpid()
    self._tasks: queue.SimpleQueue[_Launch | None] = queue.SimpleQueue()
    self.threads = [threading.Thread(target=self._serve, name=f"unigrad-cpu-{i}", daemon=True)
                    for i in range(1, self.nthreads)]
    for t in self.threads: t.start()

  def _serve(self) -> None:
    while (launch := self._tasks.get()) is not None: launch.work()

  def run(self, fxn: Callable[..., None], args: list[int], n: int) -> None:
    """Call `fxn(*args, core_id)` for core_id in 0..n-1, in parallel; returns when all are done."""
    launch = _Launch(fxn, args, n)
    for _ in range(min(n, self.nthreads) - 1): self._tasks.put(launch)
    launch.work()
    launch.done.wait()
    if launch.error is not None: raise launch.error

  def close(self) -> None:
    for _ in self.threads: self._tasks.put(None)


_pool: ChunkPool | None = None
_pool_lock = threading.Lock()


def chunk_pool() -> ChunkPool:
  """The process's pool, (re)made when the `THREADS` knob changed or after a fork."""
  global _pool
  n = cpu_threads()
  with _pool_lock:
    if _pool is None or _pool.nthreads != n or _pool.pid != os.getpid():
      if _pool is not None and _pool.pid == os.getpid(): _pool.close()
      _pool = ChunkPool(n)
    return _pool


def _load_library(lib: bytes) -> ctypes.CDLL:
  with tempfile.NamedTemporaryFile(prefix="unigrad-", suffix=".so") as f:
    f.write(lib)
    f.flush()
    return ctypes.CDLL(f.name)


def _address(buf: Any) -> int:
  if isinstance(buf, Buffer): return buf.address()
  if isinstance(buf, int) and not isinstance(buf, bool): return buf
  raise TypeError(f"CPU kernels take Buffers or int addresses, got {type(buf).__name__}")


class CPUProgram:
  """The C function `name` in the shared object `lib`, launched over `global_size[0]` chunks."""

  def __init__(self, name: str, lib: bytes) -> None:
    self.name, self.lib = name, _load_library(lib)
    try: self.fxn = getattr(self.lib, name)
    except AttributeError:
      raise RuntimeError(f"CPU: the compiled library has no function {name!r}") from None
    self.fxn.restype = None
    self._nargs = -1

  def _set_signature(self, nbufs: int, nvals: int) -> None:
    if self._nargs == nbufs + nvals: return
    self.fxn.argtypes = [ctypes.c_void_p] * nbufs + [ctypes.c_int32] * (nvals + 1)
    self._nargs = nbufs + nvals

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    """Run the kernel; `local_size` is ignored (the CPU has no work groups)."""
    n = int(global_size[0])
    if n < 1 or any(g != 1 for g in global_size[1:]):
      raise ValueError(f"CPU launches take global_size (n, 1, 1) with n >= 1, got {global_size}")
    args = [_address(b) for b in bufs] + [int(v) for v in vals]
    self._set_signature(len(bufs), len(vals))
    st = time.perf_counter()
    if n == 1 or cpu_threads() == 1:
      for i in range(n): self.fxn(*args, i)
    else:
      chunk_pool().run(self.fxn, args, n)
    return time.perf_counter() - st if wait else None


class CPUDevice(Compiled):
  """The host CPU: clang/gcc-compiled C kernels, run on a thread pool."""

  def __init__(self, name: str = "CPU") -> None:
    super().__init__(name, CPUAllocator(), ClangCompiler(), CPUProgram)

  @property
  def threads(self) -> int:
    """How many chunks run at once: the size a THREAD axis should split into."""
    return cpu_threads()

  @classmethod
  def is_available(cls) -> bool: return find_c_compiler() is not None
