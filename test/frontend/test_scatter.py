"""Scatter, scatter_reduce and setitem with tensor indices: PyTorch's values (repeated indices,
negative dims, empty and 0-d tensors, int/float/bool dtypes, errors), and their kernels: a fill of
the targets and one ordered loop of direct stores over the indices, never a loop over the target
axis per index (O(N) plus O(K), not O(N*K)), and never split across threads.
"""
import math

import numpy as np
import pytest
import torch

from unigrad import Tensor
from unigrad.codegen.linearize import launch_size
from unigrad.codegen.opt.heuristic import hand_coded_optimizations
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import CODEGEN_STAGES, full_rewrite
from unigrad.engine import entry
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import AxisType, KernelInfo, Ops

RNG = np.random.default_rng(1)
REDUCTIONS = ["sum", "prod", "mean", "amax", "amin"]


def values(dtype, *shape: int) -> np.ndarray:
  """Random values of a numpy dtype: small integers (no overflow in a product of a few), bools,
  or normal floats."""
  if dtype == np.bool_: return RNG.integers(0, 2, shape).astype(np.bool_)
  if np.issubdtype(dtype, np.integer):
    lo = 0 if np.issubdtype(dtype, np.unsignedinteger) else -3
    return RNG.integers(lo, 4, shape).astype(dtype)
  return RNG.standard_normal(shape).astype(dtype)


def positions(hi: int, *shape: int) -> np.ndarray:
  return RNG.integers(0, hi, shape).astype(np.int64)


def same(ours: Tensor, theirs: torch.Tensor, exact: bool = False) -> None:
  o, t = ours.numpy(), theirs.numpy()
  assert o.shape == t.shape and o.dtype == t.dtype, f"{o.shape} {o.dtype} != {t.shape} {t.dtype}"
  if exact: np.testing.assert_array_equal(o, t)
  else: np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-6)


def both(fn, *arrays: np.ndarray, exact: bool = False) -> None:
  """fn on unigrad Tensors equals fn on torch tensors."""
  same(fn(*[Tensor(a) for a in arrays]), fn(*[torch.from_numpy(a.copy()) for a in arrays]), exact)


# ---- values against PyTorch ----

# (dim, self shape, index shape, src shape): the index axis is longer than the target axis, so
# indices repeat
CASES = [(0, (4, 3), (9, 3), (9, 4)), (1, (3, 5, 2), (3, 12, 2), (3, 12, 3)),
         (-1, (2, 3, 4), (2, 2, 10), (2, 3, 11)), (-3, (3, 2, 2), (7, 1, 2), (8, 2, 2))]
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,xs,ish,ss", CASES)
def test_scatter_matches_torch(dtype, dim, xs, ish, ss):
  x, i, s = values(dtype, *xs), positions(xs[dim], *ish), values(dtype, *ss)
  both(lambda x, i, s: x.scatter(dim, i, s), x, i, s, exact=True)
  both(lambda x, i: x.scatter(dim, i, True if dtype == np.bool_ else 2), x, i, exact=True)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("dim,xs,ish,ss", CASES[:3])
def test_scatter_reduce_matches_torch(dim, xs, ish, ss, dtype, reduce, include_self):
  x, i, s = values(dtype, *xs), positions(xs[dim], *ish), values(dtype, *ss)
  both(lambda x, i, s: x.scatter_reduce(dim, i, s, reduce, include_self=include_self), x, i, s)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_])
def test_scatter_reduce_of_small_ints_and_bools_matches_torch(dtype, reduce):
  x, i, s = values(dtype, 2, 5), positions(5, 2, 9), values(dtype, 2, 9)
  for inc in (True, False):
    both(lambda x, i, s, inc=inc: x.scatter_reduce(1, i, s, reduce, include_self=inc), x, i, s)


def test_integer_mean_floor_divides():
  x, i, s = np.array([7, -7, 0, 5]), np.array([0, 0, 1, 1, 1, 2]), np.array([-2, 0, 3, -9, 1, 4])
  for inc in (True, False):
    both(lambda x, i, s, inc=inc: x.scatter_reduce(0, i, s, "mean", include_self=inc), x, i, s)


def test_scatter_add_and_multiply_forms():
  x, i, s = values(np.float32, 3, 4), positions(3, 5, 4), values(np.float32, 5, 4)
  both(lambda x, i, s: x.scatter(0, i, s, reduce="add"), x, i, s)
  both(lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), x, i, s)
  both(lambda x, i: x.scatter(0, i, 1.5, reduce="multiply"), x, i)


def test_empty_index_returns_self():
  x = values(np.float32, 3, 4)
  both(lambda x, i, s: x.scatter(1, i, s), x, np.zeros((3, 0), np.int64),
       np.ones((3, 2), np.float32))
  both(lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), x, np.zeros((0, 4), np.int64),
       np.ones((1, 4), np.float32))
  both(lambda x, i, s: x.scatter(0, i, s), np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64),
       np.zeros((0, 3), np.float32))


def test_zero_dim_tensors():
  x, s = np.array(5.0, np.float32), np.array(7.0, np.float32)
  i0, i1 = np.array(0), np.array([0])
  both(lambda x, i, s: x.scatter(0, i, s), x, i0, s)
  both(lambda x, i: x.scatter(-1, i, 3.0), x, i1)
  both(lambda x, i, s: x.scatter_reduce(0, i, s, "sum"), x, i0, s)
  both(lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False), x, i1, s.reshape(1))


def test_out_of_range_indices_raise_before_any_kernel(no_kernels):
  x, s = Tensor(np.zeros((2, 5), np.float32)), Tensor(np.ones((2, 2), np.float32))
  for bad in (5, -1):
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds for dimension 1 with "
                                           "size 5"):
      x.scatter(1, Tensor([[0, bad]]), s)
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds"):
      x.scatter_reduce(1, Tensor([[bad, 0]]), s, "sum")
  with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
    Tensor(np.zeros(5, np.float32))[Tensor([1, 7])] = 1.0


def test_lazy_out_of_range_indices_write_nothing():
  """A lazy index is not read on the host: out-of-range writes are dropped, the rest land."""
  i = Tensor([[0, 9, 2, -4]]) + 0
  got = Tensor(np.zeros((1, 4), np.float32)).scatter(1, i, Tensor([[1.0, 2.0, 3.0, 4.0]]))
  assert got.tolist() == [[1.0, 0.0, 3.0, 0.0]]
  src = Tensor([[1.0, 2.0, 3.0, 4.0]])
  got = Tensor(np.ones((1, 4), np.float32)).scatter_reduce(1, i, src, "sum")
  assert got.tolist() == [[2.0, 1.0, 4.0, 1.0]]


# ---- repeated indices ----

def test_repeated_indices_last_write_wins():
  n, k = 1 << 14, 7
  i, s = positions(k, n), values(np.float32, n)
  want = np.zeros(k, np.float32)
  for j in range(n): want[i[j]] = s[j]
  got = Tensor(np.zeros(k, np.float32)).scatter(0, Tensor(i), Tensor(s)).numpy()
  np.testing.assert_array_equal(got, want)


def test_repeated_indices_reduce_in_index_order():
  """Sums accumulate in float32 in the order of the indices, like numpy's unbuffered add.at."""
  n, k = 1 << 16, 5
  i, s = positions(k, n), values(np.float32, n)
  want = np.zeros(k, np.float32)
  np.add.at(want, i, s)
  got = Tensor(np.zeros(k, np.float32)).scatter_reduce(0, Tensor(i), Tensor(s), "sum").numpy()
  np.testing.assert_array_equal(got, want)
  mx = np.full(k, -np.inf, np.float32)
  np.maximum.at(mx, i, s)
  got = Tensor(np.full(k, -np.inf, np.float32)).scatter_reduce(0, Tensor(i), Tensor(s), "amax")
  np.testing.assert_array_equal(got.numpy(), mx)


def test_repeated_indices_on_every_device(device):
  """The reference interpreter runs the same read-modify-write kernels."""
  i, s = positions(4, 2, 30), values(np.float32, 2, 30)
  x = values(np.float32, 2, 4)
  for reduce in REDUCTIONS:
    got = Tensor(x, device=device).scatter_reduce(1, Tensor(i, device=device),
                                                 Tensor(s, device=device), reduce)
    same(got, torch.from_numpy(x).scatter_reduce(1, torch.from_numpy(i), torch.from_numpy(s),
                                                 reduce))
  got = Tensor(x, device=device).scatter(1, Tensor(i, device=device), Tensor(s, device=device))
  same(got, torch.from_numpy(x).scatter(1, torch.from_numpy(i), torch.from_numpy(s)), exact=True)


def test_setitem_with_tensor_indices_matches_numpy():
  x = values(np.float32, 6, 5)
  cases = [(positions(6, 20),), (slice(None), positions(5, 9)), (positions(6, 8), positions(5, 8)),
           (np.array([-1, 0, -1, 3]),), (positions(6, 2, 3), 1)]
  for idx in cases:
    want, got = x.copy(), Tensor(x.copy())
    v = values(np.float32, *want[idx].shape)
    want[idx] = v  # numpy assigns repeated indices in order: the last one wins
    got[tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in idx)] = Tensor(v)
    np.testing.assert_array_equal(got.numpy(), want)
    got[tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in idx)] = 2.5
    want[idx] = 2.5
    np.testing.assert_array_equal(got.numpy(), want)


# ---- kernels: direct stores, O(N), one thread ----

def simplified(linear) -> list:
  """The kernel ASTs of a schedule after codegen's simplify stage."""
  return [CODEGEN_STAGES[0].run(call.src[0], CRenderer()) for call in linear.src]


def loop_sizes(ast) -> list[int]:
  return sorted(u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE)


def is_scatter_kernel(ast) -> bool:
  """A kernel whose store address depends on loaded data (a read-modify-write of out[idx])."""
  st = next(u for u in ast.toposort() if u.op is Ops.STORE)
  return st.src[0].src[1].op_in_backward_slice_with_self(Ops.INDEX)


def assert_direct(linear, k: int, numel: int, index_shape: tuple[int, ...]) -> None:
  """No kernel loops over the K targets once per index: scatter kernels loop over the index
  shape only, every kernel does at most max(numel, N) iterations, and no reduction is left."""
  asts = simplified(linear)
  scatters = [a for a in asts if is_scatter_kernel(a)]
  assert scatters, "no direct-store kernel"
  for a in asts:
    assert not a.op_in_backward_slice_with_self(Ops.REDUCE), "a one-hot reduction is left"
    assert math.prod(loop_sizes(a)) <= max(numel, math.prod(index_shape)), loop_sizes(a)
  for a in scatters:
    assert k not in loop_sizes(a), f"loop over K={k} in a scatter kernel"
    assert loop_sizes(a) == sorted(s for s in index_shape if s > 1)
    assert a.arg.opts_to_apply == (), "a scatter kernel must not be optimized (threads race)"
    assert not a.arg.parallel, "a scatter kernel runs its iterations in order"


K = 40000
WRITES = {
  "scatter": lambda x, i, s: x.scatter(1, i, s),
  "scatter scalar": lambda x, i, s: x.scatter(1, i, 2.0),
  "scatter add": lambda x, i, s: x.scatter(1, i, s, reduce="add"),
  "scatter multiply": lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
  **{f"{r} {inc}": (lambda x, i, s, r=r, inc=inc: x.scatter_reduce(1, i, s, r, include_self=inc))
     for r in REDUCTIONS for inc in (True, False)},
}


@pytest.mark.parametrize("name", list(WRITES))
def test_scatter_kernels_never_loop_over_the_target_axis(name):
  x = Tensor(values(np.float32, 2, K)).realize()
  i, s = Tensor(positions(K, 2, 7)).realize(), Tensor(values(np.float32, 2, 9)).realize()
  out = WRITES[name](x, i, s)
  assert_direct(out.schedule(), K, 2 * K, (2, 7))
  torch_fn = WRITES[name]
  want = torch_fn(torch.from_numpy(x.numpy()), torch.from_numpy(i.numpy()),
                  torch.from_numpy(s.numpy()))
  same(out, want)


def test_setitem_kernels_never_loop_over_the_target_axis(monkeypatch):
  ran = []
  def record(cb, *rest):
    ran.append(cb.linear)
    return run(cb, *rest)
  run = entry.run_commands
  monkeypatch.setattr(entry, "run_commands", record)
  x = Tensor(values(np.float32, K, 3)).realize()
  idx = Tensor(positions(K, 11)).realize()
  x[idx] = Tensor(values(np.float32, 11, 3)).realize()
  assert_direct(ran[-1], K, 3 * K, (11,))


def test_spec_one_hot_scatter_add_is_a_direct_store():
  """The spec's scatter_add, `T + (arange(K) == idx).where(val, 0).sum(1)`, and its integer
  product form compile to direct stores."""
  d = 13
  idx_np, val_np = positions(K, d), values(np.float32, d)
  hot = Tensor.arange(K).reshape(K, 1).eq(Tensor(idx_np).reshape(1, d))
  t = Tensor(np.ones(K, np.float32))
  out = t + hot.where(Tensor(val_np).reshape(1, d), 0).sum(1)
  assert_direct(out.schedule(), K, K, (d,))
  want = np.ones(K, np.float32)
  np.add.at(want, idx_np, val_np)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
  ival = Tensor(positions(9, d)).reshape(1, d)
  iout = (hot.cast(ival.dtype) * ival).sum(1)
  assert_direct(iout.schedule(), K, K, (d,))
  iwant = np.zeros(K, np.int64)
  np.add.at(iwant, idx_np, ival.numpy().reshape(-1))
  np.testing.assert_array_equal(iout.numpy(), iwant)


def test_float_one_hot_product_keeps_its_nan_semantics():
  """mask.cast(float) * val is not where(mask, val, 0): 0 * inf is nan, and reaches every target
  but the one the inf is written to, so that form is left a reduction."""
  hot = Tensor.arange(4).reshape(4, 1).eq(Tensor([1, 1, 3]).reshape(1, 3))
  out = (hot.float() * Tensor([1.0, math.inf, 2.0]).reshape(1, 3)).sum(1)
  np.testing.assert_array_equal(out.numpy(), [np.nan, np.inf, np.nan, np.nan])


def test_gather_gradient_is_a_direct_scatter():
  """The gradient of a gather is the one-hot scatter-add of the gradient: direct stores too."""
  x = Tensor(values(np.float32, K, 2), requires_grad=True)
  i = Tensor(positions(K, 5, 2))
  (x.gather(0, i) * Tensor(values(np.float32, 5, 2))).sum().backward()
  assert_direct(x.grad.schedule(), K, 2 * K, (5, 2))


def test_scatter_kernel_is_one_sequential_loop():
  """Repeated indices would race in parallel threads (and lose updates in vector lanes): the
  scatter kernel asks for no optimizations, where the heuristics would split a loop this long
  into threads."""
  n, k = 1 << 17, 3
  i, s = positions(k, n), values(np.float32, n)
  out = Tensor(np.zeros(k, np.float32)).scatter_reduce(0, Tensor(i), Tensor(s), "sum")
  scatters = [c.src[0] for c in out.schedule().src if is_scatter_kernel(c.src[0])]
  assert len(scatters) == 2  # the count of writes per target, and the sum
  for ast in scatters:
    linear = full_rewrite(ast, CRenderer())
    assert launch_size(linear) == (1,) and not linear.arg.applied_opts
    unmarked = OptKernel(ast.replace(arg=KernelInfo()))
    threaded = hand_coded_optimizations(unmarked, CRenderer(), 4)
    assert any(o.arg[1] is AxisType.THREAD for o in threaded.applied), "the marker matters"
  want = np.zeros(k, np.float32)
  np.add.at(want, i, s)
  np.testing.assert_array_equal(out.numpy(), want)


def test_a_write_into_a_buffer_it_reads_is_exact():
  """An assign whose one-hot value reads its own target is not filled first (that would clobber
  what it reads): the result is the reduction of the old values."""
  x = Tensor(np.arange(6, dtype=np.float32)).realize()
  i = Tensor([5, 0, 0, 2])
  hot = Tensor.arange(6).reshape(6, 1).eq(i.reshape(1, 4))
  x.assign(hot.where(x[:4].reshape(1, 4), 0).sum(1)).realize()
  np.testing.assert_array_equal(x.numpy(), [3.0, 0.0, 3.0, 0.0, 0.0, 0.0])


def test_scatter_then_pad_reads_inside_the_buffer():
  # found by unigrad.onnx's MaxUnpool: the pad's gate and the scatter's "was it written" test
  # merge into one AND, and simplifying that test given the pad's gate stripped the gate of its
  # read, which loaded the scatter's buffer at the pad's index, past its end (validity.py)
  idx, src = Tensor([5, 7, 13, 15], device="PYTHON"), Tensor([5., 6, 7, 8], device="PYTHON")
  out = Tensor.zeros(16, device="PYTHON").scatter(0, idx, src).pad([(0, 1)])
  want = np.zeros(17, np.float32)
  want[[5, 7, 13, 15]] = [5, 6, 7, 8]
  np.testing.assert_array_equal(out.numpy(), want)


def test_scatter_then_pad_on_both_sides_and_2d_reads_inside_the_buffer():
  idx, src = Tensor([5, 7, 13, 15], device="PYTHON"), Tensor([5., 6, 7, 8], device="PYTHON")
  out = Tensor.zeros(16, device="PYTHON").scatter(0, idx, src).pad([(2, 3)])
  want = torch.zeros(16).scatter(0, torch.tensor([5, 7, 13, 15]), torch.tensor([5., 6, 7, 8]))
  np.testing.assert_array_equal(out.numpy(), torch.nn.functional.pad(want, (2, 3)).numpy())
  idx2, src2 = [[0, 2], [1, 4], [3, 3], [4, 0]], np.arange(8, dtype=np.float32).reshape(4, 2)
  out2 = Tensor.zeros(4, 5, device="PYTHON").scatter(1, Tensor(idx2, device="PYTHON"),
                                                     Tensor(src2, device="PYTHON"))
  want2 = torch.zeros(4, 5).scatter(1, torch.tensor(idx2), torch.from_numpy(src2))
  np.testing.assert_array_equal(out2.pad([(1, 1), (0, 2)]).numpy(),
                                torch.nn.functional.pad(want2, (0, 2, 1, 1)).numpy())
