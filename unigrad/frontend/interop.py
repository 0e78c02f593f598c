"""Zero-copy interop of Tensor: numpy arrays and DLPack (`__dlpack__`, `__dlpack_device__`,
`Tensor.from_dlpack`), sharing memory with the buffer a tensor reads.

What is shared (frontend/strided.py): a strided view of a realized buffer (a transpose, slice,
broadcast or reshape) is exported as that buffer with its strides and offset, no kernel run;
any other tensor is realized first (its own new buffer, row-major) and that buffer is shared.
Writes through either side show in the other. The buffer stays alive while a numpy array or a
DLPack consumer holds it; an imported array's producer is told to free it (its deleter) when the
last unigrad tensor reading it goes. A view no strided array describes (padding, a flip) is
shared only after realizing a copy; DLPack's `copy=False` refuses that with BufferError.
The exception: a buffer TinyJit writes its results into at every replay (`replay_results`) is
copied by numpy(), so an array handed out before a replay keeps its values.
"""
from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

from unigrad.dtype import FP8S, dtypes, to_numpy_name
from unigrad import engine
from unigrad.frontend.strided import contiguous_strides, strided, strided_view_of, torch_strides
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.dlpack import (KDL_CUDA, dlpack_device, export_capsule, import_capsule,
                                    is_host_device)
from unigrad.uop import UOp
from unigrad.uop.variable import concrete_shape

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


class _HostArray:
  """numpy's view of host memory (`__array_interface__`); it holds the Buffer alive, and the
  array made from it holds it."""

  def __init__(self, buf: Buffer, shape: tuple[int, ...], strides: tuple[int, ...],
               offset: int) -> None:
    import numpy as np  # noqa: PLC0415 (numpy is optional: only needed here)
    self.buffer, size = buf, buf.dtype.itemsize
    self.__array_interface__ = {
      "version": 3, "shape": shape, "typestr": np.dtype(to_numpy_name(buf.dtype)).str,
      "data": (buf.address() + offset * size, False), "strides": tuple(s * size for s in strides)}


def _buffer_view(t: Tensor, realize: bool) -> tuple[Buffer, tuple[int, ...], tuple[int, ...],
                                                    int] | None:
  """(buffer, shape, strides, offset) of the memory `t` reads, realizing `t` first if it is no
  strided view (and `realize`); None when it still is none (a symbolic shape)."""
  sv = strided_view_of(t.uop)
  if sv is None and realize and not engine.is_buffer_view(t.uop):  # a view stays one
    t.realize()
    sv = strided_view_of(t.uop)
  if sv is None: return None
  shape = tuple(int(s) for s in sv.view.shape)
  return engine.buffer_of(sv.buffer), shape, torch_strides(shape, sv.strides), sv.offset


# The buffers a captured program writes its results into at every replay (TinyJit's outputs,
# frontend/jit.py adds them at the capture): numpy() gives a copy of one, an array its caller
# owns as tinygrad's numpy() always does, which the next replay cannot overwrite. Weak: a buffer
# leaves the set with its last user.
replay_results: weakref.WeakSet[Buffer] = weakref.WeakSet()


def shared_numpy(t: Tensor) -> Any | None:
  """`t`'s values as a numpy array over its buffer's memory (a copy of a TinyJit result's, see
  `replay_results`), or None where that cannot be (see Tensor.numpy): the caller copies then."""
  if engine.capturing or isinstance(t.device, tuple) or not is_host_device(t.device): return None
  if t.dtype == dtypes.bfloat16 or t.dtype in FP8S: return None  # numpy has no such dtype
  if not all(isinstance(s, int) for s in t.shape): return None
  if math.prod(t.shape) == 0: return None
  found = _buffer_view(t, realize=True)
  if found is None: return None
  import numpy as np  # noqa: PLC0415 (numpy is optional: only needed here)
  if found[0].base in replay_results: return np.array(_HostArray(*found))  # a copy
  return np.asarray(_HostArray(*found))


def _export_source(t: Tensor, copy: bool | None) -> tuple[Buffer, tuple[int, ...],
                                                          tuple[int, ...], int]:
  if isinstance(t.device, tuple):
    raise BufferError("a tensor split over several devices cannot be exported via DLPack")
  view_needs_copy = strided_view_of(t.uop) is None and engine.is_buffer_view(t.uop)
  if copy is False and view_needs_copy:
    raise BufferError("this view of a buffer (padding or a flip) has no strided layout: "
                      "exporting it needs a copy (copy=None or True)")
  if copy or view_needs_copy: t = t.contiguous()
  found = _buffer_view(t, realize=True)
  if found is not None: return found
  shape = concrete_shape(t.shape)  # a symbolic shape: the buffer's row-major prefix
  return engine.buffer_of(t.uop), shape, contiguous_strides(shape), 0


class InteropMixin:
  """DLPack export and import (see the module docstring)."""
  uop: UOp

  @property
  def device(self) -> Any: raise NotImplementedError

  def __dlpack_device__(self) -> tuple[int, int]:
    """(DLPack device type, device id): (1, 0) for host memory (CPU, PYTHON), (2, n) for
    CUDA:n. BufferError for a device DLPack has no type for."""
    if isinstance(self.device, tuple):
      raise BufferError("a tensor split over several devices has no single DLPack device")
    return dlpack_device(self.device)

  def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                 dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
    """A DLPack capsule sharing this tensor's memory (`torch.from_dlpack(t)`,
    `np.from_dlpack(t)`). A lazy tensor is realized first; `copy=True` exports a fresh copy,
    `copy=False` refuses (BufferError) where sharing needs one."""
    if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
      raise BufferError(f"cannot export {self.device} memory to DLPack device {tuple(dl_device)}")
    with engine.realize_lock:
      buf, shape, strides, offset = _export_source(self, copy)  # type: ignore[arg-type]
      Device[buf.device].synchronize()  # the consumer's stream may read it at once
      versioned = max_version is not None and tuple(max_version) >= (1, 0)
      return export_capsule(buf, shape, strides, offset, versioned)

  @classmethod
  def from_dlpack(cls, ext: Any) -> Tensor:
    """A tensor sharing the memory of `ext` (an object with `__dlpack__`, or a DLPack capsule):
    `Tensor.from_dlpack(torch_tensor)`. Writes through either side show in the other; the
    producer's memory stays alive while the tensor reads it. Strided arrays stay strided views
    (no copy); a read-only array (DLPack 1.x flag) is copied. RuntimeError for a device or
    dtype unigrad cannot read."""
    capsule = ext
    if hasattr(ext, "__dlpack__"):
      kind, _ = ext.__dlpack_device__()
      kwargs = {"stream": 1} if kind == KDL_CUDA else {}  # 1: CUDA's legacy default stream
      try: capsule = ext.__dlpack__(max_version=(1, 0), **kwargs)
      except TypeError: capsule = ext.__dlpack__(**kwargs)
    imp = import_capsule(capsule)
    flat = cls._from_uop(engine.buffer_from(imp.buffer), imp.buffer.device)  # type: ignore
    if imp.offset == 0 and imp.strides == contiguous_strides(imp.shape) and \
       imp.buffer.size == math.prod(imp.shape):
      x = flat.reshape(imp.shape)
    else: x = strided(flat, imp.shape, imp.strides, imp.offset)
    return x.contiguous().realize() if imp.read_only else x
