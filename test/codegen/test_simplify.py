"""Kernel simplification: reduce collapse (arange, one-hot gather) and range cleanups."""
import re

import numpy as np

from unigrad import Tensor
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
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
  has_reduce = ks[0].op_in_backward_slice_with_self(Ops.REDUCE)
  assert not has_reduce, "arange must not be an O(n^2) reduction"
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


def test_gather_of_a_value_that_also_uses_the_index_keeps_no_invalid():
  T, ar = Tensor([10.0, 20.0, 30.0]), Tensor.arange(3).reshape(3, 1)
  out = ar.eq(Tensor([2, 0]).reshape(1, -1)).where(T.reshape(3, 1) * ar.float(), 0).sum(0)
  assert out.tolist() == [60.0, 0.0]


def test_masked_sum_over_a_size_one_axis():
  x = Tensor([[5.0, 6.0]])
  assert (x > 5).where(x, 0).sum(0).tolist() == [0.0, 6.0]


def test_one_hot_read_of_a_broadcast_value_collapses():
  hot = Tensor.arange(1000).reshape(1000, 1) == Tensor([1, 2, 5000]).reshape(1, -1)
  out = hot.where(Tensor.full((1000, 1), 2.0), 0).sum(0)
  ks = simplified_kernels(out)
  assert len(ks) == 1 and not ks[0].op_in_backward_slice_with_self(Ops.REDUCE)
  assert out.tolist() == [2.0, 2.0, 0.0]


def test_large_gathers_and_aranges_are_not_split_into_loops():
  ks = simplified_kernels(Tensor.arange(1 << 16))
  assert len(ks) == 1 and loop_sizes(ks[0]) == [1 << 16]
  K = 1 << 16
  idx = Tensor([3, K - 1], dtype=dtypes.int32).reshape(1, -1)
  one_hot = Tensor.arange(K).reshape(K, 1).eq(idx)
  out = one_hot.where(Tensor.arange(K).float().reshape(K, 1), 0).sum(0)
  ks = simplified_kernels(out)
  assert all(not k.op_in_backward_slice_with_self(Ops.REDUCE) for k in ks)
  assert out.tolist() == [3.0, float(K - 1)]


# ---- validity-aware index math: padded windows keep no div/mod ----

def rendered_kernels(t: Tensor) -> list[tuple[UOp, str]]:
  """(kernel AST, C source of its body) for each kernel of t, through every codegen stage."""
  ren = CRenderer()
  out = []
  for call in t.schedule().src:
    src = ren.render("k", full_rewrite(call.src[0], ren))
    out.append((call.src[0], src[src.index("void k("):]))
  return out


def div_mod_count(src: str) -> int: return len(re.findall(r"[/%]", src))


def test_padded_3x3_conv_index_math_has_no_div_or_mod():
  x, w = Tensor.empty(2, 8, 14, 14), Tensor.empty(16, 8, 3, 3)
  ks = rendered_kernels(x.conv2d(w, padding=1))
  assert [div_mod_count(src) for _, src in ks] == [0] * len(ks)
  conv = [src for ast, src in ks if ast.op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(conv) == 1 and "?" not in conv[0], "the window reads are not gated"


def test_conv_transpose_index_math_given_its_gates():
  x, w = Tensor.empty(1, 4, 8, 8), Tensor.empty(4, 4, 3, 3)
  ks = rendered_kernels(x.conv_transpose2d(w, stride=2, padding=1))
  conv = [src for ast, src in ks if ast.op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(conv) == 1 and div_mod_count(conv[0]) == 0, "the flipped kernel index is affine"
  # the dilated, padded input: 1 <= y <= 15 makes (y + 15) // 16 one and (16*a + y + 15) // 32
  # (a + 1) // 2, which leaves only the stride's parity checks and halvings
  assert sum(div_mod_count(src) for _, src in ks) <= 4
