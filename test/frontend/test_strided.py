"""stride, storage_offset, is_contiguous and as_strided against PyTorch (frontend/strided.py)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unigrad import Tensor, dtypes
from unigrad.frontend.strided import strided_view_of

VIEWS = {  # name -> the same view in both libraries, of a realized (3, 4, 5) buffer
  "plain": lambda x: x,
  "transpose": lambda x: x.transpose(0, 2),
  "permute": lambda x: x.permute(1, 2, 0),
  "slice": lambda x: x[1:, :, 2:4],
  "step": lambda x: x[:, ::2, 1::3],
  "index": lambda x: x[2, 1],
  "unsqueeze": lambda x: x[:, None, 1],
  "expand": lambda x: x[:, :1].expand(3, 6, 5),
  "reshape": lambda x: x.reshape(12, 5)[3:9],
  "transpose_slice": lambda x: x.permute(2, 0, 1)[1:4, :, 1],
}


def both(name: str) -> tuple[Tensor, torch.Tensor]:
  base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
  return VIEWS[name](Tensor(base).realize()), VIEWS[name](torch.from_numpy(base.copy()))


def same_strides(shape: tuple, a: tuple, b: tuple) -> bool:
  """Equal where it matters (a size-1 axis may have any stride)."""
  return all(x == y for n, x, y in zip(shape, a, b) if n != 1)


@pytest.mark.parametrize("name", VIEWS)
def test_stride_of_views_matches_torch(name, no_kernels):
  t, ref = both(name)
  assert t.shape == tuple(ref.shape)
  assert same_strides(t.shape, t.stride(), ref.stride()), (t.stride(), ref.stride())
  assert t.storage_offset() == ref.storage_offset()
  assert t.is_contiguous() == ref.is_contiguous()
  assert t.stride(-1) == t.stride()[-1] if t.ndim else True


def test_stride_of_computed_tensors_is_row_major(no_kernels):
  x = Tensor.ones(3, 4)
  assert (x + 1).stride() == (4, 1) and (x + 1).is_contiguous()
  assert Tensor.empty(0, 3).stride() == torch.empty(0, 3).stride()
  assert Tensor.empty(3, 0).stride() == torch.empty(3, 0).stride()
  assert Tensor.empty(3, 1).stride() == torch.empty(3, 1).stride()
  assert Tensor(2.0).stride() == () and Tensor(2.0).is_contiguous()
  assert (x + 1).T.stride() == (3, 1)  # not a view of a buffer: computed row-major when realized
  padded = Tensor(np.ones((2, 2), np.float32)).pad(((1, 1), (0, 0)))
  assert strided_view_of(padded.uop) is None and padded.stride() == (2, 1)


def test_stride_bad_input():
  with pytest.raises(IndexError): Tensor.ones(2, 3).stride(2)
  with pytest.raises(IndexError): Tensor(1.0).stride(0)


# ---- as_strided ----

CASES = [  # (size, stride, storage_offset)
  ((4, 4), (8, 2), None), ((4, 4), (8, 2), 1), ((4,), (9,), None),  # the tutorial's
  ((3, 4), (7, 3), 1), ((4, 4), (3, 1), 2), ((3, 2), (0, 5), 4),  # overlapping, zero stride
  ((2, 3, 2), (1, 4, 12), 0), ((5,), (1,), 27), ((), (), 5), ((0, 3), (1, 1), 0),
  ((2, 1, 3), (16, 100, 5), 3), ((6, 5), (5, 1), 0),
]


@pytest.mark.parametrize("size,stride,offset", CASES)
def test_as_strided_of_a_buffer_matches_torch(device, size, stride, offset):
  base = np.arange(32, dtype=np.float32)
  t, ref = Tensor(base, device=device).realize(), torch.from_numpy(base)
  np.testing.assert_array_equal(t.as_strided(size, stride, offset).numpy(),
                                ref.as_strided(size, stride, offset).numpy())


@pytest.mark.parametrize("size,stride,offset", [((3, 3), (1, 4), 1), ((2, 2), (5, 1), None),
                                                ((4,), (0,), 2)])
def test_as_strided_uses_the_storage_of_a_view(size, stride, offset):
  """Like PyTorch, as_strided reads the storage a view reads (here the whole buffer), with the
  view's offset by default."""
  base = np.arange(24, dtype=np.float32).reshape(4, 6)
  t = Tensor(base).realize()[1:, 2:].T
  ref = torch.from_numpy(base)[1:, 2:].T
  np.testing.assert_array_equal(t.as_strided(size, stride, offset).numpy(),
                                ref.as_strided(size, stride, offset).numpy())


def test_as_strided_of_a_computed_tensor_reads_its_row_major_values():
  x = Tensor.arange(12).reshape(3, 4) * 2
  np.testing.assert_array_equal(x.as_strided((2, 2), (1, 4), 1).numpy(),
                                (torch.arange(12).reshape(3, 4) * 2).as_strided((2, 2), (1, 4),
                                                                              1).numpy())


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_as_strided_random(data):
  ndim = data.draw(st.integers(1, 3))
  size = [data.draw(st.integers(1, 4)) for _ in range(ndim)]
  stride = [data.draw(st.integers(0, 7)) for _ in range(ndim)]
  reach = sum((n - 1) * s for n, s in zip(size, stride))
  offset = data.draw(st.integers(0, 40 - reach - 1)) if reach < 40 else None
  if offset is None: return
  base = np.arange(40, dtype=np.int32)
  got = Tensor(base, device="PYTHON").realize().as_strided(size, stride, offset)
  np.testing.assert_array_equal(got.numpy(), torch.from_numpy(base).as_strided(size, stride,
                                                                               offset).numpy())


def test_as_strided_is_a_strided_view_again(no_kernels):
  """A strided reading of a buffer builds a view whose layout is exactly the one asked for."""
  t = Tensor(np.arange(32, dtype=np.float32)).realize()
  for size, stride, offset in [((4, 4), (8, 2), 1), ((3, 2), (1, 6), 5), ((2, 3), (0, 1), 2)]:
    v = t.as_strided(size, stride, offset)
    assert v.stride() == stride and v.storage_offset() == offset


def test_as_strided_gradient_matches_torch():
  w = np.random.default_rng(0).standard_normal(12).astype(np.float32)
  x, xt = Tensor(w, requires_grad=True), torch.tensor(w, requires_grad=True)
  y = x.reshape(3, 4).as_strided((3, 3), (4, 1), 1)
  yt = xt.reshape(3, 4).as_strided((3, 3), (4, 1), 1)
  (y * y).sum().backward()
  (yt * yt).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)
  # overlapping windows: each element's gradient counts every read of it
  x2, xt2 = Tensor(w, requires_grad=True), torch.tensor(w, requires_grad=True)
  x2.as_strided((4, 3), (2, 2), 0).sum().backward()
  xt2.as_strided((4, 3), (2, 2), 0).sum().backward()
  np.testing.assert_allclose(x2.grad.numpy(), xt2.grad.numpy())


def test_as_strided_of_a_leaf_view_reaches_the_leaf():
  p = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True).realize()
  p.T.as_strided((2,), (4,), 0).sum().backward()
  np.testing.assert_array_equal(p.grad.numpy(), [[1, 0, 0], [0, 1, 0]])


def test_as_strided_bad_input_raises_like_torch(no_kernels):
  t = Tensor(np.arange(12, dtype=np.float32)).realize()
  ref = torch.arange(12.0)
  bad = [((4, 4), (8, 2)), ((2,), (1, 1)), ((2, 2), (-1, 1)), ((-1, 2), (1, 1)),
         ((2, 2), (1, 1), -1), ((3,), (5,), 3)]
  for args in bad:
    with pytest.raises(RuntimeError) as ours: t.as_strided(*args)
    with pytest.raises(RuntimeError) as theirs: ref.as_strided(*args)
    if "setStorage" in str(theirs.value): assert str(ours.value) == str(theirs.value)
  for args in [((2, 2), (1.5, 1)), ((2, 2), (1, 1), 2.0), ("ab", (1,))]:
    with pytest.raises(TypeError): t.as_strided(*args)
    with pytest.raises(TypeError): ref.as_strided(*args)


def test_as_strided_dtypes(device):
  for dt, np_dt in ((dtypes.int8, np.int8), (dtypes.float16, np.float16), (dtypes.bool, np.bool_)):
    a = (np.arange(10) % 3).astype(np_dt)
    t = Tensor(a, device=device)
    assert t.dtype == dt
    got = t.as_strided((3, 2), (3, 1), 1).numpy()
    np.testing.assert_array_equal(got, np.lib.stride_tricks.as_strided(
      a[1:], (3, 2), (3 * a.itemsize, a.itemsize)))
