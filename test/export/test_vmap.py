"""vmap and svmap: one trace, batched graph equal to the per-example results, exported."""
import numpy as np
import pytest

from unigrad import Tensor, dtypes, function
from unigrad.export import NumericalFunction, VmapError, batch_body, svmap, vmap
from unigrad.schedule.function import param_like
from unigrad.uop import Ops, UOp

from export.helpers import DigitsCNN, needs_cc, same_bits

W = Tensor.randn(4, 3).realize()


def per_example(x, v):
  """Reductions, broadcasting against a captured weight, a scalar result, movement ops."""
  h = (x @ W).relu()
  return h.sum() + x.max() * v.mean(), (x.reshape(2, 2).T.flip(0).pad(((1, 0), (0, 1))) - v)


def test_vmap_equals_the_per_example_results_and_traces_once():
  calls = []
  def f(x, v):
    calls.append(1)
    return per_example(x, v)
  vf = vmap(f, in_axes=(0, None))
  x, v = Tensor.randn(5, 4).realize(), Tensor.randn(3).realize()
  a, b = vf(x, v)
  assert a.shape == (5,) and b.shape == (5, 3, 3) and len(calls) == 1
  for i in range(5):
    ra, rb = per_example(x[i], v)
    np.testing.assert_allclose(a.numpy()[i], ra.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy()[i], rb.numpy(), rtol=1e-5, atol=1e-6)
  assert vf(Tensor.randn(7, 4), v)[0].shape == (7,) and len(calls) == 1  # no retrace for 7


def test_vmap_over_another_axis():
  g = vmap(lambda x, w: (x * w).sum(), in_axes=(1, None))
  x, w = Tensor.randn(3, 6).realize(), Tensor.randn(3).realize()
  np.testing.assert_allclose(g(x, w).numpy(), (x.numpy() * w.numpy()[:, None]).sum(0), rtol=1e-5)


def test_vmap_of_the_digits_cnn_matches_the_batched_model():
  Tensor.manual_seed(3)
  model = DigitsCNN()
  x = Tensor.rand(4, 64).realize()
  out = vmap(lambda e: model(e.reshape(1, 64)).reshape(10))(x)
  np.testing.assert_allclose(out.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)


@needs_cc
def test_exported_vmap_matches_unigrad_bit_for_bit():
  vf = vmap(per_example, in_axes=(0, None))
  nf = NumericalFunction(vf, ((6, 4), dtypes.float32), ((3,), dtypes.float32))
  x, v = Tensor.randn(6, 4).realize(), Tensor.randn(3).realize()
  for got, ref in zip(nf(x, v), vf(x, v)): assert same_bits(got, ref.realize())


@needs_cc
def test_svmap_takes_the_batch_size_at_run_time():
  nf = NumericalFunction(svmap(per_example, in_axes=(0, None)), ((1, 4), dtypes.float32),
                         ((3,), dtypes.float32), name="pe")
  assert "void pe(int batch, const float *in0, const float *in1, float *out0, float *out1);" in (
    nf.header)
  assert "in0: float[batch, 4]" in nf.header and "in1: float[3]" in nf.header
  v = Tensor.randn(3).realize()
  for n in (1, 5):
    x = Tensor.randn(n, 4).realize()
    a, b = nf(x, v)
    assert a.shape == (n,) and b.shape == (n, 3, 3)
    for i in range(n):  # the per-example kernels: bit for bit
      ra, rb = per_example(x[i], v)
      assert bytes(a[i:i + 1]._bytes()) == bytes(ra.reshape(1).realize()._bytes())
      assert bytes(b[i]._bytes()) == bytes(rb.realize()._bytes())


def test_bad_vmap_arguments_raise():
  with pytest.raises(VmapError, match="ints or None"): vmap(lambda x: x, in_axes="0")
  ident, add = (lambda x: x), (lambda x, y: x + y)
  with pytest.raises(VmapError, match="2 entries"): vmap(ident, in_axes=(0, 0))(Tensor.ones(2))
  with pytest.raises(VmapError, match="no axis 2"): vmap(ident, in_axes=2)(Tensor.ones(2, 2))
  with pytest.raises(VmapError, match="disagree"): vmap(add)(Tensor.ones(2), Tensor.ones(3))
  with pytest.raises(VmapError, match="at least one"): vmap(ident, in_axes=None)(Tensor.ones(2))
  with pytest.raises(VmapError, match="axis 0"): svmap(lambda x: x, in_axes=1)
  with pytest.raises(TypeError, match="needs a function"): vmap(3)


@needs_cc
def test_svmap_call_with_wrong_batch_raises():
  spec = ((2, 3), dtypes.float32)
  nf = NumericalFunction(svmap(lambda x, y: x + y), spec, spec)
  with pytest.raises(ValueError, match="disagree on the batch"):
    nf(Tensor.ones(2, 3), Tensor.ones(4, 3))
  with pytest.raises(ValueError, match=r"\(batch, 3\)"): nf(Tensor.ones(2, 4), Tensor.ones(2, 4))


def test_vmap_broadcasts_unbatched_results_and_keeps_unused_inputs():
  vf = vmap(lambda x, y: (x * 2, W, x.sum()), in_axes=(0, 0))
  a, w, s = vf(Tensor.ones(3, 2), Tensor.ones(3, 5))
  assert a.shape == (3, 2) and w.shape == (3, 4, 3) and s.shape == (3,)
  np.testing.assert_array_equal(w.numpy(), np.broadcast_to(W.numpy(), (3, 4, 3)))
  np.testing.assert_array_equal(s.numpy(), [2.0, 2.0, 2.0])


def test_vmap_rejects_ops_without_a_batching_rule():
  p = param_like(0, Tensor.empty(3).uop)
  body = UOp(Ops.TUPLE, dtypes.void, (UOp(Ops.STACK, dtypes.float32, (p, p)),))
  with pytest.raises(VmapError, match="no batching rule for STACK"): batch_body(body, (0,), 4)


def test_batch_body_takes_a_symbolic_batch_size():
  """Ready for symbolic shapes: the batch axis may be a bound variable (nothing runs here)."""
  f = function(per_example)
  a, _ = f(Tensor.empty(4), Tensor.empty(3))
  n = UOp.variable("n", 1, 64)
  batched = batch_body(a.uop.src[0].src[0], (0,), n)
  assert batched.src[0].shape == (n,) and batched.src[1].shape == (n, 3, 3)
