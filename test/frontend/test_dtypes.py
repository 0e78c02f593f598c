"""dtypes: PyTorch's type promotion (result_type and every op's result dtype), casts and bitcasts
between every pair of dtypes, on PYTHON and CPU. One kernel per target dtype (the casts of every
source are packed together); promotion checks build graphs only (no kernel runs)."""
import itertools
import math
import operator

import numpy as np
import pytest
import torch

from unigrad import Tensor
from unigrad.dtype import dtypes
from unigrad.frontend.dtypes import result_type

ALL = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
       dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
       dtypes.float64)
TORCH = dict(zip(ALL, (torch.bool, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32,
                       torch.uint32, torch.int64, torch.uint64, torch.float16, torch.bfloat16,
                       torch.float32, torch.float64)))
FROM_TORCH = {v: k for k, v in TORCH.items()}


def make(values, dt, device, shape=None):
  """A Tensor of `dt` holding torch's conversion of `values` (so both start from equal data)."""
  t = torch.tensor(values).to(TORCH[dt])
  out = Tensor(t.float().tolist() if dt == dtypes.bfloat16 else t.tolist(), dtype=dt, device=device)
  return out if shape is None else out.reshape(shape)


def to_np(t):
  return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def pack(results):
  """One 1-D tensor with every (same-dtype) result flattened in order: one kernel."""
  return Tensor.cat(*[r.reshape(-1) for r in results])


def assert_same(got, want, what):
  if got.dtype.kind == "f":
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want.astype(got.dtype)), err_msg=what)
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want.astype(got.dtype)),
                                  err_msg=what)
  else: np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)


# ---- promotion: no kernel runs ----

def _operands(kind, dt):
  if kind == "dim": return Tensor([1], dtype=dt, device="PYTHON"), torch.tensor([1]).to(TORCH[dt])
  return Tensor(1, dtype=dt, device="PYTHON"), torch.tensor(1).to(TORCH[dt])


def _torch_result_type(*xs):
  try: return FROM_TORCH[torch.result_type(*xs)]
  except RuntimeError: return None


def _ours_result_type(*xs):
  try: return result_type(*xs)
  except TypeError: return None


@pytest.mark.parametrize("kinds", list(itertools.product(("dim", "zero"), repeat=2)), ids=str)
def test_result_type_matches_torch(kinds, no_kernels):
  for a, b in itertools.product(ALL, repeat=2):
    (ua, ta), (ub, tb) = _operands(kinds[0], a), _operands(kinds[1], b)
    assert _ours_result_type(ua, ub) == _torch_result_type(ta, tb), (a, b)


@pytest.mark.parametrize("kind", ["dim", "zero"])
def test_result_type_with_python_scalars(kind, no_kernels):
  for dt in ALL:
    u, t = _operands(kind, dt)
    for s in (True, 1, -1, 2.5):
      assert _ours_result_type(u, s) == _torch_result_type(t, s), (dt, s)
      assert _ours_result_type(s, u) == _torch_result_type(s, t), (s, dt)


BINARY = {"add": operator.add, "mul": operator.mul, "truediv": operator.truediv,
          "floordiv": operator.floordiv, "mod": operator.mod, "lt": operator.lt, "eq": operator.eq,
          "and": operator.and_, "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor)
          else torch.maximum(a, b), "pow": operator.pow, "sub": operator.sub}
PAIRS = [(a, b) for a, b in itertools.product(ALL, repeat=2)
         if a not in (dtypes.uint16, dtypes.uint32, dtypes.uint64)
         and b not in (dtypes.uint16, dtypes.uint32, dtypes.uint64)]  # torch lacks their ops


@pytest.mark.parametrize("name", list(BINARY))
def test_op_result_dtypes_match_torch(name, no_kernels):
  """Every binary op's result dtype for every dtype pair (and a 0-d operand) is torch's; where
  torch refuses the dtypes, ours raises TypeError too (bitwise on floats, sub of bool, ...)."""
  f = BINARY[name]
  for (a, b), zero in itertools.product(PAIRS, (False, True)):
    ua, ta = _operands("dim", a)
    ub, tb = _operands("zero" if zero else "dim", b)
    try: want = FROM_TORCH[f(ta, tb).dtype]
    except (RuntimeError, NotImplementedError, TypeError): want = None
    try: got = f(ua, ub).dtype
    except (TypeError, ValueError): got = None
    assert got == want, (name, a, b, zero)


def test_unary_result_dtypes(no_kernels):
  for dt in ALL:
    u, t = _operands("dim", dt)
    for f in (lambda x: x.sqrt(), lambda x: x.reciprocal(), lambda x: x.exp2(), lambda x: x.sin(),
              lambda x: x.logical_not(), lambda x: x.sum(), lambda x: x.prod(), lambda x: x.max()):
      try: want = FROM_TORCH[f(t).dtype]
      except (RuntimeError, NotImplementedError): continue
      assert f(u).dtype == want, dt


# ---- casts ----

SIGNED_VALUES = [-3.7, -1.0, -0.0, 0.5, 1.0, 2.9, 100.2, 126.5]
UNSIGNED_VALUES = [0.0, 0.5, 1.0, 2.9, 100.2, 126.5, 127.9, 3.0]  # negative float -> unsigned: UB


@pytest.mark.parametrize("dst", ALL, ids=str)
def test_cast_every_pair(device, dst):
  """Every source dtype cast to `dst` (float -> int truncates toward zero; x -> bool is x != 0)."""
  values = UNSIGNED_VALUES if dtypes.is_unsigned(dst) else SIGNED_VALUES
  got = pack([make(values, src, device).cast(dst) for src in ALL]).numpy()
  want = torch.cat([torch.tensor(values).to(TORCH[src]).to(TORCH[dst]) for src in ALL])
  for i, src in enumerate(ALL):
    part = slice(i * len(values), (i + 1) * len(values))
    assert_same(got[part], to_np(want[part]), f"{src} -> {dst}")
  assert make(values, dtypes.float32, device).cast(dst).dtype == dst


def test_cast_special_floats(device):
  x = [math.nan, math.inf, -math.inf, -0.0, 0.1, 1e-40, 70000.0, 3.4e38]
  t = torch.tensor(x, dtype=torch.float64)
  a = Tensor(x, dtype=dtypes.float64, device=device)
  narrow = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
  got = pack([a.cast(dt).cast(dtypes.float64) for dt in narrow])
  want = torch.cat([t.to(d).double() for d in (torch.float32, torch.float16, torch.bfloat16)])
  assert_same(got.numpy(), want.numpy(), "float narrowing")
  assert a.cast(dtypes.bool).tolist() == t.bool().tolist()


def test_bfloat16_rounds_to_nearest_even(device):
  """Casting float32 to bfloat16 rounds to nearest, ties to even (and the value goes through
  float32 when the source is float64, like PyTorch)."""
  x = [1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -9, -(1.0 + 2 ** -8), 3.14159, 65504.0, 1e-39]
  for src, tsrc in ((dtypes.float32, torch.float32), (dtypes.float64, torch.float64)):
    got = Tensor(x, dtype=src, device=device).cast(dtypes.bfloat16).numpy()
    want = torch.tensor(x, dtype=tsrc).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(got, want)


def test_float_to_int_truncates_and_bool_roundtrip(device):
  a = Tensor([-2.9, -0.5, 0.5, 2.9], device=device)
  assert a.cast(dtypes.int32).tolist() == [-2, 0, 0, 2]
  assert a.cast(dtypes.bool).tolist() == [True, True, True, True]
  assert Tensor([True, False], device=device).cast(dtypes.float16).tolist() == [1.0, 0.0]
  assert Tensor([0, 3, -1], device=device, dtype=dtypes.int8).bool().int().tolist() == [0, 1, 1]


# ---- bitcasts ----

SAME_SIZE = [(dtypes.bool, dtypes.uint8), (dtypes.int8, dtypes.uint8), (dtypes.uint8, dtypes.int8),
             (dtypes.int16, dtypes.float16), (dtypes.float16, dtypes.int16),
             (dtypes.bfloat16, dtypes.int16), (dtypes.int16, dtypes.bfloat16),
             (dtypes.float16, dtypes.bfloat16), (dtypes.uint16, dtypes.int16),
             (dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32),
             (dtypes.float32, dtypes.uint32), (dtypes.uint32, dtypes.int32),
             (dtypes.float64, dtypes.int64), (dtypes.int64, dtypes.float64),
             (dtypes.uint64, dtypes.float64), (dtypes.int64, dtypes.uint64)]
BITS_VALUES = [0, 1, -1, 100, -100, 32767, -32768, 12345]


@pytest.mark.parametrize("src,dst", SAME_SIZE, ids=str)
def test_bitcast_same_size(device, src, dst):
  values = [v & 1 for v in BITS_VALUES] if src == dtypes.bool else BITS_VALUES
  t = torch.tensor(values).to(TORCH[src])
  a = make(values, src, device, (2, 4)).permute(1, 0)
  got = a.bitcast(dst)
  want = t.reshape(2, 4).permute(1, 0).contiguous().view(TORCH[dst])
  assert got.dtype == dst and got.shape == (4, 2)
  assert_same(got.numpy(), to_np(want), f"{src} -> {dst}")


RESIZING = [(dtypes.float32, dtypes.uint8), (dtypes.float32, dtypes.float16),
            (dtypes.uint8, dtypes.float32), (dtypes.int16, dtypes.int64),
            (dtypes.float64, dtypes.int32), (dtypes.float32, dtypes.bool)]


@pytest.mark.parametrize("src,dst", RESIZING, ids=str)
def test_bitcast_changes_last_axis(device, src, dst):
  """Regression: a size-changing bitcast ran as a same-size one (zeros on CPU, an error on
  PYTHON); it rescales the last axis like torch's view(dtype)."""
  t = torch.tensor([[1.5, -2.0, 3.25, 100.0], [0.1, 7.0, -0.5, 9.0]]).to(TORCH[src])
  got = make(t.tolist(), src, device).bitcast(dst)
  want = t.view(TORCH[dst])
  assert got.shape == tuple(want.shape)
  assert_same(got.numpy(), to_np(want), f"{src} -> {dst}")
