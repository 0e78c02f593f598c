"""upat.py: the pattern language (UPat), rule tables (PatternMatcher) and the pattern compiler."""
import itertools

import pytest

from unigrad.uop import Ops, PatternMatcher, UOp, UPat, dtypes
from unigrad.uop import upat as upat_module
from unigrad.uop.upat import _interpreted, compile_rule

idx, i32, f32 = dtypes.index, dtypes.int32, dtypes.float32


def c(v: object, dt=idx) -> UOp: return UOp.const(dt, v)


a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
fa = UOp.variable("fa", 0, 1, f32)


def matches(pat: UPat, u: UOp) -> list[dict]:
  return pat.match(u, {})


def bindings(**kw: object) -> dict:
  kw.pop("ctx")  # a callback with **kwargs receives ctx as well
  return kw


def fire(pat: UPat, u: UOp, fxn=bindings, ctx=None):
  """What a one-rule PatternMatcher returns for u (a callback result, or None)."""
  return PatternMatcher([(pat, fxn)]).rewrite(u, ctx)


# ---- op, dtype, arg, tag ----

def test_op_single_and_tuple() -> None:
  assert matches(UPat(Ops.ADD), a + b) and not matches(UPat(Ops.MUL), a + b)
  assert matches(UPat((Ops.ADD, Ops.MUL)), a * b) and matches(UPat({Ops.ADD, Ops.MUL}), a + b)
  assert not matches(UPat((Ops.ADD, Ops.MUL)), a // b)
  assert matches(UPat(), a) and matches(UPat(), a + b)  # no op: anything
  assert fire(UPat((Ops.ADD, Ops.MUL), name="x"), a * b) == {"x": a * b}
  assert fire(UPat((Ops.ADD, Ops.MUL), name="x"), a // b) is None


def test_dtype_single_tuple_and_vector_lanes() -> None:
  x32 = UOp.variable("x32", 0, 3, i32)
  assert matches(UPat.var("x", i32), x32) and not matches(UPat.var("x", idx), x32)
  assert matches(UPat.var("x", (idx, i32)), x32) and matches(UPat.var("x", (idx, i32)), a)
  assert not matches(UPat.var("x", (f32,)), a)
  vec = UOp(Ops.VCONST, i32.vec(4), arg=(1, 2, 3, 4))
  assert matches(UPat(dtype=i32), vec)  # a vector matches its scalar dtype
  assert fire(UPat.var("x", f32), fa) == {"x": fa} and fire(UPat.var("x", f32), a) is None


def test_arg() -> None:
  assert matches(UPat(Ops.CONST, arg=3), c(3)) and not matches(UPat(Ops.CONST, arg=3), c(4))
  assert matches(UPat(Ops.CONST, arg=float("nan")), c(float("nan"), f32))  # nan equals nan here
  assert not matches(UPat(Ops.CONST, arg=0.0), c(float("nan"), f32))
  r = UOp.range(4, 7)
  assert matches(UPat(Ops.RANGE, arg=r.arg), r) and not matches(UPat(Ops.RANGE, arg="x"), r)
  assert fire(UPat(Ops.CONST, arg=3, name="k"), c(3)) == {"k": c(3)}
  assert fire(UPat(Ops.CONST, arg=3, name="k"), c(5)) is None


def test_tag() -> None:
  t = UOp(Ops.SINK, dtypes.void, (a,), tag="t")
  assert matches(UPat(Ops.SINK, tag="t"), t) and not matches(UPat(Ops.SINK, tag="u"), t)
  assert fire(UPat(Ops.SINK, tag="t", name="s"), t) == {"s": t}
  assert fire(UPat(Ops.SINK, tag="u", name="s"), t) is None


# ---- sources ----

def test_src_tuple_is_positional_and_exact_length() -> None:
  pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")))
  assert matches(pat, a + 1) == [{"x": a, "k": c(1)}]
  assert not matches(pat, UOp(Ops.ADD, idx, (c(1), a)))  # order matters
  assert not matches(UPat(Ops.WHERE, src=(UPat(), UPat())), (a < b).where(a, b))  # length
  assert fire(pat, a + 1) == {"x": a, "k": c(1)} and fire(pat, a + b) is None


def test_allow_any_len_is_a_prefix_match() -> None:
  w = (a < b).where(a, b)
  pat = UPat(Ops.WHERE, src=(UPat(Ops.CMPLT, name="cond"),), allow_any_len=True)
  assert matches(pat, w) == [{"cond": a < b}]
  assert fire(pat, w) == {"cond": a < b}
  assert fire(pat, a.ne(b).where(a, b)) is None


def test_src_list_is_commutative() -> None:
  pat = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("k")])
  back = UOp(Ops.ADD, idx, (c(1), a))
  assert matches(pat, a + 1) == [{"x": a, "k": c(1)}]
  assert matches(pat, back) == [{"x": a, "k": c(1)}]
  assert fire(pat, back) == {"x": a, "k": c(1)} and fire(pat, a + b) is None
  # both orders match when both fit, in permutation order
  both = UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")])
  assert matches(both, a + b) == [{"x": a, "y": b}, {"x": b, "y": a}]


def test_src_list_tries_the_next_permutation_when_a_callback_declines() -> None:
  pat = UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")])
  seen: list = []

  def only_b_first(x: UOp, y: UOp) -> UOp | None:
    seen.append(x)
    return y if x is b else None
  assert PatternMatcher([(pat, only_b_first)]).rewrite(a + b) is a
  assert seen == [a, b]


def test_src_single_upat_repeats_for_every_source() -> None:
  pat = UPat(Ops.SINK, src=UPat(Ops.CONST), name="s")
  assert matches(pat, UOp.sink(c(1), c(2), c(3)))
  assert matches(pat, UOp(Ops.SINK, dtypes.void, ()))  # zero sources
  assert not matches(pat, UOp.sink(c(1), a))
  assert fire(pat, UOp.sink(c(1), c(2))) is not None and fire(pat, UOp.sink(a, c(2))) is None


def test_src_repeat_with_a_name_binds_one_node() -> None:
  pat = UPat(Ops.SINK, src=UPat.var("x"))
  assert matches(pat, UOp.sink(a, a)) == [{"x": a}]
  assert not matches(pat, UOp.sink(a, b))
  assert fire(pat, UOp.sink(a, a)) == {"x": a} and fire(pat, UOp.sink(a, b)) is None


def test_bad_src_type() -> None:
  with pytest.raises(TypeError, match="tuple, list or UPat"): UPat(Ops.ADD, src={UPat()})


# ---- names ----

def test_name_binds_and_same_name_twice_must_be_the_same_node() -> None:
  pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
  assert matches(pat, a + a) == [{"x": a}]
  assert not matches(pat, a + b)
  assert fire(pat, a + a) == {"x": a} and fire(pat, a + b) is None
  nested = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var())), UPat.var("x")))
  assert fire(nested, (a + b) * a) == {"x": a} and fire(nested, (a + b) * b) is None


def test_root_name() -> None:
  assert fire(UPat(Ops.ADD, name="root"), a + b) == {"root": a + b}


# ---- constructors ----

def test_var_cvar_const() -> None:
  assert matches(UPat.var("x"), a) == [{"x": a}]
  vc = UOp(Ops.VCONST, idx, arg=(1, 2))
  assert matches(UPat.cvar("k"), c(3)) and matches(UPat.cvar("k"), vc)
  assert not matches(UPat.cvar("k"), a)
  assert matches(UPat.cvar("k", i32), c(3, i32)) and not matches(UPat.cvar("k", i32), c(3))
  assert matches(UPat.const(idx, 0), c(0)) and not matches(UPat.const(idx, 0), c(1))
  assert not matches(UPat.const(i32, 0), c(0)) and matches(UPat.const(None, 0), c(0, i32))
  assert not matches(UPat.const(None, 0), vc)  # const is CONST only
  assert fire(UPat.cvar("k"), vc) == {"k": vc} and fire(UPat.cvar("k"), a) is None


def test_any() -> None:
  pat = UPat.any(UPat(Ops.ADD, name="x"), UPat(Ops.MUL, name="x"))
  assert matches(pat, a + b) == [{"x": a + b}] and matches(pat, a * b) == [{"x": a * b}]
  assert not matches(pat, a // b)
  assert fire(pat, a * b) == {"x": a * b} and fire(pat, a // b) is None
  named = UPat.any(UPat(Ops.ADD), UPat(Ops.MUL), name="n")
  assert matches(named, a + b) == [{"n": a + b}]
  # an `any` inside sources, with a name shared with a sibling
  inner = UPat(Ops.ADD, src=(UPat.any(UPat.cvar("k"), UPat(Ops.MUL, name="k")), UPat.var("k")))
  assert fire(inner, UOp(Ops.ADD, idx, (c(1), c(1)))) == {"k": c(1)}
  assert fire(inner, UOp(Ops.ADD, idx, (c(1), c(2)))) is None


def test_named_copies_the_pattern() -> None:
  base = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")))
  named = base.named("root")
  assert base.name is None and named.name == "root"
  assert fire(named, a + 1) == {"x": a, "k": c(1), "root": a + 1}
  assert fire(named, a + b) is None


def test_or_casted() -> None:
  pat = UPat.var("x", idx).or_casted("y")
  casted = a.cast(i32)
  assert fire(pat, a) == {"y": a}  # the pattern itself, renamed to y
  assert fire(pat, casted) == {"x": a, "y": casted}
  assert fire(pat, UOp.variable("f", 0, 1, f32).cast(i32)) is None  # CAST of a non-match
  assert fire(UPat(Ops.PARAM).or_casted(), casted) == {}


def test_or_after() -> None:
  pat = UPat(Ops.PARAM, name="p").or_after("v")
  after = UOp(Ops.AFTER, idx, (a, UOp.sink(b)))
  assert fire(pat, a) == {"v": a}  # the pattern itself, renamed to v
  assert fire(pat, after) == {"p": a, "v": after}
  assert fire(pat, UOp(Ops.AFTER, idx, (a + 1, UOp.sink(b)))) is None


# ---- early reject ----

def test_computed_early_reject() -> None:
  assert UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.CONST))).early_reject == {Ops.CONST}
  assert UPat(Ops.ADD, src=UPat(Ops.CONST)).early_reject == frozenset()


def test_custom_early_reject_skips_the_rule() -> None:
  pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y")), custom_early_reject={Ops.CONST})
  assert pat.early_reject == {Ops.CONST}
  assert fire(pat, a + 1) == {"x": a, "y": c(1)}
  assert fire(pat, a + b) is None  # the match would succeed; the reject set forbids it


# ---- callbacks ----

def test_callbacks_may_be_closures() -> None:
  calls: list[UOp] = []
  offset = 5

  def add_offset(x: UOp) -> UOp:
    calls.append(x)
    return x + offset
  pm = PatternMatcher([(UPat(Ops.PARAM, name="x"), add_offset)])
  assert pm.rewrite(a) is a + 5 and calls == [a]
  assert pm.rewrite(a + 1) is None and calls == [a]


def test_callbacks_that_take_ctx() -> None:
  pm = PatternMatcher([(UPat(Ops.PARAM, name="x"), lambda ctx, x: ctx[x])])
  assert pm.rewrite(a, {a: b}) is b
  assert pm.rewrite(a + 1, {a: b}) is None
  kw = PatternMatcher([(UPat(Ops.PARAM, name="x"), lambda **kw: kw["ctx"])])
  assert kw.rewrite(a, b) is b  # **kwargs receives ctx too


def test_rewrite_returns_none_for_no_match_none_or_the_same_node() -> None:
  pm = PatternMatcher([
    (UPat(Ops.ADD, name="x"), lambda x: x),  # the same node: no rewrite
    (UPat(Ops.ADD, name="x"), lambda x: None),  # declines
  ])
  assert pm.rewrite(a + b) is None and pm.rewrite(a * b) is None


def test_first_non_none_rule_wins_in_table_order() -> None:
  pm = PatternMatcher([
    (UPat(Ops.ADD), lambda: None),
    (UPat(Ops.ADD, name="x"), lambda x: x.src[0]),
    (UPat(Ops.ADD, name="x"), lambda x: x.src[1]),
  ])
  assert pm.rewrite(a + b) is a


def test_dispatch_by_op_never_calls_other_ops_rules() -> None:
  calls: list[Ops] = []
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: calls.append(x.op))])
  pm.rewrite(a * b)
  pm.rewrite(a)
  assert calls == [] and pm.rewrite(a + b) is None and calls == [Ops.ADD]


def test_add_concatenates_in_order_and_is_memoized() -> None:
  pm1 = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[0])])
  pm2 = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[1]),
                        (UPat(Ops.MUL, name="x"), lambda x: x.src[1])])
  both = pm1 + pm2
  assert both.rewrite(a + b) is a and (pm2 + pm1).rewrite(a + b) is b
  assert both.rewrite(a * b) is b and pm1.rewrite(a * b) is None
  assert pm1 + pm2 is both and len(both.patterns) == 3


def test_callback_errors_propagate() -> None:
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: 1 // 0)])
  with pytest.raises(ZeroDivisionError): pm.rewrite(a + b)


# ---- the compiler agrees with the interpreter ----

PATTERNS = [
  UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("k")]),
  UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("x")]),
  UPat((Ops.ADD, Ops.MUL), src=[UPat(Ops.MUL, src=[UPat.var("x"), UPat.cvar("k")]), UPat.var("y")]),
  UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("x"), UPat.var("x"))),
  UPat(Ops.WHERE, src=(UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("y"))), UPat.var("y"),
                       UPat.var())),
  UPat(Ops.SINK, src=UPat((Ops.CONST, Ops.PARAM))),
  UPat(Ops.SINK, src=UPat.var("x")),
  UPat.any(UPat(Ops.ADD, src=(UPat.var("x"), UPat())), UPat(Ops.MUL, src=(UPat(), UPat.var("x"))),
           name="r"),
  UPat.var("x", idx).or_casted("y"),
  UPat(Ops.CONST, arg=1).or_after(),
  UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y")), custom_early_reject={Ops.MUL}),
  UPat(Ops.MAX, src=[UPat.var("x"), UPat.any(UPat.cvar("k"), UPat(Ops.PARAM, name="k"))]),
]


def _nodes() -> list[UOp]:
  leaves = [a, b, c(1), c(1, i32), a.cast(i32)]
  out = list(leaves)
  for x, y in itertools.product(leaves[:3], repeat=2):
    out += [x + y, x * y, x.maximum(y), (x < y).where(x, y), (x < y).where(y, y), UOp.sink(x, y)]
  out += [(a * 2) + b, b + (a * 2), (a * b) * 3, UOp(Ops.AFTER, idx, (c(1), UOp.sink(a)))]
  return out


@pytest.mark.parametrize("pi", range(len(PATTERNS)))
def test_compiled_rules_return_what_the_interpreter_returns(pi: int) -> None:
  pat = PATTERNS[pi]
  seen: list[list] = [[], []]

  def record(k: int):  # declines every binding so that every match is enumerated
    return lambda **kw: seen[k].append(sorted(kw.items(), key=lambda kv: kv[0])) or None
  fast = compile_rule(pat, record(0), False, pat.custom_reject)
  slow = _interpreted(pat, record(1), False, pat.custom_reject)
  for u in _nodes():
    fast(u, None)
    slow(u, None)
    assert seen[0] == seen[1], u


def test_a_pattern_too_big_to_compile_is_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(upat_module, "MAX_COMPILED_LINES", 2)
  rule = compile_rule(PATTERNS[2], lambda x, k, y: y, False, None)
  assert "_interpreted" in rule.__qualname__ and rule((a * 2) + b, None) is b
  assert rule(a + b, None) is None
