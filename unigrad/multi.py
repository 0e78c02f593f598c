"""The spec's multi-device collectives, built exactly as the spec writes them from COPY
(`Tensor.copy`) and REPLICATED (`Tensor.replicated`): section "Multi-Device Collectives".

Let D = (d_0, ..., d_{n-1}) be an n-tuple of devices. COPY to D reshards with axis 0 and never
changes the shape. The spec states each collective for a 1-d tensor; here any shape is accepted,
with the same formula on `t.reshape(1, *t.shape)` where the spec writes `T.reshape(1, s)` (the same
graph for a 1-d tensor). "Split across D along axis 0" means `t.device == D` and `t.uop.axis == 0`:
device j holds rows [j*k, (j+1)*k) of the n*k rows.

  broadcast(t, D)   t on one device           -> t on D, replicated
  scatter(t, D)     t on one device           -> t on D, split along axis 0
  gather(t)         t on D                    -> t on D[0]
  reduce(t)         t (n*k, ...) split axis 0 -> (k, ...) on D[0]: the sum of the n parts
  allgather(t)      t on D                    -> t on D, replicated
  reduce_scatter(t) t (n*k, ...) split axis 0 -> (k, ...) on D split along axis 0: the sum of the
                                                 n parts, each device holding 1/n of it
  allreduce(t)      t (n*k, ...) split axis 0 -> (k, ...) on D, replicated: the sum of the parts

>>> from unigrad import Tensor, multi
>>> multi.allreduce(Tensor([1., 2, 3, 4]).shard(("CPU:0", "CPU:1"))).tolist()
[4.0, 6.0]
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from unigrad.frontend.multi import canonical_devices
from unigrad.frontend.tensor import Tensor

__all__ = ["broadcast", "scatter", "gather", "reduce", "allgather", "reduce_scatter", "allreduce"]


def _devices_of(t: Tensor, what: str) -> tuple[str, ...]:
  if not isinstance(t.device, tuple):
    raise ValueError(f"{what} needs a tensor on a tuple of devices, got one on {t.device}")
  return t.device


def _split_parts(t: Tensor, what: str) -> tuple[int, int]:
  """(n, s): the number of devices and the elements each holds, for t split along axis 0."""
  n = len(_devices_of(t, what))
  if t.uop.axis != 0:
    raise ValueError(f"{what} needs a tensor split along axis 0, got shape {t.shape} split along "
                     f"axis {t.uop.axis}")
  return n, math.prod(t.shape) // n


def broadcast(t: Tensor, devices: Sequence[str]) -> Tensor:
  """Replicate `t` (on one device) to all n devices: T.reshape(1, s).expand(n, s).copy(D)
  .replicated(0)."""
  d = canonical_devices(devices)
  return t.reshape(1, *t.shape).expand(len(d), *t.shape).copy(d).replicated(0)


def scatter(t: Tensor, devices: Sequence[str]) -> Tensor:
  """Split `t` (on one device) into n chunks along axis 0, one per device: T.copy(D)."""
  return t.copy(canonical_devices(devices))


def gather(t: Tensor) -> Tensor:
  """Collect all shards of `t` onto the first device: T.copy(D[0])."""
  return t.copy(_devices_of(t, "gather")[0])


def reduce(t: Tensor) -> Tensor:
  """Gather + sum of the n parts of `t` (split along axis 0), on the first device:
  gather(T).reshape(n, s).sum(0)."""
  n, s = _split_parts(t, "reduce")
  out = gather(t).reshape(n, s).sum(0, dtype=t.dtype)
  return out.reshape(t.shape[0] // n, *t.shape[1:])


def allgather(t: Tensor) -> Tensor:
  """Collect all shards of `t` and replicate them to all devices:
  T.reshape(1, n*s).expand(n, n*s).copy(D).replicated(0)."""
  n = len(_devices_of(t, "allgather"))
  return t.reshape(1, *t.shape).expand(n, *t.shape).copy(t.device).replicated(0)


def reduce_scatter(t: Tensor) -> Tensor:
  """Sum the n parts of `t` (split along axis 0) and leave 1/n of the sum on each device:
  T.reshape(n, n, s//n).permute(1, 0, 2).copy(D).sum(1).reshape(s)."""
  n, s = _split_parts(t, "reduce_scatter")
  k = t.shape[0] // n
  if s % n or k % n:
    raise ValueError(f"reduce_scatter: the parts of shape {(k, *t.shape[1:])} do not split evenly "
                     f"across {n} devices (their first axis must be a multiple of {n})")
  out = t.reshape(n, n, s // n).permute(1, 0, 2).copy(t.device).sum(1, dtype=t.dtype).reshape(s)
  return out.reshape(k, *t.shape[1:])


def allreduce(t: Tensor) -> Tensor:
  """The sum of the n parts of `t` (split along axis 0) on every device:
  allgather(reduce_scatter(T))."""
  return allgather(reduce_scatter(t))
