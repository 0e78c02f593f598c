"""Instruction selection rules (codegen/isel.py): Horner steps fused into MULACC."""
from __future__ import annotations

import math
import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unigrad import Context, Device, Tensor
from unigrad.codegen.isel import form_dot4, pm_fma_horner
from unigrad.codegen.pipeline import to_rendered
from unigrad.dtype import dtypes
from unigrad.renderer.cstyle import _dot4_chains
from unigrad.uop import Ops, PatternMatcher, UOp, UPat, graph_rewrite, sym_infer


def _x() -> UOp: return UOp.variable("x", -math.inf, math.inf, dtypes.float32)


def _c(v: float) -> UOp: return UOp.const(dtypes.float32, v)


def test_horner_chain_becomes_mulacc() -> None:
  x = _x()
  p = (x * _c(0.5) + _c(0.25)) * x + _c(1.0)
  out = graph_rewrite(p, pm_fma_horner)
  assert out.op is Ops.MULACC and out.src[0].op is Ops.MULACC
  assert Ops.ADD not in {u.op for u in out.toposort()}


def test_lone_mul_add_keeps_two_roundings() -> None:
  x, y = _x(), UOp.variable("y", -math.inf, math.inf, dtypes.float32)
  for u in (x * _c(0.5) + _c(0.25), (x * y + y) * x + y):
    assert graph_rewrite(u, pm_fma_horner) is u


def test_gelu_cpu_matches_python_and_erf_reference() -> None:
  v = np.linspace(-7, 7, 1001, dtype=np.float32)  # odd size: a vector tail
  cpu = Tensor(v).gelu().numpy()
  py = Tensor(v, device="PYTHON").gelu().numpy()
  ref = v.astype(np.float64) * 0.5 * (1 + np.vectorize(math.erf)(v.astype(np.float64) / 2**0.5))
  np.testing.assert_allclose(cpu, py, rtol=0, atol=2e-7)
  np.testing.assert_allclose(cpu, ref, rtol=2e-7, atol=2e-7)


# ---- byte dot products (DOT4) ----

def byte_products(a: Tensor, b: Tensor) -> Tensor:
  """The sum over bytes k of the uint32 words a (unsigned bytes) and b (signed bytes), written
  as nn/quantized.py writes it."""
  out = None
  for k in range(4):
    signed = (b << (24 - 8 * k)).bitcast(dtypes.int32) >> 24
    t = ((a >> (8 * k)) & 255).cast(dtypes.int32) * signed
    out = t if out is None else out + t
  return out


def byte_products_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  ua = a.view(np.uint8).reshape(-1, 4).astype(np.int64)
  sb = b.view(np.int8).reshape(-1, 4).astype(np.int64)
  return (ua * sb).sum(-1)


def sources(t: Tensor, device: str) -> str:
  ren = Device[device].renderer
  return "".join(to_rendered(u.src[0], ren).src[1].arg for u in t.schedule().src
                 if u.op is Ops.CALL)


@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64-v2"])
def test_byte_products_of_nibbles_are_dot4_on_targets_with_byte_dots(march) -> None:
  """Nibble words (bytes at most 127) times signed byte words, 4 products summed: one DOT4 per
  word on a CPU with VNNI (native here) or AVX2's vpmaddubsw (x86-64-v3); decomposed without
  them (x86-64-v2). The values are the same everywhere, and on the PYTHON interpreter."""
  if platform.machine() not in ("x86_64", "AMD64"): pytest.skip("x86 ISAs")
  rng = np.random.default_rng(0)
  a = rng.integers(0, 2 ** 32, 256, dtype=np.uint32)
  b = rng.integers(0, 2 ** 32, 256, dtype=np.uint32)
  want = byte_products_ref(a & 0x0F0F0F0F, b) + byte_products_ref((a >> 4) & 0x0F0F0F0F, b)
  with Context(MARCH=march):
    ta, tb = Tensor(a), Tensor(b)
    got = byte_products(ta & 0x0F0F0F0F, tb) + byte_products((ta >> 4) & 0x0F0F0F0F, tb)
    assert ("__dot4" in sources(got, "CPU")) == Device["CPU"].renderer.byte_dot
    np.testing.assert_array_equal(got.numpy(), want)
  np.testing.assert_array_equal((byte_products(Tensor(a, device="PYTHON") & 0x0F0F0F0F,
                                               Tensor(b, device="PYTHON"))).numpy(),
                                byte_products_ref(a & 0x0F0F0F0F, b))


def test_unsigned_bytes_above_127_stay_byte_products() -> None:
  """Bytes of up to 255 in the unsigned word: no DOT4 (AVX2's pairs of products saturate at
  int16), the products stay as written and exact."""
  rng = np.random.default_rng(1)
  a = rng.integers(0, 2 ** 32, 64, dtype=np.uint32) | 0x80808080
  b = rng.integers(0, 2 ** 32, 64, dtype=np.uint32)
  got = byte_products(Tensor(a), Tensor(b))
  assert "__dot4" not in sources(got, "CPU")
  np.testing.assert_array_equal(got.numpy(), byte_products_ref(a, b))


def u32(name: str) -> UOp: return UOp.variable(name, 0, 2 ** 32 - 1, dtypes.uint32)


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=10),
       st.integers(0, 3), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_form_dot4_keeps_every_term(terms, extra, rnd) -> None:
  """An int32 sum of byte products (byte k of word a or a2 times byte k of b, in any order and
  multiplicity) and other terms: form_dot4 turns every complete group of 4 into a DOT4, leaves
  the rest, and the value is unchanged for any words."""
  a, a2, b, c = u32("a"), u32("a2"), u32("b"), UOp.variable("c", -1000, 1000, dtypes.int32)
  def prod(w: UOp, k: int) -> UOp:
    ub = ((w & 0x0F0F0F0F) >> (8 * k) & 255).cast(dtypes.int32)
    return ub * ((b << (24 - 8 * k)).bitcast(dtypes.int32) >> 24)
  parts = [prod(a2 if second else a, k) for k, second in terms]
  parts += [prod(a, k) for k in range(4)] + [c] * extra
  rnd.shuffle(parts)
  total = parts[0]
  for p in parts[1:]: total = total + p
  formed = graph_rewrite(total, pm_dot4_only)
  assert Ops.DOT4 in {u.op for u in formed.toposort()}
  for _ in range(5):
    env = {a: rnd.getrandbits(32), a2: rnd.getrandbits(32), b: rnd.getrandbits(32),
           c: rnd.randint(-1000, 1000)}
    assert sym_infer(formed, env) == sym_infer(total, env)


pm_dot4_only = PatternMatcher([(UPat(Ops.ADD, dtypes.int32, name="x"), form_dot4)])


def test_a_long_sum_of_byte_dot_products_runs_as_two_chains() -> None:
  """Eight DOT4s of one sum (a Q4 block: 8 words of nibbles) chain through their accumulators;
  as one chain each waited for the one before (vpdpbusd: 5 cycles), 8 deep per block. Two
  chains of 4, added at the end: the int8 matvec over cached weights ran 20 -> 25 GB/s."""
  words = [u32(f"a{i}") for i in range(8)]
  b, c = u32("b"), UOp.variable("c", -1000, 1000, dtypes.int32)
  total = c
  for i, w in enumerate(words):
    for k in range(4):
      ub = ((w & 0x0F0F0F0F) >> (8 * k) & 255).cast(dtypes.int32)
      total = total + ub * (((b ^ i) << (24 - 8 * k)).bitcast(dtypes.int32) >> 24)
  formed = graph_rewrite(total, pm_dot4_only)
  assert formed.op is Ops.ADD and all(s.op is Ops.DOT4 for s in formed.src)

  def depth(u: UOp) -> int: return 1 + depth(u.src[2]) if u.op is Ops.DOT4 else 0
  assert [depth(s) for s in formed.src] == [4, 4]
  rnd = np.random.default_rng(2)
  for _ in range(5):
    env = {**{w: int(rnd.integers(0, 2 ** 32)) for w in words}, b: int(rnd.integers(0, 2 ** 32)),
           c: int(rnd.integers(-1000, 1000))}
    assert sym_infer(formed, env) == sym_infer(total, env)


def dot4_chain(n: int, bound: int | None) -> tuple[UOp, list[UOp]]:
  """A LINEAR-like list of n vector DOT4s, each the accumulator of the next (the last the top),
  each a's bytes at most `bound`."""
  vt = dtypes.int32.vec(8)
  acc, chain = u32("c"), []
  for i in range(n):
    a, b = u32(f"a{i}"), u32(f"b{i}")
    acc = UOp(Ops.DOT4, vt, (a, b, acc), bound)
    chain.append(acc)
  return UOp(Ops.SINK, dtypes.void, tuple(chain[-1:])), chain


@pytest.mark.parametrize("n, bound, lengths", [
  (10, 15, [8, 2]),  # 8 pairs of nibble products: 8 * 2 * 128 * 15 = 30720 fits in int16
  (2, 63, [2]), (2, 64, []),  # 2 * 2 * 128 * 64 = 32768 does not
  (3, 127, []),  # 7-bit bytes: one DOT4's pairs alone nearly fill 16 bits
  (3, None, []),  # a DOT4 whose bound is unknown
])
def test_dot4_chains_sum_in_16_bits_only_what_cannot_overflow(n, bound, lengths) -> None:
  """The C renderer's AVX2 chains (several vpmaddubsw summed in 16 bits, one vpmaddwd) take a
  chain of DOT4s only as long as the bound on a's bytes (DOT4's arg, from isel's masks) keeps
  the 16-bit sum exact; the rest render one DOT4 at a time."""
  linear, chain = dot4_chain(n, bound)
  uses = {c: 1 for c in chain[:-1]}
  chains, absorbed = _dot4_chains(UOp(Ops.SINK, dtypes.void, tuple(chain)), uses)
  assert sorted((len(c) for c in chains.values()), reverse=True) == lengths
  assert len(absorbed) == sum(lengths) - len(lengths)
  assert not absorbed & set(chains)
  if lengths: assert linear.src[0] in chains  # the last DOT4 renders the longest chain


def test_isel_records_the_nibble_bound_on_dot4() -> None:
  """form_dot4 records the mask of a's bytes (15 for nibbles) as each DOT4's arg."""
  a, b = u32("a"), u32("b")
  total = UOp.const(dtypes.int32, 0)
  for k in range(4):
    ub = ((a & 0x0F0F0F0F) >> (8 * k) & 255).cast(dtypes.int32)
    total = total + ub * ((b << (24 - 8 * k)).bitcast(dtypes.int32) >> 24)
  dots = [u for u in graph_rewrite(total, pm_dot4_only).toposort() if u.op is Ops.DOT4]
  assert dots and all(d.arg == 15 for d in dots)
