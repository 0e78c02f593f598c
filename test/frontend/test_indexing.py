"""Indexing (advanced __getitem__, __setitem__, gather, scatter, scatter_reduce, masks, nonzero,
sort/argsort/topk) against PyTorch on CPU, their gradients, and the kernel structure of a gather:
a direct indexed load with no loop over the gathered axis (the kernels of writes: test_scatter.py).
"""
import math
import sys

import numpy as np
import pytest
import torch

from unigrad import Tensor, dtypes
from unigrad.codegen.pipeline import CODEGEN_STAGES
from unigrad.helpers import GlobalCounters
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import Ops

CPU = "CPU"
RNG = np.random.default_rng(0)
NAN, INF = math.nan, math.inf


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)
def ints(*shape: int, lo: int = 0, hi: int = 3) -> np.ndarray:
  return RNG.integers(lo, hi, shape).astype(np.int64)


def ours(v, device=CPU):
  """numpy arrays -> Tensors, inside tuples/lists too; everything else unchanged."""
  if isinstance(v, np.ndarray): return Tensor(v, device=device)
  if isinstance(v, tuple): return tuple(ours(i, device) for i in v)
  return v


def theirs(v):
  if isinstance(v, np.ndarray): return torch.from_numpy(v.copy())
  if isinstance(v, tuple): return tuple(theirs(i) for i in v)
  return v


def same(o, r, atol=1e-6) -> None:
  if isinstance(r, (tuple, list)):
    assert len(o) == len(r)
    for a, b in zip(o, r): same(a, b, atol)
    return
  o, r = o.numpy(), r.detach().numpy()
  assert o.shape == r.shape, f"shape {o.shape} != {r.shape}"
  assert o.dtype == r.dtype, f"dtype {o.dtype} != {r.dtype}"
  np.testing.assert_allclose(o, r, atol=atol, rtol=1e-6, equal_nan=True)


def check(fn, *args, tfn=None, device=CPU):
  """fn on unigrad Tensors equals (tfn or fn) on torch tensors (values, shape, dtype)."""
  same(fn(*[ours(a, device) for a in args]), (tfn or fn)(*[theirs(a) for a in args]))


def both_raise(exc, fn, *args, match=None):
  with pytest.raises(exc): fn(*[theirs(a) for a in args])
  with pytest.raises(exc, match=match): fn(*[ours(a) for a in args])


def kernels(t: Tensor) -> list:
  """The kernel ASTs of t after codegen's first stage (simplify: where reduces collapse)."""
  return [CODEGEN_STAGES[0].run(call.src[0], CRenderer()) for call in t.schedule().src]


def loop_sizes(ast) -> list[int]:
  return sorted(u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE)


def no_reduce(ast) -> bool: return not ast.op_in_backward_slice_with_self(Ops.REDUCE)


# ---- __getitem__ ----

X = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
GETITEM = [
  [2, 0, -1], ([0, 2], [1, -1]), (slice(None), [3, 0]), (1, [0, 1], 2), (0, slice(None), [1, 4]),
  ([0], slice(None), [1, 4]), (Ellipsis, [4, 0, 4]), ([[0], [2]], slice(1, 3), [[1, 2, 3]]),
  (None, [1, 2], None, slice(None, None, 2)), (np.array([[1, 0], [2, 2]]), Ellipsis),
  (np.array(2), slice(None)), (slice(None), np.array([True, False, True, False])),
  (X[..., 0] > 20,), (X > 30,), (1, X[1] > 30), (True,), (False,), (None, True, Ellipsis, False),
  (np.array(True), 0), ([],), (slice(None), [], 0), (np.array([1, 0], dtype=np.int32), 2),
  (np.array([1, 0, 1], dtype=np.uint8), 1),
]


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
@pytest.mark.parametrize("idx", GETITEM, ids=[str(i)[:40] for i in range(len(GETITEM))])
def test_getitem(idx):
  same(Tensor(X)[ours(idx)], torch.from_numpy(X)[theirs(idx)])


def test_getitem_python_device():
  for idx in ([2, 0, -1], (slice(None), X[0] > 5), ([[0], [2]], 1, [3, -5])):
    same(Tensor(X, device="PYTHON")[ours(idx, "PYTHON")], torch.from_numpy(X)[theirs(idx)])


def test_getitem_negative_steps_with_advanced_indices():
  t = Tensor(X)
  np.testing.assert_array_equal(t[::-1, [3, 0], ::-2].numpy(), X[::-1, [3, 0], ::-2])
  np.testing.assert_array_equal(t[[2, 0], ::-3].numpy(), X[[2, 0], ::-3])


def test_getitem_lazy_index_and_dtypes():
  idx = Tensor.arange(4) * 2 - 3  # lazy: [-3, -1, 1, 3], wraps
  same(Tensor(X)[:, idx], torch.from_numpy(X)[:, torch.tensor([-3, -1, 1, 3])])
  for dt in ("int32", "int8", "float16", "bool"):
    x = np.arange(12).reshape(3, 4).astype(dt)
    same(Tensor(x)[[2, 0], 1:], torch.from_numpy(x)[[2, 0], 1:])


def test_getitem_lazy_out_of_range_reads_zero():
  """A lazy index is not checked (that would run it): out of range reads give 0."""
  idx = Tensor.arange(3) * 5 + 4  # [4, 9, 14]: past the end of every axis
  assert Tensor(X)[0, idx, 0].tolist() == [0.0, 0.0, 0.0]
  assert Tensor(X)[1, 1, idx - 20].tolist() == [0.0, 0.0, 0.0]  # [-16, -11, -6]: before the start
  assert Tensor(X)[idx - 4, idx - 4].tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0], [0.0] * 5, [0.0] * 5]


def test_getitem_errors(no_kernels):
  x = X.copy()
  both_raise(IndexError, lambda t: t[[0, 3]], x)
  both_raise(IndexError, lambda t: t[:, [-5]], x)
  both_raise(IndexError, lambda t, i: t[i], x, np.array([0, 5]))
  both_raise(IndexError, lambda t, i: t[i], x, np.array([0.0]))
  both_raise(IndexError, lambda t: t[[0, 1], [0, 1, 2]], x)
  both_raise(IndexError, lambda t, m: t[m], x, np.array([True, False]))
  both_raise(IndexError, lambda t: t[0, 0, 0, [0]], x)
  with pytest.raises(IndexError, match="single ellipsis"): Tensor(x)[..., [0], ...]
  with pytest.raises(IndexError, match="must be long, int, byte or bool"): Tensor(x)[[0.5, 1.0]]
  with pytest.raises(IndexError): Tensor(x)["a"]


def test_index_tensor_device_mismatch():
  with pytest.raises(RuntimeError, match="device"): Tensor(X)[Tensor([0], device="PYTHON")]


# ---- __setitem__ ----

SETITEM = [
  ((0, slice(1, 3)), 7.0), ((Ellipsis, slice(None, None, 2)), -1.0), ((1,), rnd(4, 5)),
  ((slice(None), 2, slice(None)), rnd(5)), ((slice(None), [0, 3], [1, -1]), rnd(2)),
  (([1, 1], [0, 0]), rnd(2, 5)), ((slice(None), 1, [0, -1]), rnd(3, 1)),
  (([[0], [2]], slice(None), [1, 2]), 5.0), ((X > 30,), 0.0), ((X > 30,), rnd(29)),
  ((np.array([True, False, True]),), rnd(4, 5)), ((0, X[0] > 10), rnd(1)),
]


@pytest.mark.parametrize("idx,value", SETITEM, ids=[str(i) for i in range(len(SETITEM))])
def test_setitem(idx, value):
  a, t = Tensor(X.copy()), torch.from_numpy(X.copy())
  a[ours(idx)] = ours(value)
  t[theirs(idx)] = theirs(value)
  same(a, t)


def test_setitem_in_place_operators_and_bool_forms():
  a, t = Tensor(X.copy()), torch.from_numpy(X.copy())
  for x in (a, t):
    x[[0, 0, 2], 1] += 1.0  # read, add, write: a repeated index is incremented once
    x[True] = x * 2
    x[1, x[1] > 50] = -1.0
  u8 = np.array([1, 0, 1], np.uint8)
  a[Tensor(u8)] = 3.0
  t[torch.from_numpy(u8).bool()] = 3.0
  same(a, t)


def test_setitem_duplicate_indices_last_wins():
  a, t = Tensor(np.zeros(4, np.float32)), torch.zeros(4)
  a[[1, 3, 1, 1]] = Tensor([1.0, 2.0, 3.0, 4.0])
  t[[1, 3, 1, 1]] = torch.tensor([1.0, 2.0, 3.0, 4.0])
  same(a, t)


def test_setitem_writes_the_buffer_through_a_view():
  base = Tensor(X.copy()).realize()
  view = base[1, ::2]
  view[0, [1, 3]] = 100.0
  view[-1] = Tensor(np.full(5, -1.0, np.float32))
  ref = torch.from_numpy(X.copy())
  ref_view = ref[1, ::2]
  ref_view[0, [1, 3]] = 100.0
  ref_view[-1] = -1.0
  same(base, ref)
  same(view, ref_view)


def test_setitem_lazy_tensor_and_self_reads():
  a = Tensor(X) * 2
  a[0, 0, 0] = -5
  a[[0, 1]] = a[[1, 0]]  # the value reads the positions being written
  t = torch.from_numpy(X) * 2
  t[0, 0, 0] = -5
  t[[0, 1]] = t[[1, 0]].clone()
  same(a, t)


def test_setitem_casts_and_python_device():
  a, t = Tensor(np.arange(6), device="PYTHON"), torch.arange(6)
  a[[0, 2]] = 2.7
  a[3:] = Tensor([1.9, -2.9, 7.0], device="PYTHON")
  t[[0, 2]] = 2.7
  t[3:] = torch.tensor([1.9, -2.9, 7.0])
  same(a, t)


def test_setitem_errors():
  both_raise(RuntimeError, lambda t, v: t.__setitem__((0, slice(None)), v), X.copy(), rnd(3))
  both_raise(RuntimeError, lambda t, v: t.__setitem__([0, 1], v), X.copy(), rnd(3, 4, 5))
  both_raise(IndexError, lambda t: t.__setitem__([5], 1.0), X.copy())
  with pytest.raises(TypeError): Tensor(X)[0] = "x"


def test_mask_reads_and_writes_are_linear_work():
  """Masks count on the host, then every element is one direct read: O(numel), not O(numel^2)."""
  x = Tensor(rnd(128, 128)).realize()
  values = Tensor(np.arange(int((x.numpy() < -1).sum()), dtype=np.float32))
  for fn in (lambda: x.__setitem__(x > 0, 0.0), lambda: x.__setitem__(x < -1, values),
             lambda: x[x < 0].realize(), lambda: x.masked_select(x < 0).realize(),
             lambda: x.__setitem__((slice(None), [1, 5]), 1.0)):
    GlobalCounters.reset()
    fn()
    assert GlobalCounters.global_ops < 16 * x.numel()


def test_host_reads_without_numpy(monkeypatch):
  """numpy is optional: the host reads (range checks, mask counts) fall back to memoryviews."""
  monkeypatch.setitem(sys.modules, "numpy", None)
  x = Tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
  assert x.nonzero().tolist() == [[0, 0], [0, 2], [1, 1]]
  assert x[x > 0.5].tolist() == [1.0, 2.0, 3.0]
  x[x > 0.5] = Tensor([7.0, 8.0, 9.0])
  assert x.tolist() == [[7.0, 0.0, 8.0], [0.0, 9.0, 0.0]]
  with pytest.raises(IndexError, match="out of bounds"): x[Tensor([0, 2])]


# ---- gather ----

@pytest.mark.parametrize("dim,ishape", [(0, (2, 4, 5)), (1, (3, 7, 5)), (2, (2, 3, 9)),
                                        (-1, (1, 1, 3)), (1, (3, 0, 5))])
def test_gather(dim, ishape):
  k = X.shape[dim]
  check(lambda x, i: x.gather(dim, i), X, ints(*ishape, hi=k))


def test_gather_dtypes():
  i = ints(3, 2, hi=4)
  for dt in ("int32", "bool", "float16", "uint8", "float64"):
    x = (np.arange(12).reshape(3, 4) % 3).astype(dt)
    check(lambda x, i: x.gather(1, i), x, i)
  check(lambda x, i: x.gather(1, i), X[0], i.astype(np.int32))
  check(lambda x, i: x.gather(0, i), np.array(3.0, np.float32), np.array(0))
  check(lambda x, i: x.gather(0, i), np.array(3.0, np.float32), np.array([0, 0]))


def test_gather_errors(no_kernels):
  both_raise(RuntimeError, lambda x, i: x.gather(1, i), X, np.array([[[5]]]))
  both_raise(RuntimeError, lambda x, i: x.gather(1, i), X, np.array([[[-1]]]))
  both_raise(RuntimeError, lambda x, i: x.gather(1, i), X, np.array([0]))
  both_raise(RuntimeError, lambda x, i: x.gather(1, i), X, np.zeros((4, 1, 1), np.int64))
  both_raise(RuntimeError, lambda x, i: x.gather(1, i), X, np.zeros((1, 1, 1), np.float32))
  both_raise(IndexError, lambda x, i: x.gather(3, i), X, np.zeros((1, 1, 1), np.int64))


# ---- scatter / scatter_reduce ----

SRC = rnd(3, 4, 5)


@pytest.mark.parametrize("dim,ishape,sshape", [(0, (2, 4, 5), (3, 4, 5)), (1, (3, 6, 2), (3, 7, 2)),
                                               (-1, (1, 2, 8), (2, 2, 9))])
def test_scatter(dim, ishape, sshape):
  i = ints(*ishape, hi=X.shape[dim])
  check(lambda x, i, s: x.scatter(dim, i, s), X, i, rnd(*sshape))
  check(lambda x, i: x.scatter(dim, i, 1.5), X, i)
  check(lambda x, i: x.scatter(dim, i, 2.0, reduce="multiply"), X, i)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
  i = ints(3, 2, 5, hi=4)
  check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), X, i, SRC)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_scatter_reduce_ints(reduce):
  x = np.arange(12).reshape(3, 4) - 5
  i = ints(2, 4, hi=3)
  check(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=False), x, i, -x[:2] * 3)
  check(lambda x, i, s: x.scatter_reduce(0, i, s, reduce), x, i, x[1:] * 7)
  check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=False),  # unwritten targets
        np.array([[5, 7, 9]]), np.array([[0, 0, 0]]), np.array([[1, 2, -4]]))


def test_scatter_add_reduce_form():
  i = ints(3, 2, 5, hi=4)
  check(lambda x, i, s: x.scatter(1, i, s, reduce="add"), X, i, SRC)


def test_scatter_errors(no_kernels):
  x, i0, i3 = np.zeros((2, 3), np.float32), np.zeros((1, 1), np.int64), np.zeros((1, 3), np.int64)
  def scatter(x, i, s): return x.scatter(1, i, s)
  both_raise(RuntimeError, scatter, x, np.array([[5]]), np.ones((1, 1), np.float32))
  both_raise(RuntimeError, scatter, x, i3, np.ones((1, 2), np.float32))  # src too small
  both_raise(RuntimeError, scatter, x, i3, np.ones((2, 3), np.float64))  # src dtype
  both_raise(RuntimeError, lambda x, i, s: x.scatter_reduce(1, i, s, "foo"), x, i0, x)
  both_raise(RuntimeError, lambda x, i, s: x.scatter(1, i, s, reduce="max"), x, i0, x)


# ---- masks and nonzero ----

M = (X.astype(np.int64) % 3 == 0)


def test_masked_fill():
  check(lambda x, m: x.masked_fill(m, -1.0), X, M)
  check(lambda x, m: x.masked_fill(m, 2.5), np.arange(5), M[0, 0])  # 2.5 -> int64 2
  check(lambda x, m: x.masked_fill(m, np.float32(7)), X[0, 0], M[:, :1])  # broadcasts
  check(lambda x, m, v: x.masked_fill(m, v), X, M, np.array(3.0, np.float32))
  both_raise(RuntimeError, lambda x, m: x.masked_fill(m, 1.0), X, M.astype(np.int64))
  both_raise(RuntimeError, lambda x, m, v: x.masked_fill(m, v), X, M, np.ones(1, np.float32))


def test_masked_select_and_nonzero():
  check(lambda x, m: x.masked_select(m), X, M)
  check(lambda x, m: x.masked_select(m), X[0], M[0, :, :1])  # mask broadcasts
  check(lambda x, m: x.masked_select(m), X, np.zeros_like(M))
  check(lambda x: x.nonzero(), M)
  check(lambda x: x.nonzero(), np.array([0.0, NAN, -0.0, 2.0], np.float32))
  check(lambda x: x.nonzero(), np.array(3.0, np.float32))
  check(lambda x: x.nonzero(as_tuple=True), M)
  check(lambda x: x.nonzero(as_tuple=True), np.array(0))
  check(lambda x: x.nonzero(), np.zeros((2, 0)))


# ---- sort / argsort / topk ----

SPECIAL = np.array([3, 1, NAN, 2, 1, -0.0, 0.0, -INF, 5, 1, INF], np.float32)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_specials_stable(descending):
  check(lambda x: x.sort(descending=descending), SPECIAL,
        tfn=lambda x: x.sort(descending=descending, stable=True))


@pytest.mark.parametrize("dt", ["int64", "int32", "uint8", "int8", "float64", "float16", "uint64",
                                "bool"])
def test_sort_dtypes(dt):
  x = RNG.integers(0, 6, (3, 7))
  if dt == "int64": x = np.array([[2 ** 63 - 1, -2 ** 63, 0, 5, -1, 2 ** 63 - 1, -2 ** 63]] * 3)
  if dt == "uint64": x = np.array([[2 ** 64 - 1, 0, 2 ** 63, 5, 2 ** 63 - 1, 1, 0]] * 3, np.uint64)
  x = x.astype(dt)
  if dt == "uint64":  # torch has no sort for uint64: compare with numpy's stable argsort
    v, i = Tensor(x).sort(dim=1, descending=True)
    ref = np.argsort(-x.astype(np.float64), axis=1, kind="stable")
    np.testing.assert_array_equal(i.numpy(), ref)
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(x, ref, 1))
    return
  check(lambda x: x.sort(dim=0, descending=True), x,
        tfn=lambda x: x.sort(dim=0, descending=True, stable=True))
  check(lambda x: x.argsort(dim=-1), x, tfn=lambda x: x.argsort(dim=-1, stable=True))


@pytest.mark.parametrize("shape,dim", [((1,), 0), ((0,), 0), ((2, 0), 1), ((5, 1, 3), 0), ((), 0),
                                       ((2, 17), 1)])
def test_sort_shapes(shape, dim):
  check(lambda x: x.sort(dim), RNG.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("k,dim,largest", [(2, -1, True), (3, 0, False), (6, 1, True), (0, 1, True),
                                           (1, 0, True)])
def test_topk(k, dim, largest):
  check(lambda x: x.topk(k, dim, largest), rnd(4, 6))


def test_topk_errors(no_kernels):
  both_raise(RuntimeError, lambda x: x.topk(7), rnd(4, 6))


# ---- gradients ----

def grad_check(fn, *arrays, tfn=None):
  """d(sum(fn(x) * w))/dx for random w, against torch."""
  ts = [torch.tensor(a, requires_grad=True) for a in arrays]
  us = [Tensor(a, requires_grad=True) for a in arrays]
  out = (tfn or fn)(*ts)
  w = RNG.standard_normal(tuple(out.shape)).astype(np.float32)
  (out * torch.from_numpy(w)).sum().backward()
  (fn(*us) * Tensor(w)).sum().backward()
  for u, t in zip(us, ts): np.testing.assert_allclose(u.grad.numpy(), t.grad.numpy(), atol=1e-5)


def idx(v):
  return lambda t: (Tensor if isinstance(t, Tensor) else torch.tensor)(v)


def test_gradients_of_reads():
  x = rnd(3, 4)
  g = idx([[0, 0, 3], [1, 2, 1], [3, 3, 3]])
  grad_check(lambda a: a.gather(1, g(a)), x)
  grad_check(lambda a: a[[0, 2, 2], [1, -1, 1]], x)  # repeated elements accumulate
  grad_check(lambda a: a[:, [3, 0, 3]], x)
  grad_check(lambda a: a[idx(x > 0)(a)], x)
  grad_check(lambda a: a.masked_select(idx(x > 0)(a)), x)
  grad_check(lambda a: a.masked_fill(idx(x > 0)(a), 2.0), x)
  grad_check(lambda a: a.sort(dim=1)[0], x)
  grad_check(lambda a: a.topk(2, dim=0)[0], x)


def test_gradients_of_scatter():
  x, s = rnd(3, 4), rnd(2, 4)
  i = idx([[0, 1, 2, 0], [2, 1, 0, 1]])
  grad_check(lambda a, b: a.scatter_reduce(0, i(a), b, "sum"), x, s)
  grad_check(lambda a, b: a.scatter_reduce(0, i(a), b, "mean", include_self=False), x, s)
  grad_check(lambda a, b: a.scatter(0, idx([[0, 1, 2, 0], [2, 0, 1, 1]])(a), b), x, s)


def test_gradient_of_scatter_reduce_prod():
  i = idx([[0, 1, 2, 0]])
  grad_check(lambda a, b: a.scatter_reduce(0, i(a), b, "prod"), rnd(3, 4), rnd(1, 4))


def test_size_one_axes():
  """Reductions over a size-1 axis are dropped, not reduced (codegen's collapse_reduce fails on a
  REDUCE whose range(1) became a constant)."""
  x = rnd(1, 4)
  check(lambda x: x[[0, 0, -1]], x)
  check(lambda x, i: x.gather(0, i), x, np.zeros((3, 4), np.int64))
  check(lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), x, ints(1, 1, hi=4), rnd(1, 1))
  check(lambda x, i, s: x.scatter(1, i, s), x, ints(1, 1, hi=4), rnd(1, 1))
  a, t = Tensor(X.copy()), torch.from_numpy(X.copy())
  a[[2]], t[[2]] = Tensor(np.ones((4, 5), np.float32)), torch.ones(4, 5)
  a[1, [3]], t[1, [3]] = 9.0, 9.0
  same(a, t)


# ---- kernel structure: a gather is a direct load, O(N), no loop over K ----

@pytest.mark.parametrize("k", [1000, 40000])
def test_gather_is_a_direct_load_without_a_loop_over_k(k):
  x = Tensor(np.arange(k * 3, dtype=np.float32).reshape(k, 3))
  i = Tensor(np.array([3, k - 1, -1, 5, 0, 7, 2]))
  g = x.gather(0, Tensor([[3], [k - 1], [5], [0]]))
  cases = [(x[i], [3, 7]), (x[i, 1], [7]), (x[:, 1][i], [7]), (g, [4]),
           (x[i, Tensor([0, 2, 1, 0, 0, 1, 2])], [7]), (x[Tensor.arange(5) * 2], [3, 5])]
  for t, loops in cases:
    ks = kernels(t)
    assert len(ks) == 1 and no_reduce(ks[0]), "a gather must be one kernel without a reduce"
    assert loop_sizes(ks[0]) == loops, f"loops {loop_sizes(ks[0])}: no loop over K={k}"
  assert x[i, 2].tolist() == [11.0, 3 * k - 1, 3 * k - 1, 17.0, 2.0, 23.0, 8.0]


def test_sort_reads_values_directly():
  """sort's values are a gather of the order: the last kernel reads x once per element."""
  v, _ = Tensor(rnd(2, 40)).sort(dim=1)
  last = kernels(v)[-1]
  assert no_reduce(last) and loop_sizes(last) == [2, 40]


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_empty_slice_assignment_changes_nothing(device):
  """Regression: `x[3:] = 5` on a 3-element tensor wrote 5 everywhere on CPU (zero-trip loop
  upcast to 16 lanes)."""
  x = Tensor([1.0, 2, 3], device=device).contiguous().realize()
  x[3:] = 5.0
  assert x.tolist() == [1.0, 2.0, 3.0]
  m = Tensor([[1.0, 2, 3], [4, 5, 6]], device=device).contiguous().realize()
  m[:, 1:1] = 9
  assert m.tolist() == [[1.0, 2, 3], [4, 5, 6]]
  x[1:1].assign(Tensor.zeros(0, device=device)).realize()
  assert x.tolist() == [1.0, 2.0, 3.0]


def test_setitem_with_an_empty_index_tensor_is_a_no_op():
  """Regression: `x[empty int64 tensor] = 1.0` raised a bare KeyError; PyTorch does nothing."""
  x = Tensor([1.0, 2, 3], device="PYTHON").contiguous().realize()
  x[Tensor.zeros(0, dtype=dtypes.int64, device="PYTHON")] = 1.0
  assert x.tolist() == [1.0, 2.0, 3.0]



# ---- every basic slice of a small tensor, against numpy ----

SWEEP_STEPS = (-3, -2, -1, 1, 2, 3, None)
SWEEP_CASES = [((4,), 0), ((3, 4), 0), ((3, 4), 1)]  # (shape, the axis sliced)
SWEEP_IDS = ["1d", "2d-dim0", "2d-dim1"]


def every_slice(shape: tuple[int, ...], dim: int) -> list[tuple]:
  """Each start/stop in [-n-1, n+1] or None, each step in SWEEP_STEPS, on axis `dim`."""
  n = shape[dim]
  bounds = [*range(-n - 1, n + 2), None]
  lead = (slice(None),) * dim
  return [(*lead, slice(a, b, c)) for a in bounds for b in bounds for c in SWEEP_STEPS]


def slices_by_view(x: Tensor, idxs: list[tuple]) -> list[list[tuple]]:
  """The indices grouped by the view of x they build. UOps are hash-consed, so indices of a group
  build the same graph: whatever one reads or writes, every other does (the sweep realizes one
  per group and checks the result against numpy's for each member)."""
  groups: dict = {}
  for idx in idxs: groups.setdefault(x[idx].uop, []).append(idx)
  return list(groups.values())


def sweep_groups(shape: tuple[int, ...], dim: int, device: str) -> list[list[tuple]]:
  """Every slice's group on the PYTHON device; on CPU only the empty ones (a compile per view
  would take a minute with a cold kernel cache; empty views compile nothing)."""
  probe = Tensor.empty(*shape, device=device)
  groups = slices_by_view(probe, every_slice(shape, dim))
  if device == "PYTHON": return groups
  return [g for g in groups if 0 in probe[g[0]].shape]


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("shape,dim", SWEEP_CASES, ids=SWEEP_IDS)
def test_every_slice_reads_like_numpy(shape, dim, device):
  """Empty slices of any step read as empty (one realize for all the slices)."""
  ref = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
  x = Tensor(ref, device=device).realize()
  groups = sweep_groups(shape, dim, device)
  outs = [x[g[0]] for g in groups]
  Tensor.realize(*outs)
  for group, out in zip(groups, outs):
    for idx in group: np.testing.assert_array_equal(out.numpy(), ref[idx], err_msg=f"x[{idx}]")


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("value_kind", ["scalar", "tensor"])
@pytest.mark.parametrize("shape,dim", SWEEP_CASES, ids=SWEEP_IDS)
def test_every_slice_writes_like_numpy(shape, dim, value_kind, device):
  """Each write (a value unique to it) changes exactly numpy's positions: an empty slice writes
  nothing, and nothing lands outside the buffer (CHECK_OOB is on in the suite). The writes go
  one after another into one tensor, checked after each."""
  ref = np.zeros(shape, dtype=np.float32)
  x = Tensor(ref, device=device).realize()
  for k, group in enumerate(sweep_groups(shape, dim, device), start=1):
    size, view_shape = ref[group[0]].size, ref[group[0]].shape
    value = np.arange(size, dtype=np.float32).reshape(view_shape) + 100 * k
    x[group[0]] = k if value_kind == "scalar" else Tensor(value, device=device)
    got = x.numpy()
    for idx in group:
      ref[idx] = k if value_kind == "scalar" else value
      np.testing.assert_array_equal(got, ref, err_msg=f"x[{idx}] = {value_kind}")


def test_empty_negative_step_slice_write_stores_nothing():
  """Regression: `v[0:2:-1] = 9` stored 9 one element before the buffer (a zero-trip loop whose
  store codegen moved out of the loop, at the flipped view's offset -1)."""
  v = Tensor.arange(4).float().contiguous().realize()
  v[0:2:-1] = 9
  assert v.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_empty_stepped_slice_write_leaves_the_first_element():
  """Regression: `x[1:1:2] = 9` overwrote element 0 (a whole row in 2-D)."""
  x = Tensor.arange(4).float().contiguous().realize()
  x[1:1:2] = 9
  assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
  m = Tensor.arange(12).float().reshape(3, 4).contiguous().realize()
  m[1:1:2] = 9
  m[:, 3:0:2] = 9
  assert m.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
