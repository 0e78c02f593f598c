"""tinygrad's names in unigrad.dtype: DTYPES_DICT, the dtype tuples, can_lossless_cast (against
numpy's safe casting), float_to_fp16, Invalid."""
import pickle

import numpy as np
import pytest

from unigrad.dtype import (DTYPES_DICT, Invalid, InvalidType, can_lossless_cast, dtypes,
                           float_to_fp16, to_numpy_name)
from unigrad.uop import Invalid as uop_invalid

NUMPY_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.float32,
                dtypes.float64]


@pytest.mark.parametrize("src", NUMPY_DTYPES, ids=str)
def test_can_lossless_cast_agrees_with_numpy_safe_casting(src):
  for dst in NUMPY_DTYPES:
    want = np.can_cast(to_numpy_name(src), to_numpy_name(dst), casting="safe")
    if src in (dtypes.int64, dtypes.uint64) and dst == dtypes.float64:
      want = False  # numpy calls it safe, but 2**53 + 1 has no float64: not lossless
    assert can_lossless_cast(src, dst) == want, (src, dst)


def test_can_lossless_cast_of_the_types_numpy_lacks():
  assert can_lossless_cast(dtypes.bfloat16, dtypes.float32)
  assert not can_lossless_cast(dtypes.bfloat16, dtypes.float16)  # the range
  assert not can_lossless_cast(dtypes.float16, dtypes.bfloat16)  # the precision
  assert can_lossless_cast(dtypes.uint8, dtypes.bfloat16)
  assert not can_lossless_cast(dtypes.int16, dtypes.bfloat16)
  assert can_lossless_cast(dtypes.fp8e4m3, dtypes.float16)
  assert can_lossless_cast(dtypes.fp8e5m2, dtypes.bfloat16)
  assert not can_lossless_cast(dtypes.fp8e4m3, dtypes.fp8e4m3fnuz)  # no -0 there
  assert not can_lossless_cast(dtypes.float32, dtypes.fp8e5m2)


def test_dtype_tables_and_tuples():
  assert DTYPES_DICT["float32"] is dtypes.float32 and DTYPES_DICT["half"] is dtypes.float16
  assert "void" not in DTYPES_DICT and "index" not in DTYPES_DICT
  assert dtypes.fp8e4m3 in dtypes.floats and dtypes.fp8s == tuple(dt for dt in dtypes.floats
                                                                  if dtypes.is_fp8(dt))
  assert set(dtypes.ints) == set(dtypes.sints) | set(dtypes.uints)
  assert all(dtypes.is_unsigned(dt) for dt in dtypes.uints)


def test_float_to_fp16_rounds_like_numpy():
  with np.errstate(over="ignore"):
    for x in (0.1, 1 / 3, 65504.0, 65520.0, 1e5, -1e-8, 2.0 ** -24, 6e-8):
      assert float_to_fp16(x) == float(np.float16(x)), x


def test_invalid_is_one_value_everywhere():
  assert Invalid is uop_invalid and InvalidType() is Invalid
  assert pickle.loads(pickle.dumps(Invalid)) is Invalid
