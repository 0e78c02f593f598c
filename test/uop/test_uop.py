"""uop.py: hash-consing, the weak cache, single-node operations, operators and traversal (002)."""
import gc
import math
import weakref

import pytest

from unigrad.uop import (AxisType, Invalid, Ops, ParamArg, RangeArg, UOp, all_metadata,
                         consumer_map_from_toposort, dtypes, shape_uop)
from unigrad import uop as uop_package
from unigrad.uop import uop as uop_module

idx = dtypes.index


def c(v: object, dt=dtypes.int32) -> UOp: return UOp.const(dt, v)


def live_cache_size() -> int:
  gc.collect()
  return len(uop_module._ucache)


# ---- hash-consing ----

def test_same_fields_same_object() -> None:
  a = UOp.variable("a", 0, 10)
  assert UOp(Ops.ADD, idx, (a, c(1, idx))) is UOp(Ops.ADD, idx, (a, c(1, idx)))
  assert a + 1 is a + 1 and UOp.variable("a", 0, 10) is a
  assert UOp.variable("a", 0, 11) is not a and UOp.variable("b", 0, 10) is not a
  assert UOp(Ops.ADD, idx, [a, a]) is UOp(Ops.ADD, idx, (a, a))  # any iterable of sources
  assert UOp(Ops.SINK, dtypes.void, (a,), tag=1) is not UOp(Ops.SINK, dtypes.void, (a,))


def test_int_float_bool_args_distinct() -> None:
  one_i = UOp(Ops.CONST, dtypes.int32, arg=1)
  one_f = UOp(Ops.CONST, dtypes.int32, arg=1.0)
  one_b = UOp(Ops.CONST, dtypes.int32, arg=True)
  assert len({id(one_i), id(one_f), id(one_b)}) == 3
  assert type(one_i.arg) is int and type(one_f.arg) is float and type(one_b.arg) is bool
  t1 = UOp(Ops.VCONST, idx, arg=(1, 0))
  assert UOp(Ops.VCONST, idx, arg=(True, False)) is not t1  # also inside tuples
  assert UOp(Ops.VCONST, idx, arg=(1, 0)) is t1
  # a tuple of plain ints is keyed as it is (the fast path for shapes): still apart from floats,
  # bools and int subclasses, at any depth
  assert UOp(Ops.VCONST, idx, arg=(1.0, 0.0)) is not t1 and shape_uop((1, 0)) is t1
  nested = UOp(Ops.CUSTOM, idx, arg=((1, 2), 3))
  assert UOp(Ops.CUSTOM, idx, arg=((1.0, 2), 3)) is not nested
  assert UOp(Ops.CUSTOM, idx, arg=((1, 2), True)) is not nested
  assert UOp(Ops.CUSTOM, idx, arg=((1, 2), 3)) is nested
  assert UOp(Ops.CUSTOM, idx, arg=()) is UOp(Ops.CUSTOM, idx, arg=())


def test_signed_zero_and_nan() -> None:
  z, nz = c(0.0, dtypes.float32), c(-0.0, dtypes.float32)
  assert z is not nz and math.copysign(1, nz.arg) == -1
  assert c(math.nan, dtypes.float32) is c(float("nan"), dtypes.float32)
  assert c(math.nan, dtypes.float32) is c(-math.nan, dtypes.float32)
  v1 = UOp(Ops.VCONST, dtypes.float32, arg=(0.0, math.nan))
  assert UOp(Ops.VCONST, dtypes.float32, arg=(0.0, float("nan"))) is v1
  assert UOp(Ops.VCONST, dtypes.float32, arg=(-0.0, math.nan)) is not v1


def test_const_constructor() -> None:
  assert c(1, dtypes.float32) is c(1.0, dtypes.float32) and c(1, dtypes.float32).arg == 1.0
  assert c(300, dtypes.uint8).arg == 44 and c(-1, dtypes.uint32).arg == 2 ** 32 - 1
  assert c(2, dtypes.bool).arg is True
  assert c(0.1, dtypes.float32).arg == float.fromhex("0x1.99999ap-4")
  assert c(Invalid, idx).arg is Invalid and c(a := UOp.variable("a", 0, 3), idx) is a
  v = UOp.const(dtypes.float32.vec(3), 2.0)
  assert v.op is Ops.STACK and v.shape == (3,) and all(s is c(2.0, dtypes.float32) for s in v.src)
  assert c(5, idx).shape == () and c(5, idx).dtype is idx
  with pytest.raises(TypeError): UOp.const(dtypes.void, 1)


def test_variable() -> None:
  v = UOp.variable("n", 1, 8)
  assert v.op is Ops.PARAM and v.dtype is idx and v.arg.name == "n" and v.arg.slot == -1
  assert v.min_max == (1, 8) and v.shape == () and v.render() == "n"
  w = UOp.variable("w", -2, 2, dtypes.int32)
  assert w.dtype is dtypes.int32 and w.src[1].dtype is dtypes.int32 and w.vmin == -2
  with pytest.raises(ValueError): UOp.variable("bad", 3, 1)
  with pytest.raises(TypeError): UOp.variable("", 0, 1)


def test_sink_and_range() -> None:
  a, b = UOp.variable("a", 0, 3), UOp.variable("b", 0, 3)
  s = UOp.sink(a, b)
  assert s.op is Ops.SINK and s.dtype is dtypes.void and s.src == (a, b) and a.sink(b) is s
  r = UOp.range(16, 0)
  assert r.op is Ops.RANGE and r.dtype is idx and r.arg == RangeArg(0, AxisType.LOOP)
  assert r.src == (c(16, idx),) and r.min_max == (0, 15)
  r2 = UOp.range(a, 1, AxisType.REDUCE)
  assert r2.src == (a,) and r2.arg.axis_type is AxisType.REDUCE and r2.vmax == 2
  with pytest.raises(TypeError): UOp.range(2.0, 0)  # type: ignore[arg-type]


# ---- the weak cache ----

def test_cache_frees_unreferenced_nodes() -> None:
  base = live_cache_size()
  x = UOp.variable("cache_test", 0, 10)
  for i in range(500): x = x * 3 + i
  assert live_cache_size() >= base + 1000
  probe = weakref.ref(x.src[0])
  del x
  assert live_cache_size() <= base and probe() is None


def test_cache_keeps_referenced_nodes() -> None:
  a = UOp.variable("keep", 0, 10)
  kept = a + 7
  ref = weakref.ref(kept)
  del kept
  gc.collect()
  assert ref() is None  # nobody held it
  kept = a + 7
  assert a + 7 is kept and (a + 7).src[0] is a


def test_fresh_node_is_the_node_uop_finds_and_leaves_the_cache_with_it() -> None:
  """fresh_node skips the cache lookup for a node that cannot exist yet (a new slot): it must
  still be the one node UOp(...) returns for those fields, and drop its entry when it dies."""
  arg, size, shape = ParamArg(10 ** 9, dtypes.float32, "CPU"), shape_uop((6,)), shape_uop((2, 3))
  base = live_cache_size()
  buf = uop_module.fresh_node(Ops.BUFFER, dtypes.float32, (size,), arg)
  view = uop_module.fresh_node(Ops.RESHAPE, dtypes.float32, (buf, shape))
  assert live_cache_size() == base + 2
  assert UOp(Ops.BUFFER, dtypes.float32, (size,), arg) is buf
  assert UOp(Ops.RESHAPE, dtypes.float32, (buf, shape)) is view
  assert view.shape == (2, 3) and buf.replace(arg=arg) is buf
  del buf, view
  assert live_cache_size() == base


def test_node_map_entries_live_as_long_as_their_nodes() -> None:
  """NodeMap keeps each value on its node: found again while the node lives, gone with it, and
  two maps never see each other's entries."""
  first, second = uop_package.NodeMap("first"), uop_package.NodeMap("second")
  a = UOp.variable("node_map", 0, 10)
  payload = type("Payload", (), {})()
  first[a] = payload
  assert a in first and first[a] is payload and first.get(a) is payload
  assert a not in second and second.get(a, "none") == "none"
  with pytest.raises(KeyError):
    second[a]
  probe = weakref.ref(payload)
  del a, payload
  gc.collect()
  assert probe() is None, "the value went with its node"
  b = UOp.variable("node_map", 0, 10)  # the same fields again: a new node, no entry
  assert b not in first


def test_rebuilt_after_free_is_equal() -> None:
  a = UOp.variable("reb", 0, 10)
  n1 = id(a * 5)
  gc.collect()
  assert (a * 5).op is Ops.MUL and isinstance(n1, int)


# ---- immutability ----

def test_fields_are_read_only() -> None:
  a = UOp.variable("imm", 0, 3)
  for field in ("op", "dtype", "src", "arg", "tag"):
    with pytest.raises(AttributeError, match="immutable"): setattr(a, field, None)
    with pytest.raises(AttributeError): delattr(a, field)
  assert a.op is Ops.PARAM and a.tag is None
  a.note = "free-form attributes still work"  # type: ignore[attr-defined]
  assert a.note.startswith("free")  # type: ignore[attr-defined]


# ---- single-node operations ----

def test_replace() -> None:
  a = UOp.variable("a", 0, 10)
  x = a + 1
  assert x.replace() is x and x.replace(src=x.src) is x and x.replace(op=Ops.ADD) is x
  assert x.replace(src=list(x.src)) is x and x.replace(arg=None) is x
  assert x.replace(op=Ops.MUL) is a * 1
  assert x.replace(tag="t").tag == "t" and x.replace(tag="t").replace(tag=None) is x
  assert x.replace(dtype=dtypes.int32).dtype is dtypes.int32
  with pytest.raises(TypeError, match="unknown"): x.replace(bogus=1)


def test_f_detach_cast_bitcast() -> None:
  x = c(1.5, dtypes.float32)
  assert x.f(Ops.RECIP) is UOp(Ops.RECIP, dtypes.float32, (x,))
  assert x.f(Ops.CAST, dtype=dtypes.int32) is UOp(Ops.CAST, dtypes.int32, (x,))
  assert x.f(Ops.REDUCE, arg=1).arg == 1
  assert x.detach() is UOp(Ops.DETACH, dtypes.float32, (x,))
  assert x.cast(dtypes.int32) is UOp(Ops.CAST, dtypes.int32, (x,)) and x.cast(dtypes.float32) is x
  assert x.bitcast(dtypes.int32) is UOp(Ops.BITCAST, dtypes.int32, (x,))
  assert x.bitcast(dtypes.float32) is x


# ---- operators ----

def test_operators_build_alu_nodes() -> None:
  a, b = UOp.variable("a", 0, 10, dtypes.int32), UOp.variable("b", 1, 5, dtypes.int32)
  two = c(2)

  def alu(op: Ops, *src: UOp) -> UOp: return UOp(op, dtypes.int32, src)
  assert a + b is alu(Ops.ADD, a, b) and a + 2 is alu(Ops.ADD, a, two)
  assert 2 + a is alu(Ops.ADD, two, a) and a * b is alu(Ops.MUL, a, b)
  assert 2 * a is alu(Ops.MUL, two, a)
  assert a // 2 is alu(Ops.IDIV, a, two) and a % 2 is alu(Ops.MOD, a, two)
  assert 7 // a is alu(Ops.IDIV, c(7), a) and 7 % a is alu(Ops.MOD, c(7), a)
  assert a - 2 is a + (-2) and a - b is a + b * -1 and 2 - a is a * -1 + 2
  assert a & b is alu(Ops.AND, a, b) and a | 2 is alu(Ops.OR, a, two)
  assert 2 & a is alu(Ops.AND, two, a)
  assert a ^ b is alu(Ops.XOR, a, b) and a << 2 is alu(Ops.SHL, a, two)
  assert a >> 2 is alu(Ops.SHR, a, two) and 2 << a is alu(Ops.SHL, two, a)
  assert 1 >> a is alu(Ops.SHR, c(1), a) and 2 | a is alu(Ops.OR, two, a)
  assert 2 ^ a is alu(Ops.XOR, two, a)
  assert -a is a * -1 and ~a is a ^ -1 and a.maximum(b) is alu(Ops.MAX, a, b)


def test_comparison_operators() -> None:
  a, b = UOp.variable("a", 0, 10, dtypes.int32), UOp.variable("b", 1, 5, dtypes.int32)
  lt = a < b
  assert lt is UOp(Ops.CMPLT, dtypes.bool, (a, b)) and lt.dtype is dtypes.bool
  assert (a > b) is UOp(Ops.CMPLT, dtypes.bool, (b, a))
  assert (a > 3) is UOp(Ops.CMPLT, dtypes.bool, (c(3), a))
  assert (a <= b) is (b < a).ne(True) and (a >= b) is (a < b).ne(True)
  assert a.ne(b) is UOp(Ops.CMPNE, dtypes.bool, (a, b)) and a.eq(b) is a.ne(b).ne(True)
  assert ~lt is lt.ne(True) and lt.logical_not() is lt.ne(True)
  w = lt.where(a, b)
  assert w is UOp(Ops.WHERE, dtypes.int32, (lt, a, b)) and lt.where(a, 0).src[2] is c(0)
  assert lt.where(1.5, 2.5).dtype is dtypes.float32
  assert a.minimum(b) is (a < b).where(a, b)
  assert (a == b) is False and (a != a) is False  # == is identity, never an ALU node


def test_float_operators() -> None:
  x = UOp.variable("x", 0, 4, dtypes.float32)
  assert x / 2 is x * 0.5 and x / x is x * x.recip() and 1 / x is x.recip() * 1
  assert (x / 0).src[1].arg == math.inf
  for fn, op in [(UOp.sqrt, Ops.SQRT), (UOp.exp2, Ops.EXP2), (UOp.log2, Ops.LOG2),
                 (UOp.sin, Ops.SIN), (UOp.recip, Ops.RECIP), (UOp.trunc, Ops.TRUNC)]:
    assert fn(x) is UOp(op, dtypes.float32, (x,))
  assert x.pow(2) is UOp(Ops.POW, dtypes.float32, (x, c(2.0, dtypes.float32)))
  i = UOp.variable("i", 0, 4)
  with pytest.raises(TypeError, match="//"): _ = i / 2
  with pytest.raises(TypeError, match="//"): _ = 2 / i


def test_truthiness() -> None:
  a = UOp.variable("a", 0, 10)
  assert bool(a < 11) is True and bool(a < 0) is False and bool(a)
  with pytest.raises(TypeError, match="symbolic"): bool(a < 5)


# ---- traversal ----

def diamond() -> tuple[UOp, ...]:
  a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
  x = a + b
  y = x * 2
  z = x * 3
  return a, b, x, y, z, UOp.sink(y, z)


def test_toposort_order() -> None:
  a, b, x, y, z, s = diamond()
  topo = list(s.toposort())
  assert topo[-1] is s and len(topo) == len(set(topo))
  pos = {u: i for i, u in enumerate(topo)}
  assert all(pos[src] < pos[u] for u in topo for src in u.src)  # sources first
  assert pos[y] < pos[z] and pos[a] < pos[b]  # sources in src order
  assert set(topo) >= {a, b, x, y, z} and isinstance(s.toposort(), dict)


def test_toposort_gate() -> None:
  a, b, x, y, z, s = diamond()
  only_below_y = UOp.variable("only_y", 0, 1)
  y2 = y + only_below_y
  s2 = UOp.sink(y2, z)
  topo = s2.toposort(lambda u: u is not y2)
  assert y2 not in topo and only_below_y not in topo and y not in topo  # gated with what's below
  assert x in topo and a in topo and z in topo  # shared nodes reached through z stay
  assert s2.toposort(lambda u: False) == {}
  assert list(s2.toposort(lambda u: True)) == list(s2.toposort())


def test_topovisit() -> None:
  a, b, x, y, z, s = diamond()
  calls: list[UOp] = []

  def count(u: UOp) -> int:
    calls.append(u)
    return 1 + sum(cache[src] for src in u.src)
  cache: dict[UOp, int] = {}
  total = s.topovisit(count, cache)
  assert total == cache[s] and cache[x] == 1 + cache[a] + cache[b]
  assert len(calls) == len(set(calls)) == len(s.toposort())
  calls.clear()
  assert s.topovisit(count, cache) == total and calls == []  # cached nodes are not revisited
  assert (y + 1).topovisit(count, cache) == cache[y] + cache[c(1, idx)] + 1
  assert y not in calls


def test_backward_slice() -> None:
  a, b, x, y, z, s = diamond()
  assert y in y.backward_slice_with_self and y not in y.backward_slice
  assert set(y.backward_slice) == set(y.toposort()) - {y} and x in y.backward_slice
  assert z not in y.backward_slice_with_self and list(y.backward_slice_with_self)[-1] is y
  assert a.backward_slice_with_self.keys() >= {a}
  assert y.op_in_backward_slice_with_self(Ops.MUL) and y.op_in_backward_slice_with_self(Ops.PARAM)
  assert y.op_in_backward_slice_with_self(Ops.SINK, Ops.VCONST)
  assert not y.op_in_backward_slice_with_self(Ops.SINK) and not a.op_in_backward_slice_with_self()


def test_consumer_maps() -> None:
  a, b, x, y, z, s = diamond()
  cm = s.get_consumer_map()
  assert list(cm[x]) == [y, z] and list(cm[y]) == [s] and cm[s] == {}
  assert set(cm) == set(s.toposort())
  assert consumer_map_from_toposort(s.toposort()) == cm
  doubled = a + a
  assert list(doubled.get_consumer_map()[a]) == [doubled]


def test_ranges() -> None:
  r0, r1 = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  e = r0 * 8 + r1
  assert list(r0.ranges) == [r0] and set(e.ranges) == {r0, r1}
  red = UOp(Ops.REDUCE, idx, (e, r1), arg=None)
  assert list(red.ranges) == [r0]
  end = UOp(Ops.END, dtypes.void, (UOp.sink(red), r0))
  assert end.ranges == {} and c(1, idx).ranges == {}
  inner = UOp.range(r0 + 1, 2)  # a range whose bound depends on another stays open on both
  assert set(inner.ranges) == {inner, r0}


def test_ranges_do_not_keep_nodes_alive() -> None:
  r = UOp.range(4, 99)
  assert list((r + 1).ranges) == [r] and list(r.ranges) == [r]
  ref = weakref.ref(r)
  del r
  assert ref() is None  # freed by reference counting: no cycle through a cached {r: None}


def test_all_metadata_is_weak() -> None:
  a = UOp.variable("meta", 0, 3) + 5
  all_metadata[a] = ("trace",)
  assert all_metadata[a] == ("trace",)
  n = len(all_metadata)
  del a
  gc.collect()
  assert len(all_metadata) == n - 1


# ---- bad input ----

def test_bad_input() -> None:
  a = UOp.variable("a", 0, 3)
  with pytest.raises(TypeError, match="source 1"): UOp(Ops.ADD, idx, (a, 1))  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="source 0"): UOp(Ops.ADD, None, ([1], a))  # type: ignore[list-item]
  with pytest.raises(TypeError, match="hashable"): UOp(Ops.CONST, idx, arg=[1])
  with pytest.raises(TypeError, match="hashable"): UOp(Ops.SINK, dtypes.void, (a,), tag={})
  with pytest.raises(TypeError, match="hashable"): UOp(Ops.VCONST, idx, arg=(1, [2]))
  with pytest.raises(ValueError, match="takes 2"): UOp(Ops.ADD, idx, (a,))
  with pytest.raises(ValueError, match="takes 3"): UOp(Ops.WHERE, idx, (a < 1, a))
  with pytest.raises(ValueError, match="takes 1"): UOp(Ops.RECIP, idx, (a, a))
  with pytest.raises(ValueError, match="takes 1"): UOp(Ops.CAST, dtypes.int32, ())
  with pytest.raises(TypeError, match="Ops member"): UOp("ADD", idx, (a, a))  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="Ops member"): UOp(1, None, ())  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="DType"): UOp(Ops.ADD, "int", (a, a))  # type: ignore[arg-type]
  with pytest.raises(TypeError): UOp(Ops.CONST, None, arg=1)  # CONST needs its dtype


# ---- 100k-node chains ----

def test_deep_chain_properties_and_free() -> None:
  base = live_cache_size()
  a = UOp.variable("deep", 0, 3)
  x = a
  for _ in range(100_000): x = x + 1
  assert x.shape == () and x.min_max == (100_000, 100_003) and x.device is None and x.axis is None
  assert len(x.toposort()) == 100_005 and len(x.backward_slice) == 100_004  # + 3 leaves, PARAM
  assert x.op_in_backward_slice_with_self(Ops.VCONST) and len(x.get_consumer_map()) == 100_005
  assert x.ranges == {}
  text = repr(x)
  assert text.count("Ops.ADD") == 100_000
  del x, text
  assert live_cache_size() <= base + 10


def test_deep_chain_eval_repr() -> None:
  x = UOp.variable("deep", 0, 3, dtypes.int32)
  for i in range(3000): x = x * 2 + i if i % 3 else x + x
  assert eval(repr(x), dict(vars(uop_package))) is x


def test_shape_uop() -> None:
  assert shape_uop((2, 3)).op is Ops.VCONST and shape_uop((2, 3)).arg == (2, 3)
  n = UOp.variable("n", 1, 4)
  s = shape_uop((2, n))
  assert s.op is Ops.STACK and s.src == (c(2, idx), n) and s.shape == (2,)
  assert ParamArg(0, dtypes.float32).device is None
