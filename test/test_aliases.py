"""tinygrad's module paths and small helpers (unigrad.tensor, .device, .jit, .ops, .linalg,
helpers), and UOp.const in both argument orders."""
import pytest

import unigrad
from unigrad import GlobalCounters, UOp, dtypes, getenv
from unigrad.device import Buffer, Device
from unigrad.helpers import (CHECK_OOB, JIT, ansistrip, argfix, cdiv, cmod, colored, fully_flatten,
                             get_shape, getbits, merge_dicts, strip_parens, time_to_str, word_wrap)
from unigrad.jit import JitError, TinyJit
from unigrad.ops import Ops, UPat, exec_alu, resolve
from unigrad.tensor import Tensor


def test_module_aliases_are_the_same_objects():
  assert Tensor is unigrad.Tensor and TinyJit is unigrad.TinyJit and Device is unigrad.Device
  assert issubclass(JitError, RuntimeError) and Buffer.__name__ == "Buffer"
  assert UPat is unigrad.uop.UPat and exec_alu(Ops.ADD, dtypes.int32, (2, 3)) == 5
  assert resolve(UOp.const(dtypes.bool, True)) is True
  assert GlobalCounters is unigrad.helpers.GlobalCounters and getenv("DEBUG") == 0
  assert callable(unigrad.function) and unigrad.linalg.det is not None
  assert int(JIT) == 1 and CHECK_OOB  # the suite runs with bounds checks (test/conftest.py)


def test_uop_const_takes_both_argument_orders():
  assert UOp.const(2.5, dtypes.float32) is UOp.const(dtypes.float32, 2.5)
  assert UOp.const(3).dtype == dtypes.int64 and UOp.const(True).dtype == dtypes.bool
  assert UOp.const(1.0, None).dtype == dtypes.float32
  with pytest.raises(TypeError): UOp.const(1, 2)
  with pytest.raises(TypeError): UOp.const(dtypes.int8)


def test_small_helpers():
  assert (cdiv(-7, 2), cmod(-7, 2), cdiv(7, -2), cdiv(3, 0)) == (-3, -1, -3, 0)
  assert argfix((1, 2)) == argfix(1, 2) == (1, 2)
  with pytest.raises(ValueError): argfix((1, 2), 3)
  assert fully_flatten([[1, [2]], (3,)]) == [1, 2, 3]
  assert merge_dicts([{"a": 1}, {"b": 2}, {"a": 1}]) == {"a": 1, "b": 2}
  with pytest.raises(ValueError): merge_dicts([{"a": 1}, {"a": 2}])
  assert strip_parens("(a+b)") == "a+b" and strip_parens("(a)+(b)") == "(a)+(b)"
  assert ansistrip(colored("hi", "red")) == "hi" and colored("hi", None) == "hi"
  assert word_wrap("abcdef", 4) == "abcd\nef"
  assert get_shape([[1, 2], [3, 4], [5, 6]]) == (3, 2) and get_shape(7) == ()
  with pytest.raises(ValueError): get_shape([[1], [2, 3]])
  assert time_to_str(0.5).strip() == "500.00ms" and getbits(0b101100, 2, 3) == 0b11


def test_uop_spec_constructors():
  a, b = UOp.const(dtypes.index, 1), UOp.const(dtypes.index, 2)
  st = UOp.stack(a, b)
  assert st.op is Ops.STACK and st.shape == (2,) and st.src == (a, b)
  assert UOp.group(a, b).op is Ops.GROUP and UOp.group(a, b).dtype == dtypes.void
  assert UOp.invalid().op is Ops.CONST and UOp.invalid().arg is unigrad.uop.Invalid
  assert UOp.invalid() is UOp.const(dtypes.index, unigrad.uop.Invalid)
  assert a.store(b).op is Ops.STORE and a.store(b).dtype == dtypes.void
  assert a.load().op is Ops.LOAD and a.load().dtype == dtypes.index
