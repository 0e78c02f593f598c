"""Multi-device Tensor methods: shard, shard_, replication (`to` with a tuple of devices), and the
spec's two multi-device primitives, `copy` (COPY) and `replicated` (REPLICATED), from which
`unigrad.multi` builds the collectives exactly as the spec writes them.

A tensor on an n-tuple device D = ("CPU:0", "CPU:1", ...) keeps its full (logical) shape; `.device`
is the tuple (canonical names: ("CPU", "CPU:1")) and `.uop.axis` the axis it is split along, chunk
j on D[j], or None when every device holds all of it (replicated). Ops between tensors on the same
D work like on one device and give the same values; `schedule/multi.py` turns the graph into one
graph per device when it is realized. Splits are into equal chunks only: sharding an axis whose
size n does not divide raises ValueError (rather than padding it, or giving the devices unequal
parts); a later op that would leave the shard axis unevenly split (`x[1]` of a tensor split along
axis 0) raises `MultiDeviceError` when it is realized: gather it first with `.to(device)`.

Not supported: random numbers on a tuple of devices (make them on one device and shard them), and
the gradient of REPLICATED (so of `.to(devices)` applied to a single-device tensor that requires
grad inside the differentiated computation); replicate the leaf itself instead: `w.to_(devices)`.

  >>> x = Tensor.arange(8).reshape(4, 2).shard(("CPU:0", "CPU:1"))  # rows 0-1 on CPU, 2-3 on CPU:1
  >>> (x * 2).sum(0).tolist(), x.device
  ([24, 32], ('CPU', 'CPU:1'))
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unigrad import engine
from unigrad.frontend.gradient import detach_if_no_grad
from unigrad.frontend.movement import canonical_axis
from unigrad.runtime.device import Device
from unigrad.uop import Ops, UOp, sint

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

DeviceArg = str | Sequence[str]


def canonical_devices(devices: Any) -> tuple[str, ...]:
  """A tuple of distinct canonical device names ("cpu:0" -> "CPU"); each device must exist."""
  if isinstance(devices, str) or not isinstance(devices, (tuple, list)):
    raise TypeError(f"expected a tuple of device names, got {type(devices).__name__} {devices!r}")
  if not devices: raise ValueError("expected at least one device, got an empty tuple")
  names = tuple(Device.canonicalize(d) for d in devices)
  if len(set(names)) != len(names): raise ValueError(f"devices must be distinct, got {names}")
  for d in names: Device[d]  # unknown or unavailable devices fail here, at the call
  return names


class MultiMixin:
  """shard, shard_, copy, replicated, replication across a tuple of devices, and `full`/`empty`
  (so every constructor built on them) taking a tuple of devices: the tensor is replicated.

  It comes first among Tensor's bases so that its `full` and `empty` see a tuple of devices
  before the single-device constructors do; it declares the rest of Tensor only for typing."""
  uop: UOp
  if TYPE_CHECKING:
    shape: tuple[sint, ...]
    device: Any
    ndim: int
    _device: Any
    def reshape(self, *shape: Any) -> Tensor: ...
    def expand(self, *shape: Any) -> Tensor: ...
    def permute(self, *order: Any) -> Tensor: ...
    @staticmethod
    def _from_uop(u: UOp, device: Any, requires_grad: bool | None = None) -> Tensor: ...

  def _on(self, u: UOp, device: Any) -> Tensor:
    """A tensor holding `u` on `device` (a name or a tuple of names)."""
    return self._from_uop(detach_if_no_grad(u), device)

  @classmethod
  def full(cls, shape: Any, fill_value: Any, dtype: Any = None, device: Any = None,
           **kwargs: Any) -> Tensor:
    """`Tensor.full`; with a tuple of devices, the constant on each of them."""
    if not isinstance(device, (tuple, list)):
      return super().full(shape, fill_value, dtype, device, **kwargs)  # type: ignore[misc]
    devices, requires_grad = canonical_devices(device), kwargs.pop("requires_grad", None)
    const = super().full(shape, fill_value, dtype, None, **kwargs)  # type: ignore[misc]
    t = cls._from_uop(const.uop, devices)  # a constant lives on no device until it is stored
    return t if requires_grad is None else t.requires_grad_(requires_grad)  # type: ignore[attr-defined]

  @classmethod
  def empty(cls, *shape: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Tensor:
    """`Tensor.empty`; with a tuple of devices, a new buffer on each of them (replicated)."""
    if not isinstance(device, (tuple, list)):
      return super().empty(*shape, dtype=dtype, device=device, **kwargs)  # type: ignore[misc]
    devices, requires_grad = canonical_devices(device), kwargs.pop("requires_grad", None)
    t = super().empty(*shape, dtype=dtype, **kwargs)  # type: ignore[misc]
    buf = engine.new_buffer(devices, t.dtype, tuple(t.shape))
    t = cls._from_uop(buf, devices)
    return t if requires_grad is None else t.requires_grad_(requires_grad)  # type: ignore[attr-defined]

  def shard(self, devices: Sequence[str], axis: int = 0) -> Tensor:
    """This tensor split along `axis` into len(devices) equal chunks, chunk i on devices[i]
    (lazy; a tensor already on devices is resharded). The size of `axis` must be a multiple of
    the number of devices. `x.shard(("CPU:0", "CPU:1"), axis=0)`"""
    dev = canonical_devices(devices)
    if self.ndim == 0: raise ValueError("cannot shard a 0-d tensor: it has no axis to split")
    ax = canonical_axis(axis, self.ndim)
    if self.shape[ax] % len(dev):
      raise ValueError(f"shard: axis {ax} of shape {self.shape} has size {self.shape[ax]}, which "
                       f"does not split evenly across {len(dev)} devices")
    if self.device == dev and self.uop.axis == ax: return self  # type: ignore[return-value]
    order = (ax, *(i for i in range(self.ndim) if i != ax))
    inverse = tuple(sorted(range(self.ndim), key=lambda i: order[i]))
    return self.permute(order).copy(dev).permute(inverse)

  def shard_(self, devices: Sequence[str], axis: int = 0) -> Tensor:
    """Shard this tensor in place (see `shard`); returns self."""
    sharded = self.shard(devices, axis)
    self.uop, self._device = sharded.uop, sharded.device  # type: ignore[attr-defined]
    return self  # type: ignore[return-value]

  def copy(self, device: DeviceArg) -> Tensor:
    """The spec's COPY: this tensor copied to `device` (lazy). To one device it gathers a tensor
    split across devices; to an n-tuple of devices it reshards with axis 0 (the size of axis 0
    must be a multiple of n). `t.copy(("CPU:0", "CPU:1"))`"""
    if isinstance(device, str):
      dev: Any = Device.canonicalize(device)
      Device[dev]
    else:
      dev = canonical_devices(device)
      if not self.shape or self.shape[0] % len(dev):
        raise ValueError(f"copy to {dev} splits axis 0 evenly, but the shape is {self.shape}")
    return self._on(UOp(Ops.COPY, self.uop.dtype, (self.uop,), dev), dev)

  def replicated(self, axis: int) -> Tensor:
    """The spec's REPLICATED: a tensor split along `axis` with one slice per device, whose slices
    are equal, as a replicated tensor without that axis (every device holds all of it).
    `t.reshape(1, s).expand(n, s).copy(D).replicated(0)` broadcasts t to the devices D."""
    if not isinstance(self.device, tuple):
      raise ValueError(f"replicated needs a tensor on a tuple of devices, got one on {self.device}")
    ax = canonical_axis(axis, self.ndim)
    if self.uop.axis != ax or self.shape[ax] != len(self.device):
      raise ValueError(f"replicated({ax}) needs axis {ax} to be the shard axis with one slice per "
                       f"device ({len(self.device)}), got shape {self.shape} split along axis "
                       f"{self.uop.axis}")
    rep = self._on(UOp(Ops.REPLICATED, self.uop.dtype, (self.uop,), (ax,)), self.device)
    return rep.reshape(*self.shape[:ax], *self.shape[ax + 1:])

  def _to_devices(self, devices: Sequence[str]) -> Tensor:
    """This tensor replicated on each of `devices` (`Tensor.to` with a tuple): the spec's
    broadcast, or allgather for a tensor already split across devices."""
    dev = canonical_devices(devices)
    if self.device == dev and self.uop.axis is None: return self  # type: ignore[return-value]
    shape = self.shape
    return self.reshape(1, *shape).expand(len(dev), *shape).copy(dev).replicated(0)
