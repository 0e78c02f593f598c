"""A standing differential fuzzer: random small programs over every dtype (broadcasting, movement
ops, reductions, casts with integer wrap-around) run on PYTHON and CPU and compared with each
other and with PyTorch. `FUZZ_EXAMPLES=2000 pytest test/test_fuzz_differential.py` hunts longer;
hypothesis prints the failing program (a list of steps) to turn into a regression test."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unigrad import Tensor, dtypes
from unigrad.knobs import FUZZ_EXAMPLES
from unigrad.runtime.ops_cpu import find_c_compiler

DTYPES = {dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8,
          dtypes.int16: torch.int16, dtypes.int32: torch.int32, dtypes.int64: torch.int64,
          dtypes.float16: torch.float16, dtypes.float32: torch.float32,
          dtypes.float64: torch.float64}
INTS = [dt for dt in DTYPES if dtypes.is_int(dt) and dt != dtypes.bool]
FLOATS = [dt for dt in DTYPES if dtypes.is_float(dt)]


def _data(draw, dt, shape):
  """Values every dtype holds: small ints around the wrap-around points, finite floats."""
  n = int(np.prod(shape))
  if dt == dtypes.bool: vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
  elif dt in INTS:
    lo, hi = int(dt.min), int(dt.max)
    near = st.sampled_from([v for v in (lo, lo + 1, -1, 0, 1, 2, 3, hi // 2 + 1, hi - 1, hi)
                            if lo <= v])
    vals = draw(st.lists(st.one_of(near, st.integers(max(lo, -20), 20)), min_size=n, max_size=n))
  else: vals = draw(st.lists(st.floats(-8, 8, width=16), min_size=n, max_size=n))
  return np.array(vals, dtype=torch.empty(0, dtype=DTYPES[dt]).numpy().dtype).reshape(shape)


def _binary(name):
  return {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "max": lambda a, b: a.maximum(b), "lt": lambda a, b: a < b,
          "eq": lambda a, b: a == b}[name]


@st.composite
def programs(draw):
  """(dtype, shape, input arrays, steps): each step transforms the current value (and may read
  the second input, drawn with a shape that broadcasts against the first)."""
  dt = draw(st.sampled_from(list(DTYPES)))
  shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
  other_shape = tuple(s if draw(st.booleans()) else 1 for s in shape)
  a, b = _data(draw, dt, shape), _data(draw, dt, other_shape)
  steps = []
  for _ in range(draw(st.integers(1, 5))):
    # arithmetic then a cast is where wrap-around bugs hide: those kinds come up most
    kind = draw(st.sampled_from(["binary"] * 3 + ["cast"] * 3 + ["unary", "movement", "reduce",
                                                                  "where"]))
    if kind == "binary":
      op = draw(st.sampled_from(["add", "sub", "mul", "max", "lt", "eq", "add_c", "mul_c"]))
      steps.append((kind, op, draw(st.sampled_from([3, 100, 127, 200, 30000, 2 ** 31 - 1]))))
    elif kind == "unary": steps.append((kind, draw(st.sampled_from(["neg", "abs", "square"]))))
    elif kind == "movement":
      steps.append((kind, draw(st.sampled_from(["flip", "permute", "flatten", "shrink", "pad",
                                                "expand"]))))
    elif kind == "reduce": steps.append((kind, draw(st.sampled_from(["sum", "amax"])),
                                         draw(st.integers(0, 2))))
    elif kind == "cast": steps.append((kind, draw(st.sampled_from(list(DTYPES)))))
    else: steps.append((kind,))
  return dt, a, b, steps


def _is_float(x) -> bool: return x.dtype in (torch.float16, torch.float32, torch.float64) or \
  (not isinstance(x, torch.Tensor) and dtypes.is_float(x.dtype))


def _unary(x, name, lib):
  if name == "neg": return x if x.dtype in (torch.bool, dtypes.bool) else -x
  if name == "abs": return x.abs() if x.dtype not in (torch.bool, dtypes.bool) else x
  return x * x if x.dtype not in (torch.bool, dtypes.bool) else x & x


def _movement(x, name, lib):
  nd = x.ndim
  if name == "flip": return x.flip(0) if lib == "torch" else x.flip(0)
  if name == "permute": return x.permute(*reversed(range(nd)))
  if name == "flatten": return x.reshape(-1)
  if name == "shrink": return x[1:] if x.shape[0] > 1 else x
  if name == "pad": return torch.nn.functional.pad(x, (1, 2)) if lib == "torch" else x.pad((1, 2))
  return x.reshape(1, *x.shape).expand(2, *x.shape)


def _reduce(x, name, axis, lib):
  axis = axis % x.ndim
  if name == "amax": return torch.amax(x, axis) if lib == "torch" else x.max(axis)
  if x.dtype in (torch.float16, dtypes.float16): x = x.float() if lib == "torch" else x.float()
  return x.sum(axis)


def _cast(x, dt, lib):
  src_float = x.dtype in (torch.float16, torch.float32, torch.float64) if lib == "torch" \
    else dtypes.is_float(x.dtype)
  if src_float and dt in INTS + [dtypes.bool]:  # C leaves out-of-range float -> int undefined
    x = x.clamp(-100, 100) if lib == "torch" else x.clip(-100, 100)
  return x.to(DTYPES[dt]) if lib == "torch" else x.cast(dt)


def _broadcasts(a: tuple, b: tuple) -> bool:
  return all(p == q or p == 1 or q == 1 for p, q in zip(a[::-1], b[::-1]))


def run(program, lib, device=None):
  """The program on PyTorch (lib="torch") or unigrad on `device`."""
  dt, a, b, steps = program
  if lib == "torch": x, y = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
  else: x, y = Tensor(a, device=device), Tensor(b, device=device)
  y0 = y
  for step in steps:
    kind = step[0]
    y = y0 if _broadcasts(tuple(x.shape), tuple(y0.shape)) else y0.reshape(-1)[:1]
    if kind == "binary":
      if step[1] in ("add_c", "mul_c"):  # a Python int operand: it takes x's dtype (wrapped)
        if x.dtype not in (torch.bool, dtypes.bool, torch.float16, dtypes.float16):
          c = np.array(step[2]).astype(x.numpy().dtype if lib == "torch" else
                                       torch.empty(0, dtype=DTYPES[x.dtype]).numpy().dtype).item()
          x = x + c if step[1] == "add_c" else x * c
      elif step[1] in ("add", "sub", "mul") and (x.dtype in (torch.bool, dtypes.bool)):
        x = x | y.to(x.dtype) if lib == "torch" else x | y.cast(x.dtype)
      elif step[1] == "sub" and y.dtype in (torch.bool, dtypes.bool): x = x + 1
      else: x = _binary(step[1])(x, y)
    elif kind == "unary": x = _unary(x, step[1], lib)
    elif kind == "movement": x = _movement(x.reshape(-1) if x.ndim == 0 else x, step[1], lib)
    elif kind == "reduce": x = _reduce(x.reshape(-1) if x.ndim == 0 else x, step[1], step[2], lib)
    elif kind == "cast": x = _cast(x, step[1], lib)
    elif lib == "torch": x = torch.where(x > 0, x, 1).to(x.dtype)
    else: x = (x > 0).where(x, 1).cast(x.dtype)
  return x.numpy()


def _same(got, want, program, what):
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape} for {program}"
  if want.dtype.kind == "f":
    tol = 2e-2 if want.dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol, equal_nan=True, err_msg=f"{what} for {program}")
  else:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype} for {program}"
    np.testing.assert_array_equal(got, want, err_msg=f"{what} for {program}")


@pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
# the CI run (the default count) is the same programs every time; longer hunts are random
@settings(max_examples=int(FUZZ_EXAMPLES), deadline=None,
          derandomize=int(FUZZ_EXAMPLES) <= FUZZ_EXAMPLES.default,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_random_programs_agree_on_python_cpu_and_pytorch(program):
  want = run(program, "torch")
  cpu = run(program, "unigrad", "CPU")
  _same(cpu, want, program, "CPU vs PyTorch")
  _same(run(program, "unigrad", "PYTHON"), cpu, program, "PYTHON vs CPU")


@st.composite
def _slices(draw, n: int):
  """A slice of an axis of size n: bounds out of range or None, any nonzero step or None."""
  bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
  step = st.one_of(st.none(), st.integers(-4, 4).filter(lambda s: s != 0))
  return slice(draw(bound), draw(bound), draw(step))


@st.composite
def slice_programs(draw):
  """(array, index, value): a float32 array of 1-3 axes (sizes 0-5), a basic index of one random
  slice per axis (empty results included), now and then an int instead, and the value a write
  stores there: a scalar or an array of the indexed view's shape."""
  shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
  a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  use_int = [n > 0 and draw(st.integers(0, 4)) == 0 for n in shape]
  idx = tuple(draw(st.integers(-n, n - 1)) if i else draw(_slices(n))
              for n, i in zip(shape, use_int))
  view_shape = a[idx].shape
  value = -1.0 if draw(st.booleans()) else -1 - np.arange(a[idx].size, dtype=np.float32)
  return a, idx, value if isinstance(value, float) else value.reshape(view_shape)


@pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
@settings(max_examples=int(FUZZ_EXAMPLES), deadline=None,
          derandomize=int(FUZZ_EXAMPLES) <= FUZZ_EXAMPLES.default,
          suppress_health_check=list(HealthCheck))
@given(slice_programs())
def test_random_slices_read_and_write_like_numpy(program):
  """getitem and setitem of random basic slices (any step, empty ones) on PYTHON and CPU equal
  numpy's; a write outside the view or the buffer fails here (CHECK_OOB is on in the suite)."""
  a, idx, value = program
  written = a.copy()
  written[idx] = value
  for device in ("PYTHON", "CPU"):
    x = Tensor(a, device=device).realize()
    _same(x[idx].numpy(), a[idx], program, f"{device} getitem")
    x[idx] = value if isinstance(value, float) else Tensor(value, device=device)
    _same(x.numpy(), written, program, f"{device} setitem")
