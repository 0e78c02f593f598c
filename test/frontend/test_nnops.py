"""NN ops of Tensor (convolution, pooling, interpolation, layers, attention, one-hot, losses)
against torch.nn.functional. Most cases run on the PYTHON device (no compile time); a few on CPU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unigrad import Tensor, dtypes
from unigrad.uop import Invalid, Ops
from unigrad.schedule.function import inline_functions

RNG = np.random.default_rng(1)
PY, CPU = "PYTHON", "CPU"


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)
def labels(n: int, *shape: int) -> np.ndarray: return RNG.integers(0, n, shape).astype(np.int64)


def _same(ours, ref, atol: float, rtol: float) -> None:
  if isinstance(ref, (tuple, list)):
    assert isinstance(ours, (tuple, list)) and len(ours) == len(ref), (ours, ref)
    for o, r in zip(ours, ref): _same(o, r, atol, rtol)
    return
  r, o = ref.detach().numpy(), ours.numpy()
  assert o.shape == r.shape, f"shape {o.shape} != {r.shape}"
  assert o.dtype == r.dtype, f"dtype {o.dtype} != {r.dtype}"
  if o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer): np.testing.assert_array_equal(o, r)
  else: np.testing.assert_allclose(o, r, atol=atol, rtol=rtol, equal_nan=True)


def check(fn, tfn, *arrays, device=PY, atol=1e-5, rtol=1e-4):
  """fn on unigrad tensors equals tfn on torch tensors: values, shape and dtype."""
  ref = tfn(*[torch.tensor(a) for a in arrays])
  _same(fn(*[Tensor(a, device=device) for a in arrays]), ref, atol, rtol)


def raises_like(exc, fn, tfn, *arrays):
  with pytest.raises(exc): tfn(*[torch.tensor(a) for a in arrays])
  with pytest.raises(exc): fn(*[Tensor(a, device=PY) for a in arrays])


# ---- convolution ----

CONV2D = [  # x shape, w shape, kwargs
  ((2, 3, 6, 5), (4, 3, 3, 3), {}),
  ((1, 4, 7, 7), (6, 2, 3, 2), dict(groups=2, stride=2, padding=1)),
  ((1, 2, 8, 6), (2, 2, 3, 3), dict(dilation=2, padding=(2, 1))),
  ((2, 3, 5, 5), (3, 1, 2, 2), dict(groups=3, stride=(1, 2), dilation=(2, 1))),
  ((1, 2, 5, 5), (3, 2, 3, 3), dict(padding="same", dilation=2)),
  ((1, 2, 5, 4), (3, 2, 2, 3), dict(padding="same")),
  ((1, 2, 5, 5), (3, 2, 1, 1), dict(stride=3)),
  ((3, 5, 5), (2, 3, 3, 3), dict(padding="valid")),  # unbatched
]


@pytest.mark.parametrize("xs,ws,kw", CONV2D)
def test_conv2d(xs, ws, kw):
  b = rnd(ws[0])
  check(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: F.conv2d(x, w, b, **kw), rnd(*xs),
        rnd(*ws), b)


def test_depthwise_conv2d_reads_its_weight_in_place():
  """One output channel per group: the weight is read as stored, one kernel (a weight copy per
  layer and call cost EfficientNet-Lite0 16 kernels a forward); a channel multiplier of 2 keeps
  the copy to (cin, kh, kw, cout)."""
  x, w = Tensor(rnd(1, 4, 6, 6), device=PY).realize(), Tensor(rnd(4, 1, 3, 3), device=PY).realize()
  assert len(x.conv2d(w, groups=4).schedule().src) == 1
  w2 = Tensor(rnd(8, 1, 3, 3), device=PY).realize()
  assert len(x.conv2d(w2, groups=4).schedule().src) == 2


def test_conv2d_flat_padding():
  check(lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)),
        lambda x, w: F.conv2d(F.pad(x, (1, 0, 2, 1)), w), rnd(1, 2, 4, 4), rnd(2, 2, 3, 3))


@pytest.mark.parametrize("xs,ws,kw", [((2, 3, 9), (4, 3, 3), dict(stride=2, padding=1)),
                                      ((1, 4, 7), (4, 1, 2), dict(groups=4, dilation=3)),
                                      ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(padding=(1, 0, 1)))])
def test_conv1d_conv3d(xs, ws, kw):
  tfn = F.conv1d if len(ws) == 3 else F.conv3d
  check(lambda x, w: x.conv2d(w, **kw), lambda x, w: tfn(x, w, **kw), rnd(*xs), rnd(*ws))


def test_conv_errors():
  raises_like(RuntimeError, lambda x, w: x.conv2d(w), F.conv2d, rnd(1, 2, 5, 5), rnd(3, 3, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv2d(w), F.conv2d, rnd(1, 2, 2, 2), rnd(3, 2, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv2d(w, groups=2),
              lambda x, w: F.conv2d(x, w, groups=2), rnd(1, 4, 5, 5), rnd(3, 2, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv2d(w), F.conv2d, rnd(2, 1, 2, 5, 5), rnd(3, 2, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv2d(w, stride=2, padding="same"),
              lambda x, w: F.conv2d(x, w, stride=2, padding="same"), rnd(1, 2, 5, 5),
              rnd(3, 2, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv2d(w, padding="full"),
              lambda x, w: F.conv2d(x, w, padding="full"), rnd(1, 2, 5, 5), rnd(3, 2, 3, 3))


def _kernels(t: Tensor) -> list:
  return [call.src[0] for call in t.schedule().src]


def test_conv2d_cpu_one_reduce_kernel_without_gates():
  check(lambda x, w, b: x.conv2d(w, b, padding=1, stride=2),
        lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2),
        rnd(2, 3, 9, 8), rnd(4, 3, 3, 3), rnd(4), device=CPU, atol=1e-4)
  x, w = Tensor(rnd(1, 3, 8, 8), device=CPU), Tensor(rnd(4, 3, 3, 3), device=CPU)
  ks = _kernels(x.conv2d(w, padding=1))
  reduces = [k for k in ks if k.op_in_backward_slice_with_self(Ops.REDUCE)]
  assert len(ks) == 3 and len(reduces) == 1, "padded input, weight layout, one reduce kernel"
  gated = [u for u in reduces[0].toposort() if u.op is Ops.CONST and u.arg is Invalid]
  assert not gated, "the reduce reads the padded copy: no bounds checks"
  assert len(_kernels(x.conv2d(w))) == 2, "without padding there is no padded copy"


def test_conv2d_gradient():
  x, w = rnd(1, 2, 5, 5), rnd(3, 2, 3, 3)
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  F.conv2d(tx, tw, stride=2, padding=1).square().sum().backward()
  ux, uw = Tensor(x, device=PY, requires_grad=True), Tensor(w, device=PY, requires_grad=True)
  ux.conv2d(uw, stride=2, padding=1).square().sum().backward()
  np.testing.assert_allclose(ux.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(uw.grad.numpy(), tw.grad.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("xs,ws,kw", [CONV2D[1], CONV2D[2], CONV2D[3], ((2, 3, 11), (2, 3, 4), {})])
def test_conv_gradients(xs, ws, kw):
  # the input gradient is the sliding-window view's override (shifted pads of each window
  # position's gradient, dilated by the stride)
  x, w = rnd(*xs), rnd(*ws)
  conv = F.conv2d if len(ws) == 4 else F.conv1d
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  conv(tx, tw, **kw).square().sum().backward()
  ux, uw = Tensor(x, device=PY, requires_grad=True), Tensor(w, device=PY, requires_grad=True)
  ux.conv2d(uw, **kw).square().sum().backward()
  np.testing.assert_allclose(ux.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(uw.grad.numpy(), tw.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_sliding_window_gradient_is_shifted_pads_without_a_reduction():
  # the rules' gradient of the repeat view reduces over ~(k+1)^2 repeated copies with div/mod
  # indexing (the digits CNN's input gradient: 1.1 ms); the override adds 9 shifted pads
  x = Tensor.empty(2, 3, 8, 8, requires_grad=True)
  out = x.conv2d(Tensor.empty(4, 3, 3, 3), padding=1)
  (gx,) = out.gradient(x, gradient=Tensor.empty(2, 4, 8, 8))
  reduces = [u for u in gx.uop.toposort() if u.op is Ops.REDUCE]
  assert len(reduces) == 1, "only the sum over output channels"
  x = Tensor.empty(2, 3, 9, 9, requires_grad=True)
  (gx,) = x.avg_pool2d(3, 2).gradient(x, gradient=Tensor.empty(2, 3, 4, 4))
  assert not any(u.op is Ops.REDUCE for u in gx.uop.toposort())


CONVT = [
  ((1, 2, 4, 4), (2, 3, 3, 3), {}),
  pytest.param((2, 4, 3, 5), (4, 2, 3, 2), dict(groups=2, stride=2, padding=1, output_padding=1)),
  pytest.param((1, 2, 4, 3), (2, 2, 2, 3), dict(stride=(3, 2), dilation=2, padding=(0, 2))),
  ((1, 2, 6, 6), (2, 1, 3, 3), dict(padding=3)),
]


@pytest.mark.parametrize("xs,ws,kw", CONVT)
def test_conv_transpose2d(xs, ws, kw):
  b = rnd(ws[1] * kw.get("groups", 1))
  check(lambda x, w, b: x.conv_transpose2d(w, b, **kw),
        lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), rnd(*xs), rnd(*ws), b)


def test_conv_transpose1d():
  check(lambda x, w: x.conv_transpose2d(w, stride=3, output_padding=2),
        lambda x, w: F.conv_transpose1d(x, w, stride=3, output_padding=2), rnd(2, 3, 4),
        rnd(3, 2, 2))


def test_conv_transpose_errors():
  check(lambda x, w: x.conv_transpose2d(w, dilation=2, padding=1),
        lambda x, w: F.conv_transpose1d(x, w, dilation=2, padding=1), rnd(2, 3, 4), rnd(3, 2, 2))
  raises_like(RuntimeError, lambda x, w: x.conv_transpose2d(w, output_padding=1),
              lambda x, w: F.conv_transpose2d(x, w, output_padding=1), rnd(1, 2, 3, 3),
              rnd(2, 2, 3, 3))
  raises_like(RuntimeError, lambda x, w: x.conv_transpose2d(w), F.conv_transpose2d, rnd(1, 3, 3, 3),
              rnd(2, 2, 3, 3))


# ---- pooling ----

POOLS = [  # x shape, kwargs (PyTorch names)
  ((2, 3, 6, 6), dict(kernel_size=2)),
  ((1, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
  ((1, 2, 7, 8), dict(kernel_size=(3, 2), stride=(2, 3), ceil_mode=True)),
  ((1, 1, 6, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
  ((2, 5, 5), dict(kernel_size=(2, 3), stride=1)),
  ((1, 1, 5, 5), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
]


@pytest.mark.parametrize("xs,kw", POOLS)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(xs, kw, count_include_pad):
  kw = dict(kw, count_include_pad=count_include_pad)
  check(lambda x: x.avg_pool2d(**kw), lambda x: F.avg_pool2d(x, **kw), rnd(*xs))


def test_avg_pool2d_divisor_override_and_errors():
  check(lambda x: x.avg_pool2d(3, padding=1, divisor_override=2),
        lambda x: F.avg_pool2d(x, 3, padding=1, divisor_override=2), rnd(1, 1, 6, 6))
  raises_like(RuntimeError, lambda x: x.avg_pool2d(2, padding=2),
              lambda x: F.avg_pool2d(x, 2, padding=2), rnd(1, 1, 6, 6))


@pytest.mark.parametrize("xs,kw", POOLS[1:4])
def test_overlapping_pool_gradients(xs, kw):
  x = rnd(*xs)
  for ours, theirs in ((lambda t: t.avg_pool2d(**kw), lambda t: F.avg_pool2d(t, **kw)),
                       (lambda t: t.max_pool2d(**kw), lambda t: F.max_pool2d(t, **kw))):
    tx, ux = torch.tensor(x, requires_grad=True), Tensor(x, device=PY, requires_grad=True)
    theirs(tx).square().sum().backward()
    ours(ux).square().sum().backward()
    np.testing.assert_allclose(ux.grad.numpy(), tx.grad.numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("xs,kw", POOLS + [
  ((1, 2, 9, 8), dict(kernel_size=3, dilation=2, padding=1)),
  ((1, 1, 8, 7), dict(kernel_size=2, dilation=(2, 3), ceil_mode=True, stride=2))])
def test_max_pool2d(xs, kw):
  check(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), rnd(*xs))
  x = RNG.integers(0, 3, xs).astype(np.float32)  # ties: the first index wins
  check(lambda x: x.max_pool2d(**kw, return_indices=True),
        lambda x: tuple(F.max_pool2d(x, **kw, return_indices=True)), x)


def test_max_pool_1d_3d_ints():
  check(lambda x: x.max_pool2d((3,), 2, padding=1), lambda x: F.max_pool1d(x, 3, 2, padding=1),
        rnd(2, 3, 8))
  check(lambda x: x.max_pool2d((2, 2, 2)), lambda x: F.max_pool3d(x, 2), rnd(1, 2, 4, 4, 4))
  check(lambda x: x.avg_pool2d((2, 2, 2), 1), lambda x: F.avg_pool3d(x, 2, 1), rnd(1, 2, 3, 4, 3))
  check(lambda x: x.max_pool2d(2), lambda x: F.max_pool2d(x, 2), labels(9, 1, 1, 4, 4) - 4)


@pytest.mark.parametrize("xs,kw,sized", [
  ((1, 2, 7, 7), dict(kernel_size=2), True),
  ((2, 1, 7, 5), dict(kernel_size=3, stride=2, padding=1), False),
  ((1, 1, 5, 5), dict(kernel_size=2, stride=1), False)])
def test_max_unpool2d(xs, kw, sized):
  x = torch.tensor(rnd(*xs))
  values, idx = F.max_pool2d(x, **kw, return_indices=True)
  size = dict(output_size=xs[-2:]) if sized else {}
  ref = F.max_unpool2d(values, idx, **kw, **size)
  ours = Tensor(values.numpy(), device=PY)
  _same(ours.max_unpool2d(Tensor(idx.numpy(), device=PY), **kw, **size), ref, 1e-6, 1e-6)


# ---- interpolate ----

INTERP = [
  ((1, 2, 3, 4), dict(size=(5, 7), mode="nearest")),
  ((1, 1, 5, 6), dict(size=(2, 3), mode="nearest")),
  ((1, 1, 3, 4), dict(size=(6, 8), mode="nearest")),
  ((1, 2, 4, 5), dict(size=(7, 3), mode="nearest-exact")),
  ((1, 2, 3, 4), dict(size=(5, 7), mode="bilinear")),
  ((1, 2, 3, 4), dict(size=(5, 7), mode="bilinear", align_corners=True)),
  ((2, 1, 6, 5), dict(size=(3, 2), mode="bilinear")), ((1, 2, 5), dict(size=8, mode="linear")),
  ((1, 2, 5), dict(size=1, mode="linear", align_corners=True)),
  ((1, 1, 2, 3, 4), dict(size=(3, 4, 2), mode="trilinear")),
  ((1, 2, 3, 4), dict(scale_factor=2.5, mode="nearest")),
  ((1, 2, 3, 4), dict(scale_factor=(1.5, 0.5), mode="bilinear")),
  ((2, 3, 5, 7), dict(size=(9, 4), mode="bicubic")),
  ((1, 2, 5, 7), dict(size=(3, 11), mode="bicubic", align_corners=True)),
  ((1, 2, 4, 4), dict(scale_factor=2.5, mode="bicubic")),
  ((2, 3, 5, 7), dict(size=(3, 4), mode="area")), ((2, 3, 7), dict(size=3, mode="area")),
  ((1, 1, 4, 5, 6), dict(size=(2, 3, 4), mode="area")),
  ((1, 2, 5, 7), dict(size=(11, 13), mode="area")),
  ((1, 2, 6, 6), dict(scale_factor=0.5, mode="area")),
]


@pytest.mark.parametrize("xs,kw", INTERP)
def test_interpolate(xs, kw):
  check(lambda x: x.interpolate(**kw), lambda x: F.interpolate(x, **kw), rnd(*xs), atol=1e-5)


def test_interpolate_ints_and_errors():
  check(lambda x: x.interpolate(size=(5, 3)), lambda x: F.interpolate(x, size=(5, 3)),
        labels(9, 1, 1, 3, 4).astype(np.uint8))
  raises_like(ValueError, lambda x: x.interpolate(size=4, align_corners=True),
              lambda x: F.interpolate(x, size=4, align_corners=True), rnd(1, 1, 3))
  raises_like(ValueError, lambda x: x.interpolate(), lambda x: F.interpolate(x), rnd(1, 1, 3))
  raises_like(NotImplementedError, lambda x: x.interpolate(size=4, mode="bad"),
              lambda x: F.interpolate(x, size=4, mode="bad"), rnd(1, 1, 3))
  raises_like(ValueError, lambda x: x.interpolate(size=4, mode="area", align_corners=True),
              lambda x: F.interpolate(x, size=4, mode="area", align_corners=True), rnd(1, 1, 3))
  raises_like(NotImplementedError, lambda x: x.interpolate(size=4, mode="bicubic"),
              lambda x: F.interpolate(x, size=4, mode="bicubic"), rnd(1, 1, 3))
  for mode in ("bicubic", "area"):
    raises_like(NotImplementedError, lambda x, m=mode: x.interpolate(size=(4, 5), mode=m),
                lambda x, m=mode: F.interpolate(x, size=(4, 5), mode=m), labels(9, 1, 1, 3, 4))


def test_interpolate_bicubic_and_area_gradients():
  x = rnd(1, 2, 4, 5)
  for kw in (dict(size=(7, 3), mode="bicubic"), dict(size=(3, 2), mode="area")):
    t, tt = Tensor(x, device=PY, requires_grad=True), torch.tensor(x, requires_grad=True)
    (t.interpolate(**kw) * t.interpolate(**kw)).sum().backward()
    (F.interpolate(tt, **kw) ** 2).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), atol=1e-5, rtol=1e-4)


# ---- layers ----

def test_linear_sequential():
  check(lambda x, w, b: x.linear(w.T, b), F.linear, rnd(2, 3, 4), rnd(5, 4), rnd(5))
  check(lambda x, w: x.linear(w), lambda x, w: x * w, rnd(2, 4), rnd(4))
  check(lambda x, w: x.sequential([lambda t: t.linear(w.T), Tensor.relu, lambda t: t * 2]),
        lambda x, w: F.relu(F.linear(x, w)) * 2, rnd(3, 4), rnd(2, 4))


def test_layernorm_batchnorm():
  check(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,)), rnd(2, 3, 5), atol=1e-4)
  check(lambda x: x.layernorm((-2, -1), eps=1e-3), lambda x: F.layer_norm(x, (3, 5), eps=1e-3),
        rnd(2, 3, 5), atol=1e-4)
  mean, var, w, b = rnd(3), np.abs(rnd(3)) + 0.5, rnd(3), rnd(3)
  check(lambda x, m, v, w, b: x.batchnorm(w, b, m, (v + 1e-5).sqrt().reciprocal()),
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-5), rnd(2, 3, 4, 4), mean, var,
        w, b, atol=1e-4)
  check(lambda x, m, v: x.batchnorm(None, None, m, (v + 1e-5).sqrt().reciprocal()),
        lambda x, m, v: F.batch_norm(x, m, v, eps=1e-5), rnd(4, 3), mean, var, atol=1e-4)


@pytest.mark.parametrize("shape, axis", [((2, 4), -1), ((3, 5, 6), (1, 2)), ((4, 6), 0)])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_layernorm_built_on_nodes_is_the_graph_of_its_tensor_formula(shape, axis, dt):
  x = Tensor.rand(*shape, dtype=dt).realize()
  y = x - x.mean(axis, keepdim=True)
  formula = y.mul((y * y).mean(axis, keepdim=True).add(1e-5).sqrt().reciprocal())
  call = x.layernorm(axis, 1e-5).uop  # traced: a call whose body resolves to the graph
  assert call.op is Ops.GETTUPLE and inline_functions([call])[0] is formula.uop


def test_layernorm_of_half_floats_takes_the_tensor_formula():
  check(lambda x: x.half().layernorm().float(), lambda x: F.layer_norm(x.half(), (5,)).float(),
        rnd(2, 3, 5), atol=3e-3)


def test_one_hot():
  check(lambda y: y.one_hot(5), lambda y: F.one_hot(y, 5), labels(5, 2, 3))
  check(lambda y: y.one_hot(), lambda y: F.one_hot(y), labels(4, 6))
  check(lambda y: y.one_hot(3), lambda y: F.one_hot(y, 3), labels(3, 0))
  raises_like(RuntimeError, lambda y: y.one_hot(3), lambda y: F.one_hot(y, 3), rnd(3))


@pytest.mark.parametrize("kind", ["none", "bool", "float", "causal", "scale"])
def test_scaled_dot_product_attention(kind):
  q, k, v = rnd(2, 3, 4, 8), rnd(2, 3, 6, 8), rnd(2, 3, 6, 5)
  mask = {"bool": RNG.random((4, 6)) > 0.3, "float": rnd(1, 4, 6)}.get(kind)
  extra = [mask] if mask is not None else []
  kw = dict(is_causal=kind == "causal", scale=0.3 if kind == "scale" else None)
  check(lambda q, k, v, *m: q.scaled_dot_product_attention(k, v, *m, **kw),
        lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, **kw), q, k, v, *extra,
        atol=1e-5)


def test_attention_errors():
  q = Tensor(rnd(2, 4), device=PY)
  with pytest.raises(RuntimeError, match="dropout"):
    q.scaled_dot_product_attention(q, q, dropout_p=1.1)
  with pytest.raises(RuntimeError): q.scaled_dot_product_attention(q, q, q > 0, is_causal=True)


# ---- losses ----

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction):
  p, y = (RNG.uniform(0, 1, (3, 4)).astype(np.float32) for _ in range(2))
  w = rnd(4)
  p[0, 0], y[0, 0] = 0.0, 1.0  # log(0) clamps at -100
  check(lambda p, y: p.binary_crossentropy(y, reduction),
        lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), p, y)
  check(lambda p, y, w: p.binary_crossentropy(y, reduction, weight=w),
        lambda p, y, w: F.binary_cross_entropy(p, y, w, reduction=reduction), p, y, w)
  x = rnd(3, 4) * 10
  check(lambda x, y: x.binary_crossentropy_logits(y, reduction),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), x, y)
  check(lambda x, y, pw: x.binary_crossentropy_logits(y, reduction, pos_weight=pw),
        lambda x, y, pw: F.binary_cross_entropy_with_logits(x, y, reduction=reduction,
                                                             pos_weight=pw), x, y, np.abs(rnd(4)))


CE = [  # logits shape, classes, kwargs
  ((4, 5), dict()), ((4, 5), dict(reduction="sum", label_smoothing=0.2)),
  ((3, 4, 2, 2), dict(reduction="none")), ((5,), dict(label_smoothing=0.1)),
  ((6, 3), dict(ignore_index=1, label_smoothing=0.3)),
  ((5, 3, 2), dict(weight=True, ignore_index=0)),
  ((6, 4), dict(weight=True, label_smoothing=0.25, reduction="none")),
  ((6, 4), dict(weight=True, label_smoothing=0.25)),
]


@pytest.mark.parametrize("xs,kw", CE)
def test_cross_entropy_and_nll(xs, kw):
  c = xs[0] if len(xs) == 1 else xs[1]
  x, y = rnd(*xs), labels(c, *xs[2:]) if len(xs) == 1 else labels(c, xs[0], *xs[2:])
  if len(xs) == 1: y = labels(c)
  args = [x, y] + ([np.abs(rnd(c)) + 0.1] if kw.get("weight") else [])
  kw = {k: v for k, v in kw.items() if k != "weight"}
  def ours(x, y, *w): return x.cross_entropy(y, weight=w[0] if w else None, **kw)
  def ref(x, y, *w): return F.cross_entropy(x, y, weight=w[0] if w else None, **kw)
  check(ours, ref, *args)
  nkw = {k: v for k, v in kw.items() if k != "label_smoothing"}
  cdim = 1 if x.ndim > 1 else 0
  check(lambda x, y, *w: x.log_softmax(cdim).nll_loss(y, w[0] if w else None, **nkw),
        lambda x, y, *w: F.nll_loss(x.log_softmax(cdim), y, w[0] if w else None, **nkw), *args)


@pytest.mark.parametrize("kw", [dict(), dict(reduction="sum", label_smoothing=0.2),
                                dict(reduction="none")])
def test_cross_entropy_probabilities(kw):
  x, p = rnd(4, 3, 2), RNG.dirichlet(np.ones(3), (4, 2)).transpose(0, 2, 1).astype(np.float32)
  check(lambda x, p: x.cross_entropy(p, **kw), lambda x, p: F.cross_entropy(x, p, **kw), x, p)
  check(lambda x, p, w: x.cross_entropy(p, weight=w, **kw),
        lambda x, p, w: F.cross_entropy(x, p, weight=w, **kw), x, p, np.abs(rnd(3)))


@pytest.mark.parametrize("kw", [dict(), dict(label_smoothing=0.2), dict(reduction="sum"),
                                dict(ignore_index=2)])
def test_sparse_categorical_crossentropy(kw):
  x, y = rnd(3, 4, 5), labels(5, 3, 4)
  y[0, 1] = kw.get("ignore_index", -1)
  tkw = dict(kw, ignore_index=kw.get("ignore_index", -1))
  check(lambda x, y: x.sparse_categorical_crossentropy(y, **kw),
        lambda x, y: F.cross_entropy(x.reshape(-1, 5), y.flatten(), **tkw), x, y)


def test_loss_errors_and_cpu():
  raises_like(ValueError, lambda x, y: x.cross_entropy(y, reduction="avg"),
              lambda x, y: F.cross_entropy(x, y, reduction="avg"), rnd(3, 4), labels(4, 3))
  raises_like(ValueError, lambda x, y: x.nll_loss(y), F.nll_loss, rnd(3, 4), labels(4, 2))
  raises_like(RuntimeError, lambda x, y: x.nll_loss(y), F.nll_loss, rnd(3, 4), labels(4, 3, 2))
  p, q = RNG.uniform(0, 1, (3,)).astype(np.float32), RNG.uniform(0, 1, (4,)).astype(np.float32)
  raises_like(ValueError, lambda x, y: x.binary_crossentropy(y), F.binary_cross_entropy, p, q)
  check(lambda x, y: x.cross_entropy(y, label_smoothing=0.1),
        lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1), rnd(8, 10), labels(10, 8),
        device=CPU)


def test_cross_entropy_gradient():
  x, y = rnd(4, 5), labels(5, 4)
  tx = torch.tensor(x, requires_grad=True)
  F.cross_entropy(tx, torch.tensor(y), label_smoothing=0.1).backward()
  ux = Tensor(x, device=PY, requires_grad=True)
  ux.cross_entropy(Tensor(y, device=PY), label_smoothing=0.1).backward()
  np.testing.assert_allclose(ux.grad.numpy(), tx.grad.numpy(), atol=1e-5, rtol=1e-4)
  assert ux.dtype == dtypes.float32
