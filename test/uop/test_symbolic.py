"""symbolic.py: the simplifier keeps every value (property tests), and each rule table's cases."""
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unigrad.uop import AxisType, Invalid, Ops, ParamArg, UOp, dtypes, shape_uop, sym_infer
from unigrad.uop.alu import exec_alu
from unigrad.uop.symbolic import (linear_terms, order_cmp, order_key, pm_canonical, pm_compare,
                                  pm_divmod, pm_fold_constants, pm_identities, pm_invalid,
                                  pm_min_max)
from unigrad.uop.validity import (pm_simplify_valid, simplify_valid, uop_given_valid,
                                  valid_bounds)

idx, i32, f32, bool_ = dtypes.index, dtypes.int32, dtypes.float32, dtypes.bool
x, y, z = UOp.variable("x", 0, 10), UOp.variable("y", 0, 3), UOp.variable("z", -5, 5)
fx = UOp.variable("fx", -1, 1, f32)


def c(v: object, dt=idx) -> UOp: return UOp.const(dt, v)


def T(v: bool = True) -> UOp: return c(v, bool_)


# ---- property: simplify keeps the value for every assignment ----

DIVISORS = [-7, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 8, 16]
MAX_ASSIGNMENTS = 96

leaf = st.one_of(st.tuples(st.just("var"), st.integers(0, 3)),
                 st.tuples(st.just("const"), st.integers(-9, 9)))
COEFFS = [-4, -1, 1, 2, 3, 4, 8]


def _extend(e: st.SearchStrategy) -> st.SearchStrategy:
  cond = st.tuples(st.sampled_from(["lt", "ne", "le", "eq"]), e, e,
                   st.sampled_from(["", "and", "or", "xor", "not"]), e, e)
  return st.one_of(
    st.tuples(st.just("add"), e, e), st.tuples(st.just("mulc"), e, st.integers(-6, 6)),
    st.tuples(st.just("mul"), e, e), st.tuples(st.just("idiv"), e, st.sampled_from(DIVISORS)),
    st.tuples(st.just("mod"), e, st.sampled_from(DIVISORS)), st.tuples(st.just("max"), e, e),
    st.tuples(st.just("neg"), e), st.tuples(st.sampled_from(["and", "or", "xor"]), e, e),
    st.tuples(st.just("andc"), e, st.integers(0, 15)), st.tuples(st.just("where"), cond, e, e),
    st.tuples(st.just("lin"), st.lists(st.tuples(e, st.sampled_from(COEFFS)), min_size=1,
                                       max_size=3), st.integers(-10, 10)),
    st.tuples(st.just("recombine"), e, st.sampled_from([2, 3, 4, 8]), st.sampled_from([1, 2, -1])),
    st.tuples(st.sampled_from(["divdiv", "divmod", "modmod"]), e, st.sampled_from([2, 3, 4]),
              st.sampled_from([2, 3, -2])),
    st.tuples(st.just("cmpc"), e, st.integers(-4, 4), st.integers(-9, 9), st.integers(-20, 20)),
  )


exprs = st.recursive(leaf, _extend, max_leaves=24)
bounds = st.lists(st.tuples(st.integers(-8, 6), st.integers(0, 9)), min_size=1, max_size=4)


def build_cond(t: tuple, vs: list[UOp], dt) -> UOp:
  kind, a, b, comb, p, q = t
  pa, pb = build(a, vs, dt), build(b, vs, dt)
  base = {"lt": pa < pb, "ne": pa.ne(pb), "le": pa <= pb, "eq": pa.eq(pb)}[kind]
  other = build(p, vs, dt) < build(q, vs, dt)
  if comb == "not": return base.logical_not()
  return {"": base, "and": base & other, "or": base | other, "xor": base ^ other}[comb]


def build(t: tuple, vs: list[UOp], dt) -> UOp:
  """A UOp from a generated tree (every op's meaning is in uop/alu.py)."""
  kind, args = t[0], t[1:]
  if kind == "var": return vs[args[0] % len(vs)]
  if kind == "const": return c(args[0], dt)
  if kind == "where":
    return build_cond(args[0], vs, dt).where(build(args[1], vs, dt), build(args[2], vs, dt))
  if kind == "lin": return sum((build(e, vs, dt) * k for e, k in args[0]), c(args[1], dt))
  sub = [build(a, vs, dt) if isinstance(a, tuple) else a for a in args]
  if kind == "add": return sub[0] + sub[1]
  if kind in ("mulc", "mul"): return sub[0] * sub[1]
  if kind == "idiv": return sub[0] // sub[1]
  if kind == "mod": return sub[0] % sub[1]
  if kind == "max": return sub[0].maximum(sub[1])
  if kind == "neg": return -sub[0]
  if kind in ("and", "andc"): return sub[0] & sub[1]
  if kind == "or": return sub[0] | sub[1]
  if kind == "xor": return sub[0] ^ sub[1]
  if kind == "recombine":
    e, d, m = sub
    return (e // d) * (d * m) + (e % d) * m  # (e//d)*d*m + (e%d)*m = e*m
  if kind == "divdiv": return (sub[0] // sub[1]) // sub[2]
  if kind == "divmod": return (sub[0] % (sub[1] * sub[2])) // sub[1]
  if kind == "modmod": return (sub[0] % (sub[1] * sub[2])) % sub[1]
  if kind == "cmpc":
    e, k, off, lim = sub
    return (e * k + off < lim).where(c(1, dt), c(0, dt))
  raise AssertionError(kind)


def assignments(vs: list[UOp], rnd: random.Random) -> list[tuple[int, ...]]:
  ranges = [range(v.vmin, v.vmax + 1) for v in vs]
  if math.prod(len(r) for r in ranges) <= MAX_ASSIGNMENTS: return list(itertools.product(*ranges))
  return [tuple(rnd.choice(r) for r in ranges) for _ in range(MAX_ASSIGNMENTS)]


def check_same_values(e: UOp, vs: list[UOp], rnd: random.Random) -> UOp:
  s = e.simplify()
  for vals in assignments(vs, rnd):
    env = dict(zip(vs, vals))
    want, got = sym_infer(e, env), sym_infer(s, env)
    assert got == want, f"{e.render(simplify=False)} -> {s.render(simplify=False)} at {vals}"
    assert e.vmin <= want <= e.vmax, f"{want} outside {e.min_max} of {e.render(simplify=False)}"
    assert s.vmin <= want <= s.vmax, f"{want} outside {s.min_max} of {s.render(simplify=False)}"
  return s


def make_vars(bs: list[tuple[int, int]], dt) -> list[UOp]:
  return [UOp.variable(f"v{i}", lo, lo + w, dt) for i, (lo, w) in enumerate(bs)]


@settings(max_examples=200, deadline=None)
@given(bounds, st.sampled_from([idx, i32]), exprs, st.randoms(use_true_random=False))
def test_simplify_keeps_integer_values(bs: list, dt, tree: tuple, rnd: random.Random) -> None:
  vs = make_vars(bs, dt)
  s = check_same_values(build(tree, vs, dt), vs, rnd)
  assert s.simplify() is s  # the result is a fixed point


@settings(max_examples=100, deadline=None)
@given(bounds, st.sampled_from([idx, i32]), st.lists(st.tuples(exprs, exprs, exprs), min_size=1,
                                                     max_size=2), st.randoms(use_true_random=False))
def test_simplify_keeps_bool_values(bs: list, dt, parts: list, rnd: random.Random) -> None:
  vs = make_vars(bs, dt)
  conds = [build_cond(("lt", a, b, "xor" if i else "and", a, d), vs, dt)
           for i, (a, b, d) in enumerate(parts)]
  e = conds[0] if len(conds) == 1 else conds[0].where(conds[1], conds[0].logical_not())
  check_same_values(e, vs, rnd)


# ---- index arithmetic ----

def test_split_div_and_mod_of_a_reshaped_index() -> None:
  assert ((x * 4 + y) // 4).simplify() is x  # 0 <= y < 4
  assert ((x * 4 + y) % 4).simplify() is y
  assert ((y + x * 4) // 4).simplify() is x and ((y + 4 * x) % 4).simplify() is y
  assert ((x * 4 + y + 8) // 4).simplify() is (x + 2).simplify()
  assert ((x * 4 + z) // 4).simplify() is not x  # z may be negative: no fold
  check_same_values((x * 4 + z) // 4, [x, z], random.Random(0))


def _flatten(rs: list[UOp], shape: tuple[int, ...]) -> UOp:
  return sum((r * math.prod(shape[i + 1:]) for i, r in enumerate(rs)), c(0))


def _unflatten(flat: UOp, shape: tuple[int, ...]) -> list[UOp]:
  return [(flat // math.prod(shape[i + 1:])) % n for i, n in enumerate(shape)]


def test_reshape_chain_of_a_6d_access_is_the_flat_index() -> None:
  shape = (2, 3, 4, 5, 6, 7)
  rs = [UOp.range(n, i) for i, n in enumerate(shape)]
  flat = _flatten(rs, shape)
  # unflatten to (6, 20, 42) and flatten again: what two reshapes produce
  through = _flatten(_unflatten(flat, (6, 20, 42)), (6, 20, 42))
  assert through.simplify() is flat.simplify()
  strides = [math.prod(shape[i + 1:]) for i in range(6)]
  assert linear_terms(flat.simplify()) == (dict(zip(rs, strides)), 0)


def test_flattening_a_6d_strided_access_with_padding() -> None:
  shape, pad = (2, 3, 4, 5, 6, 7), (0, 0, 1, 0, 2, 0)
  padded = tuple(n + 2 * p for n, p in zip(shape, pad))
  rs = [UOp.range(n, i) for i, n in enumerate(padded)]
  valid, index = None, c(0)
  for i, (coord, n, p) in enumerate(zip(_unflatten(_flatten(rs, padded), padded), shape, pad)):
    if p:
      v = (coord >= p) & (coord < n + p)
      valid = v if valid is None else valid & v
    index = index + (coord - p) * math.prod(shape[i + 1:])
  s = valid.where(index, c(Invalid)).simplify()
  assert s.op is Ops.WHERE and s.src[2].arg is Invalid
  strides = [math.prod(shape[i + 1:]) for i in range(6)]
  assert linear_terms(s.src[1]) == (dict(zip(rs, strides)), -(1 * strides[2] + 2 * strides[4]))
  assert s.src[0].ranges.keys() == {rs[2], rs[4]}  # the gate reads only the padded axes
  for v2, v4 in itertools.product(range(padded[2]), range(padded[4])):
    want = 1 <= v2 < 5 and 2 <= v4 < 8
    assert sym_infer(s.src[0], {rs[2]: v2, rs[4]: v4}) == want


def test_canonical_order() -> None:
  assert (x + y).simplify() is (y + x).simplify()
  assert (2 * x + y).simplify() is (y + x * 2).simplify()
  assert (x + (y + z)).simplify() is ((z + x) + y).simplify()
  assert (x * y).simplify() is (y * x).simplify()
  assert x.maximum(y).simplify() is y.maximum(x).simplify()
  assert (x + y + x).simplify() is (x * 2 + y).simplify()
  assert (x - x).simplify() is c(0) and (x + y - y).simplify() is x
  assert order_key(x) < order_key(c(1))  # constants sort last


def _key_cmp(a: UOp, b: UOp) -> int:
  ka, kb = order_key(a), order_key(b)
  return -1 if ka < kb else 0 if ka == kb else 1


@settings(max_examples=200, deadline=None)
@given(bounds, st.sampled_from([idx, i32, f32]), st.lists(exprs, min_size=2, max_size=4))
def test_order_cmp_is_the_order_of_order_key(bs: list, dt, trees: list) -> None:
  # the walk in step agrees with comparing the nested key tuples, on unsimplified (deep, shared)
  # expressions, their sums (shared prefixes), floats and nodes that differ only in their tag
  vs = make_vars(bs, idx if dt == f32 else dt)
  es = [build(t, vs, idx if dt == f32 else dt) for t in trees]
  if dt == f32: es = [e.cast(f32) * 2.0 for e in es]
  es += [es[0] + es[1], es[1] + es[0], es[0].replace(tag="t"), (es[0] + es[1]).replace(tag="t")]
  for a, b in itertools.product(es, repeat=2):
    assert order_cmp(a, b) == _key_cmp(a, b), (a.render(simplify=False), b.render(simplify=False))


def test_order_cmp_handles_chains_deeper_than_the_recursion_limit() -> None:
  a, b = x, y  # the first difference is at the bottom of 3000 equal levels
  for i in range(3000): a, b = a + i, b + i
  want = _key_cmp(x, y)
  assert order_cmp(a, b) == want and order_cmp(b, a) == -want and order_cmp(a, a) == 0


def test_wrapping_integer_sums_keep_their_shared_partial_sums() -> None:
  # threefry's rounds: flattening each wrapping sum into the next copied every shared partial
  # sum into each of its users (505 ADDs became 1434 in a tile of random numbers)
  u32 = dtypes.uint32
  a, b, k = (UOp.variable(n, 0, 2 ** 32 - 1, u32) for n in "abk")
  assert pm_canonical.rewrite((k + a) + b) is None
  assert pm_canonical.rewrite((x + y) + x) is x * 2 + y  # index math: linear normal form


# ---- rule tables: positive and negative cases (one rewrite step) ----

def test_pm_fold_constants() -> None:
  for op, dt, vals in [(Ops.ADD, i32, (2**31 - 1, 1)), (Ops.IDIV, idx, (-7, 2)),
                       (Ops.MOD, idx, (-7, 2)), (Ops.MOD, idx, (7, -2)), (Ops.IDIV, idx, (7, -2)),
                       (Ops.MAX, idx, (-3, 2)), (Ops.XOR, i32, (6, 3)), (Ops.MUL, f32, (1.5, 2.0))]:
    u = UOp(op, dt, tuple(c(v, dt) for v in vals))
    assert pm_fold_constants.rewrite(u) is c(exec_alu(op, dt, vals), dt), u
  assert pm_fold_constants.rewrite(c(3) < c(4)) is T()
  assert pm_fold_constants.rewrite(c(3).ne(3)) is T(False)
  assert pm_fold_constants.rewrite(c(7, i32).cast(f32)) is c(7.0, f32)
  assert pm_fold_constants.rewrite(c(1.0, f32).bitcast(i32)) is c(0x3F800000, i32)
  assert pm_fold_constants.rewrite(T().where(x, y)) is x
  assert pm_fold_constants.rewrite(T(False).where(x, y)) is y
  assert pm_fold_constants.rewrite(c(1) + c(Invalid)).arg is Invalid
  assert pm_fold_constants.rewrite(x + 1) is None and pm_fold_constants.rewrite(x.cast(i32)) is None
  assert pm_fold_constants.rewrite((x < 3).where(x, y)) is None


def test_pm_identities() -> None:
  fb = UOp.variable("b", 0, 1, bool_)
  xi = UOp.variable("xi", -4, 4, i32)
  positive = [(x + 0, x), (x * 1, x), (x * 0, c(0)), (x // 1, x), (x // -1, x * -1), (x % 1, c(0)),
              (xi | 0, xi), (xi ^ 0, xi), (xi & 0, c(0, i32)), (fb & True, fb), (fb | True, T()),
              (x.maximum(x), x), (xi ^ xi, c(0, i32)), (x < x, T(False)), (x.ne(x), T(False)),
              (fb.logical_not().logical_not(), fb), (fb.ne(False), fb), ((x < y).where(z, z), z),
              ((x < y).logical_not().where(x, y), (x < y).where(y, x)), (fb.where(True, False), fb),
              (UOp(Ops.CAST, idx, (x,)), x), (xi.trunc(), xi), ((x * -1) * -1, x), (fx * 1.0, fx)]
  for u, want in positive: assert pm_identities.rewrite(u) is want, u
  negative = [fx + 0.0, fx * 0.0, fx < fx, x + 1, x * 2, x // 2, x.maximum(y), x.cast(i32),
              (x < y).logical_not().where(x, c(Invalid))]
  for u in negative: assert pm_identities.rewrite(u) is None, u


def test_pm_min_max() -> None:
  positive = [(x < 20, T()), (x < 0, T(False)), (x.ne(-1), T()), (x // 11, c(0)),
              (x.maximum(z - 10), x), ((z - 10).maximum(x), x), (x.cast(i32) < 11, T())]
  for u, want in positive: assert pm_min_max.rewrite(u) is want, u
  assert (x < 20).where(y, z).simplify() is y and (x < 0).where(y, z).simplify() is z
  assert ((x + y) % 30).simplify() is (x + y).simplify()
  for u in [x < 5, x.ne(3), x.maximum(y), x // 3, fx < 2.0, (x < y).where(y, z)]:
    assert pm_min_max.rewrite(u) is None, u


def test_pm_canonical() -> None:
  assert pm_canonical.rewrite(y + x) is x + y and pm_canonical.rewrite(x + y) is None
  assert pm_canonical.rewrite(x + 1 + x) is x * 2 + 1
  assert pm_canonical.rewrite((x + 1) * 3) is x * 3 + 3
  assert pm_canonical.rewrite((x * 2) * 3) is x * 6
  assert pm_canonical.rewrite(y * x) is x * y and pm_canonical.rewrite(x * y) is None
  assert pm_canonical.rewrite(UOp(Ops.ADD, f32, (c(1.0, f32), fx))) is fx + 1.0
  e = (x + 3) // 4 * 4 + (x + 3) % 4  # (e//c)*c + e%c -> e, with e's constant
  assert pm_canonical.rewrite(e) is x + 3
  other = ((x // 4) * 4 + x % 3).simplify()  # different divisors: not recombined
  assert pm_canonical.rewrite(other) is None and linear_terms(other) == ({x // 4: 4, x % 3: 1}, 0)
  assert pm_canonical.rewrite(fx + fx) is None


def test_pm_divmod() -> None:
  assert pm_divmod.rewrite((x // 2) // 3) is x // 6
  assert pm_divmod.rewrite((x % 12) // 4) is (x // 4) % 3
  assert pm_divmod.rewrite((x % 12) % 4) is x % 4
  assert pm_divmod.rewrite((x * 4 + 3) // -4).simplify() is (x * -1 - 1).simplify()  # -x-1
  assert pm_divmod.rewrite((x * 4 + 3) % -4) is c(-1)
  assert pm_divmod.rewrite((x * 6 + 4) % 8) is ((x * 3 + 2) % 4) * 2  # common factor
  for u in [(x // 2) // -3, (x % 12) // 5, (x % 10) % 4, x // 3, x % 3, x // -3, x % -3, z % 4]:
    assert pm_divmod.rewrite(u) is None, u


def test_pm_compare() -> None:
  assert pm_compare.rewrite(x * 2 + 4 < 9) is (x < 3)  # 2x < 5 <=> x < 3
  assert pm_compare.rewrite(x * -2 < 5) is (x * -1 < 3)  # -2x < 5 <=> -x < 3 (ceil(5/2))
  assert pm_compare.rewrite(x // 4 < 3) is (x < 12)
  assert pm_compare.rewrite(x + 3 < 5) is (x < 2)
  for u in [x < 5, x < y, x * 2 + y < 5, fx < 1.0]: assert pm_compare.rewrite(u) is None, u


def test_pm_invalid() -> None:
  gated = (x < 5).where(x, c(Invalid))
  assert pm_invalid.rewrite(gated + y) is (x < 5).where(x + y, c(Invalid))
  assert pm_invalid.rewrite(y * gated) is (x < 5).where(y * x, c(Invalid))
  inner = (y < 2).where(x, c(Invalid))
  both = ((x < 5) & (y < 2)).where(x, c(Invalid))
  assert pm_invalid.rewrite((x < 5).where(inner, c(Invalid))) is both
  assert pm_invalid.rewrite((x < 5).where(x, 0) + y) is None
  assert pm_invalid.rewrite((x < 5).where(inner, c(0))) is None


# ---- regressions: rules that changed values ----

def test_recombined_divmod_keeps_the_constant() -> None:
  e = ((x + 3) // 4) * 4 + (x + 3) % 4
  assert e.simplify() is (x + 3).simplify()
  assert (((x + 3) // 4) * 8 + ((x + 3) % 4) * 2 + x).simplify() is (x * 3 + 6).simplify()


def test_and_with_a_mask_can_clear_every_bit() -> None:
  w = UOp.variable("w", 1, 3, i32)
  assert (w & 4).vmin == 0  # 1..3 & 4 is 0: min_max once claimed [1, 3]
  for e in [w & 4, w & 2, w & 1, (w + 4) & 3]: check_same_values(e, [w], random.Random(0))


def test_nested_div_whose_divisor_overflows_int32() -> None:
  w = UOp.variable("w", -100, 100, i32)
  e = (w // 65536) // 65536
  assert sym_infer(e.simplify(), {w: -1}) == -1
  check_same_values(e, [w], random.Random(0))


@pytest.mark.parametrize("d", [-4, -3, -1, 3, 4])
def test_div_and_mod_by_negative_and_positive_constants(d: int) -> None:
  for e in [(x * 4 + 3) // d, (x * 4 + 3) % d, (z * 6 + 2) // d, (z * 6 + 2) % d, z // d, z % d]:
    check_same_values(e, [x, z], random.Random(0))


# ---- validity (uop/validity.py): simplifying what is only used where a gate holds ----

def test_valid_bounds() -> None:
  r = UOp.range(16, 0)
  assert valid_bounds((r < 1).logical_not() & (r < 15)) == {r: (1, 14)}
  assert valid_bounds((r + 3 < 10) & (r * -1 < -2)) == {r: (3, 6)}  # r < 7, -r < -2
  assert valid_bounds(r.eq(5)) == {r: (5, 5)}
  assert valid_bounds((r < 3) & (r < 2).logical_not() & (r < 2)) is None  # contradiction
  assert valid_bounds(r < 20) == {} and valid_bounds(r.ne(3)) == {}  # nothing narrower
  s2 = UOp.range(4, 1)
  got = valid_bounds((r + s2 < 1).logical_not() & (r + s2 < 4))  # a window sum: 1 <= r+s2 <= 3
  assert got[(r + s2).simplify()] == (1, 3) and got[r] == (0, 3)


def test_uop_given_valid() -> None:
  r = UOp.range(17, 0)
  inside = (r < 1).logical_not() & (r < 16)  # 1 <= r <= 15
  assert uop_given_valid(inside, (r + 15) // 16) is c(1)
  assert uop_given_valid(inside, (r + 15) % 16) is (r + -1).simplify()
  assert uop_given_valid(r.eq(3), r * 4 + 1) is c(13)
  assert uop_given_valid(inside, r // 16) is c(0)
  assert uop_given_valid((r < 3) & (r < 5).logical_not(), r) is None  # never valid
  assert uop_given_valid(inside, r // 4) is r // 4  # still a division


def test_simplify_valid() -> None:
  r, s2 = UOp.range(17, 0), UOp.range(9, 1)
  lo, hi = (r < 1).logical_not(), r < 16
  assert simplify_valid(lo & hi & lo) is lo & hi  # repeated clause
  assert simplify_valid(lo & (r < 2).logical_not()) is (r < 2).logical_not()  # implied by r >= 2
  assert simplify_valid((r < 3) & (r < 5).logical_not()) is T(False)
  assert simplify_valid(lo & hi & (((r + 15) // 16 + s2) % 2 < 1)) is lo & hi & ((s2 + 1) % 2 < 1)
  assert simplify_valid(lo & hi) is None and simplify_valid(hi) is None
  assert simplify_valid((s2 < 3) & (r < 4)) is None  # independent clauses


def test_pm_simplify_valid() -> None:
  r = UOp.range(17, 0)
  inside = (r < 1).logical_not() & (r < 16)
  one = inside.where(c(1), c(Invalid))
  assert pm_simplify_valid.rewrite(inside.where((r + 15) // 16, c(Invalid))) is one
  both, kept = inside & (r < 2).logical_not(), (r < 16) & (r < 2).logical_not()  # r>=1 implied
  assert pm_simplify_valid.rewrite(both.where(r, c(Invalid))) is kept.where(r, c(Invalid))
  assert pm_simplify_valid.rewrite(both.where(x, c(0))) is kept.where(x, c(0))
  assert pm_simplify_valid.rewrite((r < 3).where(r, c(Invalid))) is None  # nothing to use
  assert pm_simplify_valid.rewrite(inside.where(r // 4, c(Invalid))) is None  # no div/mod removed
  assert pm_simplify_valid.rewrite(inside.where(x, c(0))) is None


def test_given_valid_keeps_the_gate_of_a_read() -> None:
  # where(r < 16 & winner[gated r] >= 0, ...): the AND computes the read also where r == 16, so
  # the other clause must not strip the read's own gate (it loaded winner[16], past its end)
  r = UOp.range(17, 0)
  winner = UOp(Ops.PARAM, i32, (shape_uop((16,)),), ParamArg(0, i32, "CPU"))
  read = UOp(Ops.INDEX, i32, (winner, (r < 16).where(r, c(Invalid))))
  found = (read < c(0, i32)).logical_not()
  assert simplify_valid((r < 16) & found) is None
  assert uop_given_valid(r < 16, found) is found
  wrapped = UOp(Ops.INDEX, i32, (winner, ((r < 16).where(r, c(Invalid)) + 15) % 16))
  inside = (r < 1).logical_not() & (r < 16)
  assert uop_given_valid(inside, wrapped) is wrapped.simplify()  # no (r+15)%16 -> r-1 in a read


def test_divmod_of_a_term_with_few_values_is_affine() -> None:
  k = UOp.range(3, 0)
  assert pm_divmod.rewrite((k * 2 + 2) % 3) is (k * -1 + 2).simplify()  # a flipped 3-tap index
  assert pm_divmod.rewrite((k + 1) % 4) is k + 1
  assert pm_divmod.rewrite((k * 3 + 1) // 2) is None  # 0, 2, 3: not affine
  check_same_values((k * 2 + 2) % 3, [k], random.Random(0))


def test_divmod_with_a_remainder_below_the_common_factor() -> None:
  r, s2 = UOp.variable("r", 1, 15), UOp.variable("s", 0, 7)
  assert pm_divmod.rewrite((s2 * 16 + r + 15) // 32) is (s2 + 1) // 2  # 16*(s+1) + (r-1)
  want = ((s2 + 1) % 2 * 16 + r - 1).simplify()
  assert ((s2 * 16 + r + 15) % 32).simplify() is want
  assert pm_divmod.rewrite((s2 * 16 + r + 16) // 32) is (s2 + 1) // 2  # 16*(s+1) + r
  assert pm_divmod.rewrite((s2 * 16 + r + 17) // 32) is None  # r+17 = 16 + [2, 16]: not below 16
  for e in [(s2 * 16 + r + 15) // 32, (s2 * 16 + r + 15) % 32, (s2 * 6 + r // 4 + 1) // 4]:
    check_same_values(e, [r, s2], random.Random(0))


# property: the validity rewrites keep every value where the gate holds

lin_coeffs = st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]), min_size=1, max_size=3)
clauses = st.lists(st.tuples(st.sampled_from(["lt", "ge", "eq"]), lin_coeffs, st.integers(-6, 12)),
                   min_size=1, max_size=4)


def build_valid(cs: list, vs: list[UOp]) -> UOp:
  out = None
  for kind, coeffs, bound in cs:
    e = sum((vs[i % len(vs)] * a for i, a in enumerate(coeffs)), c(0, vs[0].dtype))
    clause = {"lt": e < bound, "ge": (e < bound).logical_not(), "eq": e.eq(bound)}[kind]
    out = clause if out is None else out & clause
  return out


def check_given_valid(valid: UOp, e: UOp, vs: list[UOp], rnd: random.Random) -> None:
  given, sv = uop_given_valid(valid, e), simplify_valid(valid)
  gated = pm_simplify_valid.rewrite(valid.where(e, c(Invalid, e.dtype)))
  for vals in assignments(vs, rnd):
    env = dict(zip(vs, vals))
    ok = sym_infer(valid, env)
    if sv is not None: assert sym_infer(sv, env) == ok, f"{valid.render()} -> {sv.render()} {vals}"
    if not ok: continue
    want = sym_infer(e, env)
    assert given is not None, f"{valid.render()} holds at {vals}"
    assert sym_infer(given, env) == want, f"{e.render()} -> {given.render()} at {vals}"
    if gated is None or gated.op is not Ops.WHERE: continue
    assert sym_infer(gated.src[0], env), f"{gated.render()} drops {vals}"
    assert sym_infer(gated.src[1], env) == want, f"{gated.render()} at {vals}"


@settings(max_examples=200, deadline=None)
@given(bounds, st.sampled_from([idx, i32]), clauses, exprs, st.randoms(use_true_random=False))
def test_given_valid_keeps_values_where_valid(bs: list, dt, cs: list, tree: tuple,
                                              rnd: random.Random) -> None:
  vs = make_vars(bs, dt)
  check_given_valid(build_valid(cs, vs), build(tree, vs, dt).simplify(), vs, rnd)


windows = st.tuples(st.integers(1, 9), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2),
                    st.sampled_from([2, 3, 4, 8, 16]))


@settings(max_examples=200, deadline=None)
@given(windows, st.randoms(use_true_random=False))
def test_given_valid_keeps_values_of_padded_windows(w: tuple, rnd: random.Random) -> None:
  """The index math of a padded sliding window: o*s + k - p, valid inside the input."""
  n, kw, s, p, d = w
  o, k = UOp.variable("o", 0, (n + 2 * p - kw) // s if n + 2 * p >= kw else 0), UOp.variable(
    "k", 0, kw - 1)
  coord = o * s + k - p
  valid = (coord < 0).logical_not() & (coord < n)
  for e in [coord // d, coord % d, (coord + p * d) // d, (o * s * d + k + d - 1) // d]:
    check_given_valid(valid, e.simplify(), [o, k], rnd)


divmod_terms = st.tuples(st.integers(-8, 8), st.integers(-20, 20), st.sampled_from(DIVISORS),
                         st.integers(-6, 6), st.integers(0, 40))


@settings(max_examples=150, deadline=None)
@given(st.lists(divmod_terms, min_size=1, max_size=3), st.sampled_from([idx, i32]),
       st.randoms(use_true_random=False))
def test_affine_and_small_remainder_divmod_keep_values(ts: list, dt, rnd: random.Random) -> None:
  vs = [UOp.variable(f"v{i}", lo, lo + w, dt) for i, (_, _, _, lo, w) in enumerate(ts)]
  lin = sum((v * a for v, (a, _, _, _, _) in zip(vs, ts)), c(ts[0][1], dt))
  for d in {t[2] for t in ts}:
    for e in (lin // d, lin % d, (lin * 16 + vs[0]) // (16 * d), (lin * 16 + vs[-1]) % (16 * d)):
      check_same_values(e, vs, rnd)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(0, 8), st.integers(-3, 3), st.integers(1, 9),
       st.integers(0, 3), st.integers(0, 70), st.randoms(use_true_random=False))
def test_divmod_by_a_symbolic_multiple_keeps_values(k: int, e: int, qa: int, bw: int, kc: int,
                                                    nmin: int, rnd: random.Random) -> None:
  """(d*q + n*b + e*r + kc) // d and % d with d = k*n, n a variable, r a range ending at n (an
  index over a symbolic axis, flattened and unflattened): folded where the remainder provably
  stays in [0, d), and equal to the unfolded value for every n and position in any case."""
  n = UOp.variable("n", nmin + 1, nmin + 40, idx)
  r = UOp.range(n, 1, AxisType.LOOP)
  q, b = UOp.variable("q", 0, 5, idx), UOp.variable("b", 0, bw, idx)
  d = n * k
  x = q * qa * d + n * b + r * e + kc
  for expr in (x // d, x % d, (r + n * q) // n, (r + n * q) % n):
    s = expr.simplify()
    for _ in range(20):
      nv = rnd.randint(n.vmin, n.vmax)
      env = {n: nv, r: rnd.randrange(nv), q: rnd.randint(0, 5), b: rnd.randint(0, bw)}
      want = sym_infer(expr, env)
      assert sym_infer(s, env) == want, f"{expr.render(simplify=False)} -> {s.render()}"


def test_index_over_a_symbolic_axis_folds_its_divisions():
  """ridx*64 + j + i*(64*n) unflattened by 64*n and n: no division or modulo left."""
  n = UOp.variable("n", 1, 2047, idx)
  r, i = UOp.range(n, 1, AxisType.LOOP), UOp.range(c(3), 2, AxisType.LOOP)
  j = UOp.range(c(64), 3, AxisType.LOOP)
  flat = r * 64 + j + i * (n * 64)
  assert (flat // (n * 64)).simplify() is i
  assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in (flat % (n * 64)).simplify().toposort())
  assert ((r + (flat // 64 - r)) % n).simplify() is r
