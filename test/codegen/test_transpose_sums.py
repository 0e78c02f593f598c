"""Pack: the horizontal sums of a DotPlan tile become one transposed sum per run of outputs, and
the outputs' epilogue one vector computation; matmuls of every operand layout (the DotPlan's
among them) match numpy, at sizes no vector width divides too."""
import numpy as np
import pytest
import torch

from unigrad import Tensor
from unigrad.codegen.transpose_sums import RUNS, lane_sums, transpose_sums, transposed_sum
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import AddrSpace, dtypes
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Device
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.uop import Ops, UOp

AVX512 = CRenderer("CPU", vector_bytes=64, vector_registers=32)
needs_cc = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")


def evaluate(u: UOp, env: dict[UOp, list[float]]) -> list[float] | float:
  """The value of a graph of STACK, GEP and elementwise ADD/MAX over the vectors in `env`."""
  if u in env: return env[u]
  vals = [evaluate(s, env) for s in u.src]
  if u.op is Ops.GEP: return vals[0][u.arg[0]]
  if u.op is Ops.STACK: return list(vals)
  fn = {Ops.ADD: lambda a, b: a + b, Ops.MAX: max}[u.op]
  return [fn(a, b) for a, b in zip(*vals)] if isinstance(vals[0], list) else fn(*vals)


@pytest.mark.parametrize("k,n", [(k, n) for k in sorted(RUNS) for n in RUNS[k]])
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_transposed_sum_puts_each_vectors_total_in_its_lane(k, n, op):
  # n vectors of k lanes: 8 of 8 (AVX-512's 8 panel rows), 4 of 8 (AVX2's 4), 4 of 4
  rng = np.random.default_rng(k)
  vecs = [UOp(Ops.PARAM, dtypes.float.vec(k), arg=i) for i in range(n)]
  env = {v: [float(x) for x in rng.integers(-50, 50, k)] for v in vecs}
  got = evaluate(transposed_sum(vecs, op), env)
  fn = sum if op is Ops.ADD else max
  assert got == [fn(env[v]) for v in vecs]


def test_lane_sums_are_complete_sums_of_one_vector():
  v, w = (UOp(Ops.PARAM, dtypes.float.vec(4), arg=i) for i in range(2))
  lane = [UOp(Ops.GEP, dtypes.float, (v,), (i,)) for i in range(4)]
  full = (lane[0] + lane[1]) + (lane[2] + lane[3])
  partial = lane[0] + lane[1]
  mixed = full + UOp(Ops.GEP, dtypes.float, (w,), (0,))
  sums = lane_sums(UOp.sink(full, partial, mixed))
  assert sums == {full: v}


def dot_linear(t: Tensor, ren: CRenderer = AVX512):
  """The LINEAR of t's one matmul kernel for `ren` (an AVX-512 target)."""
  kernels = [c.src[0] for c in t.schedule().src
             if c.src[0].op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(kernels) == 1
  return full_rewrite(kernels[0], ren)


def vector_stores(linear) -> list[int]:
  """The lanes of each store to a buffer (not to an accumulator register)."""
  return [u.src[1].dtype.count for u in linear.src if u.op is Ops.STORE
          and u.src[0].src[0].op is Ops.PARAM
          and u.src[0].src[0].arg.addrspace is AddrSpace.GLOBAL]


def test_x_at_w_t_stores_its_tile_as_vectors_without_lane_by_lane_sums():
  x, w, b = Tensor.empty(64, 96), Tensor.empty(80, 96), Tensor.empty(80)
  linear = dot_linear((x @ (w * 2).T + b).relu())
  assert vector_stores(linear) == [8, 8], "two rows of 8 outputs: one 16-lane epilogue"
  avx2 = dot_linear((x @ (w * 2).T + b).relu(), CRenderer("CPU", vector_bytes=32))
  assert vector_stores(avx2) == [4, 4], "AVX2: two rows of 4 outputs, one 8-lane epilogue"
  assert any(u.dtype.count == 16 for u in linear.src if u.op is Ops.MAX or u.op is Ops.WHERE)
  geps = [u for u in linear.src if u.op is Ops.GEP and u.dtype.count == 1]
  assert all(u.src[0].dtype.count > 1 for u in geps)
  assert not [u for u in linear.src if u.op is Ops.ADD and u.dtype.count == 1
              and all(s.op is Ops.GEP for s in u.src)], "no scalar sum of lanes is left"


def test_without_vectors_nothing_is_packed():
  ast = (Tensor.empty(8, 8) @ Tensor.empty(8, 8)).schedule().src[0].src[0]
  assert transpose_sums(ast, CRenderer()) is ast


def test_runs_that_read_the_stored_buffer_keep_scalar_stores():
  # x @ W.T accumulated into its own output (out += x @ W.T): the epilogue loads what the run
  # stores, so no store may move across it; each value still reads its lane of the transposed sum
  out, x, w = Tensor.empty(16, 16), Tensor.empty(16, 64), Tensor.empty(16, 64)
  linear = dot_linear(out.assign(out + x @ (w * 2).T))
  assert set(vector_stores(linear)) == {1}


rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape, dtype=np.float32)


# (M, N, K): dot-tileable, odd everything (no vector width divides), odd rows only, a reduce no
# DotPlan split divides (100: the transposing copy), MiniLM's FFN up projection
SIZES = [(64, 80, 96), (37, 53, 29), (33, 40, 72), (48, 24, 100), (256, 1536, 384)]
LAYOUTS = {
  "a @ b": lambda a, b: (a, b),
  "a @ b.T": lambda a, b: (a, b.T),
  "a.T @ b": lambda a, b: (a.T, b),
  "a.T @ b.T": lambda a, b: (a.T, b.T),
}


@needs_cc
@pytest.mark.parametrize("size", SIZES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_matches_numpy(layout, size):
  m, n, k = size
  shapes = {"a @ b": ((m, k), (k, n)), "a @ b.T": ((m, k), (n, k)), "a.T @ b": ((k, m), (k, n)),
            "a.T @ b.T": ((k, m), (n, k))}[layout]
  a, b = rand(*shapes[0]), rand(*shapes[1])
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  got = (lambda x, y: x @ y)(*LAYOUTS[layout](ta, tb)).numpy()
  np.testing.assert_allclose(got, np.matmul(*LAYOUTS[layout](a, b)), rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("size", [(4, 24, 40), (3, 20, 48), (5, 16, 64)], ids=str)
def test_batched_and_broadcast_transposed_matmuls_match_numpy(size):
  batch, n, k = size
  a, b, w = rand(batch, n, k), rand(batch, n, k), rand(n, k)
  ta, tb, tw = (Tensor(v).realize() for v in (a, b, w))
  np.testing.assert_allclose((ta @ tb.transpose(-1, -2)).numpy(), a @ b.transpose(0, 2, 1),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose((ta @ tw.T).numpy(), a @ w.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose((ta.transpose(-1, -2) @ tb).numpy(), a.transpose(0, 2, 1) @ b,
                             rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("act", ["relu", "gelu", "none"])
def test_linear_epilogues_match_torch(act):
  x, w, b = rand(2, 24, 64), rand(40, 64), rand(40)
  tx, tw, tb = (Tensor(v).realize() for v in (x, w, b))
  y = tx @ tw.T + tb
  ref = torch.nn.functional.linear(*(torch.from_numpy(v) for v in (x, w, b)))
  if act != "none": y, ref = getattr(y, act)(), getattr(torch.nn.functional, act)(ref)
  np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


@needs_cc
def test_max_of_products_packs_with_max():
  x, w = rand(16, 64), rand(24, 64)
  tx, tw = Tensor(x).realize(), Tensor(w).realize()
  got = (tx[:, None, :] * tw[None, :, :]).max(-1).numpy()
  np.testing.assert_allclose(got, (x[:, None, :] * w[None, :, :]).max(-1), rtol=1e-5)


@needs_cc
def test_the_default_device_renders_a_dot_tile_with_vector_stores():
  if not Device["CPU"].renderer.vector_bytes: pytest.skip("no vector target")
  x, w = Tensor.empty(32, 64), Tensor.empty(48, 64)
  kernel = (x @ (w * 2).T).schedule().src[-1].src[0]
  assert max(vector_stores(full_rewrite(kernel, Device["CPU"].renderer))) in (4, 8)
