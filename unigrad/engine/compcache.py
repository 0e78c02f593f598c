"""Compile caches across processes: schedules and rendered kernels, kept in the disk cache.

The in-process caches of realize (schedule per function body, runner per kernel) start empty in
every process; without these a fresh process redoes scheduling and codegen for every program even
when the C compiler's output is on disk. Two tables of the disk cache (runtime/diskcache.py) add:

  schedule  (function body, number of args, device)    -> the LINEAR of kernel CALLs
  kernel    (kernel AST, device, renderer, threads)    -> a rendered PROGRAM's info and SOURCE

Keys are content digests: the graph's canonical Merkle hash (uop/serialize.py), the settings that
change the result (every knob but `OUTPUT_KNOBS`) and `source_digest()`, a hash of unigrad's own
source files, so any change to unigrad's code invalidates both tables. A graph that cannot be
serialized (a gradient function in a CallInfo) is simply not cached on disk. A damaged entry is a
miss (diskcache checks its checksum; what fails to decode is a miss too): rebuilt and rewritten.
Both tables are used at `CACHELEVEL>=2` (the default); 1 keeps only compiled binaries.
A PROGRAM from the kernel table has an empty LINEAR: its instructions are not kept (decoding a
kernel's LINEAR took 3-20 ms, more than the rest of a warm first call), and a launch needs only
the SOURCE, the BINARY and the ProgramInfo.
`stats` counts hits and misses for benchmarks and tests.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from unigrad.codegen.linearize import Estimates
from unigrad.codegen.program import ProgramInfo
from unigrad.dtype import AddrSpace, dtypes
from unigrad.knobs import CACHELEVEL, DEBUG, KNOBS
from unigrad.renderer import Renderer
from unigrad.runtime.diskcache import cache_digest, diskcache_get, diskcache_put
from unigrad.uop import Ops, UOp
from unigrad.uop.serialize import (DIGEST_BYTES, SerializeError, content_digest, dumps, loads,
                                   seed_digest)

__all__ = ["cached_schedule", "cached_kernel", "source_digest", "stats",
           "CacheStats", "OUTPUT_KNOBS"]

# knobs that change what is printed or where the cache lives, never a schedule or a kernel
OUTPUT_KNOBS = frozenset({"DEBUG", "SPEC", "CACHEDIR", "CACHELEVEL", "XDG_CACHE_HOME", "HOME",
                          "TRACK_MATCH_STATS", "LRU", "REWRITE_STACK_LIMIT", "VIZ", "VIZ_PORT",
                          "PROFILE", "PROFILE_PATH", "PROFILE_TOP"})
PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]


@dataclass
class CacheStats:
  """Disk-cache lookups of this process (in-process cache hits never get this far)."""
  schedule_hits: int = 0
  schedule_misses: int = 0
  kernel_hits: int = 0
  kernel_misses: int = 0
  lookup_s: float = 0.0  # time spent finding and decoding the hits


stats = CacheStats()


@functools.cache
def source_digest() -> str:
  """sha256 over the path and contents of every .py file of the unigrad package (once a
  process: editing unigrad's code starts new cache entries)."""
  h = hashlib.sha256()
  for p in sorted(PACKAGE_DIR.rglob("*.py")):
    h.update(p.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
    h.update(p.read_bytes() + b"\0")
  return h.hexdigest()


def settings() -> str:
  """The knob values that can change a schedule or a kernel, canonically."""
  return repr(sorted((name, repr(k.value)) for name, k in KNOBS.items()
                     if name not in OUTPUT_KNOBS))


def _canonical(x: Any) -> str:
  """repr with set elements sorted (a frozenset's order follows string hashing: per process)."""
  if isinstance(x, (set, frozenset)): return "{" + ",".join(sorted(_canonical(a) for a in x)) + "}"
  return repr(x)


@functools.lru_cache(maxsize=16)
def renderer_identity(ren: Renderer) -> str:
  """The renderer's class and settings, the same string in every process (memoized: renderers
  are frozen dataclasses, equal when their settings are)."""
  fields = ",".join(f"{f.name}={_canonical(getattr(ren, f.name))}"
                    for f in dataclasses.fields(ren))
  return f"{type(ren).__module__}.{type(ren).__qualname__}({fields})"


def _key(*parts: str) -> str: return cache_digest(source_digest(), settings(), *parts)


def _graph_key(kind: str, graph: UOp, *parts: str) -> str | None:
  """The disk key of `graph` (None: not cached on disk at this CACHELEVEL, or unserializable)."""
  if CACHELEVEL < 2: return None
  try: digest = content_digest(graph)
  except SerializeError as e:
    if DEBUG >= 2: print(f"compcache: {kind} not cached on disk: {e}")
    return None
  return _key(kind, *parts, digest)


def _encode_schedule(linear: UOp) -> bytes:
  """The LINEAR, after a first line with its kernels' content digests (a process that loads it
  need not hash them again to look the kernels up)."""
  digests = [content_digest(c.src[0]) for c in linear.src]
  return json.dumps(digests).encode() + b"\n" + dumps(linear)


def _decode_schedule(data: bytes) -> UOp | None:
  head, _, graph = data.partition(b"\n")
  try:
    digests, linear = json.loads(head), loads(graph)
  except (SerializeError, ValueError, UnicodeDecodeError): return None
  if linear.op is not Ops.LINEAR or any(c.op is not Ops.CALL for c in linear.src): return None
  if not isinstance(digests, list) or len(digests) != len(linear.src): return None
  for c, d in zip(linear.src, digests):
    if isinstance(d, str) and len(d) == 2 * DIGEST_BYTES: seed_digest(c.src[0], d)
  return linear


T = TypeVar("T")


def _lookup(table: str, key: str | None, decode: Callable[[bytes], T | None]) -> T | None:
  """The decoded entry of `key` in `table`, counting the hit or the miss (None: build it)."""
  t0 = time.perf_counter()
  if key is not None and (data := diskcache_get(table, key)) is not None:
    if (value := decode(data)) is not None:
      setattr(stats, f"{table}_hits", getattr(stats, f"{table}_hits") + 1)
      stats.lookup_s += time.perf_counter() - t0
      return value
  setattr(stats, f"{table}_misses", getattr(stats, f"{table}_misses") + 1)
  return None


def cached_schedule(body: UOp, nargs: int, device: str, build: Callable[[], UOp]) -> UOp:
  """The schedule of `body` from the disk cache, else `build()` (stored for the next process)."""
  key = _graph_key("schedule", body, str(nargs), device)
  if (linear := _lookup("schedule", key, _decode_schedule)) is not None: return linear
  linear = build()
  if key is not None and _is_portable(linear, body):
    try: diskcache_put("schedule", key, _encode_schedule(linear))
    except SerializeError: pass
  return linear


def _buffers(u: UOp) -> set[UOp]:
  return {x for x in u.toposort() if x.op is Ops.BUFFER and x.arg.addrspace is AddrSpace.GLOBAL}


def _is_portable(linear: UOp, body: UOp) -> bool:
  """Whether the schedule means the same in another process: it names no device buffer that
  the body does not (one the scheduler made would hold nothing in the process that loads it)."""
  return _buffers(linear) <= _buffers(body)


def _encode_kernel(prog: UOp) -> bytes:
  """The ProgramInfo and the source (not the LINEAR: see the module docstring)."""
  info = prog.arg
  local = None if info.local_size is None else list(info.local_size)
  return json.dumps([info.name, prog.src[1].arg, info.estimates.flops, info.estimates.mem_bytes,
                     list(info.global_size), local]).encode()


def _kernel_decoder(device: str) -> Callable[[bytes], UOp | None]:
  def decode(data: bytes) -> UOp | None:
    try: name, src, flops, mem, size, local = json.loads(data)
    except (ValueError, TypeError, UnicodeDecodeError): return None
    if not (isinstance(name, str) and isinstance(src, str) and isinstance(size, list)): return None
    if local is not None and not (isinstance(local, list) and all(type(v) is int for v in local)):
      return None
    if not all(isinstance(v, int) for v in (flops, mem, *size)): return None
    linear = UOp(Ops.LINEAR, dtypes.void, ())
    info = ProgramInfo(name, device, Estimates(flops, mem), tuple(size),
                       None if local is None else tuple(local))
    return UOp(Ops.PROGRAM, dtypes.void, (linear, UOp(Ops.SOURCE, dtypes.void, (), src)), info)
  return decode


def cached_kernel(kernel: UOp, device: str, ren: Renderer, threads: int,
                  build: Callable[[], UOp]) -> UOp:
  """The rendered PROGRAM of `kernel` from the disk cache, else `build()` (and stored)."""
  key = _graph_key("kernel", kernel, device, renderer_identity(ren), str(threads))
  if (prog := _lookup("kernel", key, _kernel_decoder(device))) is not None: return prog
  prog = build()
  if key is not None: diskcache_put("kernel", key, _encode_kernel(prog))
  return prog
