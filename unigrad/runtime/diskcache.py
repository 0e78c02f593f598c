"""The on-disk cache: one sqlite file shared by every process, holding bytes under (table, key).

The file is `cache.db` in the `CACHEDIR` knob's directory, else `$XDG_CACHE_HOME/unigrad`, else
`~/.cache/unigrad`. `CACHELEVEL=0` turns it off: `diskcache_get` misses and `diskcache_put` does
nothing. The cache is an optimization only: any sqlite or file-system error is reported at
`DEBUG>=1` and treated as a miss, never raised. Several processes may share the file (WAL journal,
a 30 s busy timeout); threads share one connection per file behind a lock.

Every value is stored behind a checksum (`DIGEST_BYTES` of blake2b over table, key and value).
A damaged entry (truncated, overwritten, emptied) fails the check and is a miss: it is deleted
and the caller rebuilds and rewrites it; damaged bytes are never handed out (a truncated shared
object would crash the process that loads it). A database file that a fresh connection still
finds damaged (not sqlite, malformed) is moved aside and a fresh one started, so one bad file is
never a persistent failure. A statement that finds the file locked beyond sqlite's own busy
handler (a journal-mode switch racing another process's first open returns SQLITE_BUSY at once)
is retried with backoff for up to `BUSY_RETRY_S` seconds before it counts as an error. Each write
is one sqlite transaction: readers see the old value or the new one, never part of one. The
entries are in SQL table `SQL_TABLE`; the raw values of older unigrads (table `cache`) are never
read.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import sqlite3
import threading
import time

from unigrad.knobs import CACHEDIR, CACHELEVEL, DEBUG, HOME, XDG_CACHE_HOME

__all__ = ["cache_path", "diskcache_get", "diskcache_put", "cache_digest", "DIGEST_BYTES"]

DIGEST_BYTES = 16
BUSY_RETRY_S = 10.0

# checksummed values live in their own SQL table: unigrads from before the checksum read and
# write raw values in table `cache` of the same file, and neither must see the other's entries
SQL_TABLE = "cache_v2"
_SCHEMA = (f"CREATE TABLE IF NOT EXISTS {SQL_TABLE} "
           "(tbl TEXT, key TEXT, value BLOB, PRIMARY KEY (tbl, key))")
_lock = threading.Lock()
_connections: dict[tuple[int, str], sqlite3.Connection] = {}


def cache_path() -> pathlib.Path:
  """Where the cache file lives, from the knobs (read each call, so `Context` overrides work)."""
  if CACHEDIR.value: return pathlib.Path(CACHEDIR.value) / "cache.db"
  if XDG_CACHE_HOME.value: return pathlib.Path(XDG_CACHE_HOME.value) / "unigrad" / "cache.db"
  home = pathlib.Path(HOME.value) if HOME.value else pathlib.Path.home()
  return home / ".cache" / "unigrad" / "cache.db"


def cache_digest(*parts: str) -> str:
  """A short, stable key for long inputs (compiler identity, kernel source, ...)."""
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() + b"\0")
  return h.hexdigest()


def _connect(path: pathlib.Path) -> sqlite3.Connection:
  """This process's connection to `path`, opened (and the table made) on first use."""
  key = (os.getpid(), str(path))  # a connection inherited through fork() must not be reused
  conn = _connections.get(key)
  if conn is not None: return conn
  path.parent.mkdir(parents=True, exist_ok=True)
  conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
  try:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(_SCHEMA)
  except BaseException:
    conn.close()  # a busy or damaged file: the retry opens a fresh connection
    raise
  _connections[key] = conn
  return conn


def _warn(what: str, err: Exception | str) -> None:
  if DEBUG >= 1: print(f"diskcache: {what} failed, continuing without the cache: {err}")


def _checksum(table: str, key: str, value: bytes) -> bytes:
  """Binds the value to its (table, key): a row copied under another key fails the check too."""
  h = hashlib.blake2b(digest_size=DIGEST_BYTES)
  h.update(table.encode() + b"\0" + key.encode() + b"\0")
  h.update(value)
  return h.digest()


def _is_damaged_file(err: sqlite3.Error) -> bool:
  """"file is not a database", "database disk image is malformed": not a lock or a full disk."""
  return isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError)


def _discard(path: pathlib.Path) -> None:
  """Move a damaged database (and its journal files) aside; the next connection starts fresh."""
  _reconnect(path)
  for suffix in ("", "-wal", "-shm"):
    p = path.with_name(path.name + suffix)
    try: p.replace(p.with_name(f"{p.name}.damaged-{os.getpid()}"))
    except OSError: continue


def _is_busy(err: sqlite3.Error) -> bool:
  """Another process holds the file ("database is locked", "database is busy"): worth a retry."""
  return isinstance(err, sqlite3.OperationalError) and ("locked" in str(err) or "busy" in str(err))


def _reconnect(path: pathlib.Path) -> None:
  """Drop this process's connection to `path`; the next statement opens a fresh one."""
  conn = _connections.pop((os.getpid(), str(path)), None)
  if conn is not None: conn.close()


def _execute(what: str, sql: str, params: tuple) -> list | None:
  """Run one statement on the cache file; rows, or None after an error (reported, not raised).
  A busy file is retried with backoff until `BUSY_RETRY_S` has passed. A file that looks damaged
  is reopened once (another process may be creating it) and discarded only if a fresh connection
  still finds it damaged: moving aside a file that other processes write to would drop their
  entries."""
  path = cache_path()
  damaged, deadline, pause = 0, time.monotonic() + BUSY_RETRY_S, 0.005
  while True:
    try:
      with _lock:
        return _connect(path).execute(sql, params).fetchall()
    except sqlite3.Error as e:
      if damaged < 2 and _is_damaged_file(e):
        damaged += 1
        with _lock:
          if damaged == 1: _reconnect(path)
          else:
            _warn(what, f"{e} (damaged file {path}, starting a new one)")
            _discard(path)
        time.sleep(pause)
        continue
      if _is_busy(e) and time.monotonic() + pause < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.25)
        continue
      _warn(what, e)
      return None
    except OSError as e:
      _warn(what, e)
      return None


def diskcache_get(table: str, key: str) -> bytes | None:
  """The bytes stored under (table, key), or None (a miss, the cache off, an error, or a damaged
  entry, which is deleted so that the caller's rebuild rewrites it)."""
  if CACHELEVEL < 1: return None
  rows = _execute("read", f"SELECT value FROM {SQL_TABLE} WHERE tbl=? AND key=?", (table, key))
  if not rows: return None
  stored = rows[0][0]
  blob = bytes(stored) if isinstance(stored, (bytes, memoryview)) else b""
  value = blob[DIGEST_BYTES:]
  if len(blob) >= DIGEST_BYTES and blob[:DIGEST_BYTES] == _checksum(table, key, value): return value
  _warn("read", f"damaged entry ({table}, {key[:16]}...), rebuilding it")
  _execute("delete", f"DELETE FROM {SQL_TABLE} WHERE tbl=? AND key=?", (table, key))
  return None


def diskcache_put(table: str, key: str, value: bytes) -> None:
  """Store `value` under (table, key), replacing what was there; a no-op when the cache is off."""
  if CACHELEVEL < 1: return
  blob = _checksum(table, key, value) + value
  _execute("write", f"INSERT OR REPLACE INTO {SQL_TABLE} (tbl, key, value) VALUES (?, ?, ?)",
           (table, key, blob))
