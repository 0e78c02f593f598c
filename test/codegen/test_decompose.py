"""The decomposition table (codegen/decompose.py): every rewritten op keeps its value.

Graphs are built on variables, rewritten with `pm_decompose(supported)`, and evaluated op by op
with `sym_infer` against the meaning of the original op (`unigrad.uop.alu`).
"""
from __future__ import annotations

import math
import random

import pytest

from unigrad.codegen.decompose import floordiv, pm_decompose, pm_decompose_ops, pm_exp, threefry2x32
from unigrad.dtype import DType, dtypes, truncate
from unigrad.uop import GroupOp, Ops, UOp, graph_rewrite, sym_infer
from unigrad.uop.alu import exec_alu
from unigrad.uop.alu import threefry2x32 as threefry_ref

LEAVES = frozenset({Ops.CONST, Ops.PARAM, Ops.VCONST})
PRIMITIVE = GroupOp.Primitive - {Ops.IDIV, Ops.MOD}
C_TARGET = PRIMITIVE | {Ops.CDIV, Ops.CMOD}
RAND = random.Random(99)


def ops_of(u: UOp) -> set[Ops]: return {x.op for x in u.toposort()}


def var(name: str, dt: DType) -> UOp:
  if dtypes.is_float(dt): return UOp.variable(name, -math.inf, math.inf, dt)
  return UOp.variable(name, dt.min, dt.max, dt)


# ---- threefry ----

def test_threefry_matches_alu() -> None:
  x, k = var("x", dtypes.uint64), var("k", dtypes.uint64)
  g = threefry2x32(x, k)
  assert ops_of(g) <= {Ops.ADD, Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.CAST} | LEAVES
  assert {u.dtype for u in g.toposort() if u.op in (Ops.ADD, Ops.XOR)} == {dtypes.uint32}
  pairs = [(0, 0), (2 ** 64 - 1, 2 ** 64 - 1), (1, 0), (0, 1 << 63)]
  pairs += [(RAND.getrandbits(64), RAND.getrandbits(64)) for _ in range(150)]
  for a, b in pairs: assert sym_infer(g, {x: a, k: b}) == threefry_ref(a, b), (a, b)


def test_threefry_rule() -> None:
  x, k = var("x", dtypes.uint64), var("k", dtypes.uint64)
  g = graph_rewrite(x.threefry(k), pm_decompose(PRIMITIVE))
  assert Ops.THREEFRY not in ops_of(g)
  assert sym_infer(g, {x: 12345, k: 678}) == threefry_ref(12345, 678)


# ---- floor division and modulo ----

def edge_values(dt: DType) -> list[int]:
  lo, hi = int(dt.min), int(dt.max)
  small = [0, 1, 2, 3, 5, 7, 8, 64, 100]
  vals = {lo, lo + 1, hi, hi - 1, *small, *(-v for v in small if lo < 0)}
  vals |= {RAND.randint(lo, hi) for _ in range(6)}
  return sorted(v for v in vals if lo <= v <= hi)


def python_divmod(op: Ops, dt: DType, a: int, b: int) -> int:
  """Python's floor // and %, with x//0 = x%0 = 0 (unigrad.uop.alu), wrapped to dt."""
  if b == 0: return 0
  return truncate(dt, a // b if op is Ops.IDIV else a % b)


INT_DTYPES = [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32]


@pytest.mark.parametrize("dt", INT_DTYPES)
@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD])
def test_floor_divmod_variables(dt: DType, op: Ops) -> None:
  a, b = var("a", dt), var("b", dt)
  g = graph_rewrite(UOp(op, dt, (a, b)), pm_decompose(C_TARGET))
  assert ops_of(g) <= C_TARGET | LEAVES and op not in ops_of(g)
  vals = edge_values(dt)
  for x in vals:
    for y in vals: assert sym_infer(g, {a: x, b: y}) == python_divmod(op, dt, x, y), (x, y)


@pytest.mark.parametrize("dt", INT_DTYPES)
@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD])
@pytest.mark.parametrize("d", [1, 2, 8, 64, 3, 7, 10, -1, -3, -8])
def test_floor_divmod_constants(dt: DType, op: Ops, d: int) -> None:
  if d < 0 and dtypes.is_unsigned(dt): pytest.skip("negative divisor of an unsigned type")
  a = var("a", dt)
  g = graph_rewrite(UOp(op, dt, (a, UOp.const(dt, d))), pm_decompose(C_TARGET))
  if d > 0 and d & (d - 1) == 0: assert not ops_of(g) & {Ops.CDIV, Ops.CMOD}  # shift and mask
  for x in edge_values(dt): assert sym_infer(g, {a: x}) == python_divmod(op, dt, x, d), x


def test_floor_divmod_nonnegative_is_truncating() -> None:
  a, b = UOp.variable("a", 0, 100, dtypes.int32), UOp.variable("b", 1, 9, dtypes.int32)
  assert floordiv(a // b, a, b) is UOp(Ops.CDIV, dtypes.int32, (a, b))
  g = graph_rewrite(a.alu(Ops.MOD, UOp.const(dtypes.int32, 6)), pm_decompose(C_TARGET))
  assert g is UOp(Ops.CMOD, dtypes.int32, (a, UOp.const(dtypes.int32, 6)))


def test_floor_divmod_index_dtype() -> None:
  a = UOp.variable("i", -50, 50)
  g = graph_rewrite(a // 4 + a % 4, pm_decompose(C_TARGET))
  assert {Ops.SHR, Ops.AND} <= ops_of(g)
  for x in range(-50, 51): assert sym_infer(g, {a: x}) == x // 4 + x % 4


# ---- the spec table's other rows ----

BINARY = [Ops.SUB, Ops.DIV, Ops.CMPGT, Ops.CMPGE, Ops.CMPLE, Ops.CMPEQ]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.uint8])
def test_binary_rows(op: Ops, dt: DType) -> None:
  if op is Ops.DIV and not dtypes.is_float(dt): pytest.skip("DIV is float division")
  a, b = var("a", dt), var("b", dt)
  node = UOp(op, dtypes.bool if op in GroupOp.Comparison else dt, (a, b))
  g = graph_rewrite(node, pm_decompose(PRIMITIVE))
  assert ops_of(g) <= PRIMITIVE | LEAVES
  vals = [0, 1, 2, 3, 7, 200] + ([-1.5, -0.0, 0.25, 1e30] if dtypes.is_float(dt) else [])
  vals += [-3, -128] if dt == dtypes.int32 else []
  for x in vals:
    for y in vals:
      if op is Ops.DIV and y == 0: continue
      x, y = truncate(dt, x), truncate(dt, y)
      got, want = sym_infer(g, {a: x, b: y}), exec_alu(op, node.dtype, (x, y))
      if op is Ops.DIV: assert abs(got - want) <= abs(want) * 2.0 ** -23, (x, y)  # two roundings
      else: assert got == want, (op, x, y)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int8, dtypes.uint32, dtypes.bool])
def test_unary_rows(dt: DType) -> None:
  x = var("x", dt)
  vals = [True, False] if dt == dtypes.bool else [0, 1, 5, -7, 100, dt.max, dt.min]
  for op in (Ops.NEG, Ops.NOT):
    if op is Ops.NOT and dtypes.is_float(dt): continue
    g = graph_rewrite(UOp(op, dt, (x,)), pm_decompose(PRIMITIVE))
    assert ops_of(g) <= PRIMITIVE | LEAVES
    for v in vals:
      v = truncate(dt, v)
      assert sym_infer(g, {x: v}) == exec_alu(op, dt, (v,)), (op, v)


def test_mulacc_row() -> None:
  a, b, c = var("a", dtypes.float32), var("b", dtypes.float32), var("c", dtypes.float32)
  g = graph_rewrite(UOp(Ops.MULACC, dtypes.float32, (a, b, c)), pm_decompose(PRIMITIVE))
  assert g is a.alu(Ops.MUL, b).alu(Ops.ADD, c)


@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT])
def test_transcendental_rows(op: Ops) -> None:
  x = var("x", dtypes.float32)
  g = graph_rewrite(UOp(op, dtypes.float32, (x,)), pm_decompose(PRIMITIVE))
  assert ops_of(g) <= PRIMITIVE | LEAVES
  for v in (0.5, 1.75, 3.0, 20.0):
    want = exec_alu(op, dtypes.float32, (v,))
    assert abs(sym_infer(g, {x: v}) - want) <= 2 * abs(want) * 2.0 ** -24, (op, v)


def test_pow_row_is_primitive() -> None:
  a, b = var("a", dtypes.float16), var("b", dtypes.float16)
  g = graph_rewrite(a.pow(b), pm_decompose(PRIMITIVE))
  assert ops_of(g) <= PRIMITIVE | LEAVES and g.dtype == dtypes.float16
  assert sym_infer(g, {a: 3.0, b: 2.0}) == 9.0 and sym_infer(g, {a: -2.0, b: 3.0}) == -8.0


# ---- the matcher ----

def test_supported_ops_are_kept() -> None:
  x, y = var("x", dtypes.float32), var("y", dtypes.int32)
  g = UOp.sink(x.exp2(), x.sin(), y // 3, UOp(Ops.NEG, dtypes.int32, (y,)))
  assert graph_rewrite(g, pm_decompose(GroupOp.All)) is g
  out = graph_rewrite(g, pm_decompose(C_TARGET | {Ops.EXP2}))
  assert Ops.EXP2 in ops_of(out) and not ops_of(out) & {Ops.SIN, Ops.IDIV, Ops.NEG}


def test_matcher_is_cached_and_filtered() -> None:
  assert pm_decompose(frozenset(C_TARGET)) is pm_decompose(set(C_TARGET))
  assert pm_decompose(GroupOp.All).patterns == pm_exp.patterns  # exp is lowered everywhere
  n_exp = len(pm_exp.patterns)
  assert len(pm_decompose(PRIMITIVE).patterns) == n_exp + len(pm_decompose_ops.patterns)
  ops = {next(iter(p.op)) for p, _ in pm_decompose(PRIMITIVE | {Ops.SIN}).patterns[n_exp:]}
  assert ops == GroupOp.Decomposed - {Ops.SIN} | {Ops.IDIV, Ops.MOD}


def test_exp_is_lowered_as_a_whole_on_every_target() -> None:
  """EXP2(x*log2(e)) becomes xexp(x) even where EXP2 is native: the rounded product would cost
  up to ~60 ulp near the overflow; another constant keeps its EXP2."""
  x = var("x", dtypes.float32)
  g = UOp.sink((x * (1 / math.log(2))).exp2(), (x * 1.5).exp2())
  out = graph_rewrite(g, pm_decompose(GroupOp.All))
  assert [u.op for u in out.toposort()].count(Ops.EXP2) == 1
  assert Ops.MULACC in ops_of(out)


# ---- DOT4 ----

def test_dot4_decomposes_into_its_byte_products() -> None:
  """DOT4(a, b, c) on a target without it: c + sum over bytes k of unsigned byte k of a times
  signed byte k of b, for any int32 words (bytes above 127 in a included)."""
  a, b, c = (var(n, dtypes.int32) for n in "abc")
  g = graph_rewrite(UOp(Ops.DOT4, dtypes.int32, (a, b, c)), pm_decompose(C_TARGET))
  assert Ops.DOT4 not in ops_of(g)
  cases = [(0, 0, 0), (-1, -1, 0), (0x7F7F7F7F, -0x80808080 & 0xFFFFFFFF, 5), (-1, 0x7F80017F, -9)]
  cases += [(RAND.getrandbits(32), RAND.getrandbits(32), RAND.getrandbits(20)) for _ in range(200)]
  for x, y, z in cases:
    x, y = truncate(dtypes.int32, x), truncate(dtypes.int32, y)
    want = z + sum(((x >> 8 * k) & 255) * (((y >> 8 * k) & 255 ^ 128) - 128) for k in range(4))
    assert sym_infer(g, {a: x, b: y, c: z}) == exec_alu(Ops.DOT4, dtypes.int32, (x, y, z)) == \
      truncate(dtypes.int32, want), (x, y, z)
