"""Devices and their memory: the `Device` registry, `Buffer`, and the interfaces of a device.

A device is an object with five attributes (see `Compiled`):
  name       canonical name, e.g. "CPU" or "CL:1"
  renderer   the `Renderer` of its kernels: the target's capabilities and its source dialect
  allocator  an `Allocator`: opaque handles to device memory, copies in and out
  compiler   a `Compiler` from source text to the bytes the runtime loads, or None
  runtime    the `Program` class: `runtime(name, lib)` loads one kernel, calling it launches it

Device modules are plugins found by name: `Device["FOO:1"]` imports `unigrad.runtime.ops_foo` and
instantiates the class there whose name is `FooDevice` (case-insensitive: `FOODevice` works too)
with the canonical name "FOO:1". Adding a device means adding that one file.

A `Buffer` is a typed, sized region of one device's memory, allocated lazily, or a view into
another buffer's allocation (how the memory planner carves an arena).
"""
from __future__ import annotations

import functools
import importlib
import pathlib
import pkgutil
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from unigrad.dtype import DType, PtrDType, buffer_nbytes, dtypes, from_bytes
from unigrad.helpers import GlobalCounters
from unigrad.knobs import DEBUG, DEV, LRU
from unigrad.renderer import Renderer
from unigrad.renderer.cstyle import OOB_STATE, CRenderer
from unigrad.runtime.diskcache import cache_digest, diskcache_get, diskcache_put

__all__ = ["Batch", "Allocator", "LRUAllocator", "Compiler", "CompileError", "Program", "Compiled",
           "DeviceRegistry", "Device", "Buffer", "OutOfBoundsError", "OOB_STATE"]


# *** memory ***

class Allocator:
  """Device memory as opaque handles. Subclasses implement `_alloc`, `_free`, `copyin`, `copyout`,
  and where the device can, `offset` (sub-buffers), `as_memoryview` and `address`."""

  def alloc(self, nbytes: int) -> Any:
    """A handle to `nbytes` bytes of fresh (uninitialized) device memory."""
    if not isinstance(nbytes, int) or nbytes < 0:
      raise ValueError(f"{type(self).__name__}.alloc needs a byte count >= 0, got {nbytes!r}")
    return self._alloc(nbytes)

  def free(self, handle: Any, nbytes: int) -> None:
    """Give back memory from `alloc(nbytes)`; the handle must not be used afterwards."""
    self._free(handle, nbytes)

  def _alloc(self, nbytes: int) -> Any: raise NotImplementedError(f"{type(self).__name__}._alloc")

  def _free(self, handle: Any, nbytes: int) -> None: pass

  def copyin(self, handle: Any, src: memoryview) -> None:
    """Copy host bytes `src` (exactly the handle's size) into device memory."""
    raise NotImplementedError(f"{type(self).__name__}.copyin")

  def copyout(self, dst: memoryview, handle: Any) -> None:
    """Copy device memory into the host bytes `dst` (exactly the handle's size)."""
    raise NotImplementedError(f"{type(self).__name__}.copyout")

  def offset(self, handle: Any, byte_offset: int, nbytes: int) -> Any:
    """A handle to `nbytes` bytes starting `byte_offset` bytes into `handle`'s memory."""
    raise NotImplementedError(f"{type(self).__name__} has no sub-buffers (Buffer.view)")

  def as_memoryview(self, handle: Any, nbytes: int) -> memoryview:
    """A zero-copy, writable byte view of device memory (host-visible devices only)."""
    raise NotImplementedError(f"{type(self).__name__} memory is not host-visible")

  def address(self, handle: Any) -> int:
    """The raw address of the memory (devices with a flat address space only)."""
    raise NotImplementedError(f"{type(self).__name__} handles have no raw address")

  def from_address(self, address: int, nbytes: int) -> Any:
    """A handle to `nbytes` bytes at `address` that someone else allocated (zero-copy wraps:
    from_blob, DLPack); the handle never owns the memory."""
    raise NotImplementedError(f"{type(self).__name__} cannot wrap memory at a raw address")


class LRUAllocator(Allocator):
  """An allocator that keeps freed handles in per-size free lists and hands them out again.

  On a `MemoryError` the free lists are released and the allocation retried once. With the
  knob `LRU=0` a freed handle goes straight back to `_free`.
  """

  def __init__(self) -> None:
    self.cache: defaultdict[int, list[Any]] = defaultdict(list)

  def alloc(self, nbytes: int) -> Any:
    if LRU and (handles := self.cache.get(nbytes)):
      try: return handles.pop()
      except IndexError: pass  # another thread took the last one
    try: return super().alloc(nbytes)
    except MemoryError:
      self.free_cache()
      return super().alloc(nbytes)

  def free(self, handle: Any, nbytes: int) -> None:
    if LRU: self.cache[nbytes].append(handle)
    else: self._free(handle, nbytes)

  def free_cache(self) -> None:
    """Release every cached handle to the device."""
    while self.cache:
      nbytes, handles = self.cache.popitem()
      for h in handles: self._free(h, nbytes)

  def cached_bytes(self) -> int: return sum(n * len(hs) for n, hs in list(self.cache.items()))


# *** compilers and programs ***

def number_lines(src: str) -> str:
  """`src` with 1-based line numbers, as printed in compile errors."""
  lines = src.splitlines()
  width = len(str(len(lines)))
  return "\n".join(f"{i:{width}d} | {line}" for i, line in enumerate(lines, 1))




class OutOfBoundsError(IndexError):
  """A kernel loaded or stored outside a buffer (checked with the CHECK_OOB knob on CPU, always on
  PYTHON); the message names the kernel, the buffer parameter and the index."""

  def __init__(self, kernel: str, slot: int, index: int, size: int, store: bool,
               lanes: int = 1) -> None:
    self.kernel, self.slot, self.index, self.size, self.store = kernel, slot, index, size, store
    what = ("store" if store else "load") + (f" of {lanes} lanes" if lanes > 1 else "")
    super().__init__(f"kernel {kernel}: {what} at index {index} of buffer data{slot}, which has "
                     f"{size} elements")


class CompileError(RuntimeError):
  """A kernel failed to compile. The message holds the compiler's output and the numbered source."""

  def __init__(self, compiler: str, stderr: str, src: str) -> None:
    self.compiler, self.stderr, self.src = compiler, stderr, src
    super().__init__(f"{compiler} failed to compile the generated kernel:\n{stderr.rstrip()}\n"
                     f"--- generated source ---\n{number_lines(src)}")


class Compiler:
  """Turns kernel source text into the bytes a device's `Program` loads.

  `cache_key` names the compiler, its version and flags; when it is not None, `compile_cached`
  keeps results in the on-disk cache (see `diskcache`) under (cache_key, source).
  `compiles_in_parallel`: `compile` may run on several threads at once (the engine compiles a
  schedule's new kernels together, engine/programs.py compile_ahead).
  """
  compiles_in_parallel: bool = False

  @property
  def cache_key(self) -> str | None:
    """Compiler, version and flags for the disk cache; None keeps results out of it."""
    return None

  def compile(self, src: str) -> bytes: raise NotImplementedError(f"{type(self).__name__}.compile")

  def compile_cached(self, src: str, refresh: bool = False) -> bytes:
    """`compile(src)`, looked up in and stored to the disk cache; `refresh` compiles anew and
    overwrites the entry (a binary the loader rejected)."""
    if self.cache_key is None: return self.compile(src)
    key = cache_digest(self.cache_key, src)
    if not refresh and (lib := diskcache_get("compile", key)) is not None: return lib
    lib = self.compile(src)
    diskcache_put("compile", key, lib)
    return lib


class Program(Protocol):
  """A loaded kernel. `Program(name, lib)` loads symbol `name` from compiled `lib`; calling it
  launches it on `bufs` (Buffers, or raw addresses where the device has them) followed by the
  int32 `vals`, over `global_size` work groups of `local_size` (None: the device's choice).
  Returns the elapsed seconds when `wait` is true, else None."""

  def __init__(self, name: str, lib: bytes) -> None: ...

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None: ...


# *** devices ***

class Batch(Protocol):
  """A native command buffer (see `Compiled.batch`): `set_arg(launch, index, value)` changes an
  argument (a Buffer or an int) before the next run; calling it runs every launch in order."""

  def set_arg(self, launch: int, index: int, value: Any) -> None: ...
  def __call__(self) -> None: ...


class Compiled:
  """The base of a device object: an allocator, a compiler (or None), a Program class and the
  renderer of its kernels (the engine asks the device for all four and never names a device)."""

  def __init__(self, name: str, allocator: Allocator, compiler: Compiler | None,
               runtime: type[Program], renderer: Renderer | None = None) -> None:
    self.name, self.allocator, self.compiler, self.runtime = name, allocator, compiler, runtime
    # a device that names no renderer gets plain C with no vectors or threads
    self._renderer = renderer if renderer is not None else CRenderer(name.split(":")[0])

  @property
  def renderer(self) -> Renderer:
    """The renderer of this device's kernels (capabilities and source dialect)."""
    return self._renderer

  @classmethod
  def is_available(cls) -> bool:
    """Whether this machine can run the device (checked before choosing it as the default)."""
    return True

  def synchronize(self) -> None:
    """Wait until all work launched on the device has finished."""

  def batch(self, launches: Sequence[tuple[Any, Sequence[Any], Sequence[int], Sequence[int]]]
            ) -> Batch | None:
    """The launches (program, buffers, global size, int values), in order, as one native command
    buffer that a single call runs, or None where the device has none (they then run one by
    one)."""
    return None

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.name}>"


_canonical_names: dict[str, str] = {}  # a device name as given -> canonicalize's answer


def _check_device_index(name: str, canonical: str) -> None:
  """A device number after the colon ("CL:1") is a non-negative integer."""
  if ":" not in canonical: return
  index = name.strip().split(":", 1)[1]
  if not index.isdecimal() or not index.isascii():
    raise ValueError(f"device {name!r}: the device index {index!r} is not a non-negative integer "
                     "(expected a name like 'CPU' or 'CPU:1')")


class DeviceRegistry:
  """`Device[name]` opens a device once and caches it; `Device.DEFAULT` is the default name."""
  default_priority: tuple[str, ...] = ("CPU", "PYTHON")  # first available wins; the last is taken

  def __init__(self) -> None:
    self._opened: dict[str, Compiled] = {}
    self._classes: dict[str, type[Compiled]] = {}  # base name -> its device class
    self._lock = threading.RLock()

  @staticmethod
  def canonicalize(name: str) -> str:
    """Upper case, device number 0 dropped: "cpu:0" -> "CPU", "cl:1" -> "CL:1"."""
    if type(name) is str and (known := _canonical_names.get(name)) is not None: return known
    if not isinstance(name, str) or not name.strip():
      raise ValueError(f"a device name must be a non-empty string, got {name!r}")
    canonical = name.strip().upper()
    _check_device_index(name, canonical)
    canonical = canonical[:-2] if canonical.endswith(":0") else canonical
    if len(_canonical_names) < 1024: _canonical_names[name] = canonical  # every launch asks
    return canonical

  @staticmethod
  @functools.cache
  def known() -> tuple[str, ...]:
    """The device names with a module here (`ops_<name>.py`), opened or not."""
    here = [str(pathlib.Path(__file__).parent)]
    return tuple(sorted(m.name[4:].upper() for m in pkgutil.iter_modules(here)
                        if m.name.startswith("ops_")))

  def device_class(self, name: str) -> type[Compiled]:
    """The class implementing device `name` (its module imported on first use)."""
    base = self.canonicalize(name).split(":")[0]
    if (known := self._classes.get(base)) is not None: return known
    if base not in self.known():
      raise RuntimeError(f"unknown device {base!r}; known devices: {', '.join(self.known())}")
    try: module = importlib.import_module(f"unigrad.runtime.ops_{base.lower()}")
    except (ImportError, OSError) as e:
      raise RuntimeError(f"device {base} cannot be loaded here: {e}") from e
    for attr, cls in vars(module).items():
      if attr.lower() == f"{base.lower()}device" and isinstance(cls, type):
        self._classes[base] = cls  # looked up once: creating a tensor on a named device asks
        return cls
    raise RuntimeError(f"unigrad/runtime/ops_{base.lower()}.py defines no class {base}Device")

  def __getitem__(self, name: str) -> Compiled:
    name = self.canonicalize(name)
    if (dev := self._opened.get(name)) is not None: return dev
    with self._lock:
      if name in self._opened: return self._opened[name]
      cls = self.device_class(name)
      try: dev = cls(name)
      except Exception as e:
        raise RuntimeError(f"device {name} is not available here: {e}") from e
      if DEBUG >= 1: print(f"opened device {name}: {type(dev).__name__}")
      self._opened[name] = dev
      return dev

  @property
  def DEFAULT(self) -> str:  # noqa: N802 (the public name, as in tinygrad)
    """The `DEV` knob, else the first available device of `default_priority`."""
    if DEV.value: return self.canonicalize(DEV.value)
    for name in self.default_priority[:-1]:
      try:
        if self.device_class(name).is_available(): return name
      except (RuntimeError, ImportError):
        continue
    return self.default_priority[-1]

  def opened(self) -> list[str]: return list(self._opened)


Device = DeviceRegistry()


# *** buffers ***

def _check_dtype(dtype: Any) -> DType:
  if not isinstance(dtype, DType):
    raise TypeError(f"Buffer dtype must be a unigrad DType, got {type(dtype).__name__} {dtype!r}")
  if isinstance(dtype, PtrDType) or dtype.itemsize == 0 or dtype == dtypes.index:
    raise TypeError(f"Buffer dtype {dtype!r} has no memory layout; use a concrete scalar or "
                    "vector dtype")
  return dtype


def _check_size(size: Any) -> int:
  if not isinstance(size, int) or isinstance(size, bool):
    raise TypeError(f"Buffer size must be an int (elements), got {type(size).__name__} {size!r}")
  if size < 0: raise ValueError(f"Buffer size must be >= 0 elements, got {size}")
  return size


def _as_bytes(data: bytes | bytearray | memoryview, nbytes: int, what: str) -> memoryview:
  mv = memoryview(data)
  if not mv.c_contiguous: raise ValueError(f"{what} needs contiguous memory")
  mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
  if mv.nbytes != nbytes:
    raise ValueError(f"{what}: got {mv.nbytes} bytes, the buffer holds {nbytes} bytes")
  return mv


class Buffer:
  """`size` elements of `dtype` on `device`. Memory is allocated on first use
  (`ensure_allocated`) and given back to the allocator when the last reference goes.

  >>> b = Buffer("CPU", 4, dtypes.float32).copyin(struct.pack("4f", 1, 2, 3, 4))
  >>> b.view(2, 2, dtypes.float32).copyout().cast("f").tolist()
  [3.0, 4.0]
  """

  def __init__(self, device: str, size: int, dtype: DType, *, base: Buffer | None = None,
               offset: int = 0) -> None:
    # first what __del__ reads, so that a Buffer whose checks below raise is deleted quietly
    self._handle: Any = None
    self._base, self.offset = base, offset  # offset: bytes into base's allocation
    self._wrapped = False
    self.device = Device.canonicalize(device)
    self.size, self.dtype = _check_size(size), _check_dtype(dtype)
    self.nbytes = buffer_nbytes(size, dtype, self.device)
    self._allocator: Allocator | None = None  # the device's, looked up at the first use
    self._owner: Any = None  # what keeps wrapped memory alive (see `wrap`)
    self._address: int | None = None  # the raw address, once asked for (a launch's hot path)

  @classmethod
  def wrap(cls, device: str, size: int, dtype: DType, address: int, owner: Any = None) -> Buffer:
    """A Buffer over `size` elements at `address` (device memory someone else allocated: a
    host pointer on CPU and PYTHON, a device pointer on CUDA), without a copy. The memory is
    never freed here; `owner` (a DLPack exporter's handle, say) lives as long as the Buffer and
    its views. The device must support it (`Allocator.from_address`)."""
    buf = cls(device, size, dtype)
    buf._handle = buf.allocator.from_address(address, buf.nbytes)
    buf._owner, buf._wrapped = owner, True
    return buf

  @property
  def base(self) -> Buffer: return self if self._base is None else self._base

  @property
  def allocator(self) -> Allocator:
    if (a := self._allocator) is None: a = self._allocator = Device[self.device].allocator
    return a

  def is_allocated(self) -> bool: return self._handle is not None

  def ensure_allocated(self) -> Buffer:
    """Allocate the memory (the base's, for a view) unless done already; returns self."""
    if self._handle is not None: return self
    if self._base is None:
      self._handle = self.allocator.alloc(nbytes := self.nbytes)
      GlobalCounters.mem_used += nbytes
    else:
      parent = self._base.ensure_allocated()
      self._handle = self.allocator.offset(parent._handle, self.offset, self.nbytes)
    return self

  @property
  def handle(self) -> Any: return self.ensure_allocated()._handle

  def address(self) -> int:
    """The raw address of the first element (devices with a flat address space); memory is
    never moved once allocated, so it is asked of the allocator once."""
    if (a := self._address) is not None: return a
    handle = self._handle if self._handle is not None else self.ensure_allocated()._handle
    a = self._address = self.allocator.address(handle)
    return a

  def view(self, offset: int, size: int, dtype: DType) -> Buffer:
    """A Buffer of `size` `dtype` elements sharing this buffer's memory, starting `offset`
    elements (of this buffer's dtype) in. The view keeps the base allocation alive."""
    _check_size(offset)
    byte_offset = self.offset + offset * self.dtype.itemsize
    view = Buffer(self.device, size, dtype, base=self.base, offset=byte_offset)
    if byte_offset % view.dtype.itemsize != 0:
      raise ValueError(f"view of {dtype!r} at byte offset {byte_offset} is misaligned; offsets "
                       f"must be multiples of {view.dtype.itemsize} bytes")
    if byte_offset + view.nbytes > self.base.nbytes:
      raise ValueError(f"view [{byte_offset}, {byte_offset + view.nbytes}) bytes is out of bounds "
                       f"of its base buffer of {self.base.nbytes} bytes")
    return view

  def copyin(self, data: bytes | bytearray | memoryview) -> Buffer:
    """Copy exactly `nbytes` host bytes into the buffer; returns self."""
    self.allocator.copyin(self.handle, _as_bytes(data, self.nbytes, "Buffer.copyin"))
    return self

  def copyout(self, dst: memoryview | bytearray | None = None) -> memoryview:
    """The buffer's bytes copied into `dst` (a fresh bytearray if None), as a byte memoryview."""
    out = _as_bytes(bytearray(self.nbytes) if dst is None else dst, self.nbytes, "Buffer.copyout")
    if out.readonly: raise ValueError("Buffer.copyout needs a writable destination")
    self.allocator.copyout(out, self.handle)
    return out

  def as_memoryview(self) -> memoryview:
    """A zero-copy byte view of the memory where the device allows one, else a copy."""
    try: return self.allocator.as_memoryview(self.handle, self.nbytes)
    except NotImplementedError: return self.copyout()

  def copy_from(self, src: Buffer) -> Buffer:
    """Copy another buffer's bytes (possibly on another device) into this one; returns self."""
    if src.nbytes != self.nbytes:
      raise ValueError(f"copy_from: source holds {src.nbytes} bytes, this buffer {self.nbytes}")
    return self.copyin(src.as_memoryview())

  def tolist(self) -> list:
    """The elements as Python values (scalar dtypes with a struct format only)."""
    return from_bytes(self.dtype, self.as_memoryview())

  def deallocate(self) -> None:
    """Give the memory back to the allocator (a view or wrapped memory: nothing to give); a
    later use allocates afresh, with undefined contents."""
    handle = self._handle
    if handle is None or self._base is not None: return
    if self._wrapped: return  # someone else's memory (see `wrap`)
    self._handle, self._address = None, None
    try:
      GlobalCounters.mem_used -= (nbytes := self.nbytes)
      self.allocator.free(handle, nbytes)
    except Exception:  # noqa: BLE001 (interpreter shutdown: modules may be gone)
      pass

  def __del__(self) -> None: self.deallocate()

  def __repr__(self) -> str:
    view = f" view@{self.offset}" if self._base is not None else ""
    state = "" if self.is_allocated() else " unallocated"
    return f"<Buffer {self.device} {self.size} {self.dtype!r}{view}{state}>"
