"""The MARCH knob: the CPU compiler's target ISA, and the vector width and register count the
heuristics read from the renderer follow it, not the host (an AVX-512 host tests the AVX2 path)."""
import platform

import numpy as np
import pytest

from unigrad import Context, Tensor, dtypes
from unigrad.engine.programs import programs, renderer_for
from unigrad.renderer.cstyle import PRELUDE
from unigrad.runtime import Buffer
from unigrad.runtime.ops_cpu import (ClangCompiler, CPUProgram, cpu_flags, find_c_compiler,
                                     target_vector_bytes)

pytestmark = pytest.mark.skipif(find_c_compiler() is None or platform.machine() != "x86_64",
                                reason="x86-64 ISA levels need an x86-64 C compiler")
AVX2 = "x86-64-v3"
RNG = np.random.default_rng(3)


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def test_avx2_target_has_32_byte_vectors_and_16_registers():
  with Context(MARCH=AVX2):
    ren = renderer_for("CPU")
    assert (ren.vector_bytes, ren.vector_registers) == (32, 16)
    assert f"-march={AVX2}" in ClangCompiler().flags
  assert "-march=native" in ClangCompiler().flags


def test_avx512_target_has_64_byte_vectors_and_32_registers():
  with Context(MARCH="x86-64-v4"):
    ren = renderer_for("CPU")
    assert (ren.vector_bytes, ren.vector_registers) == (64, 32)


def test_unknown_target_is_a_clear_error():
  with Context(MARCH="not-a-cpu"), pytest.raises(ValueError, match="MARCH='not-a-cpu'"):
    target_vector_bytes()


def kernel_names() -> set[str]: return {r.name for r in programs.runners.values()}


@pytest.mark.parametrize("march", [AVX2, "native"])
def test_kernels_on_a_target_match_numpy(march):
  a, b, c, w = rnd(64, 96), rnd(96, 80), rnd(64, 80), rnd(80, 96)
  with Context(MARCH=march):
    before = kernel_names()
    ta, tb, tc, tw = Tensor(a), Tensor(b), Tensor(c), Tensor(w)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta @ tw.T).numpy(), a @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta @ (tw * 2).T).numpy(), a @ (2 * w).T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta.T @ tc).numpy(), a.T @ c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ta.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ta.max(0).numpy(), a.max(0))
    np.testing.assert_allclose((tc * 2 + 1).exp().numpy(), np.exp(c * 2 + 1), rtol=1e-5)
    new = kernel_names() - before
  if march == AVX2:  # the matmul tile: two 8-lane registers by 4 rows (8 accumulators)
    assert any(n.endswith("_u8_u2_u4") for n in new), new
    assert any("_G8_" in n for n in new), new  # a @ (w * 2).T: 8 lanes of partial sums


def test_same_kernel_compiles_once_per_target():
  a = Tensor(rnd(32, 48)).realize()
  with Context(MARCH=AVX2): (a * 3).realize()
  count = len(programs.runners)
  with Context(MARCH="x86-64-v4"): (a * 3).realize()
  assert len(programs.runners) == count + 1, "the AVX-512 program must not be the AVX2 one"


HALF_ROUNDTRIP = PRELUDE + """
void halves(float* restrict out, unsigned short* restrict back, const float* restrict in,
            int core_id) {
  for (int i = 0; i < 65536; i++) out[i] = __h2f((unsigned short)i);
  for (int i = 0; i < 131072; i++) back[i] = __f2h(in[i]);
}"""


@pytest.mark.parametrize("march", ["x86-64-v2", AVX2])
def test_float16_conversions_equal_numpys_with_and_without_f16c(march):
  """The C prelude converts float16 with the F16C instructions where the target has them
  (x86-64-v3; a kernel full of float16 values compiled 5x faster than with the bit-twiddling
  helpers, which x86-64-v2 keeps): every half decodes, and floats (every half's value, random
  ones of every magnitude, the rounding edges) round to nearest even, as numpy does."""
  lib = ClangCompiler(flags=cpu_flags(march)).compile(HALF_ROUNDTRIP)
  rng = np.random.default_rng(0)
  every_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
  edges = np.array([65520.0, 65519.0, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -24, np.inf, np.nan],
                   np.float32)
  scaled = rng.standard_normal(65536 - len(edges)) * 10.0 ** rng.integers(-9, 6, 65536 - len(edges))
  floats = np.concatenate([every_half, scaled.astype(np.float32), edges]).astype(np.float32)
  bufs = [Buffer("CPU", n, dt).copyin(bytes(n * dt.itemsize)) for n, dt in
          ((65536, dtypes.float32), (131072, dtypes.uint16))]
  bufs.append(Buffer("CPU", 131072, dtypes.float32).copyin(floats.tobytes()))
  CPUProgram("halves", lib)(*bufs)
  out = np.frombuffer(bufs[0].copyout(), np.float32)
  back = np.frombuffer(bufs[1].copyout(), np.uint16).view(np.float16)
  np.testing.assert_array_equal(out, every_half)  # (a NaN equals any NaN)
  with np.errstate(over="ignore", invalid="ignore"):
    np.testing.assert_array_equal(back, floats.astype(np.float16))
