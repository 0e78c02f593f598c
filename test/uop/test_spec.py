"""spec.py: `spec_tensor` passes valid tensor graphs and names stage, op, rule, node of bad ones."""
import math

import pytest

from unigrad.dtype import DType, dtypes
from unigrad.uop import (CallInfo, Invalid, Ops, ParamArg, ReduceArg, SpecError, UOp, shape_uop,
                         spec_tensor)

f32, i32, idx = dtypes.float32, dtypes.int32, dtypes.index


def c(v: object, dt: DType = i32) -> UOp: return UOp.const(dt, v)


def buf(shape: tuple, dt: DType = f32, slot: int = 0, device: object = "CPU") -> UOp:
  return UOp(Ops.BUFFER, dt, (shape_uop(shape),), ParamArg(slot, dt, device))


def mov(op: Ops, x: UOp, *shapes: tuple, arg: object = None) -> UOp:
  return UOp(op, x.dtype, (x, *(shape_uop(s) for s in shapes)), arg)


def bad(u: UOp, op: str, rule: str) -> SpecError:
  with pytest.raises(SpecError) as e: spec_tensor.verify(UOp.sink(u))
  err = e.value
  assert err.stage == "tensor" and err.node.op.name == op and err.rule == rule, str(err)
  text = str(err)
  assert text.startswith(f"tensor: {op} breaks rule '{rule}'") and "node: UOp(Ops." in text
  assert isinstance(err, TypeError) and isinstance(err, ValueError)
  return err


# ---- valid graphs ----

def matmul_graph() -> UOp:
  x, w = buf((4, 8), slot=0), buf((8, 3), slot=1)
  xe = mov(Ops.EXPAND, mov(Ops.RESHAPE, x, (4, 8, 1)), (4, 8, 3))
  we = mov(Ops.EXPAND, mov(Ops.RESHAPE, w, (1, 8, 3)), (4, 8, 3))
  red = UOp(Ops.REDUCE, f32, (xe * we,), ReduceArg(Ops.ADD, (1,)))
  out = buf((4, 3), slot=2)
  store = UOp(Ops.STORE, dtypes.void, (out, mov(Ops.RESHAPE, red, (4, 3))))
  return UOp.sink(UOp(Ops.AFTER, f32, (out, store)))


def many_ops_graph() -> UOp:
  x = buf((4, 6), slot=0)
  n = UOp.variable("n", 1, 6)
  v = UOp(Ops.PARAM, f32, (shape_uop((n,)),), ParamArg(1, f32, "CPU"))
  padded = mov(Ops.PAD, x, (1, 0), (6, 6))
  shrunk = mov(Ops.SHRINK, padded, (2, 1), (3, 5))
  perm = UOp(Ops.PERMUTE, f32, (shrunk,), (1, 0))
  flip = UOp(Ops.FLIP, f32, (perm,), (True, False))
  cond = flip < 1.0
  w = cond.where(flip.sqrt(), c(0.0, f32)).cast(dtypes.float16).cast(f32)
  bits = UOp(Ops.BITCAST, i32, (w,)) ^ c(1)
  ints = (bits >> 1) & 7 | (bits // 3) % 5
  stack = UOp(Ops.STACK, f32, (w, w))
  idx_ = UOp(Ops.INDEX, f32, (stack, c(1, idx)))
  fn = UOp(Ops.FUNCTION, dtypes.void, (UOp(Ops.TUPLE, dtypes.void, (idx_.exp2(),)), x), CallInfo())
  got = UOp(Ops.GETTUPLE, f32, (fn,), 0)
  cp = UOp(Ops.COPY, f32, (UOp(Ops.CONTIGUOUSBACKWARD, f32, (got,)),), "CUDA")
  det = UOp(Ops.DETACH, f32, (cp,))
  vec = UOp(Ops.VCONST, idx, arg=(1, 2))
  return UOp.sink(det, ints, v, mov(Ops.RESHAPE, v, (1, n)), vec, c(Invalid, idx), c(math.nan, f32),
                  UOp(Ops.CONTIGUOUS, f32, (x,)), UOp(Ops.BINARY, dtypes.uint8, arg=b"ab"))


def test_valid_graphs_pass() -> None:
  for g in (matmul_graph(), many_ops_graph()):
    assert spec_tensor.verify(g) is g


# ---- wrong source count ----

def test_source_count() -> None:
  x = buf((4,))
  bad(UOp(Ops.RESHAPE, f32, (x,)), "RESHAPE", "sources")
  bad(UOp(Ops.PERMUTE, f32, (x, x), (0,)), "PERMUTE", "sources")
  bad(UOp(Ops.CONST, i32, (c(1),), 1), "CONST", "sources")
  bad(UOp(Ops.STORE, dtypes.void, (x,)), "STORE", "sources")
  bad(UOp(Ops.REDUCE, f32, (x, x), ReduceArg(Ops.ADD, (0,))), "REDUCE", "sources")


# ---- source dtypes ----

def test_source_dtypes() -> None:
  a, b = UOp.variable("a", 0, 3, i32), UOp.variable("b", 0, 3, f32)
  bad(UOp(Ops.ADD, i32, (a, b)), "ADD", "matching dtypes")
  bad(UOp(Ops.WHERE, f32, (a, b, b)), "WHERE", "bool condition")
  bad(UOp(Ops.XOR, f32, (b, b)), "XOR", "integer operands")
  bad(UOp(Ops.SHL, f32, (b, b)), "SHL", "integer operands")
  bad(UOp(Ops.RECIP, i32, (a,)), "RECIP", "float dtype")
  bad(UOp(Ops.WHERE, f32, (a < 1, b, a)), "WHERE", "matching dtypes")
  bad(UOp(Ops.INDEX, f32, (buf((4,)), b)), "INDEX", "integer indices")
  bad(UOp(Ops.STORE, dtypes.void, (buf((4,)), buf((4,), i32, 1))), "STORE", "shapes")


# ---- args ----

def test_bad_args() -> None:
  x = buf((2, 3))
  bad(UOp(Ops.PERMUTE, f32, (x,), (0, 0)), "PERMUTE", "permutation")
  bad(UOp(Ops.PERMUTE, f32, (x,), (0, 1, 2)), "PERMUTE", "permutation")
  bad(UOp(Ops.PERMUTE, f32, (x,), (True, False)), "PERMUTE", "permutation")
  bad(UOp(Ops.PERMUTE, f32, (x,), 1), "PERMUTE", "tuple arg")
  bad(UOp(Ops.FLIP, f32, (x,), (1, 0)), "FLIP", "flags")
  bad(UOp(Ops.REDUCE, f32, (x,), ReduceArg(Ops.SUB, (0,))), "REDUCE", "ReduceArg")
  bad(UOp(Ops.REDUCE, f32, (x,), (Ops.ADD, (0,))), "REDUCE", "ReduceArg")
  bad(UOp(Ops.REDUCE, f32, (x,), ReduceArg(Ops.ADD, (2,))), "REDUCE", "ReduceArg")
  bad(UOp(Ops.REPLICATED, f32, (x,), (5,)), "REPLICATED", "axes")
  bad(UOp(Ops.COPY, f32, (x,), 3), "COPY", "device arg")


@pytest.mark.parametrize("dt,value", [(dtypes.int8, 300), (dtypes.uint8, -1), (f32, 1), (i32, 1.0),
                                      (i32, True), (dtypes.bool, 1), (f32, 0.1),
                                      (dtypes.float16, 1e-30), (i32, Invalid), (f32, "1")])
def test_const_value_must_fit(dt: DType, value: object) -> None:
  bad(UOp(Ops.CONST, dt, arg=value), "CONST", "value fits dtype")


def test_const_values_that_fit() -> None:
  for u in (c(0.1, f32), c(math.inf, f32), c(math.nan, dtypes.float16), c(-0.0, dtypes.bfloat16),
            c(2 ** 63 - 1, dtypes.int64), c(False, dtypes.bool), c(Invalid, idx)):
    spec_tensor.verify(UOp.sink(u))
  bad(UOp(Ops.VCONST, dtypes.uint8, arg=(1, 256)), "VCONST", "values fit dtype")
  bad(UOp(Ops.CONST, f32.vec(2), arg=1.0), "CONST", "value fits dtype")


def test_param_bounds() -> None:
  bounds = (shape_uop(()), c(5, idx), c(1, idx))
  bad(UOp(Ops.PARAM, idx, bounds, ParamArg(-1, idx, name="v")), "PARAM", "bounds")
  wrong = (shape_uop(()), c(1), c(5))
  bad(UOp(Ops.PARAM, idx, wrong, ParamArg(-1, idx, name="v")), "PARAM", "bounds")
  bad(UOp(Ops.PARAM, f32, (shape_uop((2,)),), ParamArg(0, i32)), "PARAM", "stored dtype")
  bad(UOp(Ops.BUFFER, f32, (shape_uop((-2,)),), ParamArg(0, f32)), "BUFFER", "sizes")


# ---- stored dtype ----

def test_stored_dtype_must_equal_derived() -> None:
  a = UOp.variable("a", 0, 3, i32)
  err = bad(UOp(Ops.ADD, f32, (a, a)), "ADD", "stored dtype")
  assert "derived dtypes.int" in str(err)
  bad(UOp(Ops.CMPLT, i32, (a, a)), "CMPLT", "stored dtype")
  bad(UOp(Ops.RESHAPE, i32, (buf((4,)), shape_uop((2, 2)))), "RESHAPE", "stored dtype")
  bad(UOp(Ops.SINK, i32, ()), "SINK", "stored dtype")
  bad(UOp(Ops.CAST, dtypes.void, (a,)), "CAST", "value dtype")


# ---- shapes ----

def test_shape_errors() -> None:
  x = buf((4, 8))
  err = bad(mov(Ops.RESHAPE, x, (3, 3)), "RESHAPE", "same size")
  assert "32 elements" in str(err)
  bad(mov(Ops.RESHAPE, x, (-4, -8)), "RESHAPE", "sizes")
  bad(mov(Ops.EXPAND, x, (4, 8, 2)), "EXPAND", "broadcast")
  bad(mov(Ops.EXPAND, mov(Ops.RESHAPE, x, (4, 8, 1)), (4, 2, 3)), "EXPAND", "broadcast")
  bad(mov(Ops.SHRINK, x, (1, 0), (4, 8)), "SHRINK", "fits")
  bad(mov(Ops.SHRINK, x, (0, -1), (4, 2)), "SHRINK", "fits")
  bad(mov(Ops.SHRINK, x, (0,), (4,)), "SHRINK", "fits")
  bad(mov(Ops.PAD, x, (1, 0), (4, 9)), "PAD", "fits")
  bad(mov(Ops.PAD, x, (-1, 0), (5, 8)), "PAD", "fits")
  bad(UOp(Ops.ADD, f32, (x, buf((3,), slot=1))), "ADD", "broadcastable shapes")
  bad(UOp(Ops.STORE, dtypes.void, (x, buf((8, 4), slot=1))), "STORE", "shapes")
  bad(UOp(Ops.STACK, f32, (x, buf((8, 4), slot=1))), "STACK", "same shapes")
  bad(UOp(Ops.BITCAST, dtypes.float16, (c(1.0, f32),)), "BITCAST", "byte size")


def test_calls_and_ops_not_allowed() -> None:
  x = buf((4,))
  bad(UOp(Ops.FUNCTION, dtypes.void, (x,)), "FUNCTION", "TUPLE body")
  fn = UOp(Ops.FUNCTION, dtypes.void, (UOp(Ops.TUPLE, dtypes.void, (x,)),))
  bad(UOp(Ops.GETTUPLE, f32, (fn,), 1), "GETTUPLE", "stored dtype")
  bad(UOp(Ops.GETTUPLE, f32, (x,), 0), "GETTUPLE", "stored dtype")
  err = bad(UOp.range(4, 0), "RANGE", "allowed ops")
  assert "may not appear in the tensor stage" in str(err)
  bad(UOp(Ops.LOAD, f32, (x,)), "LOAD", "allowed ops")


def test_short_repr_is_one_line() -> None:
  a = UOp.variable("a", 0, 3, i32)
  err = bad(UOp(Ops.ADD, i32, (a, UOp.variable("b", 0, 3, f32))), "ADD", "matching dtypes")
  node_line = str(err).splitlines()[-1]
  assert node_line.strip() == "node: UOp(Ops.ADD, dtypes.int, src=(PARAM:int, PARAM:float))"
