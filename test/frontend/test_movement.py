"""Movement ops (reshape, permute, expand, pad, shrink, shrink_to, flip, basic indexing) against
numpy, on PYTHON and CPU, over shapes with 0- and 1-sized dims and over views of views.

Views without a PAD are packed into one kernel per test (each flattened into its own slice of a
1-D tensor, which is itself a PAD); views with a PAD run alone, so a bug in nested PADs
(test_pad_of_pad) cannot hide the view under test.
"""
import itertools
import math

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.frontend.movement import place_basic
from unigrad.dtype import dtypes
from unigrad.uop import Ops


def has_pad(t):
  return any(u.op is Ops.PAD for u in t.uop.toposort())


def pack(results):
  """One 1-D tensor with every (same-dtype) result flattened in order: one kernel."""
  return Tensor.cat(*[r.reshape(-1) for r in results])


def check_views(x, device, cases):
  """cases: {name: (ours(Tensor) -> Tensor, ref(ndarray) -> ndarray)}; x the source array."""
  got = {n: f(Tensor(x, device=device)) for n, (f, _) in cases.items()}
  packed = [n for n, t in got.items() if not has_pad(t) and math.prod(t.shape)]
  values = {n: t.numpy() for n, t in got.items() if n not in packed}
  if packed:
    flat, start = pack([got[n] for n in packed]).numpy(), 0
    for n in packed:
      size = math.prod(got[n].shape)
      values[n] = flat[start:start + size].reshape(got[n].shape)
      start += size
  for n, (_, ref) in cases.items():
    want = ref(x)
    assert got[n].shape == want.shape, (n, got[n].shape, want.shape)
    np.testing.assert_array_equal(values[n], want, err_msg=n)


def arange(*shape):
  return np.arange(math.prod(shape), dtype=np.int32).reshape(shape) + 1


# ---- one op at a time ----

RESHAPES = [((2, 3, 4), (4, 6)), ((2, 3, 4), (-1, 4)), ((2, 3, 4), (2, -1, 2)), ((1, 4, 1), (4,)),
            ((5,), (1, 5, 1)), ((1,), ()), ((), (1, 1)), ((3, 1), (1, 3)), ((0, 3), (3, 0)),
            ((2, 0), (0, 5)), ((0, 3), (-1, 3))]


@pytest.mark.parametrize("src,dst", RESHAPES, ids=str)
def test_reshape(device, src, dst):
  x = arange(*src)
  check_views(x, device, {"plain": (lambda t: t.reshape(dst), lambda a: a.reshape(dst)),
                          "perm": (lambda t: t.T.reshape(dst), lambda a: a.T.reshape(dst)),
                          "view": (lambda t: t.flip(0).view(*dst) if t.ndim else t.view(*dst),
                                   lambda a: (np.flip(a, 0) if a.ndim else a).reshape(dst))})


def test_reshape_none_keeps_the_size_of_that_axis():
  """tinygrad's spelling (its gpt2.py: `qkv.reshape(None, None, 3, heads, head_dim)`)."""
  x = Tensor(arange(2, 3, 4))
  assert x.reshape(None, None, 2, 2).tolist() == arange(2, 3, 2, 2).tolist()
  assert x.reshape(None, -1).shape == (2, 12) and x.reshape((None, 12)).shape == (2, 12)
  with pytest.raises(ValueError, match="None at position 3 keeps the size of axis 3"):
    x.reshape(None, None, None, None)
  with pytest.raises(ValueError, match="invalid for input of size 24"):
    x.reshape(None, 5, -1)


def test_permute(device):
  x = arange(2, 3, 4)
  cases = {str(p): (lambda t, p=p: t.permute(p), lambda a, p=p: a.transpose(p))
           for p in itertools.permutations(range(3))}
  cases["neg"] = (lambda t: t.permute(-1, 0, -2), lambda a: a.transpose(2, 0, 1))
  cases["transpose"] = (lambda t: t.transpose(0, 2), lambda a: a.transpose(2, 1, 0))
  cases["T"] = (lambda t: t[0].T, lambda a: a[0].T)
  cases["perm-perm"] = (lambda t: t.permute(2, 0, 1).permute(1, 0, 2),
                        lambda a: a.transpose(0, 2, 1))
  check_views(x, device, cases)


def test_expand(device):
  x = arange(3, 1, 2)
  check_views(x, device, {
    "mid": (lambda t: t.expand(3, 4, 2), lambda a: np.broadcast_to(a, (3, 4, 2))),
    "lead": (lambda t: t.expand(2, 3, 1, 2), lambda a: np.broadcast_to(a, (2, 3, 1, 2))),
    "minus1": (lambda t: t.expand(-1, 5, -1), lambda a: np.broadcast_to(a, (3, 5, 2))),
    "tuple": (lambda t: t.expand((1, 3, 2, 2)), lambda a: np.broadcast_to(a, (1, 3, 2, 2))),
    "zero": (lambda t: t.expand(3, 0, 2), lambda a: np.broadcast_to(a, (3, 0, 2))),
    "of-perm": (lambda t: t.permute(1, 0, 2).expand(4, 3, 2),
                lambda a: np.broadcast_to(a.transpose(1, 0, 2), (4, 3, 2))),
    "same": (lambda t: t.expand(3, 1, 2), lambda a: a)})


PADS = [(((1, 0), (0, 2)), 0), (((0, 0), (3, 3)), 7), ((1, 2), 0), ((1, 2, 0, 1), -1),
        ((-1, 2), 0), (((-1, -1), (1, -2)), 5), ((0, 0), 0)]


@pytest.mark.parametrize("padding,value", PADS, ids=str)
def test_pad(device, padding, value):
  x = arange(3, 4)
  flat = all(isinstance(p, int) for p in padding)
  pairs = padding if not flat else [(0, 0)] * (2 - len(padding) // 2) + [
    (padding[i], padding[i + 1]) for i in range(0, len(padding), 2)][::-1]
  def ref(a):
    out = np.pad(a, [(max(b, 0), max(e, 0)) for b, e in pairs], constant_values=value)
    keep = [slice(max(-b, 0), n - max(-e, 0)) for n, (b, e) in zip(out.shape, pairs)]
    return out[tuple(keep)]
  check_views(x, device, {"pad": (lambda t: t.pad(padding, value=value), ref)})


def test_pad_of_views_and_dtypes(device):
  """pad on a permuted/flipped view; the value takes the tensor's dtype, like PyTorch."""
  x = arange(2, 3)
  check_views(x, device, {"perm": (lambda t: t.T.pad(((1, 0), (0, 1))),
                                   lambda a: np.pad(a.T, ((1, 0), (0, 1))))})
  check_views(x, device, {"flip": (lambda t: t.flip(1).pad((1, 1), value=9),
                                   lambda a: np.pad(a[:, ::-1], ((0, 0), (1, 1)),
                                                    constant_values=9))})
  t = Tensor(x, device=device).pad((1, 1), value=1.5)
  assert t.dtype == dtypes.int32 and t.numpy()[0].tolist() == [1, 1, 2, 3, 1]
  b = Tensor([True, False], device=device).pad((1, 0), value=True)
  assert b.dtype == dtypes.bool and b.tolist() == [True, True, False]
  f = Tensor([1.0], device=device).pad((1, 0), value=float("-inf"))
  assert f.tolist() == [float("-inf"), 1.0]


def test_shrink_and_flip(device):
  x = arange(3, 4, 2)
  check_views(x, device, {
    "shrink": (lambda t: t.shrink(((0, 2), None, (1, 2))), lambda a: a[0:2, :, 1:2]),
    "shrink_to": (lambda t: t.shrink_to(1, None, 2), lambda a: a[:1, :, :2]),
    "shrink-empty": (lambda t: t.shrink(((1, 1), None, None)), lambda a: a[1:1]),
    "flip0": (lambda t: t.flip(0), lambda a: a[::-1]),
    "flip02": (lambda t: t.flip(0, 2), lambda a: a[::-1, :, ::-1]),
    "flip-neg": (lambda t: t.flip(-1), lambda a: a[..., ::-1]),
    "flip-list": (lambda t: t.flip([0, 1]), lambda a: a[::-1, ::-1]),
    "flip-none": (lambda t: t.flip(), lambda a: a),
    "flip-shrink-perm": (lambda t: t.flip(1).shrink((None, (1, 3), None)).permute(2, 0, 1),
                         lambda a: a[:, ::-1][:, 1:3].transpose(2, 0, 1)),
    "squeeze": (lambda t: t[:, :1].squeeze(1), lambda a: a[:, 0]),
    "unsqueeze": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "flatten": (lambda t: t.flatten(1), lambda a: a.reshape(3, 8))})


# ---- indexing ----

INDICES = [0, -1, (1, 2), (slice(None), 1), (Ellipsis, 1), (None, 0), (0, Ellipsis, None),
           (slice(1, None),), (slice(-3, -1),), (slice(5, 10),), (slice(-10, 2),), (slice(3, 1),),
           (1, -1, -1), (None, None), Ellipsis, (slice(None, None, -1),),
           (slice(None), slice(None, None, -1), slice(-1, 0, -1)), (Ellipsis, None, slice(1, 2))]
STEPPED = [(slice(None, None, 2),), (slice(1, None, -2),),
           (slice(-1, -4, -2), slice(None), slice(None, None, 3)),
           (slice(None), None, slice(None, None, -3)), (slice(None, None, 5),) * 3,
           (slice(None, None, -1), slice(None, None, -2), slice(None, None, -3))]


def test_getitem(device):
  x = arange(3, 4, 5)
  check_views(x, device, {repr(i): (lambda t, i=i: t[i], lambda a, i=i: a[i]) for i in INDICES})


@pytest.mark.parametrize("idx", STEPPED, ids=repr)
def test_getitem_steps(device, idx):
  x = arange(3, 4, 5)
  check_views(x, device, {repr(idx): (lambda t: t[idx], lambda a: a[idx])})


def test_getitem_on_views(device):
  x = arange(3, 4)
  check_views(x, device, {
    "perm": (lambda t: t.T[1:, ::-1], lambda a: a.T[1:, ::-1]),
    "expand": (lambda t: t[:1].expand(5, 4)[1:4, 2],
               lambda a: np.broadcast_to(a[:1], (5, 4))[1:4, 2]),
    "flip": (lambda t: t.flip(1)[-1], lambda a: a[:, ::-1][-1]),
    "0d": (lambda t: t[1, 2][None], lambda a: a[1, 2][None]),
    "0d-ellipsis": (lambda t: t[1, 2][...], lambda a: a[1, 2][...])})
  check_views(x, device, {"step-of-perm": (lambda t: t.T[::2, ::-3], lambda a: a.T[::2, ::-3])})


# ---- random shapes and chains ----

def _random_chain(rng, shape):
  """A random chain of movement ops on `shape` as (ours, numpy) functions."""
  ops_t, ops_n = [], []
  cur = list(shape)
  for _ in range(4):
    kind = rng.choice(["permute", "flip", "shrink", "reshape", "expand"])
    if kind == "permute":
      p = tuple(rng.permutation(len(cur)).tolist())
      ops_t.append(lambda t, p=p: t.permute(p))
      ops_n.append(lambda a, p=p: a.transpose(p))
      cur = [cur[i] for i in p]
    elif kind == "flip":
      ax = int(rng.integers(0, len(cur)))
      ops_t.append(lambda t, ax=ax: t.flip(ax))
      ops_n.append(lambda a, ax=ax: np.flip(a, ax))
    elif kind == "shrink":
      sl = tuple((int(b), int(b) + max(1, int(rng.integers(0, s - b + 1)))) if s else (0, 0)
                 for s in cur for b in [rng.integers(0, max(s, 1))])
      ops_t.append(lambda t, sl=sl: t.shrink(sl))
      ops_n.append(lambda a, sl=sl: a[tuple(slice(b, e) for b, e in sl)])
      cur = [e - b for b, e in sl]
    elif kind == "reshape":
      new = [math.prod(cur[:2])] + cur[2:] if len(cur) > 1 else [1] + cur
      ops_t.append(lambda t, n=tuple(new): t.reshape(n))
      ops_n.append(lambda a, n=tuple(new): a.reshape(n))
      cur = new
    else:
      new = [2] + cur
      ops_t.append(lambda t, n=tuple(new): t.expand(n))
      ops_n.append(lambda a, n=tuple(new): np.broadcast_to(a, n))
      cur = new
  def run(x, ops): return x if not ops else run(ops[0](x), ops[1:])
  return (lambda t: run(t, ops_t)), (lambda a: run(a, ops_n))


@pytest.mark.parametrize("seed", range(4))
def test_random_view_chains(device, seed):
  rng = np.random.default_rng(seed)
  shapes = [(2, 3, 4), (1, 4, 1), (3, 1, 2), (4, 3)]
  x = arange(*shapes[seed])
  check_views(x, device, {f"chain{i}": _random_chain(rng, x.shape) for i in range(5)})


def test_views_of_all_dtypes(device):
  for dt in (dtypes.bool, dtypes.int8, dtypes.uint16, dtypes.float16, dtypes.bfloat16,
             dtypes.float64):
    src = Tensor([[1, 0, 3], [4, 5, 0]], device=device, dtype=dt)
    got = src.T.flip(0)[1:].reshape(-1)
    want = np.array([[1, 0, 3], [4, 5, 0]]).T[::-1][1:].reshape(-1)
    assert got.dtype == dt and got.numpy().tolist() == want.astype(got.numpy().dtype).tolist(), dt


def test_pad_of_pad(device):
  """Regression (rangeify): an inner PAD's validity computed on the outer PAD's gated index
  left a bool Invalid in the load gate, and the load ran ungated out of bounds."""
  x = Tensor(np.arange(1, 6, dtype=np.int32), device=device)
  assert x.pad(((0, 1),)).pad(((2, 0),)).tolist() == [0, 0, 1, 2, 3, 4, 5, 0]


def test_place_basic_is_numpy_setitem_of_a_view():
  """place_basic (the value of a setitem on a tensor of an autograd graph) for ints, negative
  and stepped slices, None, Ellipsis and an empty slice."""
  a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
  for idx in [-1, (slice(1, 3), slice(None, None, 2)), (None, 1, slice(4, 0, -1)),
              (Ellipsis, slice(None, None, -2)), (slice(None, None, 2), None, 2, slice(1, 5, 3)),
              (slice(2, 2),)]:
    want = a.copy()
    w = -1 - np.arange(want[idx].size, dtype=np.float32).reshape(want[idx].shape)
    want[idx] = w
    np.testing.assert_array_equal(place_basic(Tensor(a), idx, Tensor(w)).numpy(), want)
