"""The sqlite disk cache: round trip, knobs, several processes writing at once."""
import multiprocessing

from unigrad.knobs import Context
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
  with Context(CACHEDIR=cachedir):
    for i in range(20): diskcache_put("t", f"{who}-{i}", bytes([who, i]))


def test_several_processes(tmp_path):
  ctx = multiprocessing.get_context("spawn")
  procs = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(3)]
  for p in procs: p.start()
  for p in procs: p.join(60)
  assert all(p.exitcode == 0 for p in procs)
  with Context(CACHEDIR=str(tmp_path)):
    assert all(diskcache_get("t", f"{w}-{i}") == bytes([w, i]) for w in range(3) for i in range(20))
