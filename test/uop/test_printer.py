"""printer.py: repr rebuilds the same object and shows shared nodes once; render reads well."""
import math

import pytest

import unigrad.uop as U
from unigrad.dtype import AddrSpace, dtypes
from unigrad.uop import (AxisType, CallInfo, Invalid, KernelInfo, Ops, ParamArg, ReduceArg, UOp,
                         shape_uop)
from unigrad.uop.printer import arg_repr, pyrender

f32, i32, idx = dtypes.float32, dtypes.int32, dtypes.index


def rebuilt(u: UOp) -> UOp: return eval(repr(u), dict(vars(U)))


def c(v: object, dt=i32) -> UOp: return UOp.const(dt, v)


def buf(shape: tuple, slot: int = 0) -> UOp:
  return UOp(Ops.BUFFER, f32, (shape_uop(shape),), ParamArg(slot, f32, "CPU"))


def graphs() -> list[UOp]:
  a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 3, i32)
  r0, r1 = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  x = buf((4, 8))
  return [
    c(1), c(1.0, f32), c(True, dtypes.bool), c(-0.0, f32), c(0.0, f32), c(math.inf, f32),
    c(-math.inf, f32), c(math.nan, f32), c(Invalid, idx), c(2 ** 62, dtypes.int64),
    c(0.1, f32) + c(float.fromhex("0x1.fffffep+127"), f32), c(1e-45, f32), c(300, dtypes.uint16),
    a, b, a * 4 + a, (b < 2).where(b, c(0)), b.cast(f32).bitcast(i32),
    r0 * 8 + r1, UOp(Ops.REDUCE, idx, (r0 * 8 + r1, r1), ReduceArg(Ops.ADD)),
    UOp(Ops.REDUCE, f32, (x,), ReduceArg(Ops.MAX, (0, 1))),
    UOp(Ops.PERMUTE, f32, (x,), (1, 0)), UOp(Ops.FLIP, f32, (x,), (True, False)),
    UOp(Ops.VCONST, f32, arg=(1.0, -0.0, math.nan, math.inf)), UOp(Ops.VCONST, idx, arg=(3,)),
    UOp(Ops.BINARY, dtypes.uint8, arg=b"\x00\x01"), UOp(Ops.SINK, dtypes.void, (x,), KernelInfo()),
    UOp(Ops.COPY, f32, (x,), ("CPU:0", "CPU:1")), UOp(Ops.CAST, f32.vec(4), (c(1.0, f32),)),
    UOp(Ops.FUNCTION, dtypes.void, (UOp(Ops.TUPLE, dtypes.void, (x,)), x), CallInfo("g")),
    UOp(Ops.PARAM, f32.ptr(AddrSpace.LOCAL, 16), (shape_uop(()),), ParamArg(3, f32, None,
                                                                           AddrSpace.LOCAL)),
    UOp(Ops.SINK, dtypes.void, (a,), tag=("t", 1.5)), UOp(Ops.SINK, dtypes.void, (a,), tag=1),
    UOp(Ops.SINK, dtypes.void, (a,), tag=True),
  ]


@pytest.mark.parametrize("i", range(len(graphs())))
def test_repr_rebuilds_same_object(i: int) -> None:
  u = graphs()[i]
  assert rebuilt(u) is u


def test_repr_in_module_namespace() -> None:
  u = UOp.variable("a", 0, 10) * 3 + 1
  assert eval(repr(u), vars(U)) is u  # the documented form, walrus names land in the module


def test_shared_nodes_printed_once() -> None:
  a = UOp.variable("a", 0, 10)
  x = a * 3
  y = (x + x) * x
  text = repr(y)
  assert text.count("Ops.PARAM") == 1 and text.count("Ops.MUL") == 2
  name = next(line.split(":=")[0].strip() for line in text.splitlines() if ":=" in line
              and "Ops.MUL" in line)
  assert text.count(f"{name}:=") == 1 and text.count(f"{name},") == 2
  assert rebuilt(y) is y


def test_unshared_graph_has_no_names() -> None:
  u = UOp(Ops.ADD, i32, (c(1), c(2)))
  assert ":=" not in repr(u) and repr(u).startswith("UOp(Ops.ADD, dtypes.int, src=(")


def test_repr_shows_fields() -> None:
  r = UOp.range(4, 7, AxisType.UPCAST)
  text = repr(r)
  assert "RangeArg(id=7, axis_type=AxisType.UPCAST)" in text and "arg=4" in text
  assert "tag=" not in text and "tag='x'" in repr(r.replace(tag="x"))


def test_arg_repr() -> None:
  assert arg_repr(math.inf) == "float('inf')" and arg_repr(-math.inf) == "float('-inf')"
  assert arg_repr(math.nan) == "float('nan')" and arg_repr(-0.0) == "-0.0"
  assert arg_repr((1,)) == "(1,)" and arg_repr(()) == "()" and arg_repr((math.inf, 2)) == \
    "(float('inf'), 2)"


def test_deep_graph_repr_rebuilds() -> None:
  x = UOp.variable("d", 0, 3)
  shared = c(5, idx)
  for i in range(500): x = x * 2 + shared if i % 2 else x + x
  text = pyrender(x)
  assert text.startswith("(") and text.endswith(")[-1]")
  assert rebuilt(x) is x


def test_render_expressions() -> None:
  r0, r1 = UOp.range(4, 0), UOp.range(8, 1)
  assert (r0 * 4 + r1).render() == "((r0*4)+r1)"
  a = UOp.variable("a", 0, 10)
  assert (a // 2).render() == "(a//2)" and (a % 3).render() == "(a%3)"
  assert (a < 3).render(simplify=False) == "(a<3)" and a.maximum(c(2, idx)).render() == "max(a, 2)"
  assert ((a < 3).where(a, c(0, idx))).render(simplify=False) == "(a if (a<3) else 0)"
  assert (a + 0).render() == "a" and (a + 0).render(simplify=False) == "(a+0)"
  assert c(2, idx).cast(i32).render(simplify=False) == "(int)2"
  assert UOp(Ops.PARAM, f32, (shape_uop(()),), ParamArg(2, f32)).render() == "param2"
  assert UOp(Ops.INDEX, f32, (buf((4,)), a)).render(simplify=False) == "buf0[a]"
  assert UOp(Ops.RECIP, f32, (c(2.0, f32),)).render(simplify=False) == "recip(2.0)"
  assert c(Invalid, idx).render() == "Invalid" and c(math.inf, f32).render() == "inf"


def test_render_custom_pm() -> None:
  class Upper:
    def rewrite(self, u: UOp, ctx: dict) -> str | None:
      return ctx[u.src[0]].upper() if u.op is Ops.SQRT else None
  x = UOp.variable("x", 0, 4, f32)
  assert x.sqrt().render(simplify=False, pm=Upper()) == "X"
