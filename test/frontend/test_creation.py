"""Tensor creation against numpy / PyTorch on PYTHON and CPU: from Python scalars, nested lists
and numpy arrays of every dtype; empty, zeros, ones, full, arange, eye and the *_like forms; and
reading data back (numpy, tolist, item)."""
import math
import warnings

import numpy as np
import pytest
import torch

from unigrad import Tensor
from unigrad.dtype import dtypes
from unigrad.frontend import creation

NP_DTYPES = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16",
             dtypes.uint16: "uint16", dtypes.int32: "int32", dtypes.uint32: "uint32",
             dtypes.int64: "int64", dtypes.uint64: "uint64", dtypes.float16: "float16",
             dtypes.float32: "float32", dtypes.float64: "float64"}
TORCH = {dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.int64: torch.int64,
         dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
         dtypes.float32: torch.float32, dtypes.float64: torch.float64, dtypes.uint8: torch.uint8,
         dtypes.int32: torch.int32}
FROM_TORCH = {v: k for k, v in TORCH.items()}


# ---- from Python and numpy data (no kernel: the data is copied into a buffer) ----

@pytest.mark.parametrize("value", [True, 7, -3, 2.5, 0.0], ids=repr)
def test_from_python_scalar(device, value, no_kernels):
  t, want = Tensor(value, device=device), torch.tensor(value)
  assert t.shape == () and t.dtype == FROM_TORCH[want.dtype] and t.device == device
  assert t.item() == value and type(t.item()) is type(value) and t.tolist() == value


NESTED = [[[1, 2], [3, 4]], [[1, 2.5], [True, 4]], [True, False], [[[1]], [[2]]], [], [[], []],
          [1.5, -2], [[0, 1, 2]]]


@pytest.mark.parametrize("data", NESTED, ids=str)
def test_from_nested_lists(device, data, no_kernels):
  t, want = Tensor(data, device=device), torch.tensor(data)
  assert t.shape == tuple(want.shape) and t.dtype == FROM_TORCH[want.dtype]
  assert t.tolist() == want.tolist()
  np.testing.assert_array_equal(t.numpy(), want.numpy())


# lists holding numpy arrays and scalars (tinygrad's beautiful_cartpole.py makes its replay buffer
# as `Tensor(list_of_observations)`): PyTorch's dtype, every element's promoted together
NUMPY_IN_LISTS = {  # the data, and PyTorch's dtype for it
  "f32 rows": ([np.array([1, 2], np.float32), np.array([3, 4], np.float32)], dtypes.float32),
  "f32 scalars": ([np.float32(1), np.float32(2)], dtypes.float32),
  "f64 scalar, float": ([np.float64(1.5), 2.0], dtypes.float64),
  "i32 scalars": ([np.int32(1), np.int32(2)], dtypes.int32),
  "i32 scalar, int": ([np.int32(1), 2], dtypes.int64),
  "f32 scalar, int": ([np.float32(1), 2], dtypes.float32),
  "list and f32 row": ([[1.0, 2.0], np.array([1, 2], np.float32)], dtypes.float32),
  "u8 and i8 rows": ([np.array([1, 2], np.uint8), np.array([3, 4], np.int8)], dtypes.int16),
  "i32 and f64 rows": ([np.array([1, 2], np.int32), np.array([1.5, 2.5])], dtypes.float64),
  "bool rows": ([np.array([True, False])] * 2, dtypes.bool),
  "2-d blocks": ([np.ones((2, 3), np.float16)] * 2, dtypes.float16)}


@pytest.mark.parametrize("data, dt", NUMPY_IN_LISTS.values(), ids=NUMPY_IN_LISTS.keys())
def test_from_lists_of_numpy_arrays_and_scalars_like_pytorch(device, data, dt, no_kernels):
  with warnings.catch_warnings():  # PyTorch: "creating a tensor from a list of ndarrays is slow"
    warnings.simplefilter("ignore", UserWarning)
    want = torch.tensor(data)
  t = Tensor(data, device=device)
  assert t.shape == tuple(want.shape) and t.dtype == dt
  assert str(want.dtype) == f"torch.{NP_DTYPES[dt]}"
  np.testing.assert_array_equal(t.numpy(), want.numpy())


def test_from_a_ragged_list_of_numpy_arrays_raises():
  with pytest.raises(ValueError, match=r"ragged.*shape \(1,\)"):
    Tensor([np.array([1.0, 2.0]), np.array([1.0])])


def test_from_lists_with_dtype(device, no_kernels):
  assert Tensor([1, 2], dtype=dtypes.float16, device=device).tolist() == [1.0, 2.0]
  assert Tensor([1.5, 2.5], dtype="bfloat16", device=device).tolist() == [1.5, 2.5]
  assert Tensor([3.14159], dtype=dtypes.bfloat16, device=device).item() == torch.tensor(
    [3.14159], dtype=torch.bfloat16).item()
  assert Tensor([255, -1, -200], dtype=dtypes.uint8, device=device).tolist() == [255, 255, 56]
  with pytest.raises(OverflowError, match="300"):  # PyTorch raises too; negatives wrap in both
    Tensor([300, -1], dtype=dtypes.uint8, device=device)
  assert Tensor([0, 2], dtype=dtypes.bool, device=device).tolist() == [False, True]


@pytest.mark.parametrize("dt", list(NP_DTYPES), ids=str)
def test_from_numpy_every_dtype(device, dt, no_kernels):
  rng = np.random.default_rng(0)
  a = (rng.integers(0, 100, (3, 4)) - (0 if dtypes.is_unsigned(dt) else 50)).astype(NP_DTYPES[dt])
  for arr in (a, a[:, ::-2], a.T, a[1:2]):  # non-contiguous numpy views are copied in order
    t = Tensor(arr, device=device)
    assert t.dtype == dt and t.shape == arr.shape
    got = t.numpy()
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(got, arr)


def test_from_numpy_with_dtype_conversion(device):
  a = np.array([1.7, -2.5, 3.0])
  got = Tensor(a, dtype=dtypes.int32, device=device)
  assert got.dtype == dtypes.int32
  assert got.tolist() == torch.tensor(a, dtype=torch.int32).tolist()


def test_from_numpy_0d(no_kernels):
  """Regression: np.ascontiguousarray made 0-d arrays (and numpy scalars) 1-d."""
  assert Tensor(np.array(3.5), device="PYTHON").shape == ()
  assert Tensor(np.float32(2.0), device="PYTHON").shape == ()


# ---- constructors ----

def test_empty(device):
  t = Tensor.empty(2, 3, dtype=dtypes.int16, device=device)
  assert t.shape == (2, 3) and t.dtype == dtypes.int16 and t.device == device
  assert t.numpy().shape == (2, 3)
  assert Tensor.empty((0, 4), device=device).numpy().shape == (0, 4)
  assert Tensor.empty(device=device).dtype == dtypes.float32


@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.int8, dtypes.uint64, dtypes.float16,
                                dtypes.bfloat16, dtypes.float64], ids=str)
def test_zeros_ones_full(device, dt):
  fill = True if dt == dtypes.bool else 3
  parts = [Tensor.zeros(2, 3, dtype=dt, device=device),
           Tensor.ones((2, 3), dtype=dt, device=device),
           Tensor.full((2, 3), fill, dtype=dt, device=device),
           Tensor.zeros(1, 3, dtype=dt, device=device).expand(2, 3).ones_like(),
           Tensor.full((3, 2), fill, dtype=dt, device=device).T.zeros_like()]
  assert all(p.dtype == dt and p.shape == (2, 3) for p in parts)
  rows = [p.reshape(1, 6).pad(((i, 4 - i), (0, 0))) for i, p in enumerate(parts)]  # one kernel
  got = (rows[0] + rows[1] + rows[2] + rows[3] + rows[4]).numpy()
  np.testing.assert_array_equal(got, np.array([[0] * 6, [1] * 6, [fill] * 6, [1] * 6, [0] * 6]))


def test_full_dtypes_like_torch(device, no_kernels):
  for v in (True, 3, 2.5):
    assert Tensor.full((2,), v, device=device).dtype == FROM_TORCH[torch.full((2,), v).dtype]
  assert Tensor.zeros(2, device=device).dtype == dtypes.float32
  assert Tensor.full(3, 1, device=device).shape == (3,)
  assert Tensor.full((), 1.5, device=device).shape == ()
  assert Tensor.ones(0, 3, device=device).shape == (0, 3)
  x = Tensor([1, 2], dtype=dtypes.int8, device=device)
  assert x.zeros_like().dtype == dtypes.int8 and x.full_like(2.7).dtype == dtypes.int8
  assert x.ones_like(dtype=dtypes.float16).dtype == dtypes.float16


ARANGES = [(5,), (2, 7), (2, 7, 2), (7, 2, -2), (0,), (0.5, 3), (0, 1, 0.1), (1, 0, -0.3),
           (-5, 5, 3), (1,)]


@pytest.mark.parametrize("args", ARANGES, ids=str)
def test_arange(device, args):
  got, want = Tensor.arange(*args, device=device), torch.arange(*args)
  assert got.dtype == FROM_TORCH[want.dtype] and got.shape == tuple(want.shape)
  # element i is start + i*step computed in double, then rounded (numpy's arange)
  np.testing.assert_array_equal(got.numpy(), np.arange(*args).astype(want.numpy().dtype))


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.float16, dtypes.float64], ids=str)
def test_arange_dtype(device, dt):
  got = Tensor.arange(2, 11, 3, dtype=dt, device=device)
  assert got.dtype == dt and got.tolist() == torch.arange(2, 11, 3, dtype=TORCH[dt]).tolist()


def test_arange_float_elements_are_start_plus_i_step(device):
  """Regression: arange accumulated in float32 (0.1 * 9 gave 0.90000004, not 0.9)."""
  got = Tensor.arange(0, 1, 0.1, device=device).numpy()
  np.testing.assert_array_equal(got, np.arange(0, 1, 0.1).astype(np.float32))


@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (1,), (0,)], ids=str)
def test_eye(device, args):
  got, want = Tensor.eye(*args, device=device), torch.eye(*args)
  assert got.dtype == dtypes.float32
  np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_eye_dtype(device):
  got = Tensor.eye(3, dtype=dtypes.int32, device=device)
  assert got.dtype == dtypes.int32 and got.tolist() == torch.eye(3, dtype=torch.int32).tolist()


def test_creation_errors(no_kernels):
  """Regression: eye(-1) and arange with a step against the bounds made empty tensors."""
  for f in (lambda: Tensor.eye(-1), lambda: Tensor.eye(2, -3), lambda: Tensor.arange(-3),
            lambda: Tensor.arange(0, 5, -1), lambda: Tensor.arange(0, 5, 0),
            lambda: Tensor.zeros(-1), lambda: Tensor.zeros(2.5), lambda: Tensor.full((2, -1), 0)):
    with pytest.raises(ValueError): f()
  with pytest.raises(ValueError, match="ragged"): Tensor([[1, 2], [3]])
  with pytest.raises(TypeError): Tensor(["a"])
  with pytest.raises(TypeError): Tensor.full((2,), "x")


# ---- from_blob: the memory at a raw address, wrapped without a copy ----

@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint16, dtypes.int32, dtypes.int64,
                                dtypes.float16, dtypes.float32, dtypes.float64, dtypes.bool],
                         ids=str)
def test_from_blob_numpy(device, dt, no_kernels):
  if device == "CL": pytest.skip("CL cannot wrap host memory (test_from_blob_shares_the_memory)")
  a = (np.arange(24).reshape(2, 3, 4) % 7 - 2).astype(NP_DTYPES[dt])
  t = Tensor.from_blob(a.ctypes.data, a.shape, dtype=dt, device=device)
  assert t.shape == (2, 3, 4) and t.dtype == dt and t.device == device
  np.testing.assert_array_equal(t.numpy(), a)


def test_from_blob_shares_the_memory(device):
  """The memory is wrapped, not copied (tinygrad's and PyTorch's from_blob): later writes to the
  source are seen. On CL (no raw addresses) from_blob raises RuntimeError."""
  a = np.float32([1.5, -2.0, 3.25, 0.0])
  if device == "CL":
    with pytest.raises(RuntimeError, match="raw address"): Tensor.from_blob(a.ctypes.data, (4,),
                                                                            device=device)
    return
  t = Tensor.from_blob(a.ctypes.data, (2, 2), device=device)  # dtype defaults to float32
  a[:] = 9.0
  np.testing.assert_array_equal((t * 2).numpy(), [[18.0, 18.0], [18.0, 18.0]])


def test_from_blob_ctypes_arrays(device, no_kernels):
  if device == "CL": pytest.skip("CL cannot wrap host memory (test_from_blob_shares_the_memory)")
  import ctypes  # noqa: PLC0415
  c = (ctypes.c_double * 3)(1.5, -2.5, 1e300)
  t = Tensor.from_blob(ctypes.addressof(c), (3,), dtype=dtypes.float64, device=device)
  assert t.tolist() == [1.5, -2.5, 1e300]
  ints = (ctypes.c_int32 * 6)(*range(-3, 3))
  t = Tensor.from_blob(ctypes.addressof(ints), 6, dtype="int32", device=device)
  assert t.tolist() == [-3, -2, -1, 0, 1, 2]
  bf = (ctypes.c_uint16 * 2)(0x3FC0, 0xC080)  # bfloat16 1.5 and -4.0
  t = Tensor.from_blob(ctypes.addressof(bf), (2,), dtypes.bfloat16, device)
  assert t.tolist() == [1.5, -4.0]
  assert Tensor.from_blob(ctypes.addressof(c), (0, 5), dtype=dtypes.float64).shape == (0, 5)


def test_from_blob_bad_input(no_kernels):
  a = np.zeros(4, np.float32)
  for ptr in (0, -8):
    with pytest.raises(ValueError, match="positive address"): Tensor.from_blob(ptr, (4,))
  for ptr in (1.5, "0x10", None, True):
    with pytest.raises(TypeError, match="int address"): Tensor.from_blob(ptr, (4,))
  for shape in ((-1,), (2, -3), (2.0,)):
    with pytest.raises(ValueError): Tensor.from_blob(a.ctypes.data, shape)
  for shape in ("ab", None, 2.5):
    with pytest.raises(TypeError, match="shape"): Tensor.from_blob(a.ctypes.data, shape)
  with pytest.raises(TypeError, match="memory layout"):
    Tensor.from_blob(a.ctypes.data, (1,), dtype=dtypes.index)
  with pytest.raises(ValueError, match="address space"): Tensor.from_blob(2 ** 64 - 8, (4,))
  with pytest.raises(RuntimeError, match="unknown device"):
    Tensor.from_blob(a.ctypes.data, (4,), device="NOPE")


# ---- reading data back ----

def test_numpy_tolist_item(device):
  t = Tensor([[1.5, 2.0]], dtype=dtypes.bfloat16, device=device)
  assert t.numpy().dtype == np.float32 and t.tolist() == [[1.5, 2.0]]
  assert Tensor(np.zeros((0, 2), np.int8), device=device).tolist() == []
  assert Tensor([[7]], device=device).item() == 7
  assert math.isnan(Tensor([math.nan], device=device).item())
  with pytest.raises(RuntimeError): Tensor([1, 2], device=device).item()
  r = (Tensor([1, 2], device=device) + 1).realize()
  assert r.tolist() == [2, 3] and r.numpy().tolist() == [2, 3]


def test_arange_graph_is_built_once_per_arguments(monkeypatch):
  first = Tensor.arange(2, 11, 3)
  with Tensor.no_grad(): detached = Tensor.arange(2, 11, 3)
  monkeypatch.setattr(creation, "_prefix_sum", None)  # a rebuild would fail
  assert Tensor.arange(2, 11, 3).uop is first.uop and Tensor.arange(2, 11, 3) is not first
  with Tensor.no_grad(): assert Tensor.arange(2, 11, 3).uop is detached.uop
  assert detached.uop is first.uop, "no gradient flows through an arange: no DETACH under no_grad"
  monkeypatch.undo()
  assert Tensor.arange(2.0, 11, 3).uop is not first.uop  # a float bound: float64 arithmetic
  assert Tensor.arange(2, 11, 3).tolist() == [2, 5, 8]
  assert Tensor.arange(2.0, 11, 3).tolist() == [2.0, 5.0, 8.0]
  assert len(creation._arange_graphs) <= creation.ARANGE_CACHE_SIZE


@pytest.mark.parametrize("start,stop,step", [(0, 5, 1), (2, 9, 3), (3, 3, 1), (0, 1, 2)])
def test_arange_with_a_symbolic_stop(start, stop, step):
  """`Tensor.arange(n)` with n a bound Variable (a causal mask over a prompt of bound length):
  the bound value's elements, one graph for every value."""
  from unigrad.uop.variable import Variable  # noqa: PLC0415
  n = Variable("n", 0, 10).bind(stop)
  np.testing.assert_array_equal(Tensor.arange(start, n, step).numpy(),
                                np.arange(start, stop, step))


def test_arange_with_a_symbolic_start_raises_naming_the_arguments():
  from unigrad.uop.variable import Variable  # noqa: PLC0415
  with pytest.raises(TypeError, match="only the stop may be symbolic"):
    Tensor.arange(Variable("s", 0, 4).bind(1), 8)
