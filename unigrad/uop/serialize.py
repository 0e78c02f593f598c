"""Serialize: a UOp graph to canonical bytes and back, for the on-disk caches.

`dumps(root)` writes the graph as compact JSON: a dtype table, then the nodes in toposort order
(sources first), each `[op, dtype index, [source indices], arg, tag]`, so equal graphs give equal
bytes and shared nodes are written once. `loads(data)` rebuilds the graph through the UOp
constructor, so hash-consing returns the very nodes of a live equal graph. Unlike `repr` (which
`eval` reads back) nothing here runs code: args are data, tagged by type:

  None, bool, int, str     as themselves       float    ["f", float.hex(x)] (inf, nan, -0.0 kept)
  tuple                    ["t", *items]       DType    ["d", name] / ["v", name, count] /
  Enum member (unigrad's)  ["e", class, name]           ["p", base, addrspace, size]
  frozen dataclass (ours)  ["c", class, [fields]]      Invalid  ["i"]
  bytes                    ["b", hex]

A class is named `module:qualname` and must be defined in a loaded `unigrad` module. Any other
arg (a function, a UOp inside an arg) raises `SerializeError`: such a graph is not cacheable.
Malformed input to `loads` raises `SerializeError` too, never anything else.
`content_digest(root)` is the cache key of a graph: a Merkle hash over the same canonical forms,
memoized per node.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import sys
from typing import Any

from unigrad.dtype import AddrSpace, DType, PtrDType, dtypes
from unigrad.uop.ops import InvalidType, Ops
from unigrad.uop.uop import NodeMap, UOp

__all__ = ["dumps", "loads", "content_digest", "seed_digest", "SerializeError",
           "FORMAT_VERSION"]

FORMAT_VERSION = 1
DIGEST_BYTES = 20


class SerializeError(ValueError):
  """A graph that cannot be written (an arg that is not plain data) or bytes that do not read
  back as a graph."""


# ---- writing ----

def _class_name(cls: type) -> str:
  if not cls.__module__.startswith("unigrad"):
    raise SerializeError(f"cannot serialize an arg of type {cls.__module__}.{cls.__qualname__}")
  return f"{cls.__module__}:{cls.__qualname__}"


def _dtype(dt: DType) -> list:
  if isinstance(dt, PtrDType): return ["p", _dtype(dt.base), dt.addrspace.name, dt.size]
  if dt.count > 1: return ["v", dt.scalar().name, dt.count]
  return ["d", dt.name]


def _arg(x: Any) -> Any:
  """The JSON form of one arg value (see the module docstring)."""
  if x is None or isinstance(x, (bool, int, str)): return x
  if isinstance(x, float): return ["f", x.hex()]
  if isinstance(x, tuple): return ["t", *(_arg(a) for a in x)]
  if isinstance(x, bytes): return ["b", x.hex()]
  if isinstance(x, DType): return _dtype(x)
  if isinstance(x, enum.Enum): return ["e", _class_name(type(x)), x.name]
  if isinstance(x, InvalidType): return ["i"]
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    fields = [_arg(getattr(x, f.name)) for f in dataclasses.fields(x)]
    return ["c", _class_name(type(x)), fields]
  raise SerializeError(f"cannot serialize an arg of type {type(x).__name__}: {x!r:.80}")


def _arg_json(x: Any) -> str:
  """The canonical JSON text of an arg (plain ints and None, the common cases, directly)."""
  if x is None: return "null"
  if type(x) is int: return str(x)
  return json.dumps(_arg(x), separators=(",", ":"), allow_nan=False)


def dumps(root: UOp) -> bytes:
  """Canonical bytes for the graph under `root` (equal graphs, equal bytes): a table of the
  dtypes, then the nodes in toposort order, each with its dtype's index in the table."""
  index: dict[UOp, int] = {}
  dtype_index: dict[DType, int] = {}
  nodes: list[list] = []
  for u in root.toposort():
    index[u] = len(nodes)
    dt = dtype_index.setdefault(u.dtype, len(dtype_index))
    arg = None if u.arg is None else _arg(u.arg)
    tag = None if u.tag is None else _arg(u.tag)
    nodes.append([u.op.name, dt, [index[s] for s in u.src], arg, tag])
  doc = [FORMAT_VERSION, [_dtype(dt) for dt in dtype_index], nodes]
  return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


_digests: NodeMap[bytes] = NodeMap("content_digest")  # node -> its content digest
_dtype_reprs: dict[DType, bytes] = {}


def _node_digest(u: UOp) -> bytes:
  dt = _dtype_reprs.get(u.dtype)
  if dt is None: dt = _dtype_reprs[u.dtype] = json.dumps(_dtype(u.dtype)).encode()
  head = f"{u.op.name}|{_arg_json(u.arg)}|{_arg_json(u.tag)}|".encode()
  h = hashlib.blake2b(head + dt, digest_size=DIGEST_BYTES)
  for s in u.src: h.update(_digests[s])
  return h.digest()


def content_digest(root: UOp) -> str:
  """A hash of the graph's content (Merkle: each node's op, dtype, arg, tag and its sources'
  hashes), the same in every process; memoized per node, so the subgraphs shared by many
  kernels or programs are hashed once. Raises SerializeError where `dumps` would."""
  return root.topovisit(_node_digest, _digests).hex()


def seed_digest(u: UOp, digest: str) -> None:
  """Record the content digest of `u`, computed by another process (stored with a cached graph
  that holds `u`), so that `content_digest(u)` need not walk it."""
  _digests[u] = bytes.fromhex(digest)


# ---- reading ----

def _scalar_dtype(name: Any) -> DType:
  dt = getattr(dtypes, name, None) if isinstance(name, str) else None
  if not isinstance(dt, DType): raise SerializeError(f"unknown dtype {name!r}")
  return dt


def _read_dtype(v: Any) -> DType:
  if not isinstance(v, list) or not v: raise SerializeError(f"bad dtype {v!r:.80}")
  if v[0] == "d" and len(v) == 2: return _scalar_dtype(v[1])
  if v[0] == "v" and len(v) == 3 and isinstance(v[2], int): return _scalar_dtype(v[1]).vec(v[2])
  if v[0] == "p" and len(v) == 4 and v[2] in AddrSpace.__members__ and isinstance(v[3], int):
    return _read_dtype(v[1]).ptr(AddrSpace[v[2]], v[3])
  raise SerializeError(f"bad dtype {v!r:.80}")


_classes: dict[str, type] = {}  # the classes found so far, by name


def _read_class(name: Any) -> type:
  """A class named `module:qualname` in an already loaded unigrad module (nothing is imported)."""
  if isinstance(name, str) and (cls := _classes.get(name)) is not None: return cls
  if not isinstance(name, str) or ":" not in name: raise SerializeError(f"bad class {name!r:.80}")
  module, qualname = name.split(":", 1)
  obj: Any = sys.modules.get(module) if module.startswith("unigrad") else None
  for part in qualname.split("."): obj = getattr(obj, part, None)
  if not isinstance(obj, type): raise SerializeError(f"unknown class {name!r:.80}")
  _classes[name] = obj
  return obj


def _read_arg(v: Any) -> Any:
  if v is None or isinstance(v, (bool, int, str)): return v
  if not isinstance(v, list) or not v: raise SerializeError(f"bad arg {v!r:.80}")
  tag = v[0]
  if tag == "f" and len(v) == 2 and isinstance(v[1], str): return float.fromhex(v[1])
  if tag == "t": return tuple(_read_arg(a) for a in v[1:])
  if tag == "b" and len(v) == 2 and isinstance(v[1], str): return bytes.fromhex(v[1])
  if tag in ("d", "v", "p"): return _read_dtype(v)
  if tag == "i": return InvalidType()
  if tag == "e" and len(v) == 3 and isinstance(v[2], str):
    cls = _read_class(v[1])
    if issubclass(cls, enum.Enum):
      try: return cls[v[2]]
      except KeyError: pass
  if tag == "c" and len(v) == 3 and isinstance(v[2], list):
    cls = _read_class(v[1])
    if dataclasses.is_dataclass(cls): return cls(*(_read_arg(a) for a in v[2]))
  raise SerializeError(f"bad arg {v!r:.80}")


_OPS: dict[str, Ops] = {o.name: o for o in Ops}


def _read_node(v: Any, built: list[UOp], dts: list[DType]) -> UOp:
  if not isinstance(v, list) or len(v) != 5 or (op := _OPS.get(v[0])) is None:
    raise SerializeError(f"bad node {v!r:.80}")
  _, dt, srcs, arg, tag = v
  try:
    src = tuple([built[i] for i in srcs])
    if srcs and min(srcs) < 0: raise IndexError
  except (IndexError, TypeError):
    raise SerializeError(f"bad sources {srcs!r:.80}") from None
  if type(dt) is not int or not 0 <= dt < len(dts): raise SerializeError(f"bad dtype {dt!r}")
  return UOp(op, dts[dt], src, None if arg is None else _read_arg(arg),
             None if tag is None else _read_arg(tag))


def loads(data: bytes) -> UOp:
  """The graph `dumps` wrote (the root is the last node)."""
  try:
    doc = json.loads(data)
  except (ValueError, UnicodeDecodeError) as e:
    raise SerializeError(f"not a serialized graph: {e}") from None
  if not isinstance(doc, list) or len(doc) != 3 or doc[0] != FORMAT_VERSION:
    raise SerializeError("not a serialized graph of this format version")
  if not isinstance(doc[1], list) or not isinstance(doc[2], list) or not doc[2]:
    raise SerializeError("a graph with no nodes")
  built: list[UOp] = []
  try:
    dts = [_read_dtype(v) for v in doc[1]]
    for v in doc[2]: built.append(_read_node(v, built, dts))
  except (TypeError, ValueError, AttributeError) as e:
    if isinstance(e, SerializeError): raise
    raise SerializeError(f"not a valid graph: {e}") from None
  return built[-1]
