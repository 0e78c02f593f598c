"""The sqlite disk cache: round trip, knobs, several processes writing at once, damaged entries
and damaged files (a miss, then rebuilt)."""
import multiprocessing
import os
import sqlite3

import pytest

from unigrad.knobs import Context
from unigrad.runtime import diskcache
from unigrad.runtime.diskcache import cache_path, diskcache_get, diskcache_put


def test_roundtrip(tmp_path):
  with Context(CACHEDIR=str(tmp_path)):
    assert cache_path() == tmp_path / "cache.db"
    assert diskcache_get("t", "k") is None
    diskcache_put("t", "k", b"v1")
    diskcache_put("t", "k", b"v2")
    assert diskcache_get("t", "k") == b"v2" and diskcache_get("other", "k") is None


def test_cache_path_fallbacks(tmp_path):
  with Context(CACHEDIR="", XDG_CACHE_HOME=str(tmp_path)):
    assert cache_path() == tmp_path / "unigrad" / "cache.db"
  with Context(CACHEDIR="", XDG_CACHE_HOME="", HOME=str(tmp_path)):
    assert cache_path() == tmp_path / ".cache" / "unigrad" / "cache.db"


def test_unwritable_dir_is_a_miss(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with Context(CACHEDIR=str(blocker / "sub")):
    diskcache_put("t", "k", b"v")
    assert diskcache_get("t", "k") is None


def _writer(cachedir: str, who: int) -> None:
  with Context(CACHEDIR=cachedir, DEBUG=1):  # a dropped write says why in the captured output
    for i in range(20): diskcache_put("t", f"{who}-{i}", bytes([who, i]))


def test_several_processes(tmp_path):
  ctx = multiprocessing.get_context("spawn")
  procs = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(3)]
  for p in procs: p.start()
  for p in procs: p.join(60)
  assert all(p.exitcode == 0 for p in procs)
  with Context(CACHEDIR=str(tmp_path)):
    assert all(diskcache_get("t", f"{w}-{i}") == bytes([w, i]) for w in range(3) for i in range(20))


def damage(path, how: str, table: str | None = None) -> int:
  """Damage every entry (of `table`) in the cache file at `path` the way `how` says; the count."""
  conn = sqlite3.connect(path)
  rows = conn.execute("SELECT tbl, key, value FROM cache_v2").fetchall()
  rows = [r for r in rows if table is None or r[0] == table]
  for tbl, key, value in rows:
    bad = {"truncated": value[:len(value) // 2], "random": os.urandom(max(len(value), 1)),
           "empty": b""}[how]
    conn.execute("UPDATE cache_v2 SET value=? WHERE tbl=? AND key=?", (bad, tbl, key))
  conn.commit()
  conn.close()
  return len(rows)


DAMAGES = ["truncated", "random", "empty"]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_entry_is_a_miss_then_rewritten(tmp_path, how):
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "k", b"\x7fELF" + bytes(range(256)) * 4)
    assert damage(cache_path(), how) == 1
    assert diskcache_get("t", "k") is None, "damaged bytes are never handed out"
    assert diskcache_get("t", "k") is None, "the damaged row was deleted"
    diskcache_put("t", "k", b"fresh")
    assert diskcache_get("t", "k") == b"fresh"


def test_entry_moved_under_another_key_is_a_miss(tmp_path):
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "a", b"value of a")
    conn = sqlite3.connect(cache_path())
    conn.execute("UPDATE cache_v2 SET key='b' WHERE key='a'")
    conn.commit()
    conn.close()
    assert diskcache_get("t", "b") is None


@pytest.mark.parametrize("how", ["random", "empty"])
def test_damaged_database_file_is_replaced(tmp_path, how):
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "k", b"v")
    path = cache_path()
    for conn in list(diskcache._connections.values()): conn.close()
    diskcache._connections.clear()
    path.write_bytes(os.urandom(8192) if how == "random" else b"")
    for suffix in ("-wal", "-shm"): path.with_name(path.name + suffix).unlink(missing_ok=True)
    assert diskcache_get("t", "k") is None
    diskcache_put("t", "k", b"again")
    assert diskcache_get("t", "k") == b"again", "not a persistent failure"


def test_raw_entries_of_older_versions_are_neither_read_nor_overwritten(tmp_path):
  """Unigrads from before the checksum share the file: each keeps to its own SQL table."""
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("compile", "k", b"\x7fELF new")
    conn = sqlite3.connect(cache_path())
    conn.execute("CREATE TABLE IF NOT EXISTS cache (tbl TEXT, key TEXT, value BLOB, "
                 "PRIMARY KEY (tbl, key))")
    conn.execute("INSERT INTO cache VALUES ('compile', 'old', ?)", (b"\x7fELF raw",))
    conn.commit()
    assert diskcache_get("compile", "old") is None
    assert conn.execute("SELECT value FROM cache WHERE key='old'").fetchone() == (b"\x7fELF raw",)
    assert conn.execute("SELECT count(*) FROM cache WHERE key='k'").fetchone() == (0,)
    conn.close()


def failing_connect(monkeypatch, error: sqlite3.Error, times: int) -> list[int]:
  """sqlite3.connect in the cache raises `error` the next `times` calls; the count left."""
  real_connect, left = sqlite3.connect, [times]

  def connect(*args, **kwargs):
    if left[0] > 0:
      left[0] -= 1
      raise error
    return real_connect(*args, **kwargs)

  monkeypatch.setattr(diskcache.sqlite3, "connect", connect)
  return left


def test_busy_file_is_retried_not_dropped(tmp_path, monkeypatch):
  """sqlite can return "database is locked" without waiting (a journal-mode switch racing another
  process's first open): the write is retried, not silently lost (CI lost one this way)."""
  left = failing_connect(monkeypatch, sqlite3.OperationalError("database is locked"), 3)
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "k", b"v")
    assert left[0] == 0
    assert diskcache_get("t", "k") == b"v"


def test_busy_file_gives_up_after_the_retry_budget(tmp_path, monkeypatch):
  failing_connect(monkeypatch, sqlite3.OperationalError("database is locked"), 10 ** 9)
  monkeypatch.setattr(diskcache, "BUSY_RETRY_S", 0.05)
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "k", b"v")  # reported at DEBUG>=1, never raised
    assert diskcache_get("t", "k") is None


def test_file_damaged_once_is_reopened_not_discarded(tmp_path, monkeypatch):
  """A "not a database" seen once (another process creating the file) must not move the shared
  file aside: the other processes' entries would go with it."""
  with Context(CACHEDIR=str(tmp_path)):
    diskcache_put("t", "mine", b"kept")
    failing_connect(monkeypatch, sqlite3.DatabaseError("file is not a database"), 1)
    for conn in list(diskcache._connections.values()): conn.close()
    diskcache._connections.clear()
    assert diskcache_get("t", "mine") == b"kept"
    assert not list(tmp_path.glob("*.damaged-*"))
