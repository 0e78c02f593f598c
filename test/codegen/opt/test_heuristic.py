"""The hand-coded heuristics: register tiles read off the loads' strides, THREAD placement, and
that a tile is only taken when the codegen makes its vector axis the vector."""
import math

import numpy as np
import pytest

from unigrad import Context, Tensor, dtypes
from unigrad.codegen.opt.heuristic import (ReducePlan, TilePlan, hand_coded_optimizations,
                                           load_strides, plan_dot, plan_reduce, plan_tiles,
                                           register_tile)
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import CODEGEN_STAGES, finish, full_rewrite
from unigrad.codegen.vectorize import choose_vector_range
from unigrad.nn.quantized import (ROW_LANES, PackedWeight, int8_linear, interleave, linear, pack,
                                   packed_weight)
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.uop import AxisType, KernelInfo, Ops, UOp
from unigrad.uop.variable import Variable

from codegen.kernels import inputs_for, params_of

AVX512, AVX2 = CRenderer(vector_bytes=64, vector_registers=32), CRenderer(vector_bytes=32)
SCALAR = CRenderer()


def reduce_kernel(t: Tensor) -> OptKernel:
  """The (simplified) kernel of t that has a REDUCE, as the optimize stage gets it."""
  asts = [c.src[0] for c in t.schedule().src if c.src[0].op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(asts) == 1
  return OptKernel(CODEGEN_STAGES[0].run(asts[0], SCALAR))


def run_cpu(kernel: UOp, opts, inputs: list[np.ndarray]) -> np.ndarray:
  """Output buffer 0 of `kernel` with `opts`, as AVX2 C code on the CPU."""
  linear = full_rewrite(kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts))), AVX2)
  bufs = [Buffer("CPU", len(a), p.dtype).copyin(a.tobytes())
          for a, p in zip(inputs, params_of(kernel))]
  dev = Device["CPU"]
  dev.runtime("k", dev.compiler.compile_cached(AVX2.render("k", linear)))(*bufs)
  return np.frombuffer(bufs[0].copyout(), dtype=np.float32).copy()


def loop_ids(k: OptKernel) -> list[int]:
  return [r.arg.id for r in k.axes if r.arg.axis_type is AxisType.LOOP]


def upcasts(k: OptKernel) -> list[int]:
  return [s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.UPCAST]


def test_load_strides_of_a_matmul():
  k = reduce_kernel(Tensor.empty(64, 32) @ Tensor.empty(32, 48))
  m, n = loop_ids(k)
  assert sorted((s.of[m], s.of[n]) for s in load_strides(k)) == [(0, 1), (32, 0)]  # B: n, A: m


def test_matmul_tiles_its_contiguous_output_axis():
  k = reduce_kernel(Tensor.empty(512, 512) @ Tensor.empty(512, 512))
  m, n = loop_ids(k)
  assert plan_tiles(k, 64)[0] == TilePlan(n, m, (m,))
  out = hand_coded_optimizations(k, AVX512, threads=2)
  assert out.axis_types().count(AxisType.THREAD) == 1
  assert upcasts(out) == [16, 2, 8], "two registers of n (two vectors), reused over 8 rows of A"
  outer = next(r.arg.id for r in out.axes if r.arg.axis_type is AxisType.LOOP)
  # the outermost loop walks B's 32-column panels (A does not depend on it)
  assert sorted(st.of[outer] for st in load_strides(out)) == [0, 32], "B's panel stays in cache"
  vec = choose_vector_range(out.ast, 64)
  assert vec is not None and vec.src[0].arg == 16


def test_matmul_tile_follows_the_targets_vector_width_and_registers():
  k = reduce_kernel(Tensor.empty(512, 512) @ Tensor.empty(512, 512))
  out = hand_coded_optimizations(k, AVX2, threads=1)
  assert upcasts(out) == [8, 6, 2], "12 of AVX2's 16 registers: 6 rows of 2 vectors of 8 lanes"
  vec = choose_vector_range(out.ast, 32)
  assert vec is not None and vec.src[0].arg == 8


def test_conv_prefers_the_widest_contiguous_axis():
  """Weights are stored (cin, kh, kw, cout): cout (64) allows wider vectors than ox (56)."""
  k = reduce_kernel(Tensor.empty(4, 16, 56, 56).conv2d(Tensor.empty(64, 16, 3, 3), padding=1))
  b, cout, oy, ox = loop_ids(k)
  plans = plan_tiles(k, 64)
  assert [(p.vector, p.reuse) for p in plans] == [(cout, ox), (ox, cout), (ox, oy)]
  assert plans[0].independent == (b, oy, ox) and plans[1].independent == (cout,)
  assert not plans[-1].checked


def test_conv_tile_is_one_the_codegen_vectorizes():
  k = reduce_kernel(Tensor.empty(4, 16, 56, 56).conv2d(Tensor.empty(64, 16, 3, 3), padding=1))
  out = hand_coded_optimizations(k, AVX512, threads=2)
  vec = choose_vector_range(out.ast, 64)
  assert vec is not None and vec.arg.axis_type is AxisType.UPCAST and vec.src[0].arg >= 8
  assert len(upcasts(out)) in (2, 3) and out.axis_types().count(AxisType.THREAD) == 1
  assert 64 <= math.prod(upcasts(out)) <= 128, "a tile of about 8 registers"


def depthwise_bn(channels: int, size: int, kernel: int, stride: int) -> OptKernel:
  """A depthwise convolution with a batchnorm and ReLU6 after it (EfficientNet's), as one kernel."""
  x = Tensor.empty(1, channels, size, size)
  y = x.conv2d(Tensor.empty(channels, 1, kernel, kernel), None, channels, stride, 1, kernel // 2)
  c = Tensor.empty(channels)
  return reduce_kernel(y.batchnorm(c, c, c, c).relu6())


@pytest.mark.parametrize("channels, size, kernel, stride", [(672, 14, 5, 1), (144, 56, 5, 2),
                                                            (96, 112, 3, 2), (144, 56, 3, 1)])
def test_depthwise_conv_gets_no_tile_from_its_per_channel_loads(channels, size, kernel, stride):
  """The batchnorm's per-channel loads are contiguous along the channels but read outside the
  window loop: no tile, no output vector; the C compiler vectorizes the plain loops (672x14x14
  5x5: a 2-lane output vector ran 8x slower)."""
  k = depthwise_bn(channels, size, kernel, stride)
  assert plan_tiles(k, 64) == []
  out = hand_coded_optimizations(k, AVX512, threads=2)
  assert upcasts(out) == [] and AxisType.GROUP_REDUCE not in out.axis_types()
  assert out.axis_types().count(AxisType.THREAD) == 1


def test_short_window_conv_over_three_channels_keeps_its_tile():
  """A stem convolution (3 input channels, 3x3: every reduce axis short) reuses each input across
  its output channels: the register tile stays."""
  k = reduce_kernel(Tensor.empty(1, 3, 224, 224).conv2d(Tensor.empty(32, 3, 3, 3), stride=2,
                                                          padding=1))
  assert [p.reuse is not None for p in plan_tiles(k, 64)] == [True]
  assert len(upcasts(hand_coded_optimizations(k, AVX512, threads=2))) >= 2


def test_avx2_conv_tile_keeps_eight_accumulators():
  """A nested reduce's tile takes a quarter of the registers but never fewer accumulators than
  two FMA units of 4 cycles keep in flight: AVX2's 16 registers give 8, not 4 (which ran the
  convolution at half the FMA rate)."""
  k = reduce_kernel(Tensor.empty(4, 16, 56, 56).conv2d(Tensor.empty(64, 16, 3, 3), padding=1))
  out = hand_coded_optimizations(k, AVX2, threads=2)
  vec = choose_vector_range(out.ast, 32)
  assert vec is not None and vec.src[0].arg == 8
  assert math.prod(upcasts(out)) == 8 * 8, "8 accumulators of 8 lanes"


def test_without_vector_values_the_first_plan_is_taken():
  k = reduce_kernel(Tensor.empty(4, 16, 56, 56).conv2d(Tensor.empty(64, 16, 3, 3), padding=1))
  out = hand_coded_optimizations(k, SCALAR, threads=2)
  assert upcasts(out) == [4, 2, 4], "two 16-byte registers by 4, 8 of them for a nested reduce"
  thread = [r for r in out.axes if r.arg.axis_type is AxisType.THREAD]
  assert len(thread) == 1 and thread[0].src[0].arg == 2


def test_short_reductions_and_elementwise_kernels_get_no_tile():
  k = reduce_kernel(Tensor.empty(256, 8).sum(1))
  assert plan_tiles(k, 64) == []
  assert AxisType.UPCAST not in hand_coded_optimizations(k, AVX512, threads=1).axis_types()


def only_kernel(t: Tensor) -> OptKernel:
  asts = [c.src[0] for c in t.schedule().src]
  assert len(asts) == 1
  return OptKernel(CODEGEN_STAGES[0].run(asts[0], SCALAR))


def test_elementwise_kernels_get_one_register_of_the_contiguous_axis():
  k = only_kernel((Tensor.empty(1024, 1024) * Tensor.empty(1024, 1024) + 1).relu())
  out = hand_coded_optimizations(k, AVX512, threads=2)
  assert upcasts(out) == [16] and out.axis_types().count(AxisType.THREAD) == 1
  vec = choose_vector_range(out.ast, 64)
  assert vec is not None and vec.src[0].arg == 16
  assert upcasts(hand_coded_optimizations(k, SCALAR, threads=2)) == [], "no vector values"


def test_column_sums_vectorize_the_output_and_row_sums_the_reduce():
  cols = hand_coded_optimizations(only_kernel(Tensor.empty(512, 256).sum(0)), AVX512, threads=1)
  assert upcasts(cols) == [16] and AxisType.GROUP_REDUCE not in cols.axis_types()
  rows = hand_coded_optimizations(only_kernel(Tensor.empty(256, 512).sum(1)), AVX512, threads=1)
  assert upcasts(rows) == [] and AxisType.GROUP_REDUCE in rows.axis_types()


def group_lanes(k: OptKernel) -> list[int]:
  return [s for s, t in zip(k.sizes, k.axis_types()) if t is AxisType.GROUP_REDUCE]


# both inputs contiguous along the reduce axis, neither along an output axis; the second operand
# is computed (a view of a buffer would get a transposing copy from rangeify instead)
B = Tensor.empty(8, 256, 256)
LAYOUTS = {
  "a @ b.T": lambda: Tensor.empty(512, 512) @ (Tensor.empty(512, 512) * 2).T,
  "x @ W.T (nn.Linear)": lambda: Tensor.empty(256, 384) @ (Tensor.empty(1536, 384) * 2).T,
  "batched @ .T": lambda: B @ (B * 2).permute(0, 2, 1),
  "broadcast @ W.T": lambda: Tensor.empty(8, 256, 256) @ (Tensor.empty(256, 256) * 2).T,
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_transposed_weight_gets_a_register_tile_of_partial_sums(name):
  # the matmul tile on these vectorized a strided axis: one load per lane, 30x slower
  k = reduce_kernel(LAYOUTS[name]())
  for ren, tile in ((AVX512, 16), (AVX2, 8)):
    out = hand_coded_optimizations(k, ren, threads=2)
    assert group_lanes(out) == [8], "32 bytes of partial sums along the reduce axis"
    assert sorted(upcasts(out)) == [2, tile // 2], "half the registers: 2 streamed rows by N"
    vec = choose_vector_range(out.ast, ren.vector_bytes)
    assert vec is not None and vec.arg.axis_type is AxisType.GROUP_REDUCE


def test_a_long_reduce_gets_four_panel_rows_and_stream_blocks():
  # 8 rows of 1536 floats (48 KiB) overflow a 32 KiB L1: 4 rows, 4 streamed (82 -> 91 GFLOPS);
  # x (1.5 MiB) streams in blocks that stay in L2, each past every panel (91 -> 101 GFLOPS)
  k = reduce_kernel(Tensor.empty(256, 1536) @ (Tensor.empty(384, 1536) * 2).T)
  out = hand_coded_optimizations(k, AVX512, threads=1)
  assert group_lanes(out) == [8] and sorted(upcasts(out)) == [4, 4]
  loops = [s for s, t in zip(out.sizes, out.axis_types()) if t is AxisType.LOOP]
  assert len(loops) == 3 and loops[1] == 384 // 4, "stream blocks, panels, rows in a block"


def test_dot_panel_runs_outside_the_streamed_inputs_batch_loops():
  # MiniLM's x is 8 sequences of 32 rows: W is read from L2 once per call, not once per sequence
  k = reduce_kernel(Tensor.empty(8, 32, 384) @ (Tensor.empty(384, 384) * 2).T)
  out = hand_coded_optimizations(k, AVX512, threads=1)
  outer = next(r.arg.id for r in out.axes if r.arg.axis_type is AxisType.LOOP)
  strides = sorted(st.of[outer] for st in load_strides(out))
  assert strides == [0, 8 * 384], "x does not depend on the outermost loop, W's 8 rows do"


def test_attention_output_projection_gets_the_dot_tile():
  # the reduce axis merges heads and head size, (h, d) -> h*d: the attention output is no linear
  # function of it, but contiguous along runs of d, which the 8 partial sums split off
  att = Tensor.empty(8, 12, 32, 32).transpose(1, 2).reshape(8, 32, 384)
  k = reduce_kernel(att @ (Tensor.empty(384, 384) * 2).T)
  plan = plan_dot(k, 8)
  assert plan is not None and plan.lanes == 8
  out = hand_coded_optimizations(k, AVX512, threads=1)
  assert group_lanes(out) == [8]
  vec = choose_vector_range(finish(out), 64)  # simplified: 8*(r % 4) + g, contiguous along g
  assert vec is not None and vec.arg.axis_type is AxisType.GROUP_REDUCE


@pytest.mark.parametrize("layout", ["a.T @ b", "a.T @ b.T", "broadcast"])
def test_other_layouts_get_the_matmul_tile(layout):
  a, b = Tensor.empty(512, 512), Tensor.empty(512, 512)
  t = {"a.T @ b": lambda: a.T @ b, "a.T @ b.T": lambda: a.T @ b.T,
       "broadcast": lambda: Tensor.empty(8, 256, 256) @ Tensor.empty(256, 256)}[layout]()
  out = hand_coded_optimizations(reduce_kernel(t), AVX512, threads=2)
  assert upcasts(out) == [16, 2, 8] and not group_lanes(out)
  vec = choose_vector_range(out.ast, 64)
  assert vec is not None and vec.src[0].arg == 16 and vec.arg.axis_type is AxisType.UPCAST


def test_transposing_copy_unrolls_rows_of_the_load():
  # the store is contiguous along one axis, the load along the other: 8 rows per vector use
  # each loaded line 8 times (a 512x512 transpose 0.70 -> 0.09 ms; 4 rows: 0.42 ms)
  k = only_kernel(Tensor.empty(512, 512).T.contiguous())
  assert upcasts(hand_coded_optimizations(k, AVX512, threads=1)) == [16, 8]
  plain = only_kernel(Tensor.empty(512, 512) + 1)
  assert upcasts(hand_coded_optimizations(plain, AVX512, threads=1)) == [16]


def test_row_sums_keep_one_register_of_partial_sums_per_target():
  k = only_kernel(Tensor.empty(256, 512).sum(1))
  assert group_lanes(hand_coded_optimizations(k, AVX512, threads=1)) == [16]
  assert group_lanes(hand_coded_optimizations(k, AVX2, threads=1)) == [8]  # not two registers


def conv_weight_gradient() -> OptKernel:
  """dw of a 3x3 convolution over 4x4 outputs (the digits CNN's second layer)."""
  w = Tensor.empty(16, 8, 3, 3, requires_grad=True)
  (dw,) = Tensor.empty(64, 8, 6, 6).conv2d(w).gradient(w, gradient=Tensor.empty(64, 16, 4, 4))
  return reduce_kernel(dw)


def test_conv_weight_gradient_gets_vector_partial_sums_reused_across_its_outputs():
  # both inputs are contiguous along the output width (the innermost reduce, 4 long) and no
  # output axis makes a vector (the kernel is 3 wide): one scalar accumulator before, 1.3 ms
  k = conv_weight_gradient()
  cout, _, _, kw = loop_ids(k)
  assert plan_reduce(k) == ReducePlan(k.axes[-1].arg.id, (kw, cout), 4)
  for ren, tile in ((AVX512, [3, 4]), (AVX2, [3, 2])):
    out = hand_coded_optimizations(k, ren, threads=2)
    assert group_lanes(out) == [4], "the whole 4-long reduce axis as partial sums"
    assert upcasts(out) == tile, "3 kernel columns by output channels: half the registers"
    vec = choose_vector_range(out.ast, ren.vector_bytes)
    assert vec is not None and vec.arg.axis_type is AxisType.GROUP_REDUCE


def test_reduce_plan_needs_two_contiguous_loads_along_the_reduce():
  assert plan_reduce(reduce_kernel(Tensor.empty(64, 32).sum(1))) is None  # one load
  # a load strided along the innermost reduce axis (a column of a row-major matrix)
  k = reduce_kernel((Tensor.empty(32, 64) * Tensor.empty(64, 32).T).sum(1))
  assert plan_reduce(k) is None


def test_a_per_row_broadcast_load_unrolls_no_rows():
  # (x - mean) / std: the row statistics are contiguous along the rows but one scalar per vector;
  # unrolling 4 rows for them multiplied a GELU-backward kernel's code by 4 (200 ms of codegen)
  x, mean = Tensor.empty(64, 256), Tensor.empty(64, 1)
  k = only_kernel(((x - mean) * 3).exp())
  assert upcasts(hand_coded_optimizations(k, AVX512, threads=1)) == [16]


def test_an_unvectorized_tile_fits_in_registers():
  # B is read with a nonlinear index along the reduce axis and no output axis is contiguous in
  # a load: the register tile was 128 scalar accumulators (spilled, 200 ms of codegen)
  a = Tensor.empty(64, 64)
  b = Tensor.empty(4, 16, 16).permute(1, 0, 2).reshape(16, 64) * 2
  k = reduce_kernel(b @ a.T)
  out = hand_coded_optimizations(k, AVX512, threads=1)
  assert math.prod(upcasts(out)) <= 16 or choose_vector_range(out.ast, 64) is not None


@pytest.mark.parametrize("n", [256, 2048])
def test_few_register_tile_takes_six_rows_padded(n):
  """AVX2's 16 registers: 12 accumulators (6 rows of 2 vectors), the rows padded to a multiple of
  6; AVX-512's 32 keep 8 rows of 2 vectors (16 accumulators)."""
  k = reduce_kernel(Tensor.empty(n, n) @ Tensor.empty(n, n))
  out = hand_coded_optimizations(k, AVX2, threads=2)
  assert upcasts(out) == [8, 6, 2]
  assert any(o.op.name == "PADTO" and o.arg == 6 for o in out.applied)
  assert upcasts(hand_coded_optimizations(k, AVX512, threads=2)) == [16, 2, 8]


def test_few_register_tile_needs_enough_rows():
  k = reduce_kernel(Tensor.empty(32, 512) @ Tensor.empty(512, 512))
  assert upcasts(hand_coded_optimizations(k, AVX2, threads=1)) == [8, 2, 4]


@pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("shape", [((200, 300), (300, 48)), ((3, 100, 64), (3, 64, 128))],
                         ids=["odd", "batched"])
def test_few_register_tile_equals_the_four_row_tile_on_the_cpu(shape):
  """The padded 6-row tile sums each output in the same order as the 4-row tile: equal bits."""
  a, b = (Tensor.empty(*s) for s in shape)
  k = reduce_kernel(a @ b)
  six = hand_coded_optimizations(k, AVX2, threads=1)
  assert upcasts(six)[:2] == [8, 6]
  plan = plan_tiles(k, 32)[0]
  four = register_tile(k, plan, 32, 16)
  assert four is not None and upcasts(four) == [8, 2, 4]
  inputs = inputs_for(k.ast)
  got = run_cpu(k.ast, six.applied, inputs)
  np.testing.assert_array_equal(got, run_cpu(k.ast, four.applied, inputs))
  x, y = (v.reshape(s) for v, s in zip(inputs[1:], shape))
  np.testing.assert_allclose(got.reshape((x @ y).shape), x @ y, rtol=1e-4, atol=1e-4)


def test_batched_row_sums_get_partial_sums_not_a_scalar_tile():
  # softmax's sum of its realized exp over (heads, rows, keys): no load is reused across the two
  # innermost output axes, so a 4x4 scalar register tile only lost the vectors (33 -> 13 us)
  k = only_kernel(Tensor.empty(12, 128, 128).sum(-1))
  assert plan_tiles(k, 64) == []
  for ren, lanes in ((AVX512, [16]), (AVX2, [8])):
    out = hand_coded_optimizations(k, ren, threads=1)
    assert group_lanes(out) == lanes and upcasts(out) == []


def test_masked_max_and_sum_of_exp_take_full_registers_of_partial_sums():
  # softmax's max over a key mask: the ReducePlan's partial sums are 32 bytes for a sum of
  # products (FMA throughput) but a whole register for a max or a transcendental's body
  x, keep = Tensor.empty(12, 128, 128), Tensor.empty(1, 1, 128, dtype="int32").cast("bool")
  masked = keep.where(x, -math.inf)
  for t in (masked.max(-1), (masked - 1).exp().sum(-1)):
    assert group_lanes(hand_coded_optimizations(only_kernel(t), AVX512, threads=1)) == [16]
  w = conv_weight_gradient()
  assert group_lanes(hand_coded_optimizations(w, AVX512, threads=1)) == [4]


@pytest.mark.parametrize("make", [lambda: Tensor.empty(256, 256) @ Tensor.empty(256, 256),
                                  lambda: Tensor.empty(64, 384) @ Tensor.empty(96, 384).T],
                         ids=["matmul", "x @ W.T"])
def test_a_tile_records_the_vector_range_it_was_made_for(make):
  kernel = CODEGEN_STAGES[0].run(make().schedule().src[-1].src[0], SCALAR)
  k = hand_coded_optimizations(OptKernel(kernel), AVX512, 1)
  vectors = {r.arg.id for r in k.axes if r.arg.axis_type in (AxisType.UPCAST,
                                                             AxisType.GROUP_REDUCE)}
  assert k.vector is not None and len(k.vector) == 1 and set(k.vector) <= vectors
  assert finish(k).arg.vector == k.vector  # optimize hands the choice on in the KernelInfo
  assert full_rewrite(kernel, AVX512).arg.vector  # expand recorded the register of it it kept


def test_without_a_tile_nothing_is_recorded_and_expand_chooses():
  kernel = CODEGEN_STAGES[0].run(Tensor.empty(256, 256).exp().schedule().src[-1].src[0], SCALAR)
  k = hand_coded_optimizations(OptKernel(kernel), AVX512, 1)
  assert k.applied and k.vector is None
  assert full_rewrite(kernel, AVX512).arg.vector  # expand chose, and recorded its choice


def test_a_symbolic_reduce_takes_an_output_vector_and_accumulators():
  """Attention's probabilities @ values over a bound cache length: the reduce cannot be split
  into partial sums, so the vector comes from the output axis the values are contiguous along
  (it ran scalar: SmolLM2's decode, 9 heads x 64 over 140 positions, 70 -> 10 us), and the
  heads are upcast by the largest divisor of 9 within half the registers: 9 independent
  accumulators, where one FMA chain per vector waited on its own latency."""
  n = Variable("n", 2, 512).bind(140)
  p, v = Tensor.empty(9, 512)[:, :n], Tensor.empty(512, 64)[:n]
  k = reduce_kernel(p @ v)
  out = hand_coded_optimizations(k, AVX512, threads=1)
  assert upcasts(out) == [16, 9]
  assert choose_vector_range(finish(out), 64) is not None


def decode_scores() -> OptKernel:
  """SmolLM2's decode attention scores: 3 key/value heads, each serving 3 query heads, over a
  bound cache length."""
  n = Variable("n", 2, 512).bind(140)
  q = Tensor.empty(1, 3, 3, 1, 64)
  keys = Tensor.empty(1, 512, 3, 64)[:, :n].permute(0, 2, 3, 1).reshape(1, 3, 1, 64, n)
  return reduce_kernel(q @ keys)


def test_decode_scores_share_each_key_across_its_query_heads():
  """The dot tile's stream (the 3 query heads of a key) is upcast whole, though 3 is no power of
  two, and takes the registers the symbolic panel (the positions) cannot: each loaded key serves
  the 3 heads' accumulators."""
  out = hand_coded_optimizations(decode_scores(), AVX512, threads=1)
  assert upcasts(out) == [3] and group_lanes(out) == [8]


def test_threads_pad_an_axis_they_do_not_divide():
  """No output axis of the decode scores divides 2 threads (3 heads, 3 query heads, a symbolic
  length): the key/value heads are padded to 4 and split 2 and 2, a padded head storing nothing;
  an axis whose padding would leave more than a quarter idle is not padded."""
  k = decode_scores()
  out = hand_coded_optimizations(k, AVX512, threads=2)
  thread = [s for s, t in zip(out.sizes, out.axis_types()) if t is AxisType.THREAD]
  assert thread == [2] and any(o.op.name == "PADTO" for o in out.applied)
  small = reduce_kernel(Tensor.empty(5, 4096).sum(1))
  assert not any(t is AxisType.THREAD for t in hand_coded_optimizations(small, AVX512,
                                                                        threads=4).axis_types())


@pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")
def test_padded_threads_compute_decode_attention_as_numpy():
  """The decode scores with their padded threads (a padded head's stores skipped) and the rest
  of grouped attention on the CPU, at two bound lengths of one program, against numpy."""
  from unigrad.llm.model import grouped_attention  # noqa: PLC0415
  rng = np.random.default_rng(0)
  qn, cache = rng.standard_normal((1, 1, 9, 64), np.float32), rng.standard_normal((1, 64, 3, 64),
                                                                                   np.float32)
  q, keys = Tensor(qn), Tensor(cache)
  for end in (17, 40):
    n = Variable("end", 2, 64).bind(end)
    got = grouped_attention(q, keys[:, 0:n], keys[:, 0:n], None).numpy()
    k = np.repeat(cache[0, :end], 3, axis=1)  # (end, 9, 64): each kv head serves 3 query heads
    s = np.einsum("hd,lhd->hl", qn[0, 0], k) / 8
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(got[0, 0], np.einsum("hl,lhd->hd", p, k), rtol=1e-5, atol=1e-5)


def test_a_packed_weights_nibble_index_is_unrolled_affine():
  """A Q4_1 matvec reads byte r // 2 and its nibble r % 2 along the rest of its reduce: the
  heuristics unroll that axis by 2 so the two nibbles share one load and shift by constants
  (1536x576 on one core: 114 -> 82 us), and the partial sums stay the vector."""
  with Context(INT8_MATVEC=0):  # the blocks in row order (not interleaved for int8 matvecs)
    w = pack(Tensor(np.zeros(1536 * 18 * 20, np.uint8)), "Q4_1", (1536, 576))
  k = reduce_kernel(linear(Tensor.empty(1, 576), w))
  out = hand_coded_optimizations(k, AVX512, threads=1)
  unrolls = [s for s, t in zip(out.sizes, out.axis_types()) if t is AxisType.UNROLL]
  assert unrolls == [2]
  vec = choose_vector_range(finish(out), 64)
  assert vec is not None and vec.arg.axis_type is AxisType.GROUP_REDUCE


def int8_matvec_kernel() -> OptKernel:
  """The int8 matvec kernel of a 1536x576 Q4_1 weight over row-interleaved words."""
  with Context(INT8_MATVEC=0):
    pw = packed_weight(pack(Tensor(np.zeros(1536 * 18 * 20, np.uint8)), "Q4_1", (1536, 576)))
  parts = tuple(p.contiguous().realize() for p in interleave(pw.parts, pw.shape, ROW_LANES))
  y = int8_linear(Tensor.empty(1, 576), PackedWeight(pw.fmt, parts, pw.shape, ROW_LANES))
  asts = [c.src[0] for c in y.schedule().src if any(
    u.op is Ops.PARAM and u.dtype == dtypes.uint32 and u.size > 1000 for u in c.src[0].toposort())]
  assert len(asts) == 1
  return OptKernel(CODEGEN_STAGES[0].run(asts[0], SCALAR))


def test_an_int8_matvec_over_interleaved_rows_takes_its_outputs_as_lanes():
  """The int8 matvec over row-interleaved Q4_1 words (nn/quantized.py): every load that varies
  with the outputs is contiguous along them, so the vector is 16 output rows (each lane sums
  its own row: no horizontal sums), not partial sums of the activations, which are contiguous
  along the reduction but read by every output; and its few iterations (96 x 18), each a few
  hundred byte ops, are split over the threads (work counts the ops)."""
  out = hand_coded_optimizations(int8_matvec_kernel(), AVX512, threads=2)
  assert upcasts(out) == [16]
  assert AxisType.THREAD in out.axis_types() and AxisType.GROUP_REDUCE not in out.axis_types()
  vec = choose_vector_range(finish(out), 64)
  assert vec is not None and vec.arg.axis_type is AxisType.UPCAST


def test_an_avx2_int8_matvec_takes_two_registers_of_outputs():
  """On AVX2 (8 lanes) the int8 matvec still takes 16 output rows a step, as two registers:
  each broadcast activation word serves both (AVX2 Q4_1 3072x576, 2 threads: 13.3 -> 13.7-15.3
  GB/s; SmolLM2 decode 11.3-12.1 -> 9.1-10.2 ms/token)."""
  out = hand_coded_optimizations(int8_matvec_kernel(), AVX2, threads=2)
  assert upcasts(out) == [16]
