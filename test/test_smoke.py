"""Smoke test: the IR core builds, simplifies and prints in well under a second."""
import unigrad.uop as U
from unigrad.uop import Ops, UOp, dtypes


def test_simplify_reshape_index():
  a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 3)
  assert ((a * 4 + b) // 4).simplify() is a
  assert ((a * 4 + b) % 4).simplify() is b


def test_hash_consing_and_repr_roundtrip():
  x = UOp.const(dtypes.int32, 3) + UOp.variable("v", 0, 5, dtypes.int32)
  assert UOp.const(dtypes.int32, 3) + UOp.variable("v", 0, 5, dtypes.int32) is x
  assert eval(repr(x), vars(U)) is x
  assert x.op is Ops.ADD
