"""The CPU device: compile and run C kernels, the disk cache, compile errors, parallel chunks."""
import os
import struct
import threading
import time

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.dtype import dtypes
from unigrad.knobs import Context
from unigrad.runtime import Buffer, CompileError, Device
from unigrad.runtime import ops_cpu
from unigrad.runtime.ops_cpu import ChunkPool, ClangCompiler, chunk_pool, find_c_compiler

pytestmark = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")

ADD = """void add(float* restrict d0, const float* restrict d1, int n, int core_id) {
  for (int i = core_id; i < n; i += 2) d0[i] += d1[i];
}"""
IDS = "void ids(int* restrict out, int core_id) { out[core_id] = core_id + 1; }"
# chunk i checks it runs inside launch `gen` (its counter was bumped by every launch before)
BUMP = """void bump(int* restrict counts, int gen, int core_id) {
  if (counts[core_id] == gen) counts[core_id] += 1;
}"""
TID = """#include <pthread.h>
void tid(unsigned long* restrict out, int core_id) {
  out[core_id] = (unsigned long)pthread_self();
}"""
# every chunk waits (up to 5 s) until all n have arrived: only parallel chunks can all succeed
MEET = """#include <time.h>
void meet(int* restrict arrived, int* restrict ok, int n, int core_id) {
  __atomic_add_fetch(arrived, 1, __ATOMIC_SEQ_CST);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    if (__atomic_load_n(arrived, __ATOMIC_SEQ_CST) >= n) { ok[core_id] = 1; return; }
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (t.tv_sec - t0.tv_sec < 5);
}"""


def program(name, src):
  dev = Device["CPU"]
  return dev.runtime(name, dev.compiler.compile_cached(src))


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
  """Compile into a fresh cache, not the user's."""
  with Context(CACHEDIR=str(tmp_path_factory.mktemp("cache"))): yield


def ints(n): return Buffer("CPU", n, dtypes.int32).copyin(bytes(4 * n))


def test_compile_and_run():
  a = Buffer("CPU", 5, dtypes.float32).copyin(struct.pack("5f", *range(5)))
  b = Buffer("CPU", 5, dtypes.float32).copyin(struct.pack("5f", *[10.0] * 5))
  prog = program("add", ADD)
  assert prog(a, b, vals=(5,), global_size=(2,)) is None
  assert a.tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
  elapsed = prog(a.address(), b.address(), vals=(5,), wait=True)  # raw addresses work too
  assert isinstance(elapsed, float) and elapsed >= 0
  assert a.tolist()[0::2] == [20.0, 22.0, 24.0]  # one chunk: core_id 0 does the even slots


def test_each_chunk_gets_its_core_id():
  out = ints(7)
  program("ids", IDS)(out, global_size=(7, 1, 1))
  assert out.tolist() == [1, 2, 3, 4, 5, 6, 7]
  with Context(THREADS=1):  # serial path: same result
    out2 = ints(7)
    program("ids", IDS)(out2, global_size=(7,))
    assert out2.tolist() == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("n", [2, 4])
def test_chunks_run_concurrently(n):
  arrived, ok = ints(1), ints(n)
  with Context(THREADS=n):
    program("meet", MEET)(arrived, ok, vals=(n,), global_size=(n,))
  assert ok.tolist() == [1] * n


def test_pool_threads_are_reused():
  prog = program("tid", TID)
  with Context(THREADS=2):
    pool = chunk_pool()
    seen = set()
    for _ in range(3):
      out = Buffer("CPU", 8, dtypes.uint64).copyin(bytes(64))
      prog(out, global_size=(8,))
      seen |= set(out.tolist())
    assert chunk_pool() is pool and len(pool.thread_ids) == 1
    assert seen <= set(pool.thread_ids) | {threading.get_ident()}


def test_pool_runs_many_launches_in_a_row_exactly_once_per_chunk():
  """Back-to-back launches reuse the pool's two descriptor slots: every chunk of every launch
  runs once, none of a launch runs after the next launch began."""
  counts = ints(64)
  prog = program("bump", BUMP)
  with Context(THREADS=2):
    for i in range(200): prog(counts, vals=(i,), global_size=(64,))
  assert counts.tolist() == [200] * 64


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_pool():
  """The parent's pool threads do not exist in a forked child: its first launch makes a new pool
  (the fork hook drops the parent's), and the kernel runs on every chunk."""
  counts = ints(64)
  prog = program("bump", BUMP)
  with Context(THREADS=2):
    prog(counts, vals=(0,), global_size=(64,))
    parent = chunk_pool()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the pool it gets and what its launch did, then leave
      ok = chunk_pool() is not parent
      prog(counts, vals=(1,), global_size=(64,))
      os.write(write, bytes([ok and counts.tolist() == [2] * 64]))
      os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"\x01"
    assert chunk_pool() is parent and counts.tolist() == [1] * 64


def test_pool_wakes_sleeping_workers_and_stops():
  pool = ChunkPool(2)
  prog = program("meet", MEET)
  time.sleep(0.01)  # past the spin: the worker sleeps on the condition variable
  arrived, ok = ints(1), ints(2)
  pool.run(prog.address, [arrived.address(), ok.address()], [2], 2)
  assert ok.tolist() == [1, 1]
  pool.close()
  pool.close()  # twice is harmless


def test_bad_launches():
  prog = program("ids", IDS)
  with pytest.raises(ValueError, match="global_size"): prog(ints(1), global_size=(0,))
  with pytest.raises(ValueError, match="global_size"): prog(ints(1), global_size=(1, 2))
  with pytest.raises(TypeError, match="Buffers or int"): prog("nope")
  with pytest.raises(RuntimeError, match="no function 'missing'"): program("missing", IDS)


class CountingCompiler(ClangCompiler):
  def __init__(self):
    super().__init__()
    self.calls = 0

  def compile(self, src):
    self.calls += 1
    return super().compile(src)


def test_disk_cache_hit(tmp_path):
  src = IDS.replace("ids", "ids_cached")
  with Context(CACHEDIR=str(tmp_path), CACHELEVEL=1):
    c1, c2 = CountingCompiler(), CountingCompiler()
    lib = c1.compile_cached(src)
    assert c2.compile_cached(src) == lib and (c1.calls, c2.calls) == (1, 0)
    assert (tmp_path / "cache.db").exists()
    c2.compile_cached(src + "\n")  # another source misses
    assert c2.calls == 1
  out = ints(2)
  Device["CPU"].runtime("ids_cached", lib)(out, global_size=(2,))
  assert out.tolist() == [1, 2]


def test_disk_cache_off(tmp_path):
  with Context(CACHEDIR=str(tmp_path), CACHELEVEL=0):
    c = CountingCompiler()
    c.compile_cached(IDS)
    c.compile_cached(IDS)
    assert c.calls == 2 and not (tmp_path / "cache.db").exists()


def test_compile_error_shows_source():
  src = "void broken(int core_id) {\n  int x = ;\n}"
  with pytest.raises(CompileError) as e: Device["CPU"].compiler.compile(src)
  msg = str(e.value)
  assert "error" in msg and "2 |   int x = ;" in msg and "1 | void broken" in msg
  assert e.value.src == src and e.value.stderr


def test_buffer_made_unused_by_simplification_keeps_its_argument_position():
  a = Tensor(np.ones((2, 3), np.float32), device="CPU")
  b = Tensor(np.full((2, 3), 2, np.float32), device="CPU")
  # the padded sum reads only b in rows 2..3: a's buffer drops out of the kernel's body
  got = (a.pad(((0, 2), (0, 0))) + b.pad(((2, 0), (0, 0))))[2:4].numpy()
  np.testing.assert_equal(got, np.full((2, 3), 2, np.float32))


def test_load_directory_that_fails_is_dropped(tmp_path, monkeypatch):
  """A tmpfs mounted noexec (or gone) makes dlopen fail there: load from /tmp and stop trying it."""
  missing = str(tmp_path / "gone")
  monkeypatch.setattr(ops_cpu, "_load_dirs", [missing])
  lib = ClangCompiler().compile(IDS)
  out = np.zeros(2, np.int32)
  buf = Buffer("CPU", 2, dtypes.int32).ensure_allocated()
  ops_cpu.CPUProgram("ids", lib)(buf, global_size=(2,))
  out[:] = np.frombuffer(buf.copyout(), np.int32)
  assert out.tolist() == [1, 2] and ops_cpu._load_dirs == []
  with pytest.raises(OSError, match="truncated"): ops_cpu.CPUProgram("ids", lib[:len(lib) // 2])


# a libm call and a compiler-runtime builtin (128-bit division is __divti3 in libgcc/compiler-rt)
MATH = """#include <math.h>
void mathrt(float* restrict out, long long* restrict q, int core_id) {
  out[0] = expf(out[0]);
  __int128 big = ((__int128)q[0] << 64) | (unsigned long long)q[1];
  q[0] = (long long)(big / (__int128)q[2]);
}"""


def _run_mathrt(lib):
  out = Buffer("CPU", 1, dtypes.float32).copyin(struct.pack("f", 1.0))
  q = Buffer("CPU", 3, dtypes.int64).copyin(struct.pack("3q", 3, 0, 1 << 20))
  ops_cpu.CPUProgram("mathrt", lib)(out, q)
  return struct.unpack("f", out.copyout())[0], struct.unpack("3q", q.copyout())[0]


@pytest.mark.parametrize("direct", [True, False], ids=["direct_link", "driver_link"])
def test_kernels_calling_libm_and_runtime_builtins_load_with_either_link(direct, monkeypatch):
  """The compiler links a kernel's object with the linker itself where the driver says how (50 ms
  less than the driver's own link), else through the driver: both resolve libm and the compiler
  runtime's builtins."""
  if not direct: monkeypatch.setattr(ops_cpu, "_direct_link", lambda cc: None)
  elif ops_cpu._direct_link(ClangCompiler().cc) is None: pytest.skip("no linker the driver names")
  e, quotient = _run_mathrt(ClangCompiler().compile(MATH))
  assert e == pytest.approx(np.e, rel=1e-6) and quotient == (3 << 64) // (1 << 20)


def test_a_link_that_fails_falls_back_to_the_driver(monkeypatch):
  monkeypatch.setattr(ops_cpu, "_direct_link", lambda cc: ("false",))
  e, _ = _run_mathrt(ClangCompiler().compile(MATH))
  assert e == pytest.approx(np.e, rel=1e-6)
