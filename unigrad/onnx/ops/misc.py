"""Losses, NonMaxSuppression, GridSample, window functions and other less common operators."""
from __future__ import annotations

import math
from typing import Any

from unigrad.onnx.ops.registry import (Node, Tensor, dtypes, np, onnx_dtype, op, scalar, tensor,
                                       value_of)


def _nll(n: Node, logp: Tensor, target: Any, weight: Any) -> Tensor:
  tgt = tensor(n, target).cast(dtypes.int64)
  ignore = n.attr("ignore_index", None)
  keep = (tgt != ignore) if ignore is not None else None
  safe = keep.where(tgt, 0) if keep is not None else tgt
  picked = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
  w = tensor(n, weight)[safe] if weight is not None else None
  if keep is not None:
    w = keep.where(w if w is not None else 1.0, 0.0).cast(logp.dtype)
  loss = picked * w if w is not None else picked
  red = n.attr("reduction", "mean")
  if red == "none": return loss
  if red == "sum": return loss.sum()
  if w is None: return loss.mean()
  return loss.sum() / w.sum()


@op("NegativeLogLikelihoodLoss")
def nll_loss(n: Node, x: Any, target: Any, weight: Any = None) -> Tensor:
  return _nll(n, tensor(n, x), target, weight)


@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(n: Node, x: Any, labels: Any, weight: Any = None) -> Any:
  logp = tensor(n, x).log_softmax(1)
  loss = _nll(n, logp, labels, weight)
  return (loss, logp) if len(n.outputs) > 1 and n.outputs[1] else loss


def _iou(a: np.ndarray, b: np.ndarray) -> float:
  ya1, xa1, ya2, xa2 = min(a[0], a[2]), min(a[1], a[3]), max(a[0], a[2]), max(a[1], a[3])
  yb1, xb1, yb2, xb2 = min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3])
  ih = max(0.0, min(ya2, yb2) - max(ya1, yb1))
  iw = max(0.0, min(xa2, xb2) - max(xa1, xb1))
  inter = ih * iw
  union = (ya2 - ya1) * (xa2 - xa1) + (yb2 - yb1) * (xb2 - xb1) - inter
  return inter / union if union > 0 else 0.0


@op("NonMaxSuppression")
def non_max_suppression(n: Node, boxes: Any, scores: Any, max_out: Any = None, iou: Any = None,
                        score_th: Any = None) -> np.ndarray:
  """Greedy NMS per batch and class on the host (the output's length depends on the values)."""
  b, s = value_of(n, boxes, "boxes"), value_of(n, scores, "scores")
  limit = int(scalar(n, max_out, "max_output_boxes_per_class")) if max_out is not None else 0
  th = float(scalar(n, iou, "iou_threshold")) if iou is not None else 0.0
  sth = float(scalar(n, score_th, "score_threshold")) if score_th is not None else -math.inf
  if n.attr("center_point_box", 0):
    xc, yc, w, h = (b[..., k] for k in range(4))
    b = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
  out = []
  for bi in range(s.shape[0]):
    for ci in range(s.shape[1]):
      order = [int(i) for i in np.argsort(-s[bi, ci], kind="stable") if s[bi, ci, i] > sth]
      kept: list[int] = []
      for i in order:
        if len(kept) >= limit: break
        if all(_iou(b[bi, i], b[bi, k]) <= th for k in kept): kept.append(i)
      out.extend([bi, ci, k] for k in kept)
  return np.array(out, dtype=np.int64).reshape(-1, 3)


def _window(n: Node, size: Any, coeffs: tuple[float, ...]) -> np.ndarray:
  m = int(scalar(n, size, "size"))
  periodic = bool(n.attr("periodic", 1))
  denom = m if periodic else m - 1
  k = np.arange(m, dtype=np.float64)
  w = sum(c * (-1) ** j * np.cos(2 * math.pi * j * k / denom) for j, c in enumerate(coeffs))
  from unigrad.onnx.convert import numpy_dtype_of  # noqa: PLC0415 (one caller)
  return np.asarray(w).astype(numpy_dtype_of(onnx_dtype(n.attr("output_datatype", 1))))


@op("HannWindow")
def hann(n: Node, size: Any) -> np.ndarray: return _window(n, size, (0.5, 0.5))


@op("HammingWindow")
def hamming(n: Node, size: Any) -> np.ndarray: return _window(n, size, (25 / 46, 21 / 46))


@op("BlackmanWindow")
def blackman(n: Node, size: Any) -> np.ndarray: return _window(n, size, (0.42, 0.5, 0.08))


def _unnormalize(c: Tensor, size: int, align: bool) -> Tensor:
  return (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
  span = hi - lo
  if span <= 0: return x * 0 + lo
  d = (x - lo).abs()
  flips = (d / span).floor()
  extra = d - flips * span
  return (flips.mod(2) == 0).where(lo + extra, hi - extra)


def _cubic_coeffs(t: Tensor) -> list[Tensor]:
  a = -0.75
  def near(x: Tensor) -> Tensor: return ((a + 2) * x - (a + 3)) * x * x + 1
  def far(x: Tensor) -> Tensor: return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
  return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@op("GridSample")
def grid_sample(n: Node, x: Any, grid: Any) -> Tensor:
  """Sampling at grid points (2-D and 3-D): gathers from the flattened spatial axes."""
  t, g = tensor(n, x), tensor(n, grid)
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(n.attr("mode", "linear"),
                                                         n.attr("mode", "linear"))
  pad, align = n.attr("padding_mode", "zeros"), bool(n.attr("align_corners", 0))
  N, C, *ins = t.shape
  k = len(ins)
  outs = g.shape[1:-1]
  coords = [_unnormalize(g[..., k - 1 - j], ins[j], align) for j in range(k)]  # per axis
  if pad == "border": coords = [c.clamp(0, i - 1) for c, i in zip(coords, ins)]
  elif pad == "reflection":
    coords = [_reflect(c, 0, i - 1) if align else _reflect(c, -0.5, i - 0.5).clamp(0, i - 1)
              for c, i in zip(coords, ins)]
  flat = t.reshape(N, C, -1)
  m = math.prod(outs)

  def sample(idx: list[Tensor]) -> Tensor:
    valid = None
    lin = None
    for j, (ix, size) in enumerate(zip(idx, ins)):
      ok = (ix >= 0) & (ix < size)
      valid = ok if valid is None else valid & ok
      c = ix.clamp(0, size - 1)
      lin = c * math.prod(ins[j + 1:]) if lin is None else lin + c * math.prod(ins[j + 1:])
    assert lin is not None and valid is not None
    li = lin.cast(dtypes.int64).reshape(N, 1, m).expand(N, C, m)
    vals = flat.gather(2, li)
    return valid.reshape(N, 1, m).where(vals, 0)

  if mode == "nearest":
    r = sample([c.round_half_even() for c in coords])
  else:
    base = [c.floor() for c in coords]
    frac = [c - b for c, b in zip(coords, base)]
    taps = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
    weights = [[(1 - f) if tap == 0 else f for tap in taps] if mode == "linear" else
               _cubic_coeffs(f) for f in frac]
    r = None
    for combo in np.ndindex(*([len(taps)] * k)):
      idx = [b + taps[c] for b, c in zip(base, combo)]
      if pad == "border" and mode == "cubic": idx = [i.clamp(0, s - 1) for i, s in zip(idx, ins)]
      w = None
      for j, c in enumerate(combo): w = weights[j][c] if w is None else w * weights[j][c]
      assert w is not None
      term = sample(idx) * w.reshape(N, 1, m)
      r = term if r is None else r + term
    assert r is not None
  return r.reshape(N, C, *outs).cast(t.dtype)


@op("AffineGrid")
def affine_grid(n: Node, theta: Any, size: Any) -> Tensor:
  th = tensor(n, theta)
  dims = [int(v) for v in value_of(n, size, "size").reshape(-1)]
  N, spatial = dims[0], dims[2:]
  align = bool(n.attr("align_corners", 0))
  axes = []
  for s in spatial[::-1]:  # x first
    if align: v = np.linspace(-1, 1, s) if s > 1 else np.zeros(1)
    else: v = (np.arange(s) * 2 + 1) / s - 1
    axes.append(v)
  mesh = np.meshgrid(*axes[::-1], indexing="ij")[::-1]
  base = np.stack([*mesh, np.ones_like(mesh[0])], -1).reshape(-1, len(spatial) + 1)
  b = Tensor(base.astype(np.float32), device=th.device).cast(th.dtype)
  out = b @ th.transpose(1, 2)  # (N, points, k)
  return out.reshape(N, *spatial, len(spatial))


@op("Col2Im")
def col2im(n: Node, x: Any, image_shape: Any, block_shape: Any) -> Tensor:
  t = tensor(n, x)
  img = [int(v) for v in value_of(n, image_shape, "image_shape").reshape(-1)]
  blk = [int(v) for v in value_of(n, block_shape, "block_shape").reshape(-1)]
  k = len(img)
  ds = n.attr("dilations", None) or [1] * k
  ss = n.attr("strides", None) or [1] * k
  ps = n.attr("pads", None) or [0] * (2 * k)
  N, CK, L = t.shape
  C = CK // math.prod(blk)
  padded = [i + ps[j] + ps[j + k] for j, i in enumerate(img)]
  outs = [(p - d * (b - 1) - 1) // s + 1 for p, d, b, s in zip(padded, ds, blk, ss)]
  # the flat padded-image position of every (block element, window) pair, on the host
  pos = np.zeros((math.prod(blk), L), dtype=np.int64)
  for bi, b in enumerate(np.ndindex(*blk)):
    for li, o in enumerate(np.ndindex(*outs)):
      p = [oo * s + bb * d for oo, s, bb, d in zip(o, ss, b, ds)]
      pos[bi, li] = np.ravel_multi_index(p, padded)
  idx = Tensor(pos.reshape(1, 1, -1), device=t.device).expand(N, C, pos.size)
  src = t.reshape(N, C, -1)
  out = Tensor.zeros(N, C, math.prod(padded), dtype=t.dtype, device=t.device)
  out = out.scatter_reduce(2, idx, src, "sum", include_self=True).reshape(N, C, *padded)
  return out.shrink([None, None, *[(ps[j], ps[j] + img[j]) for j in range(k)]])


@op("MaxUnpool")
def max_unpool(n: Node, x: Any, indices: Any, output_shape: Any = None) -> Tensor:
  t, idx = tensor(n, x), tensor(n, indices).cast(dtypes.int64)
  ks = n.attr("kernel_shape")
  k = len(ks)
  ss = n.attr("strides", None) or [1] * k
  ps = n.attr("pads", None) or [0] * (2 * k)
  shape = list(t.shape[:2]) + [(i - 1) * s - ps[j] - ps[j + k] + kk for j, (i, s, kk) in
                               enumerate(zip(t.shape[2:], ss, ks))]
  out = Tensor.zeros(math.prod(shape), dtype=t.dtype, device=t.device)
  out = out.scatter(0, idx.reshape(-1), t.reshape(-1)).reshape(*shape)
  if output_shape is None: return out
  # the indices address the default output; a larger output_shape pads after it
  # (contiguous: a pad straight over the scatter reads past its buffer, test_scatter.py's xfail)
  want = [int(v) for v in value_of(n, output_shape, "output_shape").reshape(-1)]
  return out.contiguous().pad([(0, w - h) for w, h in zip(want, shape)])


@op("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike")
def random(n: Node, x: Any = None) -> Tensor:
  shape = tuple(x.shape) if x is not None else tuple(n.attr("shape"))
  dt = onnx_dtype(n.attr("dtype")) if "dtype" in n.attrs else \
    (x.dtype if x is not None else dtypes.float32)
  if "seed" in n.attrs: Tensor.manual_seed(int(n.attr("seed")))
  if n.op_type.startswith("RandomNormal"):
    return Tensor.randn(*shape, device=n.device) * n.attr("scale", 1.0) + n.attr("mean", 0.0)
  lo, hi = n.attr("low", 0.0), n.attr("high", 1.0)
  return (Tensor.rand(*shape, device=n.device) * (hi - lo) + lo).cast(dt)
