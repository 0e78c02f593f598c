"""Linear algebra of Tensor: norms, QR, SVD, determinants, solve and inverse, Newton-Schulz.

Everything is built from Tensor ops over batches of matrices (..., m, n): on every device and
differentiable by the primitive rules. Each algorithm runs a number of steps fixed by the shape,
never by the data. Each step is realized on its own (a small schedule) and reads its step number
from memory, so all the steps of one shape are the same kernels, compiled and scheduled once and
then cache hits (one lazy graph of hundreds of steps schedules far slower). Realized steps keep
their autograd history (engine.with_history): gradients flow through every step, though the
backward graph, one graph of all the steps, takes seconds to schedule.
- QR: Householder reflections with LAPACK's conventions (the reflector maps a column to
  -sign(a_jj) * |x|, a column already zero below the diagonal is left alone), so Q and R are
  PyTorch's.
- SVD: a QR first (m >= n; a wide matrix is transposed), then one-sided Jacobi (Hestenes) on the
  square R: pairs of columns are rotated until orthogonal, n/2 disjoint pairs per round in the
  round-robin order of the circle method (the same column permutation after every round),
  `JACOBI_SWEEPS` sweeps of n-1 rounds. The singular values are the column norms, sorted
  descending; the left vectors are the normalized columns, completed to an orthonormal basis by a
  second QR where a singular value is zero.
- det, slogdet: the product of R's diagonal, negated per reflection applied.
- solve, inv: QR, then back substitution row by row.
Like PyTorch, integer inputs raise RuntimeError; float16 and bfloat16 compute in float32.
Singular inputs are not checked (that would read values back): solve and inv give inf or NaN.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unigrad.dtype import dtypes

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

JACOBI_SWEEPS = {dtypes.float32: 8, dtypes.float64: 12}  # sweeps of n-1 rounds (see _jacobi)
NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Newton-Schulz quintic of Muon (Jordan et al. 2024)


# ---- input checks and dtypes ----

def _matrix(a: Tensor, fn: str, square: bool = False) -> Tensor:
  """a as a float matrix batch (float32 for the 16-bit floats); PyTorch's errors otherwise."""
  if a.ndim < 2:
    raise RuntimeError(f"{fn}: The input tensor A must have at least 2 dimensions.")
  if not dtypes.is_float(a.dtype):
    raise RuntimeError(f"{fn}: Expected a floating point tensor as input. Got {a.dtype!r}")
  if square and a.shape[-1] != a.shape[-2]:
    raise RuntimeError(f"{fn}: A must be batches of square matrices, but they are "
                       f"{a.shape[-2]} by {a.shape[-1]} matrices")
  return a.float() if a.dtype in (dtypes.float16, dtypes.bfloat16) else a


def _eye(like: Tensor, n: int) -> Tensor:
  return type(like).eye(n, dtype=like.dtype, device=like.device)


# ---- Householder QR ----

def _step_index(like: Tensor, j: int) -> Tensor:
  """j as a 0-d int64 buffer: the steps of a loop read it from memory, so every step is the same
  kernels (one compile, then cache hits) instead of one set per constant j."""
  return type(like)([j], dtype=dtypes.int64, device=like.device).reshape(())


def _householder(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """(Q (..., m, m), R (..., m, n), reflections (...,) applied) with A = Q R."""
  *batch, m, n = a.shape
  cls, dev = type(a), a.device
  rows, cols = cls.arange(m, device=dev).reshape(m, 1), cls.arange(n, device=dev).reshape(1, n)
  q, r = _eye(a, m).expand(*batch, m, m), a
  flips = a.sum((-2, -1)).mul(0)
  for j in range(min(m - 1, n)):
    jt = _step_index(a, j)
    col = cols.eq(jt).where(r, 0).sum(-1, keepdim=True)
    alpha = rows.eq(jt).where(col, 0).sum(-2, keepdim=True)
    tail = (rows > jt).where(col, 0)
    tail_sq = (tail * tail).sum(-2, keepdim=True)
    active = tail_sq > 0
    norm = active.where(alpha * alpha + tail_sq, 1).sqrt()
    beta = (alpha >= 0).where(-norm, norm)
    v = tail + rows.eq(jt).where(alpha - beta, 0)
    vtv = (v * v).sum(-2, keepdim=True)
    coef = active.where(2 / active.where(vtv, 1), 0)
    r = r - (coef * v) @ (v.mT @ r)
    q = q - ((q @ v) * coef) @ v.mT
    flips = flips + active.reshape(*batch).cast(flips.dtype)
    r.realize(q, flips)  # one small schedule per step, the same every step (not `contiguous`:
    # a realized CONTIGUOUS keeps no autograd history)
  return q, r.triu(), flips


def qr(a: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:
  """torch.linalg.qr: A = Q R with Q orthonormal and R upper triangular; mode 'reduced'
  (k = min(m, n) columns of Q), 'complete' (m) or 'r' (R only; Q is empty)."""
  if mode not in ("reduced", "complete", "r"):
    raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
                       "(default), 'r', or 'complete'")
  x = _matrix(a, "linalg.qr")
  m, n = x.shape[-2:]
  q, r, _ = _householder(x)
  k = min(m, n)
  if mode == "complete": return q.cast(a.dtype), r.cast(a.dtype)
  r = r[..., :k, :].cast(a.dtype)
  if mode == "r": return type(a).empty(0, dtype=a.dtype, device=a.device), r
  return q[..., :, :k].cast(a.dtype), r


# ---- one-sided Jacobi SVD ----

def _round_robin(n: int) -> tuple[list[int], list[list[int]]]:
  """The circle method for n (even) players: the position permutation taking one round's
  layout (pairs at positions 2i, 2i+1) to the next, and every round's layout of column ids."""
  circle, layouts = list(range(n)), []
  for _ in range(n - 1):
    layouts.append([c for i in range(n // 2) for c in (circle[i], circle[n - 1 - i])])
    circle = [circle[0], circle[-1], *circle[1:-1]]
  nxt = [c for i in range(n // 2) for c in (circle[i], circle[n - 1 - i])]
  perm = [layouts[-1].index(c) for c in nxt] if n > 2 else [0, 1]
  return perm, layouts


def _permutation(like: Tensor, perm: Sequence[int]) -> Tensor:
  """The matrix P with (X @ P)[:, i] = X[:, perm[i]]."""
  n = len(perm)
  src = type(like).arange(n, device=like.device).reshape(n, 1)
  dst = type(like)(list(perm), device=like.device).reshape(1, n)
  return src.eq(dst).cast(like.dtype)


def _rotate_pairs(x: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
  """One Jacobi rotation for each column pair (2i, 2i+1) of x, orthogonalizing the pair; the
  same rotation applied to v's columns."""
  *_, m, n = x.shape
  xp = x.reshape(*x.shape[:-1], n // 2, 2)
  p, q = xp[..., 0], xp[..., 1]
  alpha, beta, gamma = (p * p).sum(-2), (q * q).sum(-2), (p * q).sum(-2)
  rotate = gamma.abs() > (alpha * beta).sqrt() * 1e-30
  zeta = (beta - alpha) / (2 * rotate.where(gamma, 1))
  big = zeta.abs() > 1e15
  zs = big.where(1, zeta)
  t = (zs >= 0).where(1.0, -1.0) / (zs.abs() + (zs * zs + 1).sqrt())
  t = rotate.where(big.where(0.5 / big.where(zeta, 1), t), 0)
  c = (t * t + 1).rsqrt()
  s = c * t

  def apply(y: Tensor) -> Tensor:
    yp = y.reshape(*y.shape[:-1], n // 2, 2)
    a, b = yp[..., 0], yp[..., 1]
    ca, sa = c.unsqueeze(-2), s.unsqueeze(-2)
    return (a * ca - b * sa).stack(a * sa + b * ca, dim=-1).reshape(y.shape)
  return apply(x), apply(v)


def _jacobi(r: Tensor) -> tuple[Tensor, Tensor]:
  """(W, V) with W = R V having orthogonal columns and V orthonormal, for a square batch R."""
  n = r.shape[-1]
  nn = n + n % 2
  x = r.pad(((0, 0),) * (r.ndim - 1) + ((0, nn - n),)) if nn != n else r
  v = _eye(r, nn)[:n].expand(*r.shape[:-2], n, nn)
  if nn == 2: perm, layouts = [0, 1], [[0, 1]]
  else: perm, layouts = _round_robin(nn)
  if nn > 2:  # the columns into the first round's layout
    first = _permutation(r, layouts[0])
    x, v = x @ first, v @ first
  step = _permutation(r, perm)
  rounds = JACOBI_SWEEPS.get(r.dtype, 12) * (nn - 1)
  for _ in range(rounds):
    x, v = _rotate_pairs(x, v)
    x, v = x @ step, v @ step
    x.realize(v)  # one small schedule per round (the same one every round: a cache hit)
  order = layouts[rounds % len(layouts)]
  back = _permutation(r, [order.index(c) for c in range(nn)])  # the columns in their first order
  return (x @ back)[..., :n], (v @ back)[..., :n]


def _complete(u: Tensor, s: Tensor) -> Tensor:
  """u's columns where s > 0, orthonormal; the others replaced and orthonormalized by a QR."""
  n = u.shape[-1]
  tiny = s.max(-1, keepdim=True) * (n * 1e-30)
  live = (s > tiny).unsqueeze(-2)
  if n == 1: return live.where(u, 1.0)
  q, r, _ = _householder(live.where(u, _eye(u, n)))
  sign = (r.diagonal(dim1=-2, dim2=-1) >= 0).where(1.0, -1.0).unsqueeze(-2)
  return q * sign


def _svd_tall(a: Tensor, full: bool) -> tuple[Tensor, Tensor, Tensor]:
  """(U, S, V) of a batch with m >= n: U (m, m) if full else (m, n), V (n, n)."""
  m, n = a.shape[-2:]
  q, r, _ = _householder(a)
  w, v = _jacobi(r[..., :n, :])
  s = (w * w).sum(-2).sqrt()
  s, idx = s.sort(-1, descending=True)
  w = w.gather(-1, idx.unsqueeze(-2).expand(w.shape))
  v = v.gather(-1, idx.unsqueeze(-2).expand(v.shape))
  u1 = _complete(w / (s > 0).where(s, 1).unsqueeze(-2), s)
  if not full or m == n: return q[..., :, :n] @ u1, s, v
  pad = ((0, 0),) * (u1.ndim - 2) + ((0, m - n), (0, m - n))
  lower = type(a).arange(m, device=a.device) >= n
  block = u1.pad(pad) + (lower.unsqueeze(-1) & lower).where(_eye(a, m), 0)
  return q @ block, s, v


def svd(a: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
  """torch.linalg.svd: (U, S, Vh) with A = U diag(S) Vh, S descending. Singular vectors are
  unique up to sign (and rotation within repeated singular values), as in every SVD."""
  x = _matrix(a, "linalg.svd")
  m, n = x.shape[-2:]
  if m >= n: u, s, v = _svd_tall(x, full_matrices)
  else:
    v, s, u = _svd_tall(x.mT, full_matrices)
  dt = a.dtype
  return u.cast(dt), s.cast(dt), v.mT.cast(dt)


def svdvals(a: Tensor) -> Tensor:
  """torch.linalg.svdvals: the singular values, descending."""
  return svd(a, full_matrices=False)[1]


# ---- determinants, solve, inverse ----

def slogdet(a: Tensor) -> tuple[Tensor, Tensor]:
  """torch.linalg.slogdet: (sign, log|det|)."""
  x = _matrix(a, "linalg.slogdet", square=True)
  _, r, flips = _householder(x)
  d = r.diagonal(dim1=-2, dim2=-1)
  negative = (d < 0).sum(-1).cast(flips.dtype) + flips
  sign = (negative % 2).eq(0).where(1.0, -1.0) * (d.ne(0).all(-1)).where(1.0, 0.0)
  return sign.cast(a.dtype), d.abs().log().sum(-1).cast(a.dtype)


def det(a: Tensor) -> Tensor:
  """torch.linalg.det: the product of R's diagonal, negated per Householder reflection."""
  x = _matrix(a, "linalg.det", square=True)
  _, r, flips = _householder(x)
  sign = (flips % 2).eq(0).where(1.0, -1.0)
  return (r.diagonal(dim1=-2, dim2=-1).prod(-1) * sign).cast(a.dtype)


def _back_substitute(r: Tensor, y: Tensor) -> Tensor:
  """X with R X = Y for upper triangular R (..., n, n) and Y (..., n, k)."""
  n = r.shape[-1]
  rows = type(r).arange(n, device=r.device).reshape(n, 1)
  x = y.mul(0)
  for i in range(n - 1, -1, -1):
    it = _step_index(r, i)
    pick = rows.eq(it)
    r_row = pick.where(r, 0).sum(-2, keepdim=True)
    r_ii = (rows.reshape(1, n).eq(it)).where(r_row, 0).sum(-1, keepdim=True)
    row = (pick.where(y, 0).sum(-2, keepdim=True) - r_row @ x) / r_ii
    x = pick.where(row, x).realize()
  return x


def solve(a: Tensor, b: Tensor, left: bool = True) -> Tensor:
  """torch.linalg.solve: X with A X = B (X A = B with left=False); B is a vector batch when it is
  1-D or has A's shape without the last axis."""
  if not left: return solve(a.mT, b.mT).mT
  x = _matrix(a, "linalg.solve", square=True)
  if not dtypes.is_float(b.dtype):
    raise RuntimeError(f"linalg.solve: Expected B to have a floating point dtype, got {b.dtype!r}")
  vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
  rhs = (b.unsqueeze(-1) if vector else b).cast(x.dtype)
  if rhs.shape[-2] != x.shape[-1]:
    raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                       f"({x.shape[-2]}x{x.shape[-1]} and {rhs.shape[-2]}x{rhs.shape[-1]})")
  q, r, _ = _householder(x)
  out = _back_substitute(r, q.mT @ rhs)
  return (out.squeeze(-1) if vector else out).cast(a.dtype)


def inv(a: Tensor) -> Tensor:
  """torch.linalg.inv: A^-1 (solve against the identity)."""
  x = _matrix(a, "linalg.inv", square=True)
  return solve(x, _eye(x, x.shape[-1]).expand(x.shape)).cast(a.dtype)


# ---- norms ----

def vector_norm(x: Tensor, ord: float = 2, dim: int | Sequence[int] | None = None,  # noqa: A002
                keepdim: bool = False, dtype: Any = None) -> Tensor:
  """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over `dim` (all axes for None); ord inf is
  max |x|, -inf min |x|, 0 the count of nonzeros. The 2-norm's gradient at 0 is 0 (PyTorch)."""
  if not dtypes.is_float(x.dtype):
    raise RuntimeError(f"linalg.vector_norm: Expected a floating point tensor as input. Got "
                       f"{x.dtype!r}")
  if isinstance(ord, str):
    raise RuntimeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
  t = x.cast(dtype) if dtype is not None else x
  axes = tuple(range(t.ndim)) if dim is None else dim
  a = t.abs()
  if ord == math.inf: return a.max(axes, keepdim=keepdim)
  if ord == -math.inf: return a.min(axes, keepdim=keepdim)
  if ord == 0: return a.ne(0).sum(axes, keepdim=keepdim).cast(a.dtype)
  if ord == 1: return a.sum(axes, keepdim=keepdim)
  if ord == 2:
    sq = (t * t).sum(axes, keepdim=keepdim)
    zero = sq.eq(0)
    return zero.where(0.0, zero.where(1.0, sq).sqrt()).cast(sq.dtype)
  return a.pow(ord).sum(axes, keepdim=keepdim).pow(1 / ord)


def matrix_norm(a: Tensor, ord: Any = "fro", dim: tuple[int, int] = (-2, -1),  # noqa: A002
                keepdim: bool = False) -> Tensor:
  """torch.linalg.matrix_norm: 'fro', 'nuc' (sum of singular values), inf / -inf (max / min
  absolute row sum), 1 / -1 (columns), 2 / -2 (largest / smallest singular value)."""
  x = _matrix(a, "linalg.matrix_norm")
  d0, d1 = (d % x.ndim for d in dim)
  if d0 == d1: raise RuntimeError(f"linalg.matrix_norm: dims must be different, got {dim}")
  if ord == "fro": return vector_norm(x, 2, (d0, d1), keepdim).cast(a.dtype)
  if ord in ("nuc", 2, -2):
    s = svdvals(x.permute(*[i for i in range(x.ndim) if i not in (d0, d1)], d0, d1))
    out = s.sum(-1) if ord == "nuc" else s[..., 0] if ord == 2 else s[..., -1]
    if keepdim: out = out.unsqueeze(min(d0, d1)).unsqueeze(max(d0, d1))
    return out.cast(a.dtype)
  if ord in (math.inf, -math.inf, 1, -1):
    sums = x.abs().sum(d1 if abs(ord) == math.inf else d0, keepdim=True)
    out = sums.max((d0, d1), keepdim=True) if ord > 0 else sums.min((d0, d1), keepdim=True)
    return (out if keepdim else out.squeeze(max(d0, d1)).squeeze(min(d0, d1))).cast(a.dtype)
  raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """F.normalize: x / max(||x||_p along dim, eps)."""
  return x / vector_norm(x, p, dim, keepdim=True).maximum(eps)


def newton_schulz(g: Tensor, steps: int = 5, coeffs: Sequence[float] = NS_COEFFS,
                  eps: float = 1e-7) -> Tensor:
  """An approximately orthogonal matrix with the row and column spaces of each matrix of `g`
  (Muon's orthogonalization): X <- a X + b (X X^T) X + c (X X^T)^2 X, from X = G / ||G||_F."""
  x = _matrix(g, "newton_schulz")
  if x.shape[-2] > x.shape[-1]: return newton_schulz(x.mT, steps, coeffs, eps).mT.cast(g.dtype)
  x = x / (vector_norm(x, 2, (-2, -1), keepdim=True) + eps)
  for _ in range(steps):
    gram = x @ x.mT
    terms = [x]
    for _c in coeffs[1:]: terms.append(gram @ terms[-1])
    x = sum((c * t for c, t in zip(coeffs[1:], terms[1:])), coeffs[0] * x).contiguous()
  return x.cast(g.dtype)


def norm(a: Tensor, ord: Any = None, dim: int | Sequence[int] | None = None,  # noqa: A002
         keepdim: bool = False, dtype: Any = None) -> Tensor:
  """torch.linalg.norm: a matrix norm for a 2-tuple `dim` (or a 2-D input with `ord`), else the
  vector norm (2 by default) over `dim` (all axes for None)."""
  x = a.cast(dtype) if dtype is not None else a
  matrix = (dim is not None and not isinstance(dim, int) and len(dim) == 2) or \
    (dim is None and ord is not None and x.ndim == 2)
  if matrix:
    return matrix_norm(x, "fro" if ord is None else ord, tuple(dim or (-2, -1)), keepdim)
  if isinstance(ord, str): raise RuntimeError(f"linalg.norm: ord {ord!r} needs a 2-D input or dim")
  return vector_norm(x, 2 if ord is None else ord, dim, keepdim)


class LinalgMixin:
  """norm, normalize, qr, svd, det, slogdet, inverse, newton_schulz (the functions above)."""

  def norm(self, p: Any = "fro", dim: int | Sequence[int] | None = None, keepdim: bool = False,
           dtype: Any = None) -> Tensor:
    """torch.Tensor.norm: 'fro' (and any number p) is the vector p-norm over `dim` (all axes for
    None; a 2-tuple too), 'nuc' the nuclear norm of the matrices on `dim` (the last two axes for
    None). `Tensor([3.0, 4.0]).norm()` is `5.0`."""
    x: Tensor = self  # type: ignore[assignment]
    if dtype is not None: x = x.cast(dtype)
    if p == "nuc":
      if isinstance(dim, int): raise RuntimeError("norm: 'nuc' needs two dims, got one")
      d0, d1 = (-2, -1) if dim is None else dim
      return matrix_norm(x, "nuc", (d0, d1), keepdim)
    if isinstance(p, str) and p != "fro": raise RuntimeError(f"norm: unknown p {p!r}")
    return vector_norm(x, 2 if p == "fro" else p, dim, keepdim)

  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """F.normalize: self / max(||self||_p along dim, eps)."""
    return normalize(self, p, dim, eps)  # type: ignore[arg-type]

  def qr(self, some: bool = True, mode: str | None = None) -> tuple[Tensor, Tensor]:
    """torch.Tensor.qr (`some=False` is the complete Q), or torch.linalg.qr's `mode`."""
    return qr(self, mode or ("reduced" if some else "complete"))  # type: ignore[arg-type]

  def svd(self, some: bool = True, compute_uv: bool = True,
          full_matrices: bool | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """torch.Tensor.svd: (U, S, V) with A = U diag(S) V^T (reduced unless some=False; U and V
    zero without compute_uv). Given `full_matrices` (torch.linalg.svd's and tinygrad's keyword)
    it returns torch.linalg.svd's (U, S, Vh) instead."""
    x: Tensor = self  # type: ignore[assignment]
    if full_matrices is not None: return svd(x, full_matrices)
    u, s, vh = svd(x, not some)
    if not compute_uv: return u.zeros_like(), s, vh.mT.zeros_like()
    return u, s, vh.mT

  def det(self) -> Tensor:
    """torch.linalg.det of each square matrix."""
    return det(self)  # type: ignore[arg-type]

  def slogdet(self) -> tuple[Tensor, Tensor]:
    """torch.linalg.slogdet: (sign, log|det|)."""
    return slogdet(self)  # type: ignore[arg-type]

  def inverse(self) -> Tensor:
    """torch.Tensor.inverse (torch.linalg.inv)."""
    return inv(self)  # type: ignore[arg-type]

  def newton_schulz(self, steps: int = 5, params: Sequence[float] = NS_COEFFS,
                    eps: float = 1e-7) -> Tensor:
    """Muon's Newton-Schulz orthogonalization of each matrix (`params` are the polynomial's
    coefficients a, b, c, ...)."""
    return newton_schulz(self, steps, params, eps)  # type: ignore[arg-type]
