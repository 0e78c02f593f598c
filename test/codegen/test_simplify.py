"""Kernel simplification: reduce collapse (arange, one-hot gather) and range cleanups."""
import numpy as np

from unigrad import Tensor
from unigrad.codegen.pipeline import CODEGEN_STAGES
from unigrad.dtype import dtypes
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import Ops, UOp


def simplified_kernels(t: Tensor) -> list[UOp]:
  out = []
  for call in t.schedule().src:
    ast = call.src[0]
    for stage in CODEGEN_STAGES[:1]: ast = stage.run(ast, CRenderer())
    out.append(ast)
  return out


def loop_sizes(ast: UOp) -> list[int]:
  return sorted(u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE)


def test_arange_prefix_sum_collapses_to_the_index():
  ks = simplified_kernels(Tensor.arange(1000))
  assert len(ks) == 1
  assert not ks[0].op_in_backward_slice_with_self(Ops.REDUCE), "arange must not be an O(n^2) reduction"
  assert loop_sizes(ks[0]) == [1000]
  assert Tensor.arange(5, 20, 3).tolist() == list(range(5, 20, 3))


def test_one_hot_gather_is_a_direct_load_without_a_loop_over_k():
  K, D = 1000, 7
  T = Tensor(np.arange(K, dtype=np.float32) * 2)
  idx = Tensor([3, 0, 999, 1000, -1, 500, 7], dtype=dtypes.int32)
  out = Tensor.arange(K).reshape(K, 1).eq(idx.reshape(1, -1)).where(T.reshape(K, 1), 0).sum(0)
  ks = simplified_kernels(out)
  assert len(ks) == 1
  assert loop_sizes(ks[0]) == [D], "the spec's one-hot gather must not loop over K"
  assert out.tolist() == [6.0, 0.0, 1998.0, 0.0, 0.0, 1000.0, 14.0]  # out of range reads 0


def test_eye_is_one_kernel_without_reduce():
  ks = simplified_kernels(Tensor.eye(64))
  assert len(ks) == 1 and not ks[0].op_in_backward_slice_with_self(Ops.REDUCE)


def test_size_one_ranges_vanish():
  ks = simplified_kernels(Tensor.empty(8, 1, 4).sum(1))
  assert 1 not in loop_sizes(ks[0])
