"""The on-disk cache: one sqlite file shared by every process, holding bytes under (table, key).

The file is `cache.db` in the `CACHEDIR` knob's directory, else `$XDG_CACHE_HOME/unigrad`, else
`~/.cache/unigrad`. `CACHELEVEL=0` turns it off: `diskcache_get` misses and `diskcache_put` does
nothing. The cache is an optimization only: any sqlite or file-system error is reported at
`DEBUG>=1` and treated as a miss, never raised. Several processes may share the file (WAL journal,
a 30 s busy timeout); threads share one connection per file behind a lock.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import sqlite3
import threading

from unigrad.knobs import CACHEDIR, CACHELEVEL, DEBUG, HOME, XDG_CACHE_HOME

__all__ = ["cache_path", "diskcache_get", "diskcache_put", "cache_digest"]

_SCHEMA = ("CREATE TABLE IF NOT EXISTS cache "
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
  conn.execute("PRAGMA journal_mode=WAL")
  conn.execute(_SCHEMA)
  _connections[key] = conn
  return conn


def _warn(what: str, err: Exception) -> None:
  if DEBUG >= 1: print(f"diskcache: {what} failed, continuing without the cache: {err}")


def diskcache_get(table: str, key: str) -> bytes | None:
  """The bytes stored under (table, key), or None (a miss, the cache off, or an error)."""
  if CACHELEVEL < 1: return None
  try:
    with _lock:
      row = _connect(cache_path()).execute(
        "SELECT value FROM cache WHERE tbl=? AND key=?", (table, key)).fetchone()
  except (sqlite3.Error, OSError) as e:
    _warn("read", e)
    return None
  return None if row is None else bytes(row[0])


def diskcache_put(table: str, key: str, value: bytes) -> None:
  """Store `value` under (table, key), replacing what was there; a no-op when the cache is off."""
  if CACHELEVEL < 1: return
  try:
    with _lock:
      _connect(cache_path()).execute(
        "INSERT OR REPLACE INTO cache (tbl, key, value) VALUES (?, ?, ?)", (table, key, value))
  except (sqlite3.Error, OSError) as e:
    _warn("write", e)
