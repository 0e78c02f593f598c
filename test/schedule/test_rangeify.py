"""Rangeify's fusion policy on whole models: what a layer's kernels read must not depend on depth.

A value over a reduction of data (a LayerNorm output, a matmul plus bias) read inside another
kernel's reduction loop gets its own kernel; recomputing it there made each layer's kernels read
every earlier layer's inputs (BERT: kernels with 16 to 76 input buffers).
"""
import math
from collections import Counter

import numpy as np
import torch

from unigrad import Tensor, dtypes, nn
from unigrad.uop import Ops

D, HEADS, FF, B, S = 32, 2, 64, 2, 8
RNG = np.random.default_rng(0)


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32) * 0.3


class Block:
  """Post-LN transformer encoder block: attention, residual + LayerNorm, GELU MLP, residual +
  LayerNorm (BERT's layout), from unigrad.nn layers."""

  def __init__(self) -> None:
    self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
    self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
    self.up, self.down = nn.Linear(D, FF), nn.Linear(FF, D)
    for lin in (self.q, self.k, self.v, self.o, self.up, self.down):
      lin.weight = Tensor(rnd(*lin.weight.shape)).realize()
      lin.bias = Tensor(rnd(*lin.bias.shape)).realize()
    for ln in (self.ln1, self.ln2):
      ln.weight = Tensor(1 + rnd(D)).realize()
      ln.bias = Tensor(rnd(D)).realize()

  def __call__(self, x: Tensor) -> Tensor:
    b, t, _ = x.shape
    q, k, v = (lin(x).reshape(b, t, HEADS, D // HEADS).transpose(1, 2)
               for lin in (self.q, self.k, self.v))
    att = (q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)).softmax(-1) @ v
    x = self.ln1(x + self.o(att.transpose(1, 2).reshape(b, t, D)))
    return self.ln2(x + self.down(self.up(x).gelu(approximate="none")))

  def torch(self, x: torch.Tensor) -> torch.Tensor:
    def lin(layer: nn.Linear, v: torch.Tensor) -> torch.Tensor:
      return torch.nn.functional.linear(v, *(torch.from_numpy(p.numpy())
                                             for p in (layer.weight, layer.bias)))
    def ln(layer: nn.LayerNorm, v: torch.Tensor) -> torch.Tensor:
      w, bias = (torch.from_numpy(p.numpy()) for p in (layer.weight, layer.bias))
      return torch.nn.functional.layer_norm(v, (D,), w, bias)
    b, t, _ = x.shape
    q, k, v = (lin(layer, x).reshape(b, t, HEADS, D // HEADS).transpose(1, 2)
               for layer in (self.q, self.k, self.v))
    att = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    x = ln(self.ln1, x + lin(self.o, att.transpose(1, 2).reshape(b, t, D)))
    return ln(self.ln2, x + lin(self.down, torch.nn.functional.gelu(lin(self.up, x))))


def signatures(t: Tensor) -> Counter:
  """Each kernel of t's schedule as (name, number of buffers), counted."""
  return Counter((c.src[0].arg.name, len(c.src) - 1) for c in t.schedule().src)


def test_second_transformer_layer_has_the_kernels_of_the_first():
  layers = [Block(), Block()]
  x = Tensor(rnd(B, S, D)).realize()
  one = signatures(layers[0](x))
  two = signatures(layers[1](layers[0](x)))
  assert two == one + one, f"layer 2 added {two - one}, layer 1 has {one}"
  assert max(n for _, n in one) <= 8  # out, x, mean, rstd, residual, weight, bias: no recompute


def test_transformer_layers_match_torch():
  layers = [Block(), Block()]
  x = rnd(B, S, D)
  ours = layers[1](layers[0](Tensor(x))).numpy()
  ref = torch.from_numpy(x)
  for layer in layers: ref = layer.torch(ref)
  np.testing.assert_allclose(ours, ref.numpy(), atol=2e-4, rtol=2e-4)


def test_kernel_inputs_do_not_grow_with_depth():
  # a cheap normalization (no transcendental) over a residual stream: its output is read inside
  # the next matmul's reduction, so recomputing it there would re-read every earlier layer
  ws = [Tensor(rnd(D, D)).realize() for _ in range(4)]
  y = Tensor(rnd(B * S, D)).realize()
  widths = []
  for w in ws:
    h = y + y @ w
    y = h - h.mean(-1, keepdim=True)
    widths.append(max(len(c.src) - 1 for c in y.schedule().src))
  assert widths[-1] == widths[1], f"buffers per kernel by depth: {widths}"


def test_bias_add_is_stored_by_the_matmul_that_makes_it():
  x, w1, w2 = (Tensor(rnd(8, 16)).realize(), Tensor(rnd(16, 16)).realize(),
               Tensor(rnd(16, 16)).realize())
  b = Tensor(rnd(16)).realize()
  calls = ((x @ w1 + b) @ w2).schedule().src
  assert len(calls) == 2
  assert len(calls[0].src) - 1 == 4  # out, x, w1, b: the bias is added once per element
  second = calls[1].src[0]
  assert not any(u.op is Ops.ADD and u.dtype == dtypes.float32 for u in second.toposort())


def test_x_at_w_t_runs_in_place_without_a_transposing_copy():
  # x @ W.T with W stored (out, in) reads both operands contiguously along the reduce axis: the
  # heuristics' DotPlan runs it in place as fast as the contiguous matmul, so no copy of W runs
  # on every call (MiniLM: 1.5 ms of an 11 ms layer)
  x, w = Tensor(rnd(64, 96)).realize(), Tensor(rnd(80, 96)).realize()
  calls = (x @ w.T).schedule().src
  assert [len(c.src) - 1 for c in calls] == [3]  # matmul (out, x, w)
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-4)


def test_x_at_w_t_with_a_reduce_axis_no_dot_tile_splits_gets_the_transposing_copy():
  # 100 is no multiple of the DotPlan's 8 partial sums: W is copied, and the contiguous matmul
  # reads the copy (a @ b.T 1024: 0.68 -> 0.95 of a @ b's speed with the copy, before DotPlan's
  # transposed sums)
  x, w = Tensor(rnd(64, 100)).realize(), Tensor(rnd(80, 100)).realize()
  calls = (x @ w.T).schedule().src
  assert [len(c.src) - 1 for c in calls] == [2, 3]  # copy (out, w), matmul (out, x, w.T)
  assert not calls[0].src[0].op_in_backward_slice_with_self(Ops.REDUCE)
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-4)


def test_attention_output_projection_runs_in_place():
  # the attention output (b, h, t, d) read as (b, t, h*d): its reduce index is (h, d), contiguous
  # along runs of d; the DotPlan's 8 partial sums split d, so no copy of W either
  b, h, t, d = 2, 4, 8, 16
  att, w = Tensor(rnd(b, h, t, d)).realize(), Tensor(rnd(h * d, h * d)).realize()
  y = att.transpose(1, 2).reshape(b, t, h * d) @ w.T
  assert [len(c.src) - 1 for c in y.schedule().src] == [3]
  ref = att.numpy().transpose(0, 2, 1, 3).reshape(b, t, h * d) @ w.numpy().T
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_gelu_after_an_in_place_matmul_gets_its_own_kernel():
  # fused into the DotPlan tile the GELU's long dependent chains ran once per 16 outputs (4.4
  # ms); apart, as an elementwise kernel, 2.9 + 0.8 ms (MiniLM's FFN up projection)
  x, w, bias = (Tensor(rnd(16, 64)).realize(), Tensor(rnd(32, 64)).realize(),
                Tensor(rnd(32)).realize())
  y = (x @ w.T + bias).gelu()
  calls = y.schedule().src
  assert [c.src[0].op_in_backward_slice_with_self(Ops.REDUCE) for c in calls] == [True, False]
  ref = torch.nn.functional.gelu(torch.from_numpy(x.numpy() @ w.numpy().T + bias.numpy()))
  np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_weight_written_between_calls_is_read_anew():
  # training: an optimizer step writes W between two forwards; nothing derived from W (no
  # transposed copy) may outlive the step
  x, w = Tensor(rnd(32, 64)).realize(), Tensor(rnd(48, 64)).realize()
  first = (x @ w.T).numpy()
  w.assign(w * 2 + 1).realize()
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-4)
  assert not np.allclose(first, (x @ w.T).numpy())


def test_matrix_vector_product_reads_the_weight_in_place():
  # one row reads each weight element once: a copy would double the work
  x, w = Tensor(rnd(1, 96)), Tensor(rnd(80, 96))
  assert len((x @ w.T).schedule().src) == 1


def test_layernorm_read_by_a_matmul_and_a_residual_is_realized_whatever_the_walk_order():
  # the residual path reaches the LayerNorm's statistics (realized: they are broadcast) before
  # the matmul's reduction loop reaches its output; the output must still get its own kernel
  # rather than being recomputed per output column of the matmul (MiniLM's q/k/v: 30x slower)
  ln, lin = nn.LayerNorm(D), nn.Linear(D, D)
  Tensor.realize_all(ln.weight, ln.bias, lin.weight, lin.bias)
  x = Tensor(rnd(B, S, D)).realize()
  h = ln(x)
  y = lin(h) + h
  assert [len(c.src) - 1 for c in y.schedule().src] == [2, 3, 6, 4]  # mean, rstd, LN out, matmul
  ref = torch.nn.functional.layer_norm(torch.from_numpy(x.numpy()), (D,))
  ref = torch.nn.functional.linear(ref, torch.from_numpy(lin.weight.numpy()),
                                   torch.from_numpy(lin.bias.numpy())) + ref
  np.testing.assert_allclose(y.numpy(), ref.numpy(), atol=1e-4, rtol=1e-4)


def test_layernorm_output_read_by_x_at_w_t_runs_in_place():
  # the LayerNorm's output is read from its buffer, so its per-row statistics are no load of the
  # matmul: they looked contiguous along an output axis (the rows) and kept nn.Linear's x @ W.T
  # from both the copy and the in-place DotPlan (MiniLM, ~10x slower)
  ln, lin = nn.LayerNorm(D), nn.Linear(D, D)
  Tensor.realize_all(ln.weight, ln.bias, lin.weight, lin.bias)
  x = Tensor(rnd(4, 8, D)).realize()
  calls = lin(ln(x)).schedule().src
  assert sorted(len(c.src) - 1 for c in calls) == [2, 3, 4, 6]  # no copy (out, w)
  assert not any(len(c.src) - 1 == 2 and c.src[2] is lin.weight.uop.src[0] for c in calls)


def test_elementwise_value_of_many_loads_is_realized_before_a_broadcasting_reduction():
  # each output of the reduction would redo every load of the value (the digits CNN's ReLU
  # gradient, read by the second convolution's input gradient once per input channel and kernel
  # position: 72 times)
  a, b, c = (Tensor(rnd(8, 16)) for _ in range(3))
  w = Tensor(rnd(4, 16))
  def reduce_over(e: Tensor) -> Tensor: return (e.reshape(8, 1, 16).expand(8, 4, 16) * w).sum(2)
  many, few = reduce_over(a * b + c), reduce_over(a * b)
  assert [len(k.src) - 1 for k in many.schedule().src] == [4, 3], "3 loads: its own kernel"
  assert [len(k.src) - 1 for k in few.schedule().src] == [4], "2 loads: recomputed inline"
  an, bn, cn, wn = (t.numpy() for t in (a, b, c, w))
  np.testing.assert_allclose(many.numpy(), (an * bn + cn) @ wn.T, atol=1e-4, rtol=1e-4)


def test_deep_graph_of_many_kernels_realizes_without_recursion_error():
  """Sixty layers of matmul, norm and softmax (about 240 kernels) in one realize: rangeify builds
  the realized inputs first instead of nesting one build per kernel boundary."""
  rng = np.random.default_rng(0)
  x0, w0 = rng.standard_normal((2, 16)).astype(np.float32), rng.standard_normal((16, 16))
  w0 = (w0 / 4).astype(np.float32)
  x, w, want = Tensor(x0), Tensor(w0), x0
  for _ in range(60):
    h = x @ w
    x = (h * (h.square().mean(-1, keepdim=True) + 1e-5).rsqrt()).softmax(-1) * 16
    hn = want @ w0
    hn = hn / np.sqrt((hn ** 2).mean(-1, keepdims=True) + 1e-5)
    want = np.exp(hn - hn.max(-1, keepdims=True))
    want = want / want.sum(-1, keepdims=True) * 16
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-3, atol=1e-4)


def test_a_copy_assigned_into_a_slice_lands_in_the_slice():
  """A COPY (or COLLECTIVE) call writes a whole buffer from its start: stored into a view that is
  not its whole buffer, it is copied into an intermediate first and stored by a kernel (it
  raised, or would have written at offset 0)."""
  u = Tensor.zeros(8).contiguous().realize()
  u[4:8].assign(Tensor.arange(4).float().to("CPU:1").to("CPU"))
  assert u.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
