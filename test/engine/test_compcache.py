"""Schedules and rendered kernels cached on disk across processes (engine/compcache.py): a warm
cache skips scheduling and codegen, keys follow the knobs and unigrad's source, and a damaged
entry (truncated, random bytes, empty) in any table is a miss that is rebuilt and rewritten."""
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.engine import compcache
from unigrad.engine import entry, execute, programs
from unigrad.knobs import Context
from unigrad.runtime.device import Device
from unigrad.runtime.diskcache import cache_path, diskcache_get, diskcache_put
from unigrad.runtime.ops_cpu import ClangCompiler, check_shared_object, find_c_compiler
from unigrad.uop import Ops, UOp

needs_cc = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
A = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
B = np.linspace(-1, 1, 18, dtype=np.float32).reshape(6, 3)


def program(device: str) -> np.ndarray:
  a, b = Tensor(A, device=device), Tensor(B, device=device)
  return ((a @ b).relu() * 2 + 1).softmax(-1).numpy()


def want() -> np.ndarray:
  y = np.maximum(A @ B, 0) * 2 + 1
  e = np.exp(y - y.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.fixture
def counting(monkeypatch):
  """Counts scheduler and codegen runs; the in-process caches start empty (a fresh process)."""
  calls = {"schedule": 0, "codegen": 0}
  real_schedule, real_codegen = entry.create_schedule, programs.to_rendered
  def schedule(*args):
    calls["schedule"] += 1
    return real_schedule(*args)
  def codegen(*args):
    calls["codegen"] += 1
    return real_codegen(*args)
  monkeypatch.setattr(entry, "create_schedule", schedule)
  monkeypatch.setattr(programs, "to_rendered", codegen)
  forget()
  return calls


def forget() -> None:
  """Drop this process's schedule and program caches (what a new process starts without)."""
  entry.schedule_cache.clear()
  execute.forget_programs()


def test_warm_disk_cache_skips_scheduling_and_codegen(tmp_path, counting):
  with Context(CACHEDIR=str(tmp_path)):
    np.testing.assert_allclose(program("PYTHON"), want(), rtol=1e-5)
    cold = dict(counting)
    assert cold["schedule"] >= 1 and cold["codegen"] >= 1
    forget()
    np.testing.assert_allclose(program("PYTHON"), want(), rtol=1e-5)
    assert counting == cold, "nothing scheduled or generated again"


def test_cachelevel_1_keeps_only_binaries(tmp_path, counting):
  with Context(CACHEDIR=str(tmp_path), CACHELEVEL=1):
    program("PYTHON")
    cold = dict(counting)
    forget()
    program("PYTHON")
    assert counting == {k: 2 * v for k, v in cold.items()}


def test_keys_follow_knobs_and_source(tmp_path, counting, monkeypatch):
  with Context(CACHEDIR=str(tmp_path)):
    program("PYTHON")
    cold = dict(counting)
    forget()
    with Context(NOOPT=True): program("PYTHON")
    assert counting["codegen"] > cold["codegen"], "NOOPT kernels are other kernels"
    before = dict(counting)
    forget()
    monkeypatch.setattr(compcache, "source_digest", lambda: "edited unigrad")
    program("PYTHON")
    assert counting["schedule"] > before["schedule"] and counting["codegen"] > before["codegen"]


def damage_table(table: str, how: str) -> int:
  """Damage every entry of `table` in the cache file; the number damaged."""
  conn = sqlite3.connect(cache_path())
  rows = conn.execute("SELECT key, value FROM cache_v2 WHERE tbl=?", (table,)).fetchall()
  for key, value in rows:
    bad = {"truncated": value[:len(value) // 2], "random": os.urandom(max(len(value), 1)),
           "empty": b""}[how]
    conn.execute("UPDATE cache_v2 SET value=? WHERE tbl=? AND key=?", (bad, table, key))
  conn.commit()
  conn.close()
  return len(rows)


def valid_entries(table: str) -> int:
  conn = sqlite3.connect(cache_path())
  keys = [k for (k,) in conn.execute("SELECT key FROM cache_v2 WHERE tbl=?", (table,))]
  conn.close()
  return sum(diskcache_get(table, k) is not None for k in keys)


@pytest.fixture
def compiles(monkeypatch):
  """Counts C compiler runs."""
  calls = []
  real = ClangCompiler.compile
  def compile_counting(self, src):
    calls.append(src)
    return real(self, src)
  monkeypatch.setattr(ClangCompiler, "compile", compile_counting)
  return calls


REBUILT_BY = {"schedule": "schedule", "kernel": "codegen"}


@needs_cc
@pytest.mark.parametrize("how", ["truncated", "random", "empty"])
@pytest.mark.parametrize("table", ["schedule", "kernel", "compile"])
def test_damaged_entries_are_rebuilt(tmp_path, counting, compiles, table, how):
  with Context(CACHEDIR=str(tmp_path)):
    np.testing.assert_allclose(program("CPU"), want(), rtol=1e-5)
    assert damage_table(table, how) >= 1
    forget()
    before, ncompiles = dict(counting), len(compiles)
    np.testing.assert_allclose(program("CPU"), want(), rtol=1e-5)
    if table in REBUILT_BY: assert counting[REBUILT_BY[table]] > before[REBUILT_BY[table]]
    else: assert len(compiles) > ncompiles
    assert valid_entries(table) >= 1, "rewritten"
    forget()
    before, ncompiles = dict(counting), len(compiles)
    np.testing.assert_allclose(program("CPU"), want(), rtol=1e-5)
    assert counting == before and len(compiles) == ncompiles, "a hit again: not a lasting failure"


@needs_cc
def test_truncated_binary_with_a_valid_checksum_is_recompiled(tmp_path, counting, compiles):
  """A shared object cut short before it was stored (a full disk): loading it would SIGBUS."""
  with Context(CACHEDIR=str(tmp_path)):
    program("CPU")
    conn = sqlite3.connect(cache_path())
    keys = [k for (k,) in conn.execute("SELECT key FROM cache_v2 WHERE tbl='compile'")]
    conn.close()
    for k in keys:
      lib = diskcache_get("compile", k)
      diskcache_put("compile", k, lib[:len(lib) * 3 // 4])
    forget()
    ncompiles = len(compiles)
    np.testing.assert_allclose(program("CPU"), want(), rtol=1e-5)
    assert len(compiles) > ncompiles
    assert any(is_whole(diskcache_get("compile", k)) for k in keys), "rewritten whole"


def is_whole(lib: bytes | None) -> bool:
  try: check_shared_object(lib or b"")
  except OSError: return False
  return True


def test_truncated_shared_object_raises_oserror():
  if find_c_compiler() is None: pytest.skip("no C compiler")
  lib = ClangCompiler().compile("void f(int core_id) {}")
  for bad in (lib[:-8], lib[:len(lib) // 2], lib[:64], b"", os.urandom(len(lib))):
    with pytest.raises(OSError, match="shared object"): Device["CPU"].runtime("f", bad)


CHILD = """
import numpy as np
from unigrad import Tensor
from unigrad.engine import compcache
a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
print(((a @ a.T).exp().sum(1) / 100).tolist(), compcache.stats.schedule_misses,
      compcache.stats.kernel_misses)
"""


@needs_cc
def test_fresh_process_with_a_warm_cache_schedules_nothing(tmp_path):
  env = {**os.environ, "CACHEDIR": str(tmp_path)}
  outs = [subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True).stdout.rsplit(maxsplit=2) for _ in range(2)]
  (cold, cold_s, cold_k), (warm, warm_s, warm_k) = outs
  assert cold == warm and int(cold_s) >= 1 and int(cold_k) >= 1
  assert (warm_s, warm_k) == ("0", "0")


def test_schedule_naming_a_buffer_the_body_lacks_is_not_stored(tmp_path):
  """A buffer made while scheduling would hold nothing in the process that loads the schedule."""
  made = Tensor.empty(4, device="PYTHON").contiguous().realize().uop
  assert made.op is Ops.BUFFER
  empty = UOp(Ops.LINEAR, dtypes.void, ())
  odd = UOp(Ops.LINEAR, dtypes.void, (UOp(Ops.CALL, dtypes.void, (made,)),))
  with Context(CACHEDIR=str(tmp_path)):
    hits = compcache.stats.schedule_hits
    body, other = Tensor.empty(4).uop, Tensor.empty(5).uop
    compcache.cached_schedule(body, 1, "PYTHON", lambda: empty)
    assert compcache.cached_schedule(body, 1, "PYTHON", lambda: odd) is empty
    assert compcache.stats.schedule_hits == hits + 1
    compcache.cached_schedule(other, 1, "PYTHON", lambda: odd)
    assert compcache.cached_schedule(other, 1, "PYTHON", lambda: odd) is odd
    assert compcache.stats.schedule_hits == hits + 1, "never stored"
