"""Device registry, Buffer, allocators and the NULL device (no C compiler needed)."""
import gc
import struct

import pytest

from unigrad.dtype import dtypes
from unigrad.helpers import GlobalCounters
from unigrad.knobs import Context
from unigrad.runtime import Buffer, Compiled, Device, LRUAllocator
from unigrad.runtime.ops_null import NullAllocator, NullHandle


# *** registry ***

@pytest.mark.parametrize("name, canon", [("cpu:0", "CPU"), ("CPU", "CPU"), ("cl:1", "CL:1"),
                                         (" null ", "NULL"), ("cuda:10", "CUDA:10")])
def test_canonicalize(name, canon):
  assert Device.canonicalize(name) == canon


def test_canonicalize_rejects_empty():
  with pytest.raises(ValueError, match="non-empty"): Device.canonicalize("")


def test_unknown_device_names_known_ones():
  with pytest.raises(RuntimeError, match="unknown device 'NOPE'.*CPU.*NULL"): Device["nope"]


def test_device_cached_and_canonical():
  d = Device["null:0"]
  assert d is Device["NULL"] and d.name == "NULL" and isinstance(d, Compiled)
  assert Device["NULL:1"] is not d and Device["NULL:1"].name == "NULL:1"
  assert {"CPU", "NULL"} <= set(Device.known())


def test_default_from_knob():
  with Context(DEV="null"): assert Device.DEFAULT == "NULL"
  with Context(DEV=""): assert Device.DEFAULT in ("CPU", "PYTHON")


# *** NULL device ***

def test_null_device():
  d = Device["NULL"]
  assert d.compiler.compile("int x;") == b"int x;"
  prog = d.runtime("k", d.compiler.compile_cached("void k(int core_id){}"))
  b = Buffer("NULL", 16, dtypes.float32)
  assert prog(b, global_size=(4,), vals=(3,)) is None
  assert prog(b, wait=True) == 0.0


def test_null_allocator_tracks_sizes():
  a = NullAllocator()
  h1, h2 = a.alloc(100), a.alloc(50)
  assert a.live_bytes == 150 and a.peak_bytes == 150
  a.free(h1, 100)
  assert a.live_bytes == 50 and a.peak_bytes == 150
  sub = a.offset(h2, 8, 16)
  assert isinstance(sub, NullHandle) and (sub.nbytes, sub.offset) == (16, 8)


def test_null_buffer_view_and_copies():
  b = Buffer("NULL", 8, dtypes.int32).copyin(bytes(32))
  v = b.view(2, 4, dtypes.int32).ensure_allocated()
  assert v.handle.offset == 8 and v.handle.nbytes == 16
  assert b.copyout().nbytes == 32  # copies nothing, but sizes hold


# *** Buffer ***

def test_buffer_lazy_and_mem_used():
  gc.collect()  # buffers left by earlier tests must be freed before the baseline is taken
  before = GlobalCounters.mem_used
  b = Buffer("CPU", 10, dtypes.float64)
  assert not b.is_allocated() and b.nbytes == 80 and GlobalCounters.mem_used == before
  b.ensure_allocated()
  assert b.is_allocated() and GlobalCounters.mem_used == before + 80
  del b
  gc.collect()
  assert GlobalCounters.mem_used == before


def test_buffer_roundtrip():
  vals = [1.5, -2.0, 3.25, 0.0, 7.0]
  b = Buffer("cpu", 5, dtypes.float32).copyin(struct.pack("5f", *vals))
  assert struct.unpack("5f", b.copyout()) == tuple(vals)
  assert b.tolist() == vals
  dst = bytearray(20)
  b.copyout(memoryview(dst))
  assert struct.unpack("5f", dst) == tuple(vals)


def test_buffer_copyin_typed_memoryview():
  b = Buffer("CPU", 3, dtypes.int32).copyin(memoryview(struct.pack("3i", 1, 2, 3)).cast("i"))
  assert b.tolist() == [1, 2, 3]


@pytest.mark.parametrize("size, dtype, err", [(-1, dtypes.float32, ValueError),
                                              (2.0, dtypes.float32, TypeError),
                                              (4, "float32", TypeError),
                                              (4, dtypes.void, TypeError),
                                              (4, dtypes.index, TypeError),
                                              (4, dtypes.float32.ptr(), TypeError)])
def test_buffer_bad_args(size, dtype, err):
  with pytest.raises(err): Buffer("CPU", size, dtype)


def test_buffer_copy_size_mismatch():
  b = Buffer("CPU", 4, dtypes.float32)
  with pytest.raises(ValueError, match="got 12 bytes, the buffer holds 16"): b.copyin(bytes(12))
  with pytest.raises(ValueError, match="holds 16"): b.copyout(memoryview(bytearray(8)))


def test_buffer_view_shares_memory():
  base = Buffer("CPU", 8, dtypes.int32).copyin(struct.pack("8i", *range(8)))
  v = base.view(2, 4, dtypes.int32)
  assert v.tolist() == [2, 3, 4, 5] and v.base is base and v.offset == 8
  v.copyin(struct.pack("4i", 20, 30, 40, 50))
  assert base.tolist() == [0, 1, 20, 30, 40, 50, 6, 7]
  vv = v.view(1, 2, dtypes.int32)  # a view of a view points into the same base
  assert vv.base is base and vv.offset == 12 and vv.tolist() == [30, 40]


def test_buffer_view_other_dtype():
  arena = Buffer("CPU", 64, dtypes.uint8).copyin(bytes(64))
  v = arena.view(16, 2, dtypes.float64).copyin(struct.pack("2d", 1.0, 2.0))
  assert struct.unpack("2d", arena.copyout()[16:32]) == (1.0, 2.0)
  assert v.address() == arena.address() + 16


def test_buffer_view_errors():
  base = Buffer("CPU", 8, dtypes.uint8)
  with pytest.raises(ValueError, match="out of bounds"): base.view(4, 2, dtypes.float32)
  with pytest.raises(ValueError, match="misaligned"): base.view(1, 1, dtypes.float32)


def test_view_keeps_base_alive():
  base = Buffer("CPU", 4, dtypes.int32).copyin(struct.pack("4i", 5, 6, 7, 8))
  v = base.view(1, 2, dtypes.int32)
  del base
  gc.collect()
  assert v.tolist() == [6, 7]


def test_as_memoryview_zero_copy():
  b = Buffer("CPU", 4, dtypes.uint8).copyin(bytes(4))
  b.as_memoryview()[1] = 9
  assert bytes(b.copyout()) == b"\x00\x09\x00\x00"


@pytest.mark.parametrize("n", [1, 100, 1 << 20])
def test_cpu_alignment(n):
  assert Buffer("CPU", n, dtypes.uint8).address() % 64 == 0


def test_copy_from_other_device():
  src = Buffer("CPU", 3, dtypes.int16).copyin(struct.pack("3h", 1, -2, 3))
  dst = Buffer("CPU", 3, dtypes.int16).copy_from(src)
  assert dst.tolist() == [1, -2, 3]
  assert Buffer("NULL", 3, dtypes.int16).copy_from(src).is_allocated()


# *** LRU ***

class FakeAllocator(LRUAllocator):
  """Counts real allocations; fails with MemoryError while anything is cached, if told to."""

  def __init__(self):
    super().__init__()
    self.made, self.freed, self.fail_when_cached = 0, 0, False

  def _alloc(self, nbytes):
    if self.fail_when_cached and self.cache: raise MemoryError("full")
    self.made += 1
    return bytearray(nbytes)

  def _free(self, handle, nbytes): self.freed += 1


def test_lru_reuses_same_size():
  a = FakeAllocator()
  h = a.alloc(64)
  a.free(h, 64)
  assert a.alloc(32) is not h and a.alloc(64) is h and a.made == 2 and a.freed == 0


def test_lru_off():
  a = FakeAllocator()
  with Context(LRU=0):
    h = a.alloc(64)
    a.free(h, 64)
    assert a.alloc(64) is not h and a.freed == 1


def test_lru_frees_cache_on_memory_error():
  a = FakeAllocator()
  h1, h2 = a.alloc(16), a.alloc(8)
  a.free(h1, 16)
  a.free(h2, 8)
  assert a.cached_bytes() == 24 and a.freed == 0
  a.fail_when_cached = True
  a.alloc(100)  # fails once (cache non-empty), the cache is released, the retry succeeds
  assert a.freed == 2 and a.cached_bytes() == 0 and a.made == 3


def test_lru_cpu_buffer_reuse():
  alloc = Device["CPU"].allocator
  alloc.free_cache()
  b = Buffer("CPU", 1000, dtypes.uint8).ensure_allocated()
  addr = b.address()
  del b
  gc.collect()
  assert alloc.cached_bytes() == 1000
  assert Buffer("CPU", 250, dtypes.float32).address() == addr
