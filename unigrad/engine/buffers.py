"""Device memory behind the graph's BUFFER nodes, and the lock every engine entry holds.

`buffers` maps each BUFFER node to its device `Buffer`, made on first use (`buffer_of`) and kept
as long as the node lives (a NodeMap: the entry goes with the node). Python threads realize one
at a time: every entry point of the engine (realize, schedule, copyout, buffer_with_data) holds
`realize_lock` (re-entrant), which guards the engine's caches and the devices' launch state.
"""
from __future__ import annotations

import threading
import time

from unigrad.dtype import DType
from unigrad.engine import profile
from unigrad.engine.capture import capturing
from unigrad.knobs import PROFILE
from unigrad.runtime.device import Buffer
from unigrad.schedule import sharding
from unigrad.schedule.callify import buffer_base, is_plain_buffer
from unigrad.schedule.callify import new_buffer as new_single_buffer
from unigrad.uop import NodeMap, Ops, UOp

__all__ = ["buffers", "realize_lock", "buffer_of", "new_buffer", "buffer_from",
           "buffer_with_data", "is_realized", "is_buffer_view"]

buffers: NodeMap[Buffer] = NodeMap("buffer")  # BUFFER node -> its device Buffer
realize_lock = threading.RLock()


def buffer_of(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER node (created on first use)."""
  base = buffer_base(u)
  if base is None: raise RuntimeError(f"{u.op.name} node is not backed by a buffer")
  buf = buffers.get(base)
  if buf is None:
    size = base.src[0].arg[0] if base.src[0].op is Ops.VCONST else base.shape[0]  # shape is slower
    buf = buffers[base] = Buffer(base.arg.device, size, base.dtype)
    if capturing: capturing[-1].fresh[buf] = None
  return buf


def new_buffer(device: str | tuple[str, ...], dtype: DType, shape: tuple[int, ...]) -> UOp:
  """A fresh buffer viewed with `shape`; on a tuple of devices, replicated (a copy on each)."""
  if isinstance(device, tuple): return sharding.new_multi_buffer(device, dtype, shape, None)
  return new_single_buffer(device, dtype, shape)


def buffer_from(buf: Buffer) -> UOp:
  """A fresh BUFFER node of shape (buf.size,) backed by the existing Buffer `buf` (memory
  wrapped without a copy: from_blob, DLPack)."""
  with realize_lock:
    u = new_single_buffer(buf.device, buf.dtype, (buf.size,))
    buffers[u] = buf
  return u


def buffer_with_data(device: str, dtype: DType, data: bytes, shape: tuple[int, ...]) -> UOp:
  """A fresh buffer of `shape` holding `data` (row-major bytes)."""
  with realize_lock:
    u = new_buffer(device, dtype, shape)
    st = time.perf_counter()
    buf = buffer_of(u).copyin(data)
    if capturing: capturing[-1].uploaded[buf] = None
    if PROFILE: profile.record("copyin", "copy", device, st, mem_bytes=len(data))
  return u


def is_realized(u: UOp) -> bool: return is_plain_buffer(u) or sharding.is_multi_view(u)


def is_buffer_view(u: UOp) -> bool: return buffer_base(u) is not None or sharding.is_multi_view(u)
