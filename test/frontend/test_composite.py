"""Composite Tensor ops (movement compositions, pad modes, scans, statistics, einsum, elementwise
helpers) against PyTorch. Most cases run on the PYTHON device (no compile time); a few run on CPU.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unigrad import Tensor, dtypes
from unigrad.frontend.composite import CAT_FUSE_MAX

RNG = np.random.default_rng(0)
PY, CPU = "PYTHON", "CPU"
NAN, INF = math.nan, math.inf


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)
def ints(*shape: int, lo: int = -3, hi: int = 4) -> np.ndarray:
  return RNG.integers(lo, hi, shape).astype(np.int64)
def arr(*v: float) -> np.ndarray: return np.array(v, dtype=np.float32)


def _same(ours, ref, atol: float, rtol: float) -> None:
  if isinstance(ref, (tuple, list)):
    assert isinstance(ours, (tuple, list)) and len(ours) == len(ref), (ours, ref)
    for o, r in zip(ours, ref): _same(o, r, atol, rtol)
    return
  r = ref.numpy()
  o = ours.numpy()
  assert o.shape == r.shape, f"shape {o.shape} != {r.shape}"
  assert o.dtype == r.dtype, f"dtype {o.dtype} != {r.dtype}"
  if o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer): np.testing.assert_array_equal(o, r)
  else: np.testing.assert_allclose(o, r, atol=atol, rtol=rtol, equal_nan=True)


def check(fn, *arrays, tfn=None, device=PY, atol=1e-5, rtol=1e-5):
  """fn on unigrad tensors equals (tfn or fn) on torch tensors: values, shape and dtype."""
  ref = (tfn or fn)(*[torch.tensor(a) for a in arrays])
  _same(fn(*[Tensor(a, device=device) for a in arrays]), ref, atol, rtol)


def raises_like(exc, fn, *arrays, tfn=None):
  """Both libraries raise `exc` for the same call."""
  with pytest.raises(exc): (tfn or fn)(*[torch.tensor(a) for a in arrays])
  with pytest.raises(exc): fn(*[Tensor(a, device=PY) for a in arrays])


# ---- cat / stack ----

@pytest.mark.parametrize("shapes,dim", [
  ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 2)], -1), ([(1, 2, 3), (1, 2, 3)], 1),
  ([(2, 0), (2, 3)], 1), ([(0,), (3, 2)], 0), ([(3,), (2,)], -1)])
def test_cat(shapes, dim):
  xs = [rnd(*s) for s in shapes]
  check(lambda *t: t[0].cat(*t[1:], dim=dim), *xs, tfn=lambda *t: torch.cat(t, dim))


def test_cat_forms_promotion_bool():
  check(lambda a, b: Tensor.cat([a, b], dim=0), ints(2, 2), rnd(1, 2),
        tfn=lambda a, b: torch.cat([a, b], 0))
  check(lambda a, b: a.cat(b), np.array([True, False]), np.array([False]),
        tfn=lambda a, b: torch.cat([a, b]))
  neg_zero = Tensor(arr(-0.0), device=PY).cat(Tensor(arr(1.0), device=PY)).numpy()
  assert np.signbit(neg_zero[0])


def test_cat_errors():
  raises_like(RuntimeError, lambda a, b: a.cat(b, dim=0), rnd(2, 3), rnd(2, 4),
              tfn=lambda a, b: torch.cat([a, b], 0))
  raises_like(RuntimeError, lambda a, b: a.cat(b), rnd(2, 3), rnd(3),
              tfn=lambda a, b: torch.cat([a, b]))
  raises_like(RuntimeError, lambda a, b: a.cat(b), np.float32(1), np.float32(2),
              tfn=lambda a, b: torch.cat([a, b]))
  raises_like(IndexError, lambda a, b: a.cat(b, dim=2), rnd(2, 3), rnd(2, 3),
              tfn=lambda a, b: torch.cat([a, b], 2))


def test_a_cat_of_many_pieces_is_copied_once_not_fused_into_its_consumers():
  """A cat of more than CAT_FUSE_MAX pieces is one copy kernel its consumer reads (fused, a
  convolution over DenseNet's concatenated features was a reduce nest per piece, compiled again
  in every consumer); a cat of few pieces still fuses. Values and gradients stay PyTorch's."""
  many, few = [rnd(1, 2, 5, 5) for _ in range(CAT_FUSE_MAX + 2)], [rnd(1, 2, 5, 5)
                                                                     for _ in range(CAT_FUSE_MAX)]
  w = rnd(3, 2 * len(many), 3, 3)
  assert len(Tensor.cat(*[Tensor(a, device=CPU) for a in few], dim=1).sum().schedule().src) == 1
  assert len(Tensor.cat(*[Tensor(a, device=CPU) for a in many], dim=1).sum().schedule().src) == 2
  nested = Tensor(many[0], device=CPU)  # ONNX's nested two-input Concats count as one cat
  for a in many[1:]: nested = nested.cat(Tensor(a, device=CPU), dim=1)
  assert len(nested.sum().schedule().src) == 2  # a copy at 5 pieces (then 2), then the sum
  xs = [Tensor(a, device=CPU, requires_grad=True) for a in many]
  out = Tensor.cat(*xs, dim=1).conv2d(Tensor(w, device=CPU))
  tx = [torch.tensor(a, requires_grad=True) for a in many]
  ref = F.conv2d(torch.cat(tx, 1), torch.tensor(w))
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-4, rtol=1e-4)
  out.square().sum().backward(), ref.square().sum().backward()
  for x, t in zip(xs, tx):
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(dim):
  check(lambda a, b, c: a.stack(b, c, dim=dim), rnd(2, 3), rnd(2, 3), rnd(2, 3),
        tfn=lambda a, b, c: torch.stack([a, b, c], dim))


def test_stack_scalars_and_errors():
  check(lambda a, b: Tensor.stack(a, b), np.float32(1), np.float32(2),
        tfn=lambda a, b: torch.stack([a, b]))
  raises_like(RuntimeError, lambda a, b: a.stack(b), rnd(2, 3), rnd(2, 4),
              tfn=lambda a, b: torch.stack([a, b]))


# ---- repeat / split / unfold / meshgrid ----

@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 1)), ((3,), (2, 2)), ((2, 1, 3), (1, 3, 2)),
                                        ((2, 3), (0, 2)), ((), (3,))])
def test_repeat(shape, reps):
  check(lambda a: a.repeat(*reps), rnd(*shape))


def test_repeat_errors():
  raises_like(RuntimeError, lambda a: a.repeat(2), rnd(2, 3))


@pytest.mark.parametrize("repeats,dim", [(2, None), (3, 0), (2, -1), ([1, 0, 2], 1), (0, 1)])
def test_repeat_interleave(repeats, dim):
  check(lambda a: a.repeat_interleave(repeats, dim), rnd(2, 3),
        tfn=lambda a: a.repeat_interleave(torch.tensor(repeats) if isinstance(repeats, list)
                                          else repeats, dim))


def test_repeat_interleave_tensor_repeats():
  out = Tensor(rnd(3), device=PY)
  r = out.repeat_interleave(Tensor([1, 2, 0], device=PY))
  assert r.shape == (3,)
  with pytest.raises(RuntimeError): out.repeat_interleave([1, 2])


@pytest.mark.parametrize("sizes,dim", [(2, 0), (2, -1), ([1, 3, 1], 1), (5, 1), ([0, 5], 1)])
def test_split(sizes, dim):
  check(lambda a: a.split(sizes, dim), rnd(4, 5), tfn=lambda a: torch.split(a, sizes, dim))


def test_split_errors():
  raises_like(RuntimeError, lambda a: a.split([2, 2], 1), rnd(4, 5),
              tfn=lambda a: torch.split(a, [2, 2], 1))
  raises_like(RuntimeError, lambda a: a.split(0, 1), rnd(4, 5),
              tfn=lambda a: torch.split(a, 0, 1))


@pytest.mark.parametrize("n,dim,shape", [(3, 0, (5,)), (4, 0, (5,)), (2, -1, (3, 4)), (3, 0, (0,)),
                                         (7, 1, (2, 3))])
def test_chunk(n, dim, shape):
  check(lambda a: a.chunk(n, dim), rnd(*shape), tfn=lambda a: torch.chunk(a, n, dim))


def test_chunk_errors():
  raises_like(RuntimeError, lambda a: a.chunk(0), rnd(3), tfn=lambda a: torch.chunk(a, 0))


@pytest.mark.parametrize("shape,dim,size,step", [
  ((7,), 0, 3, 2), ((3, 6), 1, 2, 1), ((3, 6), -2, 3, 3), ((2, 5, 2), 1, 5, 1), ((4,), 0, 1, 5),
  ((), 0, 1, 1), ((4,), 0, 0, 1)])
def test_unfold(shape, dim, size, step):
  check(lambda a: a.unfold(dim, size, step), rnd(*shape))


def test_unfold_errors():
  raises_like(RuntimeError, lambda a: a.unfold(0, 4, 1), rnd(3))
  raises_like(RuntimeError, lambda a: a.unfold(0, 2, 0), rnd(3))


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
  check(lambda a, b, c: a.meshgrid(b, c, indexing=indexing), rnd(2), rnd(3), np.float32(4),
        tfn=lambda a, b, c: torch.meshgrid(a, b, c, indexing=indexing))
  check(lambda a, b: a.meshgrid(b, indexing=indexing), rnd(2), rnd(3),
        tfn=lambda a, b: torch.meshgrid(a, b, indexing=indexing))


def test_meshgrid_errors():
  raises_like(RuntimeError, lambda a, b: a.meshgrid(b, indexing="ab"), rnd(2), rnd(3),
              tfn=lambda a, b: torch.meshgrid(a, b, indexing="ab"))


# ---- diagonals, roll, triangles ----

@pytest.mark.parametrize("shape,offset,d1,d2", [
  ((3, 4), 0, 0, 1), ((3, 4), 2, 0, 1), ((3, 4), -1, 0, 1), ((2, 3, 4), 1, -1, 1),
  ((2, 3, 3), 0, 2, 0), ((3, 4), 5, 0, 1)])
def test_diagonal(shape, offset, d1, d2):
  check(lambda a: a.diagonal(offset, d1, d2), rnd(*shape))


@pytest.mark.parametrize("shape,k", [((3,), 0), ((3,), 2), ((3,), -1), ((3, 4), 1), ((4, 3), -2),
                                     ((0,), 0)])
def test_diag(shape, k):
  check(lambda a: a.diag(k), rnd(*shape), tfn=lambda a: torch.diag(a, k))


def test_diag_errors():
  raises_like(RuntimeError, lambda a: a.diag(), rnd(2, 2, 2), tfn=torch.diag)
  raises_like(RuntimeError, lambda a: a.diagonal(0, 1, 1), rnd(2, 2))


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-2, 1), ((1, 3), (0, 1)), (5, None), (7, -1),
                                         (0, 0)])
def test_roll(shifts, dims):
  check(lambda a: a.roll(shifts, dims), rnd(3, 4), tfn=lambda a: torch.roll(a, shifts, dims))


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3, -4])
def test_triu_tril(diagonal):
  check(lambda a: a.triu(diagonal), rnd(2, 3, 4))
  check(lambda a: a.tril(diagonal), rnd(4, 3))
  check(lambda a: a.tril(diagonal), np.ones((3, 3), dtype=bool))


def test_triangle_errors():
  raises_like(RuntimeError, lambda a: a.triu(), rnd(3))


# ---- pad modes ----

@pytest.mark.parametrize("mode,pads,shape", [
  ("reflect", (1, 2), (2, 3, 4)), ("reflect", (2, 1, 1, 2), (1, 2, 3, 4)),
  ("replicate", (3, 0, 1, 2), (1, 2, 3, 4)), ("replicate", (0, 2), (2, 2, 1)),
  ("circular", (2, 1, 0, 3), (1, 2, 3, 4)), ("circular", (-1, 2), (1, 2, 5)),
  ("constant", (1, -1, 2, 0), (2, 3, 4)), ("reflect", (1, 1, 1, 1, 1, 1), (1, 2, 3, 3, 2))])
def test_pad_modes(mode, pads, shape):
  check(lambda a: a.pad(pads, mode=mode), rnd(*shape), tfn=lambda a: F.pad(a, pads, mode=mode))


def test_pad_value_and_pairs():
  check(lambda a: a.pad((1, 2), value=2.5), rnd(2, 3), tfn=lambda a: F.pad(a, (1, 2), value=2.5))
  check(lambda a: a.pad(((1, 0), None), "replicate"), rnd(2, 3),
        tfn=lambda a: F.pad(a[None], (0, 0, 1, 0), mode="replicate")[0])
  x = Tensor(rnd(2, 3), device=PY)
  np.testing.assert_array_equal(x.pad(((0, 1), (0, 0)), 7.0).numpy()[2], [7, 7, 7])


def test_pad_errors():
  raises_like(RuntimeError, lambda a: a.pad((3, 0), mode="reflect"), rnd(1, 2, 3),
              tfn=lambda a: F.pad(a, (3, 0), mode="reflect"))
  raises_like(RuntimeError, lambda a: a.pad((4, 0), mode="circular"), rnd(1, 2, 3),
              tfn=lambda a: F.pad(a, (4, 0), mode="circular"))
  raises_like(NotImplementedError, lambda a: a.pad((1, 0), mode="wrap"), rnd(1, 2, 3),
              tfn=lambda a: F.pad(a, (1, 0), mode="wrap"))


# ---- softmax family ----

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family(axis):
  x = rnd(3, 4) * 3
  x[1, 2] = -INF
  check(lambda a: a.softmax(axis), x, tfn=lambda a: a.softmax(axis))
  check(lambda a: a.log_softmax(axis), x, tfn=lambda a: a.log_softmax(axis))
  check(lambda a: a.logsumexp(axis), x, tfn=lambda a: a.logsumexp(axis))
  check(lambda a: a.logsumexp(axis, keepdim=True), x, tfn=lambda a: a.logsumexp(axis, True))


def test_softmax_edge_cases():
  check(lambda a: a.logsumexp((0, 1)), arr(-INF, -INF, 1.0, INF).reshape(2, 2),
        tfn=lambda a: a.logsumexp((0, 1)))
  check(lambda a: a.logsumexp(1), arr(-INF, -INF, 1.0, INF).reshape(2, 2),
        tfn=lambda a: a.logsumexp(1))
  check(lambda a: a.logsumexp(0), rnd(0, 3), tfn=lambda a: a.logsumexp(0))
  check(lambda a: a.softmax(0), np.float32(2.0), tfn=lambda a: a.softmax(0))
  check(lambda a: a.softmax(-1), ints(2, 3), tfn=lambda a: a.float().softmax(-1))
  check(lambda a: a.softmax(0), rnd(3).astype(np.float16), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("shape, axis", [((2, 4), -1), ((3, 5, 6), 1), ((4, 6), 0), ((7,), 0)])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_softmax_built_on_nodes_is_the_graph_of_its_tensor_formula(shape, axis, dt):
  x = Tensor.rand(*shape, dtype=dt).realize()
  e = (x - x.max(axis, keepdim=True).detach()).exp()
  assert x.softmax(axis).uop is e.div(e.sum(axis, keepdim=True)).uop


# ---- scans ----

@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 4), 1), ((3, 4), -2), ((2, 1, 3), 1),
                                        ((), 0), ((2, 0), 1)])
def test_cumsum_cumprod(shape, axis):
  check(lambda a: a.cumsum(axis), rnd(*shape), tfn=lambda a: a.cumsum(axis))
  check(lambda a: a.cumprod(axis), rnd(*shape), tfn=lambda a: a.cumprod(axis))
  check(lambda a: a.cumsum(axis), ints(*shape), tfn=lambda a: a.cumsum(axis))


def test_cumsum_dtypes():
  check(lambda a: a.cumsum(0), np.array([True, False, True]), tfn=lambda a: a.cumsum(0))
  check(lambda a: a.cumprod(0), ints(4).astype(np.int32), tfn=lambda a: a.cumprod(0))
  check(lambda a: a.cumsum(0, dtype=dtypes.float64), rnd(4),
        tfn=lambda a: a.cumsum(0, dtype=torch.float64))


def test_cumsum_cpu():
  check(lambda a: a.cumsum(1), rnd(3, 200), device=CPU, atol=1e-4, rtol=1e-4)
  sched = Tensor(rnd(64), device=CPU).cumsum(0).schedule()
  assert len(sched.src) == 1, "cumsum is one kernel"


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin(op):
  x = arr(1, 3, 3, 0, 5, 5, -1, 2)
  for data, axis in [(x, 0), (ints(3, 5), -1), (rnd(4, 2), 0), (arr(1, NAN, 3, 0), 0),
                     (np.float32(3), 0)]:
    check(lambda a, axis=axis: getattr(a, op)(axis), data,
          tfn=lambda a, axis=axis: tuple(getattr(torch, op)(a, axis)))


@pytest.mark.parametrize("shape,axis", [((6,), 0), ((3, 4), 1), ((3, 4), -2), ((), 0)])
def test_logcumsumexp(shape, axis):
  check(lambda a: a.logcumsumexp(axis), rnd(*shape) * 5, tfn=lambda a: a.logcumsumexp(axis))
  check(lambda a: a.logcumsumexp(0), arr(-INF, -INF, 2, INF, 1), tfn=lambda a: a.logcumsumexp(0))


# ---- statistics ----

@pytest.mark.parametrize("axis,keepdim,correction", [(None, False, 1), (0, False, 1), (-1, True, 0),
                                                     ((0, 2), False, 2), (1, True, 1)])
def test_var_std(axis, keepdim, correction):
  x = rnd(3, 4, 2)
  kw = dict(dim=axis, keepdim=keepdim, correction=correction)
  check(lambda a: a.var(axis, keepdim, correction), x, tfn=lambda a: torch.var(a, **kw))
  check(lambda a: a.std(axis, keepdim, correction), x, tfn=lambda a: torch.std(a, **kw))
  check(lambda a: a.var_mean(axis, keepdim, correction), x, tfn=lambda a: torch.var_mean(a, **kw))
  check(lambda a: a.std_mean(axis, keepdim, correction), x, tfn=lambda a: torch.std_mean(a, **kw))


def test_var_edge_cases():
  check(lambda a: a.var(0), rnd(1, 3), tfn=lambda a: a.var(0))
  check(lambda a: a.var(), np.float32(2), tfn=lambda a: a.var())
  raises_like(RuntimeError, lambda a: a.var(), ints(3))


@pytest.mark.parametrize("axis,keepdim", [(None, False), (None, True), (0, False), (-1, True),
                                          (1, False)])
def test_argmax_argmin(axis, keepdim):
  x = ints(3, 4, lo=0, hi=3)  # many ties: the first index wins
  check(lambda a: a.argmax(axis, keepdim), x, tfn=lambda a: a.argmax(axis, keepdim))
  check(lambda a: a.argmin(axis, keepdim), x, tfn=lambda a: a.argmin(axis, keepdim))
  f = rnd(3, 4)
  f[1, 1] = f[1, 3] = NAN
  check(lambda a: a.argmax(axis, keepdim), f, tfn=lambda a: a.argmax(axis, keepdim))
  check(lambda a: a.argmin(axis, keepdim), f, tfn=lambda a: a.argmin(axis, keepdim))


def test_argmax_edge_cases():
  check(lambda a: a.argmax(0), np.array([False, True, True]), tfn=lambda a: a.int().argmax(0))
  check(lambda a: a.argmax(), np.float32(3), tfn=lambda a: a.argmax())
  check(lambda a: a.argmin(0), np.array([3, 0, 255, 0], dtype=np.uint8), tfn=lambda a: a.argmin(0))
  raises_like(IndexError, lambda a: a.argmax(1), rnd(2, 0))
  raises_like(IndexError, lambda a: a.argmax(2), rnd(2, 3))


# ---- logic ----

@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, True), (-1, False)])
def test_any_all(axis, keepdim):
  x = ints(3, 4, lo=0, hi=2)
  x[0] = 1
  kw = {} if axis is None else dict(dim=axis, keepdim=keepdim)
  check(lambda a: a.any(axis, keepdim), x, tfn=lambda a: a.any(**kw))
  check(lambda a: a.all(axis, keepdim), x, tfn=lambda a: a.all(**kw))
  check(lambda a: a.all(axis, keepdim), rnd(3, 4), tfn=lambda a: a.all(**kw))
  check(lambda a: a.any(axis, keepdim), rnd(3, 0), tfn=lambda a: a.any(**kw))
  check(lambda a: a.all(axis, keepdim), rnd(3, 0), tfn=lambda a: a.all(**kw))


def test_isclose_allclose():
  a = arr(1.0, 1.0, NAN, INF, -INF, INF, 0.0, 1e-9)
  b = arr(1.0 + 1e-6, 1.1, NAN, INF, INF, 1e30, 1e-9, 0.0)
  check(lambda x, y: x.isclose(y), a, b, tfn=lambda x, y: torch.isclose(x, y))
  check(lambda x, y: x.isclose(y, equal_nan=True), a, b,
        tfn=lambda x, y: torch.isclose(x, y, equal_nan=True))
  check(lambda x, y: x.isclose(y, rtol=0.2, atol=0.0), a, b,
        tfn=lambda x, y: torch.isclose(x, y, rtol=0.2, atol=0.0))
  check(lambda x, y: x.isclose(y, atol=1), ints(5), ints(5),
        tfn=lambda x, y: torch.isclose(x, y, atol=1))
  x = Tensor(rnd(3), device=PY)
  assert x.allclose(x + 1e-9) and not x.allclose(x + 1)


# ---- einsum ----

EINSUM_CASES = [
  ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("ii", [(3, 3)]),
  ("ii->i", [(3, 3)]), ("i,j->ij", [(2,), (3,)]), ("ij->ji", [(2, 3)]),
  ("ij,ij->", [(2, 3), (2, 3)]),
  ("ij,jk", [(2, 3), (3, 4)]), ("...ij,...jk->...ik", [(2, 1, 2, 3), (3, 3, 2)]),
  ("i...->...", [(2, 3, 4)]), ("ba,ab", [(2, 3), (3, 2)]), ("iij->j", [(2, 2, 3)]),
  ("ij,j->i", [(2, 1), (3,)]), ("b...,b...->b", [(2, 3), (2, 3)]), ("i,i,i->i", [(4,), (4,), (4,)]),
  ("...", [(2, 3)]), ("ij->", [(0, 3)])]


@pytest.mark.parametrize("formula,shapes", EINSUM_CASES)
def test_einsum(formula, shapes):
  xs = [rnd(*s) for s in shapes]
  check(lambda *t: Tensor.einsum(formula, *t), *xs, tfn=lambda *t: torch.einsum(formula, *t))


def test_einsum_ints_and_list():
  a, b = ints(4).astype(np.int32), ints(4).astype(np.int32)
  check(lambda a, b: Tensor.einsum("i,i->", [a, b]), a, b,
        tfn=lambda a, b: torch.einsum("i,i->", a, b))


@pytest.mark.parametrize("formula,shapes", [("ij,jk->ik", [(2, 3), (4, 4)]), ("ij->k", [(2, 3)]),
                                            ("ijk", [(2, 3)]), ("ij,jk", [(2, 3)]),
                                            ("ij->ii", [(2, 2)]), ("ii", [(2, 3)])])
def test_einsum_errors(formula, shapes):
  raises_like(RuntimeError, lambda *t: Tensor.einsum(formula, *t), *[rnd(*s) for s in shapes],
              tfn=lambda *t: torch.einsum(formula, *t))


# ---- elementwise compositions ----

def test_clamp():
  x = rnd(3, 4) * 3
  check(lambda a: a.clamp(-1, 1), x, tfn=lambda a: a.clamp(-1, 1))
  check(lambda a: a.clamp(min=0.5), x, tfn=lambda a: a.clamp(min=0.5))
  check(lambda a: a.clip(max_=0), x, tfn=lambda a: a.clip(max=0))
  check(lambda a: a.clamp(2, 1), x, tfn=lambda a: a.clamp(2, 1))
  check(lambda a: a.clamp(0.5), ints(5), tfn=lambda a: a.clamp(0.5))
  check(lambda a: a.clamp(-1, 2), ints(5), tfn=lambda a: a.clamp(-1, 2))
  check(lambda a, lo, hi: a.clamp(lo, hi), x, rnd(4), rnd(3, 1) + 1,
        tfn=lambda a, lo, hi: a.clamp(lo, hi))
  check(lambda a: a.clamp(0, 1), arr(NAN, 2), tfn=lambda a: a.clamp(0, 1))
  raises_like(RuntimeError, lambda a: a.clamp(), x)


def test_lerp():
  check(lambda a, b: a.lerp(b, 0.3), rnd(3, 4), rnd(4), tfn=lambda a, b: torch.lerp(a, b, 0.3))
  check(lambda a, b: a.lerp(b, 0.8), rnd(3, 4), rnd(4), tfn=lambda a, b: torch.lerp(a, b, 0.8))
  w = RNG.uniform(-1, 2, (3, 4)).astype(np.float32)
  check(lambda a, b, w: a.lerp(b, w), rnd(3, 4), rnd(3, 4), w, tfn=torch.lerp)


def test_sign_copysign_logaddexp():
  x = arr(-2, -0.0, 0.0, 3, NAN, INF, -INF)
  check(lambda a: a.sign(), x, tfn=torch.sign)
  check(lambda a: a.sign(), ints(6), tfn=torch.sign)
  check(lambda a: a.sign(), np.array([0, 3], dtype=np.uint8), tfn=torch.sign)
  check(lambda a: a.sign(), np.array([True, False]), tfn=torch.sign)
  y = arr(1, -1, -0.0, 0.0, -NAN, 2, -3)
  got = Tensor(x, device=PY).copysign(Tensor(y, device=PY)).numpy()
  np.testing.assert_array_equal(np.signbit(got), np.signbit(np.copysign(x, y)))
  np.testing.assert_array_equal(np.abs(got), np.abs(x))
  check(lambda a, b: a.copysign(b), ints(5), rnd(5), tfn=torch.copysign)
  check(lambda a: a.copysign(-1), rnd(3).astype(np.float64), tfn=lambda a: torch.copysign(a, -1))
  a, b = arr(1, -INF, INF, INF, NAN, 50, -3), arr(2, -INF, INF, -INF, 1, -50, -3)
  check(lambda p, q: p.logaddexp(q), a, b, tfn=torch.logaddexp)
  check(lambda p: p.logaddexp(1), ints(4),
        tfn=lambda p: torch.logaddexp(p.float(), torch.tensor(1.)))


def test_composites_on_cpu():
  x = rnd(2, 3, 5)
  p = (2, 1, 1, 1)
  check(lambda a: a.pad(p, mode="reflect").cat(a.pad(p), dim=0), x, device=CPU,
        tfn=lambda a: torch.cat([F.pad(a, p, mode="reflect"), F.pad(a, p)]))
  check(lambda a: (a.softmax(-1), a.argmax(1), a.var(0)), x, device=CPU,
        tfn=lambda a: (a.softmax(-1), a.argmax(1), a.var(0)))
  check(lambda a, b: Tensor.einsum("bij,bkj->bik", a, b), x, rnd(2, 4, 5), device=CPU, atol=1e-4,
        tfn=lambda a, b: torch.einsum("bij,bkj->bik", a, b))


@pytest.mark.parametrize("fn,tfn", [
  (lambda t: t.softmax(1), lambda t: t.softmax(1)),
  (lambda t: t.logsumexp(0), lambda t: t.logsumexp(0)),
  (lambda t: t.var(1), lambda t: t.var(1)),
  (lambda t: t.cat(t * 2, dim=1), lambda t: torch.cat([t, t * 2], 1)),
  (lambda t: Tensor.einsum("ij,kj->ik", t, t), lambda t: torch.einsum("ij,kj->ik", t, t)),
  pytest.param(lambda t: t.cumsum(1), lambda t: t.cumsum(1)),
  pytest.param(lambda t: t.pad((1, 2), mode="reflect"),
               lambda t: F.pad(t, (1, 2), mode="reflect"))])
def test_gradients(fn, tfn):
  x = rnd(3, 4)
  tx = torch.tensor(x, requires_grad=True)
  tfn(tx).square().sum().backward()
  ux = Tensor(x, device=PY, requires_grad=True)
  fn(ux).square().sum().backward()
  np.testing.assert_allclose(ux.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4)
