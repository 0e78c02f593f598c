"""properties.py: one test per row of the spec's "Derived Properties" table, then the axis rules.

Each row checks dtype, shape, device, addrspace, min_max and axis of a node of that op.
"""
import itertools
import math

import pytest

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.uop import (Invalid, Ops, ParamArg, RangeArg, ReduceArg, UOp, shape_uop)
from unigrad.uop.alu import exec_alu

f32, i32, idx = dtypes.float32, dtypes.int32, dtypes.index
D2 = ("CPU:0", "CPU:1")


def c(v: object, dt: DType = i32) -> UOp: return UOp.const(dt, v)


def buf(shape: tuple, dt: DType = f32, device: object = "CPU", slot: int = 0,
        space: AddrSpace = AddrSpace.GLOBAL) -> UOp:
  return UOp(Ops.BUFFER, dt, (shape_uop(shape),), ParamArg(slot, dt, device, space))


def param(shape: tuple, slot: int, dt: DType = f32, device: object = None) -> UOp:
  return UOp(Ops.PARAM, dt, (shape_uop(shape),), ParamArg(slot, dt, device))


def var(name: str, lo: int, hi: int, dt: DType = i32) -> UOp:
  return c(lo, dt) if lo == hi else UOp.variable(name, lo, hi, dt)


def mov(op: Ops, x: UOp, *shapes: tuple, arg: object = None) -> UOp:
  return UOp(op, x.dtype, (x, *(shape_uop(s) for s in shapes)), arg)


def reduce(x: UOp, op: Ops, axes: tuple[int, ...]) -> UOp:
  return UOp(Ops.REDUCE, x.dtype, (x,), ReduceArg(op, axes))


def props(u: UOp) -> tuple:
  return (u.dtype, u.shape, u.device, u.addrspace, u.min_max, u.axis)


FULL_F32 = (-math.inf, math.inf)
FULL_I32 = (i32.min, i32.max)


# ---- source ops ----

def test_row_buffer() -> None:
  b = buf((4, 5), i32, "CPU", space=AddrSpace.LOCAL)
  assert props(b) == (i32, (4, 5), "CPU", AddrSpace.LOCAL, FULL_I32, None)
  assert props(buf((8,), f32, D2)) == (f32, (8,), D2, AddrSpace.GLOBAL, FULL_F32, 0)
  assert buf((), f32).shape == () and buf((0,), f32).shape == (0,)


def test_row_const() -> None:
  assert props(c(7)) == (i32, (), None, AddrSpace.REG, (7, 7), None)
  assert c(2.5, f32).min_max == (2.5, 2.5) and c(True, dtypes.bool).min_max == (True, True)
  assert c(Invalid, idx).min_max == (idx.min, idx.max)  # an invalid index holds nothing known


def test_row_param_without_bounds() -> None:
  p = param((3, 2), 1, dtypes.uint8, "CPU")
  assert props(p) == (dtypes.uint8, (3, 2), "CPU", AddrSpace.GLOBAL, (0, 255), None)
  assert param((2,), 0, f32, D2).axis == 0


def test_row_param_with_bounds() -> None:
  v = UOp.variable("n", 2, 9)
  assert props(v) == (idx, (), None, AddrSpace.REG, (2, 9), None)
  w = UOp.variable("w", -3, 3, i32)
  assert w.min_max == (-3, 3) and w.dtype is i32


# ---- movement ops ----

def test_row_permute() -> None:
  b = buf((2, 3, 4), i32, "CPU")
  p = UOp(Ops.PERMUTE, i32, (b,), (2, 0, 1))
  assert props(p) == (i32, (4, 2, 3), "CPU", AddrSpace.GLOBAL, FULL_I32, None)
  v = UOp(Ops.PERMUTE, i32, (mov(Ops.RESHAPE, var("v", 1, 5), (1, 1)),), (1, 0))
  assert v.min_max == (1, 5)


def test_row_flip() -> None:
  b = buf((2, 3), f32, "CPU", space=AddrSpace.LOCAL)
  assert props(UOp(Ops.FLIP, f32, (b,), (True, False))) == props(b)[:5] + (None,)


def test_row_reshape() -> None:
  x = mov(Ops.RESHAPE, buf((2, 6), i32, "CPU"), (3, 4))
  assert props(x) == (i32, (3, 4), "CPU", AddrSpace.GLOBAL, FULL_I32, None)
  n = UOp.variable("n", 1, 8)
  sym = UOp(Ops.RESHAPE, f32, (param((4,), 0), shape_uop((n, 4))))
  assert sym.shape == (n, 4) and sym.size is (n * 4)  # symbolic sizes flow through
  assert mov(Ops.RESHAPE, var("v", 0, 3), (1,)).min_max == (0, 3)


def test_row_expand() -> None:
  x = mov(Ops.EXPAND, mov(Ops.RESHAPE, var("v", -1, 1), (1, 1)), (4, 5))
  assert props(x) == (i32, (4, 5), None, AddrSpace.REG, (-1, 1), None)


def test_row_pad() -> None:
  x = mov(Ops.PAD, buf((2, 3), f32, "CPU"), (1, 0), (4, 5))
  assert props(x) == (f32, (4, 5), "CPU", AddrSpace.GLOBAL, FULL_F32, None)


def test_row_shrink() -> None:
  v = mov(Ops.EXPAND, mov(Ops.RESHAPE, var("v", 3, 4), (1,)), (9,))
  x = mov(Ops.SHRINK, v, (2,), (5,))
  assert props(x) == (i32, (5,), None, AddrSpace.REG, (3, 4), None)


def test_row_index() -> None:
  b = buf((4, 5, 6), f32, "CPU")
  i = var("i", 0, 3, idx)
  want = (f32, (5, 6), "CPU", AddrSpace.GLOBAL, FULL_F32, None)
  assert props(UOp(Ops.INDEX, f32, (b, i))) == want
  assert UOp(Ops.INDEX, f32, (b, i, i)).shape == (6,)
  k = mov(Ops.EXPAND, mov(Ops.RESHAPE, i, (1,)), (7,))  # a (7,)-shaped index makes the dim 7
  assert UOp(Ops.INDEX, f32, (b, k)).shape == (7, 5, 6)
  assert UOp(Ops.INDEX, f32, (b, i, k, i)).shape == (7,)
  vals = mov(Ops.EXPAND, mov(Ops.RESHAPE, var("v", 2, 3), (1,)), (4,))
  assert UOp(Ops.INDEX, i32, (vals, i)).min_max == (2, 3)


def test_row_stack() -> None:
  a, b = var("a", 0, 3), var("b", -2, 1)
  s = UOp(Ops.STACK, i32, (a, b, a))
  assert props(s) == (i32, (3,), None, AddrSpace.REG, (-2, 3), None)
  rows = UOp(Ops.STACK, f32, (buf((2, 2), slot=0), buf((2, 2), slot=1)))
  assert rows.shape == (2, 2, 2) and rows.device == "CPU"


def test_row_replicated() -> None:
  x = mov(Ops.EXPAND, mov(Ops.RESHAPE, var("v", 1, 2), (1, 3)), (4, 3))
  r = UOp(Ops.REPLICATED, i32, (x,), (0,))
  assert props(r) == (i32, (1, 3), None, AddrSpace.REG, (1, 2), None)


# ---- reduce, cast, bitcast, copy ----

def test_row_reduce() -> None:
  x = mov(Ops.EXPAND, mov(Ops.RESHAPE, var("v", 1, 2), (1, 1, 1)), (2, 3, 4))
  r = reduce(x, Ops.ADD, (0, 2))
  assert props(r) == (i32, (1, 3, 1), None, AddrSpace.REG, FULL_I32, None)
  assert reduce(buf((5, 6), f32, "CPU"), Ops.MAX, (1,)).shape == (5, 1)
  assert reduce(buf((5, 6), f32, "CPU"), Ops.MAX, (1,)).device == "CPU"


def test_row_cast() -> None:
  v = var("v", -5, 300)
  assert props(v.cast(dtypes.int64)) == (dtypes.int64, (), None, AddrSpace.REG, (-5, 300), None)
  assert v.cast(dtypes.uint8).min_max == (0, 255)  # wraps: no narrower interval is sound
  assert var("w", 1, 200).cast(dtypes.uint8).min_max == (1, 200)
  assert v.cast(f32).min_max == (-5.0, 300.0) and type(v.cast(f32).vmin) is float
  assert var("big", 0, 100_000).cast(dtypes.float16).min_max == (0.0, math.inf)  # clamped
  assert v.cast(dtypes.bool).min_max == (False, True)
  assert var("p", 1, 3).cast(dtypes.bool).min_max == (True, True)
  assert c(0).cast(dtypes.bool).min_max == (False, False)
  assert (v < 0).cast(i32).min_max == (0, 1)
  assert buf((3,), f32, "CPU").cast(i32).min_max == FULL_I32
  cast = mov(Ops.RESHAPE, buf((6,), f32, "CPU"), (2, 3)).cast(dtypes.float16)
  assert (cast.dtype, cast.shape, cast.device) == (dtypes.float16, (2, 3), "CPU")


def test_row_bitcast() -> None:
  b = UOp(Ops.BITCAST, i32, (buf((4,), f32, "CPU"),))
  assert props(b) == (i32, (4,), "CPU", AddrSpace.REG, FULL_I32, None)
  assert UOp(Ops.BITCAST, dtypes.uint16, (var("v", 0, 3, dtypes.int16),)).min_max == (0, 65535)
  half = UOp(Ops.BITCAST, dtypes.float16, (buf((4,), f32, "CPU"),))
  assert half.shape == (8,)  # total bytes are preserved: the last axis scales


def test_row_copy() -> None:
  x = mov(Ops.RESHAPE, var("v", 0, 9), (1,))
  cp = UOp(Ops.COPY, i32, (x,), "CUDA")
  assert props(cp) == (i32, (1,), "CUDA", AddrSpace.GLOBAL, (0, 9), None)
  assert UOp(Ops.COPY, f32, (buf((4,), f32, "CPU"),), D2).axis == 0  # to n devices: axis 0


# ---- elementwise ----

def test_row_alu_unary() -> None:
  x = buf((2, 3), f32, "CPU")
  r = UOp(Ops.RECIP, f32, (x,))
  assert props(r) == (f32, (2, 3), "CPU", AddrSpace.REG, FULL_F32, None)
  assert UOp(Ops.TRUNC, i32, (var("v", 0, 3),)).min_max == FULL_I32
  assert (-var("v", 1, 3)).min_max == (-3, -1)  # NEG is MUL by -1


def test_row_add() -> None:
  a, b = var("a", -2, 5), var("b", 10, 20)
  assert props(a + b) == (i32, (), None, AddrSpace.REG, (8, 25), None)
  assert (var("big", 0, i32.max) + 1).min_max == FULL_I32  # may wrap: dtype range
  x = buf((4, 1), f32, "CPU") + mov(Ops.RESHAPE, buf((3,), f32, "CUDA", slot=1), (1, 3))
  assert (x.dtype, x.shape, x.device) == (f32, (4, 3), "CPU") and x.min_max == FULL_F32
  bad = buf((4,), f32) + buf((3,), f32, slot=1)
  with pytest.raises(ValueError, match="broadcast"): _ = bad.shape


def test_row_mul() -> None:
  assert (var("a", -2, 3) * var("b", -5, 4)).min_max == (-15, 12)
  assert (var("a", 2, 3) * c(0)).min_max == (0, 0)
  assert (var("a", -2, -1) * var("b", -5, -4)).min_max == (4, 10)
  big = var("big", 0, 2 ** 20) * var("b", 0, 2 ** 20)
  assert big.min_max == FULL_I32


def test_row_max() -> None:
  assert var("a", -2, 3).maximum(var("b", 0, 1)).min_max == (0, 3)
  assert var("a", -9, -2).maximum(var("b", -5, -4)).min_max == (-5, -2)
  m = buf((2,), f32, "CPU").maximum(c(0.0, f32))
  assert (m.dtype, m.shape, m.device, m.min_max) == (f32, (2,), "CPU", FULL_F32)


def test_row_other_binary() -> None:
  a, b = var("a", 0, 3), var("b", 0, 3)
  for x in (a ^ b, a | b, a << b, UOp(Ops.POW, i32, (a, b))):
    assert props(x) == (i32, (), None, AddrSpace.REG, FULL_I32, None), x.op
  assert (a - b).min_max == (-3, 3)  # SUB gets a tighter (sound) bound
  assert (var("x", 0, 99) // 10).min_max == (0, 9) and (var("x", -7, 7) % 4).min_max == (0, 3)
  assert (var("x", 8, 11) % 4).min_max == (0, 3) and (var("x", 8, 10) % 4).min_max == (0, 2)
  assert (var("x", 1, 3) & 4).min_max == (0, 3) and (var("x", 0, 200) & 255).min_max == (0, 200)
  assert (var("x", 16, 64) >> 2).min_max == (4, 16) and (c(6) & 3).min_max == (2, 2)
  assert (var("x", 0, 9) // var("y", 1, 3)).min_max == FULL_I32  # non-constant divisor


def test_row_cmplt_cmpne() -> None:
  a = var("a", 0, 3)
  assert props(a < 4) == (dtypes.bool, (), None, AddrSpace.REG, (True, True), None)
  assert (a < 0).min_max == (False, False) and (a < 2).min_max == (False, True)
  assert a.ne(4).min_max == (True, True) and c(2).ne(c(2)).min_max == (False, False)
  assert a.ne(2).min_max == (False, True)
  assert (a > 3).min_max == (False, False) and (a >= 0).min_max == (True, True)
  assert (a <= 2).min_max == (False, True) and a.eq(9).min_max == (False, False)
  assert (buf((2,), f32, "CPU") < 1.0).shape == (2,) and (buf((2,), f32) < 1.0).device == "CPU"
  vec = UOp(Ops.CMPLT, None, (UOp(Ops.STACK, f32, (c(1.0, f32),) * 4).cast(f32.vec(4)),) * 2)
  assert vec.dtype == dtypes.bool.vec(4) and (vec.src[0] < vec.src[0]) is vec  # operators too


def test_row_where() -> None:
  cond = var("a", 0, 5) < 3
  w = cond.where(var("b", 0, 2), var("c", 10, 20))
  assert props(w) == (i32, (), None, AddrSpace.REG, (0, 20), None)
  assert (var("a", 0, 5) < 9).where(var("b", 0, 2), c(7)).min_max == (0, 2)  # decided condition
  valid = cond.where(var("i", 4, 6, idx), c(Invalid, idx))
  assert valid.min_max == (4, 6)  # the invalid branch holds no value
  x = buf((2, 1), dtypes.bool, "CPU").where(c(1.5, f32), buf((3,), f32, "CUDA", slot=1))
  assert (x.dtype, x.shape, x.device) == (f32, (2, 3), "CPU")


# ---- calls ----

def test_row_function_gettuple() -> None:
  n = UOp(Ops.PARAM, idx, (shape_uop(()), c(1, idx), c(16, idx)), ParamArg(1, idx, None,
                                                                          AddrSpace.REG, "n"))
  p0 = UOp(Ops.PARAM, f32, (shape_uop((n, 2)),), ParamArg(0, f32))
  body = UOp(Ops.TUPLE, dtypes.void, (p0 * 2.0, (p0 < 1.0)))
  fn = UOp(Ops.FUNCTION, None, (body, buf((8, 2), f32, "CPU"), c(8, idx)))
  assert props(fn)[:3] == (dtypes.void, None, "CPU") and fn.min_max == FULL_F32
  g0 = UOp(Ops.GETTUPLE, None, (fn,), 0)
  assert props(g0) == (f32, (8, 2), "CPU", AddrSpace.REG, FULL_F32, None)
  g1 = UOp(Ops.GETTUPLE, None, (fn,), 1)
  assert g1.dtype is dtypes.bool and g1.shape == (8, 2)
  m = UOp.variable("m", 1, 8)
  g_sym = UOp(Ops.GETTUPLE, None, (fn.replace(src=(body, fn.src[1], m)),), 0)
  assert g_sym.shape == (m, 2)  # the argument replaces PARAM n: now the caller's variable
  p2 = UOp(Ops.PARAM, f32, (shape_uop((n * 2,)),), ParamArg(0, f32))
  fn2 = UOp(Ops.FUNCTION, None, (UOp(Ops.TUPLE, dtypes.void, (p2,)), buf((10,), f32), c(5, idx)))
  assert UOp(Ops.GETTUPLE, None, (fn2,), 0).shape == (10,)
  assert UOp(Ops.GETTUPLE, None, (body,), 1).shape == (n, 2)  # a bare TUPLE: nothing replaced
  with pytest.raises(ValueError): UOp(Ops.GETTUPLE, None, (fn,), 2)


def test_row_call() -> None:
  kernel = UOp.sink(UOp(Ops.STORE, dtypes.void, (param((4,), 0), param((4,), 1))))
  call = UOp(Ops.CALL, None, (kernel, buf((4,), f32, "CUDA"), buf((4,), f32, "CUDA", slot=1)))
  assert (call.dtype, call.device, call.min_max, call.axis) == (dtypes.void, "CUDA", FULL_F32, None)
  body = UOp(Ops.TUPLE, dtypes.void, (param((3,), 0),))
  call2 = UOp(Ops.CALL, None, (body, c(1.0, f32), buf((3,), f32, "CPU")))
  assert call2.device == "CPU"  # the first argument with a device


# ---- ordering ----

def test_row_range() -> None:
  r = UOp.range(10, 0)
  assert props(r) == (idx, (), None, AddrSpace.REG, (0, 9), None) and r.arg == RangeArg(0)
  assert UOp.range(UOp.variable("n", 1, 8), 1).min_max == (0, 7)
  assert UOp.range(1, 2).min_max == (0, 0)


def test_row_store() -> None:
  b = buf((4,), f32, "CPU", space=AddrSpace.LOCAL)
  s = UOp(Ops.STORE, None, (b, buf((4,), f32, "CPU", slot=1)))
  assert (s.dtype, s.shape, s.device, s.addrspace) == (dtypes.void, (), "CPU", AddrSpace.LOCAL)


def test_row_after() -> None:
  b = buf((4,), i32, "CPU")
  s = UOp(Ops.STORE, None, (b, buf((4,), i32, "CPU", slot=1)))
  a = UOp(Ops.AFTER, None, (b, s))
  assert props(a) == props(b)
  assert UOp(Ops.AFTER, None, (var("v", 2, 4), s)).min_max == (2, 4)


def test_marker_ops_pass_through() -> None:
  b = buf((4,), i32, D2)
  for op in (Ops.CONTIGUOUS, Ops.CONTIGUOUSBACKWARD, Ops.DETACH):
    assert props(UOp(op, None, (b,))) == props(b), op


def test_load_arg() -> None:
  i = UOp(Ops.INDEX, f32, (param((4,), 0, device="CPU"), var("i", 0, 3, idx)))
  assert (i.dtype, i.shape, i.device) == (f32, (), "CPU")
  assert UOp(Ops.LOAD, None, (i,)).addrspace is AddrSpace.REG
  assert UOp(Ops.LOAD, None, (i,), AddrSpace.LOCAL).addrspace is AddrSpace.LOCAL
  ld = UOp(Ops.LOAD, None, (i,), ("CUDA", AddrSpace.GLOBAL))
  assert (ld.device, ld.addrspace, ld.dtype) == ("CUDA", AddrSpace.GLOBAL, f32)


# ---- axis ----

def test_axis_buffer_on_devices() -> None:
  assert buf((8, 2), f32, D2).axis == 0 and buf((8, 2), f32, "CPU").axis is None


@pytest.mark.parametrize("new,axis", [((2, 2, 6), 0), ((24,), 0), ((1, 24), 1), ((8, 3), 0),
                                      ((2, 12), 0), ((4, 6, 1), 0), ((1, 4, 3, 2), 1)])
def test_axis_reshape_remaps(new: tuple, axis: int) -> None:
  assert mov(Ops.RESHAPE, buf((4, 6), f32, D2), new).axis == axis


def test_axis_reshape_breaking_shard_raises() -> None:
  bad = mov(Ops.RESHAPE, buf((4, 6), f32, D2), (3, 8))
  with pytest.raises(ValueError, match="shard"): _ = bad.axis
  inner = UOp(Ops.PERMUTE, f32, (buf((6, 4), f32, D2),), (1, 0))  # sharded on axis 1 now
  assert inner.axis == 1
  assert mov(Ops.RESHAPE, inner, (4, 2, 3)).axis == 1
  with pytest.raises(ValueError): _ = mov(Ops.RESHAPE, inner, (24,)).axis


def test_axis_permute_follows() -> None:
  b = buf((2, 3, 4), f32, D2)
  assert UOp(Ops.PERMUTE, f32, (b,), (1, 2, 0)).axis == 2
  assert UOp(Ops.PERMUTE, f32, (b,), (0, 2, 1)).axis == 0


def test_axis_reduce_and_replicated() -> None:
  b = buf((4, 6), f32, D2)
  assert reduce(b, Ops.ADD, (0,)).axis is None and reduce(b, Ops.ADD, (1,)).axis == 0
  assert UOp(Ops.REPLICATED, f32, (b,), (0,)).axis is None
  assert UOp(Ops.REPLICATED, f32, (b,), (1,)).axis == 0


def test_axis_copy_alu_and_default() -> None:
  b = buf((4, 6), f32, D2)
  assert UOp(Ops.COPY, f32, (b,), "CPU:0").axis is None and (b * 2.0).axis == 0
  assert (c(1.0, f32) + b).axis == 0 and b.cast(i32).axis == 0
  assert mov(Ops.PAD, b, (0, 1), (4, 8)).axis == 0 and UOp(Ops.STACK, f32, (b, b)).axis == 1
  assert UOp(Ops.INDEX, f32, (UOp(Ops.PERMUTE, f32, (b,), (1, 0)), var("i", 0, 5, idx))).axis == 0
  assert UOp(Ops.INDEX, f32, (b, var("i", 0, 3, idx))).axis is None  # the shard axis is indexed
  assert UOp(Ops.SINK, None, (b,)).axis is None


def test_axis_reduce_scatter_example() -> None:
  n, s = 2, 4
  t = buf((n * s,), f32, "CPU")
  x = UOp(Ops.PERMUTE, f32, (mov(Ops.RESHAPE, t, (n, n, s // n)),), (1, 0, 2))
  x = reduce(UOp(Ops.COPY, f32, (x,), D2), Ops.ADD, (1,))
  out = mov(Ops.RESHAPE, x, (s,))
  assert (out.shape, out.device, out.axis) == ((s,), D2, 0)


# ---- min_max is sound: every value the op can produce lies inside ----

INT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHR,
           Ops.SHL, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.CMPGT, Ops.CMPGE, Ops.CMPLE]
RANGES = [(-3, -3), (0, 0), (4, 4), (0, 3), (1, 3), (-5, 2), (5, 9), (120, 127), (-128, -120)]


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, idx])
@pytest.mark.parametrize("op", INT_OPS)
def test_min_max_sound(op: Ops, dt: DType) -> None:
  ranges = [(lo, hi) for lo, hi in RANGES if dt.min <= lo and hi <= dt.max]
  out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.CMPGT, Ops.CMPGE,
                                 Ops.CMPLE) else dt
  for (alo, ahi), (blo, bhi) in itertools.product(ranges, repeat=2):
    if op in (Ops.SHL, Ops.SHR) and blo < 0: continue
    u = UOp(op, out_dt, (var("a", alo, ahi, dt), var("b", blo, bhi, dt)))
    lo, hi = u.min_max
    for a, b in itertools.product(range(alo, ahi + 1), range(blo, bhi + 1)):
      v = exec_alu(op, out_dt, (a, b))
      assert lo <= v <= hi, (op, dt, (alo, ahi), (blo, bhi), a, b, v, (lo, hi))
