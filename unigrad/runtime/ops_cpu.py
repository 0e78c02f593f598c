"""The CPU device: C source compiled to a shared object by clang or gcc, run in-process.

Kernel ABI: `void name(T0* data0, ..., int var0, ..., int core_id)`: buffer pointers in order,
then the int32 variables, then always `core_id`. A launch with `global_size[0] == n` calls the
kernel n times with core_id 0..n-1; with n > 1 the calls run in parallel on a native pool of OS
threads (one ctypes call per launch, the GIL released), the launching thread taking chunks too.
The pool is sized by the `THREADS` knob (0: every core this process may run on) and reused
across launches.

Memory is 64-byte aligned host memory, zero-copy visible as a memoryview.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import mmap
import os
import pathlib
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from unigrad.helpers import cpu_threads
from unigrad.knobs import CC, MARCH, PREFETCH
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import (Buffer, Compiled, CompileError, Compiler, LRUAllocator,
                                    OOB_STATE, OutOfBoundsError)

__all__ = ["CPUDevice", "CPUAllocator", "ClangCompiler", "CPUProgram", "ChunkPool",
           "find_c_compiler", "cpu_threads", "chunk_pool", "target_vector_bytes",
           "target_vector_registers", "last_level_cache_bytes", "cpu_flags", "CFLAGS"]

# compile flags, both accepted by clang 14 and gcc 12; the source is read from stdin; the target
# ISA (-march) comes from the MARCH knob (see cpu_flags)
CFLAGS: tuple[str, ...] = ("-shared", "-fPIC", "-O2", "-fno-math-errno", "-fwrapv",
                           "-mprefer-vector-width=512", "-ffp-contract=off")
LIBS: tuple[str, ...] = ("-lm",)
ALIGN = 64  # bytes: one cache line, one AVX-512 register
_MMAP_MIN = 1 << 16  # buffers this big come from mmap (page aligned, zeroed lazily by the OS)
# buffers this big ask for transparent huge pages, 2 MiB aligned: a kernel streaming over them
# misses the TLB far less often, and a fresh buffer faults in 2 MiB at a time
_HUGE_MIN, _HUGE_PAGE = 1 << 22, 1 << 21


# *** memory ***

class CPUAllocator(LRUAllocator):
  """Host memory. A handle is a ctypes `c_uint8` array, 64-byte aligned; it owns its memory."""

  def _alloc(self, nbytes: int) -> Any:
    if nbytes >= _MMAP_MIN:
      huge = nbytes >= _HUGE_MIN and hasattr(mmap, "MADV_HUGEPAGE")
      size = nbytes + (_HUGE_PAGE if huge else 0)
      # private, not mmap's default shared mapping: only private memory gets huge pages
      try: mem: Any = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
      except OSError as e: raise MemoryError(f"CPU: cannot map {nbytes} bytes: {e}") from e
      if not huge: return (ctypes.c_uint8 * nbytes).from_buffer(mem)
      mem.madvise(mmap.MADV_HUGEPAGE)
      pad = -ctypes.addressof(ctypes.c_uint8.from_buffer(mem)) % _HUGE_PAGE
      return (ctypes.c_uint8 * nbytes).from_buffer(mem, pad)
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

  def from_address(self, address: int, nbytes: int) -> Any:
    return (ctypes.c_uint8 * nbytes).from_address(address)


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
def _direct_link(cc: str) -> tuple[str, ...] | None:
  """How to link one kernel object into a shared object without the compiler driver: the
  driver's linker, then the arguments that follow the object (its library directories, libm,
  and the compiler's runtime library for the builtins it may call). None off Linux or when the
  driver does not say. C library symbols stay undefined and bind at load, where the process
  has them (a symbol nothing defines fails the load with OSError, never a crash)."""
  if platform.system() != "Linux": return None
  def ask(*args: str) -> str:
    try: proc = subprocess.run([cc, *args], capture_output=True, text=True, timeout=30)
    except OSError: return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""
  ld = shutil.which(ask("-print-prog-name=ld") or "ld")
  runtime = ask("-print-libgcc-file-name")
  dirs = next((ln.split("=", 1)[1] for ln in ask("-print-search-dirs").splitlines()
               if ln.startswith("libraries:")), "")
  if ld is None or not os.path.isfile(runtime): return None
  search = tuple(f"-L{d}" for d in dict.fromkeys(os.path.normpath(d) for d in dirs.split(":") if d)
                 if os.path.isdir(d))
  return (ld, *search, *LIBS, runtime)


def cpu_flags(march: str | None = None) -> tuple[str, ...]:
  """The compile flags for target ISA `march` (default: the MARCH knob)."""
  return (*CFLAGS, f"-march={MARCH.value if march is None else march}")


@functools.cache
def _predefined_macros(cc: str, march: str) -> frozenset[str]:
  proc = subprocess.run([cc, f"-march={march}", "-dM", "-E", "-x", "c", "-"], input="",
                        capture_output=True, text=True, timeout=30)
  if proc.returncode != 0:
    raise ValueError(f"MARCH={march!r}: {cc} rejects -march={march} ({proc.stderr.strip()}); use "
                     "native, or an ISA the compiler knows (x86-64-v3 for AVX2, x86-64-v4)")
  return frozenset(ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("#define "))


def target_vector_bytes(march: str | None = None) -> int:
  """The widest vector register of target ISA `march` (default: the MARCH knob): 64 with
  AVX-512, 32 with AVX, 16 with SSE or NEON; 0 without a compiler. The CPU renderer's vector
  width."""
  cc = find_c_compiler()
  if cc is None: return 0
  macros = _predefined_macros(cc, MARCH.value if march is None else march)
  if "__AVX512F__" in macros: return 64
  if "__AVX__" in macros: return 32
  return 16 if macros & {"__SSE2__", "__ARM_NEON", "__ARM_NEON__"} else 0


def target_vector_registers(march: str | None = None) -> int:
  """How many vector registers target ISA `march` has: 32 with AVX-512 or on AArch64, 16 with
  SSE/AVX (x86-64); 0 without vectors. The heuristics size register tiles by it."""
  cc = find_c_compiler()
  if cc is None or not target_vector_bytes(march): return 0
  macros = _predefined_macros(cc, MARCH.value if march is None else march)
  return 32 if macros & {"__AVX512F__", "__aarch64__"} else 16


def target_byte_dot(march: str | None = None) -> bool:
  """Whether target ISA `march` has a byte dot product (x86 AVX2's vpmaddubsw, or VNNI): the CPU
  renderer's DOT4."""
  cc = find_c_compiler()
  return cc is not None and "__AVX2__" in _predefined_macros(cc, MARCH.value if march is None
                                                             else march)


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
  gcc-compatible compiler works (the `CC` knob); by default clang, else gcc. Each compile is its
  own process in its own temporary directory: several can run at once."""
  compiles_in_parallel = True

  def __init__(self, cc: str | None = None, flags: Sequence[str] | None = None) -> None:
    path = _which_cc(cc) if cc else find_c_compiler()
    if path is None:
      raise RuntimeError(f"no C compiler found (CC={cc or CC.value!r}); install clang or gcc, or "
                         "set CC to a compiler on PATH")
    self.cc, self._flags = path, None if flags is None else tuple(flags)

  @property
  def flags(self) -> tuple[str, ...]:
    """The given flags, else cpu_flags() for the MARCH knob's target as it is now."""
    return self._flags if self._flags is not None else cpu_flags()

  @property
  def cache_key(self) -> str | None:
    return f"cpu|{self.cc}|{_compiler_identity(self.cc)}|{' '.join(self.flags + LIBS)}"

  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="unigrad-cc-") as tmp:
      out = pathlib.Path(tmp) / "lib.so"
      link = _direct_link(self.cc) if "-shared" in self.flags else None
      # compile to an object, then link it with the linker itself: the driver's own link adds C
      # runtime start files and libraries a kernel never uses, and costs about 50 ms. With no
      # linker of its own (or one that fails on this object) the driver compiles and links.
      if link is not None and self._object_linked(src, link, out): return out.read_bytes()
      self._run([self.cc, *self.flags, "-x", "c", "-", "-x", "none", "-o", str(out), *LIBS], src)
      if not out.exists(): raise CompileError(f"{self.cc}", "no shared object was written", src)
      return out.read_bytes()

  def _object_linked(self, src: str, link: tuple[str, ...], out: pathlib.Path) -> bool:
    obj = str(out.with_name("kernel.o"))
    self._run([self.cc, *(f for f in self.flags if f != "-shared"), "-c", "-x", "c", "-", "-o",
               obj], src)
    linked = subprocess.run([link[0], "-shared", "-o", str(out), obj, *link[1:]],
                            capture_output=True)
    return linked.returncode == 0 and out.exists()

  @staticmethod
  def _run(cmd: list[str], src: str) -> None:
    """Run the compiler on `src` (stdin); a failure raises CompileError showing the source."""
    proc = subprocess.run(cmd, input=src.encode(), capture_output=True)
    if proc.returncode != 0:
      raise CompileError(" ".join(cmd), proc.stderr.decode(errors="replace"), src)


# *** programs and the thread pool ***

# The pool is C: a worker that finished a launch waits for the next one spinning (SPIN_NS) before
# it sleeps on a condition variable, so launches in a row (a schedule's kernels) start on every
# core at once instead of after an OS wake-up (tens of microseconds, far more from an idle core),
# and no chunk needs the GIL. A launch is (trampoline, kernel, args, n): chunks are claimed from a
# 64-bit word holding (generation, next chunk), so a worker still finishing one launch cannot
# claim a chunk of the next; each generation's descriptor has its own slot of two, and the
# launching thread reuses a slot only after every chunk of the launch before was done.
SPIN_NS = 2_000_000
POOL_SRC = r"""#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
typedef void (*tramp_t)(void*, uint64_t*, int);
typedef struct { tramp_t tramp; void* fxn; uint64_t* args; uint32_t n; int remaining; } launch_t;
typedef struct {
  uint64_t state;  /* generation << 32 | next chunk */
  launch_t slots[2];
  int sleepers, stop, nthreads;
  long spin_ns;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t threads[];
} pool_t;

static long now_ns(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
/* run chunks of generation gen until none is left; 0 once the state has moved on */
static void work(pool_t* p, uint32_t gen) {
  launch_t* l = &p->slots[gen & 1];
  uint64_t s = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
  while ((uint32_t)(s >> 32) == gen && (uint32_t)s < l->n) {
    if (!__atomic_compare_exchange_n(&p->state, &s, s + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      continue;
    l->tramp(l->fxn, l->args, (int)(uint32_t)s);
    __atomic_sub_fetch(&l->remaining, 1, __ATOMIC_RELEASE);
    s = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
  }
}
static void* serve(void* arg) {
  pool_t* p = arg;
  uint32_t seen = 0;
  for (;;) {
    long t0 = now_ns();
    uint32_t gen;
    for (unsigned i = 1;; i++) {
      if ((gen = (uint32_t)(__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) >> 32)) != seen) break;
      if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) return 0;
      relax();
      if ((i & 255) == 0 && now_ns() - t0 > p->spin_ns) {
        pthread_mutex_lock(&p->mu);
        __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
        while ((uint32_t)(__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) >> 32) == seen
               && !__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST))
          pthread_cond_wait(&p->cv, &p->mu);
        __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&p->mu);
        t0 = now_ns();
      }
    }
    seen = gen;
    work(p, gen);
  }
}
void* unigrad_pool_new(int nthreads, long spin_ns) {
  pool_t* p = calloc(1, sizeof(pool_t) + sizeof(pthread_t) * (nthreads > 1 ? nthreads - 1 : 0));
  if (!p) return 0;
  p->nthreads = nthreads; p->spin_ns = spin_ns;
  pthread_mutex_init(&p->mu, 0);
  pthread_cond_init(&p->cv, 0);
  for (int i = 0; i < nthreads - 1; i++) pthread_create(&p->threads[i], 0, serve, p);
  return p;
}
void unigrad_pool_run(void* pp, tramp_t tramp, void* fxn, uint64_t* args, uint32_t n) {
  pool_t* p = pp;
  uint32_t gen = (uint32_t)(__atomic_load_n(&p->state, __ATOMIC_RELAXED) >> 32) + 1;
  launch_t* l = &p->slots[gen & 1];
  l->tramp = tramp; l->fxn = fxn; l->args = args; l->n = n; l->remaining = (int)n;
  __atomic_store_n(&p->state, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  work(p, gen);
  while (__atomic_load_n(&l->remaining, __ATOMIC_ACQUIRE) > 0) relax();
}
typedef struct { tramp_t tramp; void* fxn; uint64_t* args; uint64_t n; } item_t;
/* a command buffer: each launch in order, one chunk on this thread, more through the pool */
void unigrad_pool_run_many(void* pp, item_t* items, int count) {
  for (int i = 0; i < count; i++) {
    if (items[i].n == 1) items[i].tramp(items[i].fxn, items[i].args, 0);
    else unigrad_pool_run(pp, items[i].tramp, items[i].fxn, items[i].args, (uint32_t)items[i].n);
  }
}
unsigned long unigrad_pool_thread(void* pp, int i) {
  return (unsigned long)((pool_t*)pp)->threads[i];
}
void unigrad_pool_stop(void* pp) {
  pool_t* p = pp;
  __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&p->mu);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->threads[i], 0);
  free(p);
}
"""


@functools.cache
def _pool_lib() -> ctypes.CDLL:
  lib = _load_library(ClangCompiler().compile_cached(POOL_SRC))
  lib.unigrad_pool_new.argtypes, lib.unigrad_pool_new.restype = [ctypes.c_int, ctypes.c_long], \
    ctypes.c_void_p
  lib.unigrad_pool_run.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_uint32]
  lib.unigrad_pool_run.restype = None
  lib.unigrad_pool_run_many.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
  lib.unigrad_pool_run_many.restype = None
  lib.unigrad_pool_thread.argtypes = [ctypes.c_void_p, ctypes.c_int]
  lib.unigrad_pool_thread.restype = ctypes.c_ulong
  lib.unigrad_pool_stop.argtypes, lib.unigrad_pool_stop.restype = [ctypes.c_void_p], None
  return lib


@functools.cache
def trampoline(nbufs: int, nvals: int) -> int:
  """The address of `void t(void* kernel, uint64_t* args, int core_id)`, which calls a kernel of
  the ABI above with `nbufs` pointers and `nvals` ints from args (so C can launch any kernel)."""
  params = ["void*"] * nbufs + ["int"] * nvals + ["int"]
  args = [f"(void*)a[{i}]" for i in range(nbufs)] + [f"(int)a[{nbufs + i}]" for i in range(nvals)]
  src = (f"#include <stdint.h>\nvoid t(void* f, uint64_t* a, int core_id) {{\n"
         f"  ((void (*)({', '.join(params)}))f)({', '.join([*args, 'core_id'])});\n}}\n")
  lib = _load_library(ClangCompiler().compile_cached(src))
  _libraries.append(lib)  # the address must outlive this call
  return ctypes.cast(lib.t, ctypes.c_void_p).value or 0


_libraries: list[ctypes.CDLL] = []


class ChunkPool:
  """`nthreads - 1` native worker threads (see POOL_SRC); with the launching thread, `nthreads`
  run chunks. `run` is one ctypes call: the GIL is released for the whole launch."""

  def __init__(self, nthreads: int) -> None:
    self.nthreads = max(1, nthreads)
    self._lib = _pool_lib()
    self._pool = self._lib.unigrad_pool_new(self.nthreads, SPIN_NS)
    if not self._pool: raise MemoryError("CPU: cannot allocate the thread pool")
    self._launch_lock = threading.Lock()  # the pool runs one launch at a time (one launch slot)

  @property
  def thread_ids(self) -> list[int]:
    """The pthread ids of the workers (the launching thread is not one)."""
    return [self._lib.unigrad_pool_thread(self._pool, i) for i in range(self.nthreads - 1)]

  def run(self, fxn: int, bufs: Sequence[int], vals: Sequence[int], n: int) -> None:
    """Call the C kernel at address `fxn` with the buffer addresses `bufs`, the int32 `vals` and
    core_id for core_id in 0..n-1, in parallel; returns when all are done."""
    args = [*bufs, *(v & (2 ** 64 - 1) for v in vals)]
    arr = (ctypes.c_uint64 * max(1, len(args)))(*args)
    tramp = trampoline(len(bufs), len(vals))
    with self._launch_lock: self._lib.unigrad_pool_run(self._pool, tramp, fxn, arr, n)

  def run_many(self, items: int, count: int) -> None:
    """Run `count` launch descriptors (`_Item`s at address `items`) in order, in one call."""
    with self._launch_lock: self._lib.unigrad_pool_run_many(self._pool, items, count)

  def close(self) -> None:
    with self._launch_lock:
      if self._pool:
        self._lib.unigrad_pool_stop(self._pool)
        self._pool = None


_pool: ChunkPool | None = None
_pool_lock = threading.Lock()


def chunk_pool(n: int | None = None) -> ChunkPool:
  """The process's pool of `n` threads (default `cpu_threads()`), (re)made when the `THREADS` knob
  changed or after a fork."""
  global _pool
  if n is None: n = cpu_threads()
  if (pool := _pool) is not None and pool.nthreads == n: return pool  # (a fork drops it)
  with _pool_lock:
    if _pool is None or _pool.nthreads != n:  # (a forked child starts with none: _after_fork)
      if _pool is not None: _pool.close()
      _pool = ChunkPool(n)
    return _pool


def _after_fork() -> None:
  """In a forked child: the parent's pool threads do not exist here, and the child may run on
  other cores (helpers.usable_cores asks again); the pool is made again at the first launch (no
  pid check on every launch: a getpid is a system call)."""
  global _pool, _pool_lock
  _pool, _pool_lock = None, threading.Lock()  # (a parent thread may have held the lock)


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork)


ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # e_ident ... e_shstrndx
ELF64_PHDR = struct.Struct("<IIQQQQQQ")  # p_type, p_flags, p_offset, ..., p_filesz, ...


def check_shared_object(lib: bytes) -> None:
  """Raise OSError unless a 64-bit little-endian ELF `lib` holds every byte its headers point
  to: dlopen maps segments by offset, and touching a page past the end of a truncated file kills
  the process with SIGBUS. Other formats are left to the loader."""
  if not lib.startswith(b"\x7fELF"):
    if platform.system() == "Linux": raise OSError(f"not a shared object ({len(lib)} bytes)")
    return
  if len(lib) < ELF64_HEADER.size: raise OSError(f"truncated shared object ({len(lib)} bytes)")
  if lib[4:6] != b"\x02\x01": return  # 32-bit or big-endian: the loader checks it
  hdr = ELF64_HEADER.unpack_from(lib)
  phoff, shoff, phentsize, phnum, shentsize, shnum = hdr[5], hdr[6], *hdr[9:13]
  if phoff + phentsize * phnum > len(lib) or shoff + shentsize * shnum > len(lib):
    raise OSError(f"truncated shared object ({len(lib)} bytes)")
  for i in range(phnum):
    _, _, offset, _, _, filesz, _, _ = ELF64_PHDR.unpack_from(lib, phoff + i * phentsize)
    if offset + filesz > len(lib): raise OSError(f"truncated shared object ({len(lib)} bytes)")


# where shared objects are written to be loaded: memory (tmpfs) first, a file on /tmp can cost
# milliseconds to create; a tmpfs mounted noexec is dropped after its first failed load
_load_dirs: list[str | None] = [d for d in ("/dev/shm",) if os.access(d, os.W_OK | os.X_OK)]


def _dlopen_copy(lib: bytes, directory: str | None) -> ctypes.CDLL:
  with tempfile.NamedTemporaryFile(prefix="unigrad-", suffix=".so", dir=directory) as f:
    f.write(lib)
    f.flush()
    return ctypes.CDLL(f.name)


def _load_library(lib: bytes) -> ctypes.CDLL:
  """dlopen `lib` from a fresh private temporary file (so nothing can change it while mapped),
  after `check_shared_object`: damaged bytes raise OSError, never crash the process."""
  check_shared_object(lib)
  for directory in list(_load_dirs):
    try: return _dlopen_copy(lib, directory)
    except OSError:
      lib_ok = _dlopen_copy(lib, None)  # raises if the bytes are at fault
      if directory in _load_dirs: _load_dirs.remove(directory)
      return lib_ok
  return _dlopen_copy(lib, None)


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
    self.address = ctypes.cast(self.fxn, ctypes.c_void_p).value or 0
    self._nargs = -1
    # with CHECK_OOB the source defines OOB_STATE, the first bad access (see renderer/cstyle.py)
    try: self.oob: Any = (ctypes.c_longlong * 6).in_dll(self.lib, OOB_STATE)
    except ValueError: self.oob = None

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
    addrs, ints = [_address(b) for b in bufs], [int(v) for v in vals]
    self._set_signature(len(bufs), len(vals))
    st = time.perf_counter()
    if n == 1 or (threads := cpu_threads()) == 1:
      for i in range(n): self.fxn(*addrs, *ints, i)
    else:
      chunk_pool(threads).run(self.address, addrs, ints, n)
    if self.oob is not None and self.oob[0]: self._raise_oob()
    return time.perf_counter() - st if wait else None

  def tramp_address(self, nbufs: int, nvals: int) -> int:
    """The trampoline a native command buffer calls this program through (`trampoline`); a
    program that is not a kernel (an MPI collective) brings its own."""
    return trampoline(nbufs, nvals)

  def _raise_oob(self) -> None:
    _, slot, index, size, store, lanes = list(self.oob)
    ctypes.memset(self.oob, 0, ctypes.sizeof(self.oob))
    raise OutOfBoundsError(self.name, slot, index, size, bool(store), lanes)


class _Item(ctypes.Structure):
  _fields_ = [("tramp", ctypes.c_void_p), ("fxn", ctypes.c_void_p), ("args", ctypes.c_void_p),
              ("n", ctypes.c_uint64)]


class CPUBatch:
  """A command buffer of CPU kernel launches run by one native call (`unigrad_pool_run_many`):
  no Python and no GIL between kernels. Arguments can be changed between runs (`set_arg`)."""

  def __init__(self, launches: Sequence[tuple[Any, Sequence[Any], Sequence[int], Sequence[int]]]
               ) -> None:
    self.items = (_Item * max(1, len(launches)))()
    self.items_address = ctypes.addressof(self.items)
    self.count = len(launches)
    self.args: list[Any] = []
    self.checked = list({id(p): p for p, _, _, _ in launches
                         if getattr(p, "oob", None) is not None}.values())
    for i, (prog, bufs, global_size, vals) in enumerate(launches):
      if not isinstance(prog, CPUProgram):
        raise TypeError(f"CPUBatch takes CPU programs, got {type(prog).__name__}")
      words = [_address(b) for b in bufs] + [int(v) & (2 ** 64 - 1) for v in vals]
      arr = (ctypes.c_uint64 * max(1, len(words)))(*words)
      self.args.append(arr)
      self.items[i] = _Item(prog.tramp_address(len(bufs), len(vals)), prog.address,
                            ctypes.addressof(arr), int(global_size[0]))

  def set_arg(self, launch: int, index: int, value: Any) -> None:
    """Argument `index` of launch `launch`: a Buffer (its address) or an int value."""
    self.args[launch][index] = _address(value) if not isinstance(value, int) else value & (
      2 ** 64 - 1)

  def __call__(self) -> None:
    chunk_pool().run_many(self.items_address, self.count)
    for prog in self.checked:  # CHECK_OOB programs: the first bad access of the batch raises
      if prog.oob[0]: prog._raise_oob()


@functools.cache
def _cpu_renderer(march: str, vector_bytes: int, vector_registers: int, byte_dot: bool,
                  prefetch_bytes: int) -> CRenderer:
  return CRenderer("CPU", vector_bytes, last_level_cache_bytes(), vector_registers, byte_dot,
                   max(0, prefetch_bytes))


class CPUDevice(Compiled):
  """The host CPU: clang/gcc-compiled C kernels, run on a thread pool."""

  def __init__(self, name: str = "CPU") -> None:
    super().__init__(name, CPUAllocator(), ClangCompiler(), CPUProgram)

  @property
  def renderer(self) -> CRenderer:
    """C for the target ISA the `MARCH` knob names (its vector width and register count) and
    the `PREFETCH` distance, made per setting: `Context(MARCH=...)` switches it."""
    return _cpu_renderer(str(MARCH), target_vector_bytes(), target_vector_registers(),
                         target_byte_dot(), int(PREFETCH))

  @property
  def threads(self) -> int:
    """How many chunks run at once: the size a THREAD axis should split into."""
    return cpu_threads()

  @classmethod
  def is_available(cls) -> bool: return find_c_compiler() is not None

  def batch(self, launches: Sequence[tuple[Any, Sequence[Any], Sequence[int], Sequence[int]]]
            ) -> CPUBatch:
    """The launches (program, buffers, global size, int values) as one native command buffer."""
    return CPUBatch(launches)
