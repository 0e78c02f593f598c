"""Zero-copy interop: numpy() views, DLPack with PyTorch and numpy, from_blob (frontend/interop.py,
runtime/dlpack.py). Memory sharing is proven by writing through one side and reading the other;
lifetimes by dropping the exporter and checking its buffer outlives the consumer."""
import ctypes
import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from unigrad import Device, Tensor, dtypes
from unigrad import engine
from unigrad.frontend.strided import strided_view_of
from unigrad.runtime import dlpack


def host_devices():
  return [d for d in ("CPU", "PYTHON") if d != "CPU" or Device.DEFAULT == "CPU"]


def buffer_ref(t: Tensor) -> weakref.ref:
  sv = strided_view_of(t.uop)
  assert sv is not None
  return weakref.ref(engine.buffer_of(sv.buffer))


# ---- numpy() ----

@pytest.mark.parametrize("dev", host_devices())
def test_numpy_of_a_view_shares_memory_without_a_kernel(dev, no_kernels):
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev)
  for view, ref in ((a.T, np.arange(12).reshape(3, 4).T), (a[1:, ::2], [[4, 6], [8, 10]]),
                    (a[:, 1:2].expand(3, 5), np.repeat(np.arange(1, 12, 4)[:, None], 5, 1))):
    n = view.numpy()
    np.testing.assert_array_equal(n, ref)
  t = a.T.numpy()
  assert t.strides == (4, 16) and not t.flags["C_CONTIGUOUS"]
  t[2, 1] = -7.0  # a write through numpy shows in the tensor
  assert a.numpy()[1, 2] == -7.0
  a.T.numpy()[0, 0] = 5.0
  assert a.numpy()[0, 0] == 5.0


def test_reading_a_view_leaves_it_a_view():
  """tolist/numpy of a view that numpy cannot share (a flip) read a copy: the tensor stays a
  view of its buffer and sees later writes."""
  a = Tensor(np.arange(4, dtype=np.float32)).realize()
  v, f = a[1:], a.flip(0)
  assert v.tolist() == [1, 2, 3] and f.tolist() == [3, 2, 1, 0]
  np.testing.assert_array_equal(f.numpy(), [3, 2, 1, 0])
  a.numpy()[3] = 30.0
  assert v.tolist() == [1, 2, 30] and f.tolist() == [30, 2, 1, 0] and f.numpy()[0] == 30.0


def test_numpy_of_a_computed_tensor_is_its_buffer():
  x = Tensor.arange(6).reshape(2, 3) * 3
  n = x.numpy()
  np.testing.assert_array_equal(n, [[0, 3, 6], [9, 12, 15]])
  n[0, 0] = 42
  assert x.tolist()[0][0] == 42  # x was realized into the buffer n shows


def test_numpy_keeps_the_buffer_alive():
  a = Tensor(np.arange(1000, dtype=np.float32)).realize()
  ref = buffer_ref(a)
  n = a[500:].numpy()
  del a
  gc.collect()
  assert ref() is not None
  for _ in range(3): Tensor.full((1000,), 9.0).realize()  # would reuse freed memory
  np.testing.assert_array_equal(n[:3], [500, 501, 502])
  del n
  gc.collect()
  assert ref() is None


def test_numpy_copies_where_it_cannot_share(device):
  a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device).realize()
  flipped = a.flip(1)  # no strided layout with non-negative strides: realized, then shared
  np.testing.assert_array_equal(flipped.numpy(), [[2, 1, 0], [5, 4, 3]])
  np.testing.assert_array_equal(a.pad(((1, 0), (0, 0))).numpy()[0], [0, 0, 0])
  bf = Tensor([1.5, 2.0], dtype=dtypes.bfloat16, device=device)
  np.testing.assert_array_equal(bf.numpy(), np.float32([1.5, 2.0]))
  assert Tensor.empty(0, 3, device=device).numpy().shape == (0, 3)


# ---- DLPack with PyTorch ----

@pytest.mark.parametrize("dev", host_devices())
def test_torch_from_dlpack_shares_memory(dev):
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev).realize()
  assert a.__dlpack_device__() == (1, 0)
  t = torch.from_dlpack(a)
  assert t.shape == (3, 4) and t.dtype == torch.float32
  t[1, 2] = 100.0  # torch writes, unigrad reads
  assert a.numpy()[1, 2] == 100.0
  a.T.numpy()[0, 0] = -1.0  # unigrad writes, torch reads
  assert t[0, 0].item() == -1.0
  tv = torch.from_dlpack(a[1:, 1::2].T)  # a strided view is exported as one, without a kernel
  assert tv.stride() == (2, 4) and tv.storage_offset() == 0
  assert tv.data_ptr() == t.data_ptr() + 5 * 4
  assert tv.tolist() == [[5.0, 9.0], [7.0, 11.0]]


def test_torch_from_dlpack_of_a_lazy_tensor_realizes_it():
  x = Tensor.arange(6).reshape(2, 3).float() + 1
  t = torch.from_dlpack(x)
  assert t.tolist() == [[1, 2, 3], [4, 5, 6]]
  t.mul_(2)
  assert x.tolist() == [[2, 4, 6], [8, 10, 12]]  # x is the realized buffer torch writes


def test_dlpack_export_keeps_the_buffer_alive():
  a = Tensor(np.arange(4096, dtype=np.float32)).realize()
  ref = buffer_ref(a)
  t = torch.from_dlpack(a[100:])
  del a
  gc.collect()
  assert ref() is not None
  for _ in range(3): Tensor.full((4096,), 7.0).realize()
  assert t[:3].tolist() == [100.0, 101.0, 102.0]
  del t
  gc.collect()
  assert ref() is None and not dlpack._exports


def test_unconsumed_capsule_releases_the_buffer():
  a = Tensor(np.arange(8, dtype=np.int32)).realize()
  ref = buffer_ref(a)
  for version in (None, (1, 0)):
    capsule = a.__dlpack__(max_version=version)
    assert dlpack._exports
    del capsule
    gc.collect()
    assert not dlpack._exports
  del a
  gc.collect()
  assert ref() is None


def test_from_dlpack_of_torch_shares_memory():
  src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
  t = Tensor.from_dlpack(src)
  assert t.shape == (3, 4) and t.dtype == dtypes.float32
  src[0, 1] = 50.0
  assert t.numpy()[0, 1] == 50.0
  t.assign(t * 2).realize()  # unigrad writes into torch's memory
  assert src[0, 1].item() == 100.0 and src[2, 3].item() == 22.0
  view = Tensor.from_dlpack(src.T[1:])  # strided: stays a view of torch's memory
  assert view.stride() == src.T[1:].stride()
  assert view.storage_offset() == torch.from_dlpack(src.T[1:]).storage_offset() == 0
  src[1, 2] = -3.0
  assert view.numpy()[1, 1] == -3.0
  np.testing.assert_array_equal((view + 1).numpy(), src.T[1:].numpy() + 1)
  assert torch.from_dlpack(view).data_ptr() == src.T[1:].data_ptr()  # the round trip shares


def test_from_dlpack_keeps_the_producer_alive():
  src = np.arange(10, dtype=np.float64)
  ref = weakref.ref(src)
  t = Tensor.from_dlpack(src)
  del src
  gc.collect()
  assert ref() is not None  # the producer's deleter has not run
  assert t.tolist()[-1] == 9.0
  del t
  gc.collect()
  assert ref() is None  # the deleter ran when the last tensor reading it went


@pytest.mark.parametrize("dt,tdt", [(dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8),
                                    (dtypes.int16, torch.int16), (dtypes.int32, torch.int32),
                                    (dtypes.int64, torch.int64), (dtypes.float16, torch.float16),
                                    (dtypes.bfloat16, torch.bfloat16),
                                    (dtypes.float64, torch.float64), (dtypes.bool, torch.bool)],
                         ids=str)
def test_dlpack_dtypes_round_trip(dt, tdt):
  ref = (torch.arange(6) % 3).to(tdt).reshape(2, 3)
  t = Tensor.from_dlpack(ref)
  assert t.dtype == dt
  back = torch.from_dlpack(t)
  assert back.dtype == tdt and torch.equal(back, ref) and back.data_ptr() == ref.data_ptr()


# ---- DLPack with numpy ----

def test_numpy_from_dlpack_shares_memory():
  a = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)).realize()
  n = np.from_dlpack(a.T)
  assert n.strides == (4, 12)
  n[2, 0] = 9
  assert a.tolist()[0][2] == 9
  src = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, 1:]  # a negative stride
  t = Tensor.from_dlpack(src)
  np.testing.assert_array_equal(t.numpy(), src)
  src[0, 0] = 77.0
  assert t.numpy()[0, 0] == 77.0


def test_read_only_arrays_are_copied():
  src = np.arange(4, dtype=np.float32)
  src.flags.writeable = False
  t = Tensor.from_dlpack(src)
  assert t.tolist() == [0, 1, 2, 3]
  assert engine.is_realized(t.uop) and engine.buffer_of(t.uop).address() != src.ctypes.data


# ---- DLPack bad input ----

def _capsule(device_type: int, code: int, bits: int):
  """A legacy capsule of a 1-element array with the given device and dtype."""
  shape = (ctypes.c_int64 * 1)(1)
  data = (ctypes.c_uint8 * 8)()
  managed = dlpack.DLManagedTensor()
  t = managed.dl_tensor
  t.data, t.device, t.ndim = ctypes.addressof(data), dlpack.DLDevice(device_type, 0), 1
  t.dtype, t.shape = dlpack.DLDataType(code, bits, 1), shape
  keep = (shape, data, managed)
  return dlpack._capsule_new(ctypes.addressof(managed), b"dltensor", None), keep


def test_from_dlpack_rejects_what_it_cannot_read():
  capsule, _keep = _capsule(4, 2, 32)  # kDLOpenCL
  with pytest.raises(RuntimeError, match="device type 4"): Tensor.from_dlpack(capsule)
  capsule, _keep = _capsule(1, 5, 64)  # complex64
  with pytest.raises(RuntimeError, match="dtype"): Tensor.from_dlpack(capsule)
  capsule, _keep = _capsule(1, 2, 32)
  Tensor.from_dlpack(capsule)
  with pytest.raises(RuntimeError, match="consumed only once"): Tensor.from_dlpack(capsule)
  with pytest.raises(RuntimeError, match="dtype"): Tensor.from_dlpack(np.zeros(2, np.complex64))
  with pytest.raises(RuntimeError, match="invalid capsule"): Tensor.from_dlpack(3)


def test_dlpack_export_bad_input():
  a = Tensor(np.arange(4, dtype=np.float32)).realize()
  with pytest.raises(BufferError, match="copy"): a.flip(0).__dlpack__(copy=False)
  with pytest.raises(BufferError, match="device"): a.__dlpack__(dl_device=(2, 0))
  copied = torch.from_dlpack(a.__dlpack__(copy=True))
  copied[0] = 5.0
  assert a.tolist()[0] == 0.0
  if Device.device_class("CL").is_available():
    with pytest.raises(BufferError, match="CL"): torch.from_dlpack(Tensor([1.0], device="CL"))
  with pytest.raises(BufferError): Tensor.ones(2, device="NULL").__dlpack_device__()


# ---- alive at interpreter exit ----

ROOT = Path(__file__).resolve().parents[2]
# what stays alive until the modules are torn down: in sys under a _name (cleared in the first
# pass over sys, after the other modules), in a reference cycle (collected at the very end) and in
# the main module; one interpreter per direction
ALIVE_AT_EXIT = {
  "dlpack_consumers": ["sys._keep = torch.from_dlpack(Tensor.ones(10).contiguous().realize())",
                       "a = A(); a.me = a; a.d = torch.from_dlpack(Tensor([1.0]).realize())",
                       "sys._np = np.from_dlpack(Tensor.ones(10).contiguous().realize())",
                       "sys._capsule = Tensor.ones(10).contiguous().realize().__dlpack__()",
                       "d = torch.from_dlpack(Tensor.ones(1 << 16).contiguous().realize())"],
  "numpy_views": ["sys._keep = Tensor.ones(1 << 20).contiguous().realize().numpy()",
                  "a = A(); a.me = a; a.v = (Tensor.ones(10) * 2).realize().numpy()"],
  "dlpack_producers": ["sys._keep = Tensor.from_dlpack(torch.ones(10)); sys._keep.realize()",
                       "a = A(); a.me = a; a.t = Tensor.from_dlpack(torch.ones(1 << 20))",
                       "sys._np = Tensor.from_dlpack(np.ones(10))",
                       "t = Tensor.from_dlpack(torch.ones(9)); sys._a = torch.from_dlpack(t)"],
}


@pytest.mark.parametrize("kept", ALIVE_AT_EXIT.values(), ids=ALIVE_AT_EXIT.keys())
def test_dlpack_and_numpy_sharing_alive_at_exit_exits_cleanly(kept):
  script = "\n".join(["import sys, numpy as np, torch", "from unigrad import Tensor",
                      "class A: pass", *kept])
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                        timeout=300)
  assert proc.returncode == 0 and proc.stderr == "", (proc.returncode, proc.stderr)


# ---- from_blob ----

@pytest.mark.parametrize("dev", host_devices())
def test_from_blob_shares_memory(dev, no_kernels):
  a = np.arange(6, dtype=np.int32)
  t = Tensor.from_blob(a.ctypes.data, (2, 3), dtypes.int32, device=dev)
  a[4] = 40
  assert t.tolist() == [[0, 1, 2], [3, 40, 5]]
  t.numpy()[0, 0] = -1
  assert a[0] == -1


def test_from_blob_on_a_device_without_raw_addresses():
  if not Device.device_class("CL").is_available(): pytest.skip("no OpenCL platform")
  a = np.zeros(2, np.float32)
  with pytest.raises(RuntimeError, match="raw address"):
    Tensor.from_blob(a.ctypes.data, (2,), device="CL")


# ---- CUDA (device pointers; runs on a GPU machine) ----

@pytest.mark.skipif(not Device.device_class("CUDA").is_available(), reason="no CUDA GPU")
def test_cuda_dlpack_and_from_blob_share_device_memory():
  a = Tensor(np.arange(6, dtype=np.float32), device="CUDA").realize()
  assert a.__dlpack_device__() == (2, 0)
  b = Tensor.from_dlpack(a)  # a CUDA capsule: wraps the device pointer
  assert b.device == "CUDA"
  b.assign(b * 2).realize()
  assert a.tolist() == [0, 2, 4, 6, 8, 10]
  c = Tensor.from_blob(engine.buffer_of(a.uop).address(), (2, 3), device="CUDA")
  assert c.T.tolist() == [[0, 6], [2, 8], [4, 10]]
  assert a.numpy().tolist() == [0, 2, 4, 6, 8, 10]  # device memory: numpy() copies
