"""Adjacent axes merged before the opts (codegen/merge_axes.py): which pairs merge, and that a
merged kernel computes what the unmerged one did."""
import numpy as np
from hypothesis import given, settings, strategies as st

from unigrad import Tensor
from unigrad.codegen.pipeline import CODEGEN_STAGES
from unigrad.runtime.device import Device
from unigrad.uop import Ops


def axes(t: Tensor) -> list[tuple[str, int]]:
  """The (kind, size) of each range of `t`'s last kernel after the simplify stage."""
  ast = CODEGEN_STAGES[0].run(t.schedule().src[-1].src[0], Device["CPU"].renderer)
  ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg.id)
  return [(r.arg.axis_type.name, r.src[0].arg) for r in ranges]


def test_contiguous_axes_merge_into_one():
  assert axes(Tensor.empty(4, 6, 5) + 1) == [("LOOP", 120)]
  assert axes(Tensor.empty(4, 6, 5).sum(axis=(1, 2))) == [("LOOP", 4), ("REDUCE", 30)]


def test_a_transposing_copy_merges_what_both_sides_read_in_order():
  # the (cin, k) of a (cout, cin, k) weight copied to (cin, k, cout): the copy had a contiguous
  # axis of 5 and ran as scalar moves
  assert axes(Tensor.empty(512, 256, 5).permute(1, 2, 0).contiguous()) == [("LOOP", 1280),
                                                                          ("LOOP", 512)]
  assert axes(Tensor.empty(4, 6, 5).permute(1, 0, 2).contiguous()) == [("LOOP", 6), ("LOOP", 4),
                                                                      ("LOOP", 5)]


def test_a_padded_window_keeps_its_rows_and_columns_apart():
  x, w = Tensor.empty(1, 8, 10, 10), Tensor.empty(16, 8, 3, 3)
  conv = axes(x.conv2d(w, padding=1))
  assert ("LOOP", 10) in conv and ("LOOP", 100) not in conv  # the pad's guards read h and w


def test_a_concatenation_merges_the_image_but_not_the_channels():
  x = Tensor.empty(1, 8, 10, 10)
  assert axes(Tensor.cat(x.exp(), x, dim=1)) == [("LOOP", 16), ("LOOP", 100)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.randoms(use_true_random=False),
       st.booleans())
def test_merged_kernels_compute_what_numpy_does(shape, rnd, reduce):
  a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 7
  perm = list(range(len(shape)))
  rnd.shuffle(perm)
  want, got = a.transpose(perm), Tensor(a).permute(*perm)
  if reduce:
    red = tuple(sorted(rnd.sample(range(len(shape)), rnd.randint(1, len(shape)))))
    want, got = want.sum(axis=red), got.sum(axis=red)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
