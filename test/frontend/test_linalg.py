"""frontend/linalg.py (norms, QR, SVD, det, solve, inv, Newton-Schulz) against torch.linalg."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unigrad import Tensor, dtypes, linalg

RNG = np.random.default_rng(7)


def rnd(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_equals_torch(shape, mode):
  a = rnd(*shape)
  q, r = linalg.qr(Tensor(a), mode)
  tq, tr = torch.linalg.qr(torch.tensor(a), mode)
  np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=2e-6)
  assert q.shape == tuple(tq.shape)
  if mode != "r": np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=2e-6)


def test_tensor_qr_some_and_bad_mode():
  a = rnd(4, 3)
  q, r = Tensor(a).qr(some=False)
  assert q.shape == (4, 4) and r.shape == (4, 3)
  np.testing.assert_allclose((q @ r).numpy(), a, atol=2e-6)
  with pytest.raises(RuntimeError, match="mode"): linalg.qr(Tensor(a), "bad")
  with pytest.raises(RuntimeError, match="mode"): torch.linalg.qr(torch.tensor(a), "bad")


def _check_svd(a: np.ndarray, full: bool) -> None:
  u, s, vh = (t.numpy() for t in linalg.svd(Tensor(a), full_matrices=full))
  tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full)
  assert (u.shape, s.shape, vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape))
  np.testing.assert_allclose(s, ts.numpy(), atol=1e-5, rtol=1e-5)
  k = s.shape[-1]
  rebuilt = (u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :]
  np.testing.assert_allclose(rebuilt, a, atol=2e-5)
  eye = lambda n: np.broadcast_to(np.eye(n), u.shape[:-2] + (n, n))  # noqa: E731
  np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, eye(u.shape[-1]), atol=2e-5)
  np.testing.assert_allclose(vh @ np.swapaxes(vh, -1, -2), eye(vh.shape[-2]), atol=2e-5)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])  # n = 3 each: shared kernels
def test_svd_matches_torch(shape):
  _check_svd(rnd(*shape), full=True)
  _check_svd(rnd(*shape), full=False)


def test_svd_of_rank_deficient_matrix_has_orthonormal_vectors():
  a = rnd(4, 2) @ rnd(2, 3)  # rank 2
  _check_svd(a, full=True)
  assert linalg.svdvals(Tensor(a)).numpy()[-1] < 1e-5


def test_tensor_svd_is_torchs():
  a = rnd(5, 3)
  u, s, v = Tensor(a).svd()
  assert u.shape == (5, 3) and v.shape == (3, 3)
  np.testing.assert_allclose(((u * s.unsqueeze(0)) @ v.T).numpy(), a, atol=2e-5)
  u0, _, v0 = Tensor(a).svd(compute_uv=False)
  assert not u0.numpy().any() and not v0.numpy().any()
  _, _, vh = Tensor(a).svd(full_matrices=False)  # the keyword of torch.linalg.svd: Vh
  np.testing.assert_allclose(vh.numpy(), v.T.numpy(), atol=1e-6)


def test_det_slogdet_solve_inv():
  a, b = rnd(2, 3, 3), rnd(2, 3, 2)
  ta, tb = torch.tensor(a), torch.tensor(b)
  np.testing.assert_allclose(linalg.det(Tensor(a)).numpy(), torch.linalg.det(ta), rtol=1e-5)
  sign, logabs = linalg.slogdet(Tensor(a))
  tsign, tlog = torch.linalg.slogdet(ta)
  np.testing.assert_array_equal(sign.numpy(), tsign.numpy())
  np.testing.assert_allclose(logabs.numpy(), tlog.numpy(), rtol=1e-5)
  np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(b)).numpy(),
                             torch.linalg.solve(ta, tb).numpy(), atol=1e-4, rtol=1e-4)
  v = b[..., 0]
  np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(v)).numpy(),
                             torch.linalg.solve(ta, torch.tensor(v)).numpy(), atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(Tensor(a).inverse().numpy(), torch.linalg.inv(ta).numpy(),
                             atol=1e-4, rtol=1e-4)
  assert linalg.det(Tensor([[1.0, 2.0], [2.0, 4.0]])).item() == 0.0
  assert Tensor([[2.0, 0.0], [0.0, 3.0]]).det().item() == pytest.approx(6.0)


def test_linalg_bad_inputs_raise_like_torch():
  for fn, tfn in ((linalg.det, torch.linalg.det), (linalg.inv, torch.linalg.inv)):
    for bad in (np.ones((2, 3), np.float32), np.ones((3,), np.float32), np.ones((2, 2), np.int64)):
      with pytest.raises(RuntimeError): tfn(torch.tensor(bad))
      with pytest.raises(RuntimeError): fn(Tensor(bad))
  with pytest.raises(RuntimeError): linalg.svd(Tensor([1.0, 2.0]))
  with pytest.raises(RuntimeError, match="Incompatible"):
    linalg.solve(Tensor(rnd(3, 3)), Tensor(rnd(2, 1)))


def test_gradients_through_det_and_svdvals():
  a = rnd(2, 2)
  for fn, tfn in ((lambda x: x.det(), torch.linalg.det),
                  (lambda x: (linalg.svdvals(x) * Tensor([2.0, 1.0])).sum(),
                   lambda x: (torch.linalg.svdvals(x) * torch.tensor([2.0, 1.0])).sum())):
    t, tt = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fn(t).backward()
    tfn(tt).backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(), dict(p=1), dict(p=3, dim=1), dict(p=math.inf, dim=0),
                                dict(p=-math.inf), dict(p=0), dict(dim=(0, 1), keepdim=True),
                                dict(p="fro", dim=-1, keepdim=True)])
def test_tensor_norm_matches_torch(kw):
  x = rnd(3, 4)
  x[0, 0] = 0.0
  np.testing.assert_allclose(Tensor(x).norm(**kw).numpy(), torch.tensor(x).norm(**kw).numpy(),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ord_", ["fro", "nuc", math.inf, -math.inf, 1, -1, 2, -2])
def test_matrix_norm_matches_torch(ord_):
  x = rnd(2, 3, 3)
  np.testing.assert_allclose(linalg.matrix_norm(Tensor(x), ord_).numpy(),
                             torch.linalg.matrix_norm(torch.tensor(x), ord_).numpy(), rtol=1e-5)


def test_norm_gradient_at_zero_and_int_input():
  t = Tensor([0.0, 0.0], requires_grad=True)
  t.norm().backward()
  assert t.grad.tolist() == [0.0, 0.0]
  with pytest.raises(RuntimeError): torch.tensor([1, 2]).norm()
  with pytest.raises(RuntimeError): Tensor([1, 2]).norm()
  assert linalg.norm(Tensor([[3.0, 4.0], [0.0, 0.0]])).item() == pytest.approx(5.0)
  np.testing.assert_allclose(linalg.norm(Tensor(rnd(3, 3)), 2).numpy().shape, ())


def test_normalize_matches_f_normalize():
  x = rnd(3, 5)
  x[1] = 0.0
  for kw in (dict(), dict(p=1.0, dim=0), dict(dim=-1, eps=1e-3)):
    np.testing.assert_allclose(Tensor(x).normalize(**kw).numpy(),
                               F.normalize(torch.tensor(x), **kw).numpy(), rtol=1e-6, atol=1e-7)


def test_newton_schulz_orthogonalizes():
  g = rnd(4, 6)
  x = Tensor(g).newton_schulz(steps=10).numpy()
  s = np.linalg.svd(x, compute_uv=False)
  assert x.shape == (4, 6) and np.all(np.abs(s - 1) < 0.35)  # Muon's quintic: singular values ~1
  assert Tensor(g, dtype=dtypes.float16).newton_schulz().dtype == dtypes.float16
