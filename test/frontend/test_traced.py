"""@traced composite ops: one FUNCTION call per use, the op's own graph and values, gradients."""
import math

import numpy as np
import pytest
import torch

from unigrad import Tensor, nn
from unigrad.frontend import nnops
from unigrad.frontend.function import op_function, structure_key
from unigrad.frontend.traced import traced
from unigrad.schedule.function import inline_functions
from unigrad.uop import Ops
from unigrad.uop.variable import Variable

RNG = np.random.default_rng(0)


def rnd(*shape):
  return RNG.standard_normal(shape).astype(np.float32)


# (name, traced op on tensors, the same op untraced, input shapes)
OPS = [
  ("gelu", lambda x: x.gelu(), lambda x: Tensor.gelu.__wrapped__(x), [(4, 6)]),
  ("gelu_tanh", lambda x: x.gelu("tanh"), lambda x: Tensor.gelu.__wrapped__(x, "tanh"), [(5,)]),
  ("erf", lambda x: x.erf(), lambda x: Tensor.erf.__wrapped__(x), [(3, 7)]),
  ("layernorm", lambda x: x.layernorm(-1, 1e-5),
   lambda x: Tensor.layernorm.__wrapped__(x, -1, 1e-5), [(3, 8)]),
  ("linear", lambda x, w, b: x.linear(w, b), lambda x, w, b: Tensor.linear.__wrapped__(x, w, b),
   [(2, 3, 4), (4, 5), (5,)]),
  ("attention", lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
   lambda q, k, v: _untraced_attention(q, k, v), [(2, 3, 4, 8)] * 3),
]


def _untraced_attention(q, k, v):
  return nnops._attention.__wrapped__(q, k, v, None, True, None, False)


@pytest.mark.parametrize("name, op, untraced, shapes", OPS, ids=[o[0] for o in OPS])
def test_traced_op_is_one_call_whose_body_is_the_ops_graph(name, op, untraced, shapes):
  xs = [Tensor(rnd(*s)).realize() for s in shapes]
  y = op(*xs)
  assert y.uop.op is Ops.GETTUPLE and y.uop.src[0].op is Ops.FUNCTION
  assert inline_functions([y.uop])[0] is untraced(*xs).uop, "the call resolves to the op's graph"
  assert op(*[Tensor(rnd(*s)) for s in shapes]).uop.src[0].src[0] is y.uop.src[0].src[0], \
    "traced once: another input of the signature gets the same body"
  np.testing.assert_array_equal(y.numpy(), untraced(*xs).numpy())


def test_embedding_and_linear_layers_are_one_call_each():
  emb, lin = nn.Embedding(10, 4), nn.Linear(4, 3)
  idx = Tensor([[1, 9], [0, 3]]).realize()
  h = emb(idx)
  y = lin(h)
  assert h.uop.op is Ops.GETTUPLE and y.uop.op is Ops.GETTUPLE
  w, lw, lb = emb.weight.numpy(), lin.weight.numpy(), lin.bias.numpy()
  np.testing.assert_allclose(y.numpy(), w[idx.numpy()] @ lw.T + lb, rtol=1e-5, atol=1e-6)
  with pytest.raises(IndexError, match="out of range"): emb(Tensor([10]))  # checked at the call


def test_gradients_flow_through_traced_ops_like_torch():
  x, w, b = rnd(2, 3, 4), rnd(5, 4), rnd(5)
  ln_w, ln_b = rnd(5), rnd(5)
  tx, tw, tb = (Tensor(a, requires_grad=True) for a in (x, w, b))
  ln = nn.LayerNorm(5)
  ln.weight, ln.bias = Tensor(ln_w, requires_grad=True), Tensor(ln_b, requires_grad=True)
  ln(tx.linear(tw.T, tb).gelu()).square().sum().backward()
  px, pw, pb, plw, plb = (torch.tensor(a, requires_grad=True) for a in (x, w, b, ln_w, ln_b))
  y = torch.nn.functional.gelu(torch.nn.functional.linear(px, pw, pb))
  torch.nn.functional.layer_norm(y, (5,), plw, plb).square().sum().backward()
  for ours, theirs in ((tx, px), (tw, pw), (tb, pb), (ln.weight, plw), (ln.bias, plb)):
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_traced_op_under_no_grad_gives_a_detached_result():
  x = Tensor(rnd(3), requires_grad=True)
  with Tensor.no_grad(): y = x.gelu()
  assert y.uop.op is Ops.DETACH
  y.sum().backward()  # y (requires_grad None) gets a gradient of its own, x none
  assert x.grad is None and y.grad is not None


def test_tensors_it_cannot_trace_take_the_op_itself():
  n = Variable("n", 1, 8).bind(3)
  symbolic = Tensor.ones(n, 4).contiguous()
  assert symbolic.gelu().uop.op is not Ops.GETTUPLE
  sharded = Tensor(rnd(4, 2), device="CPU").shard(("CPU:0", "CPU:1"), axis=0)
  y = sharded.gelu()
  assert y.uop.op is not Ops.GETTUPLE
  np.testing.assert_allclose(y.numpy(), Tensor(sharded.numpy()).gelu().numpy(), rtol=1e-6)


def test_attention_with_dropout_draws_new_weights_at_every_call():
  q = Tensor(rnd(1, 1, 16, 4))
  a, b = (q.scaled_dot_product_attention(q, q, dropout_p=0.5) for _ in range(2))
  assert a.uop.op is not Ops.GETTUPLE
  assert not np.array_equal(a.numpy(), b.numpy()), "dropout is random, not traced once"


def test_float_arguments_trace_by_their_bits():
  assert structure_key(0.0) != structure_key(-0.0)
  assert structure_key(math.nan) == structure_key(math.nan)
  x = Tensor(rnd(2, 8))
  assert x.layernorm(-1, 0.0).uop.src[0].src[0] is not x.layernorm(-1, -0.0).uop.src[0].src[0]


def test_op_function_keeps_at_most_max_traces_signatures():
  calls = []

  @traced
  def double(x):
    calls.append(x.shape)
    return x * 2
  for n in range(1, op_function.MAX_TRACES + 3): double(Tensor.ones(n))
  assert len(calls) == op_function.MAX_TRACES + 2
  double(Tensor.ones(op_function.MAX_TRACES + 2))  # the newest signature is kept
  double(Tensor.ones(1))  # the oldest was dropped: traced again
  assert len(calls) == op_function.MAX_TRACES + 3


def _block(seed):
  """A small post-LN transformer layer over embeddings, forward and backward: (output, grads)."""
  Tensor.manual_seed(seed)
  emb, ln1, ln2 = nn.Embedding(11, 8), nn.LayerNorm(8), nn.LayerNorm(8)
  qkv, up, down = nn.Linear(8, 24), nn.Linear(8, 16), nn.Linear(16, 8)
  params = [emb.weight, ln1.weight, ln1.bias, ln2.weight, ln2.bias, qkv.weight, qkv.bias,
            up.weight, up.bias, down.weight, down.bias]
  ids = Tensor([[1, 4, 9, 0], [3, 3, 10, 2]])
  keep = Tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).cast("bool").reshape(2, 1, 1, 4)
  x = emb(ids)
  q, k, v = (t.reshape(2, 4, 2, 4).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
  h = ln1(x + q.scaled_dot_product_attention(k, v, attn_mask=keep).transpose(1, 2).reshape(2, 4, 8))
  out = ln2(h + down(up(h).gelu()))
  out.square().sum().backward()
  return out.numpy(), [p.grad.numpy() for p in params]


def test_a_transformer_layer_gives_the_same_bits_traced_and_untraced(monkeypatch):
  traced_out, traced_grads = _block(0)
  monkeypatch.setattr(op_function, "__call__", lambda self, *a, **k: self.fn(*a, **k))
  out, grads = _block(0)
  np.testing.assert_array_equal(traced_out, out)
  for a, b in zip(traced_grads, grads): np.testing.assert_array_equal(a, b)
