"""Neural-network operators: convolutions, pooling, normalizations, MatMul/Gemm/Einsum,
Dropout."""
from __future__ import annotations

import math
from typing import Any

from unigrad.frontend.nnops import pool
from unigrad.onnx.ops.registry import Node, Tensor, check, dtypes, np, op, scalar, tensor

Pads = list[tuple[int, int]]


def _spatial(n: Node, name: str, k: int, default: int) -> list[int]:
  v = n.attr(name, None)
  return list(v) if v else [default] * k


def conv_pads(n: Node, ins: tuple[int, ...], ks: list[int], ss: list[int],
              ds: list[int]) -> Pads:
  """(begin, end) padding per spatial axis from `pads` or `auto_pad`."""
  auto = n.attr("auto_pad", "NOTSET")
  if auto in ("SAME_UPPER", "SAME_LOWER"):
    out = []
    for i, k, s, d in zip(ins, ks, ss, ds):
      total = max(0, (math.ceil(i / s) - 1) * s + (k - 1) * d + 1 - i)
      small = total // 2
      out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out
  if auto == "VALID": return [(0, 0)] * len(ins)
  p = n.attr("pads", None) or [0] * (2 * len(ins))
  return [(p[j], p[j + len(ins)]) for j in range(len(ins))]


@check("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger", "QLinearConv")
def check_auto_pad(n: Node) -> str | None:
  auto = n.attr("auto_pad", "NOTSET")
  ok = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
  return None if auto in ok else f"auto_pad {auto!r} is not one of {list(ok)}"


def _pad_spatial(t: Tensor, pads: Pads, value: float = 0.0) -> Tensor:
  if all(p == (0, 0) for p in pads): return t
  return t.pad([(0, 0)] * (t.ndim - len(pads)) + list(pads), value=value)


def conv(n: Node, t: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
  k = w.ndim - 2
  ks = list(n.attr("kernel_shape", None) or w.shape[2:])
  ss, ds = _spatial(n, "strides", k, 1), _spatial(n, "dilations", k, 1)
  pads = conv_pads(n, tuple(t.shape[2:]), ks, ss, ds)
  # conv2d's own padding (PyTorch's flat form, last axis first): it pads the input into a buffer
  # of its own, read without bounds checks (padded here, the kernel gated every load: nudenet's
  # kernels summed 34 ms a call at batch 1, 203-322 at batch 8; 28 and 177-185 so)
  flat = [p for before_after in reversed(pads) for p in before_after]
  return t.conv2d(w, b, groups=n.attr("group", 1), stride=ss, dilation=ds, padding=flat)


@op("Conv")
def conv_op(n: Node, x: Any, w: Any, b: Any = None) -> Tensor:
  return conv(n, tensor(n, x), tensor(n, w), tensor(n, b) if b is not None else None)


@op("ConvTranspose")
def conv_transpose(n: Node, x: Any, w_in: Any, b: Any = None) -> Tensor:
  t, w = tensor(n, x), tensor(n, w_in)
  k = w.ndim - 2
  ins, ks = t.shape[2:], list(n.attr("kernel_shape", None) or w.shape[2:])
  ss, ds = _spatial(n, "strides", k, 1), _spatial(n, "dilations", k, 1)
  ops = _spatial(n, "output_padding", k, 0)
  full = [s * (i - 1) + (kk - 1) * d + 1 for i, s, kk, d in zip(ins, ss, ks, ds)]
  auto, shape = n.attr("auto_pad", "NOTSET"), n.attr("output_shape", None)
  if shape is None and auto in ("SAME_UPPER", "SAME_LOWER"): shape = [i * s for i, s in
                                                                     zip(ins, ss)]
  if shape is not None:
    shape = list(shape)[-k:]
    pads = []
    for f, o, op_ in zip(full, shape, ops):
      total = f + op_ - o
      pads.append((total // 2, total - total // 2) if auto == "SAME_UPPER" else
                  (total - total // 2, total // 2))
  else: pads = conv_pads(n, tuple(ins), ks, ss, ds) if auto != "NOTSET" else \
    [(p[0], p[1]) for p in _explicit(n, k)]
  out = t.conv_transpose2d(w, None, groups=n.attr("group", 1), stride=ss, dilation=ds)
  out = out.pad([(0, 0), (0, 0)] + [(-pb, op_ - pe) for (pb, pe), op_ in zip(pads, ops)])
  if b is not None: out = out + tensor(n, b).reshape(1, -1, *[1] * k)
  return out


def _explicit(n: Node, k: int) -> Pads:
  p = n.attr("pads", None) or [0] * (2 * k)
  return [(p[j], p[j + k]) for j in range(k)]


def _pool_geometry(n: Node, t: Tensor) -> tuple[list[int], list[int], list[int], Pads,
                                                list[int]]:
  """kernel, strides, dilations, (begin, end + extra) pads, output sizes of a pooling node."""
  ks = list(n.attr("kernel_shape"))
  k = len(ks)
  ss, ds = _spatial(n, "strides", k, 1), _spatial(n, "dilations", k, 1)
  ins = tuple(t.shape[2:])
  pads = conv_pads(n, ins, ks, ss, ds)
  ceil = bool(n.attr("ceil_mode", 0))
  outs, geo = [], []
  for i, kk, s, d, (b, e) in zip(ins, ks, ss, ds, pads):
    span = i + b + e - d * (kk - 1) - 1
    if n.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"): o = math.ceil(i / s)
    else:
      o = (span + (s - 1 if ceil else 0)) // s + 1
      if ceil and (o - 1) * s >= i + b: o -= 1
    need = (o - 1) * s + d * (kk - 1) + 1
    outs.append(o)
    geo.append((b, need - i - b))
  return ks, ss, ds, geo, outs


@op("MaxPool")
def max_pool(n: Node, x: Any) -> Any:
  t = tensor(n, x)
  ks, ss, ds, geo, outs = _pool_geometry(n, t)
  k = len(ks)
  low = -math.inf if dtypes.is_float(t.dtype) else t.dtype.min
  win = pool(_pad_spatial(t, geo, low), ks, ss, ds)
  axes = tuple(range(-k, 0))
  values = win.max(axes)
  if len(n.outputs) < 2 or not n.outputs[1]: return values
  spatial = t.shape[2:]
  flat = np.arange(math.prod(spatial), dtype=np.int64)
  flat = flat.reshape(spatial[::-1]).transpose() if n.attr("storage_order", 0) else \
    flat.reshape(spatial)
  idx = Tensor(np.ascontiguousarray(flat), device=t.device)
  iwin = pool(_pad_spatial(idx, geo, -1), ks, ss, ds)
  big = math.prod(spatial)
  hit = win == values.reshape(*values.shape, *[1] * k)
  first = (hit & (iwin >= 0)).where(iwin, big).min(axes)
  N, C = t.shape[:2]
  base = Tensor.arange(N * C, device=t.device).reshape(N, C, *[1] * k) * big
  return values, (first + base).cast(dtypes.int64)


def _window_counts(ins: tuple[int, ...], geo: Pads, pads: Pads, ks: list[int], ss: list[int],
                   ds: list[int], outs: list[int], include_pad: bool) -> np.ndarray:
  """How many window elements lie inside the input (and its explicit padding if counted)."""
  per_axis = []
  for i, (gb, _), (pb, pe), kk, s, d, o in zip(ins, geo, pads, ks, ss, ds, outs):
    lo, hi = (-pb, i + pe) if include_pad else (0, i)
    starts = np.arange(o) * s - gb
    pos = starts[:, None] + np.arange(kk)[None, :] * d
    per_axis.append(((pos >= lo) & (pos < hi)).sum(1))
  out = per_axis[0].astype(np.float64)
  for c in per_axis[1:]: out = out[..., None] * c
  return out


@op("AveragePool")
def average_pool(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  ks, ss, ds, geo, outs = _pool_geometry(n, t)
  k = len(ks)
  sums = pool(_pad_spatial(t, geo), ks, ss, ds).sum(tuple(range(-k, 0)))
  pads = conv_pads(n, tuple(t.shape[2:]), ks, ss, ds)
  include = bool(n.attr("count_include_pad", 0))
  counts = _window_counts(tuple(t.shape[2:]), geo, pads, ks, ss, ds, outs, include)
  return sums / Tensor(counts.astype(np.float32), device=t.device).cast(t.dtype)


@op("LpPool")
def lp_pool(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  ks, ss, ds, geo, _ = _pool_geometry(n, t)
  p = n.attr("p", 2)
  win = pool(_pad_spatial(t.abs(), geo), ks, ss, ds)
  return (win ** p).sum(tuple(range(-len(ks), 0))) ** (1 / p)


@op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  axes = tuple(range(2, t.ndim))
  if n.op_type == "GlobalAveragePool": return t.mean(axes, keepdim=True)
  if n.op_type == "GlobalMaxPool": return t.max(axes, keepdim=True)
  p = n.attr("p", 2)
  return (t.abs() ** p).sum(axes, keepdim=True) ** (1 / p)


def _channel(v: Tensor, ndim: int) -> Tensor:
  return v.reshape(1, -1, *[1] * (ndim - 2))


@op("BatchNormalization")
def batch_norm(n: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
  t, sc, bi = tensor(n, x), tensor(n, scale), tensor(n, bias)
  m, v = tensor(n, mean), tensor(n, var)
  eps = n.attr("epsilon", 1e-5)
  if n.attr("training_mode", 0):
    axes = tuple(a for a in range(t.ndim) if a != 1)
    bm, bv = t.mean(axes), t.var(axes, correction=0)
    mom = n.attr("momentum", 0.9)
    y = (t - _channel(bm, t.ndim)) / (_channel(bv, t.ndim) + eps).sqrt()
    y = y * _channel(sc, t.ndim) + _channel(bi, t.ndim)
    return y, m * mom + bm * (1 - mom), v * mom + bv * (1 - mom)
  y = (t - _channel(m, t.ndim)) * (_channel(v, t.ndim) + eps).rsqrt()
  return y * _channel(sc, t.ndim) + _channel(bi, t.ndim)


@op("InstanceNormalization")
def instance_norm(n: Node, x: Any, scale: Any, bias: Any) -> Tensor:
  t = tensor(n, x)
  axes = tuple(range(2, t.ndim))
  mean = t.mean(axes, keepdim=True)
  var = ((t - mean) ** 2).mean(axes, keepdim=True)
  y = (t - mean) / (var + n.attr("epsilon", 1e-5)).sqrt()
  return y * _channel(tensor(n, scale), t.ndim) + _channel(tensor(n, bias), t.ndim)


@op("LayerNormalization")
def layer_norm(n: Node, x: Any, scale: Any, bias: Any = None) -> tuple[Tensor, ...]:
  t = tensor(n, x)
  axis = n.attr("axis", -1)
  axis = axis + t.ndim if axis < 0 else axis
  axes = tuple(range(axis, t.ndim))
  f = t.float() if n.attr("stash_type", 1) == 1 and t.dtype != dtypes.float64 else t
  mean = f.mean(axes, keepdim=True)
  var = ((f - mean) ** 2).mean(axes, keepdim=True)
  inv = (var + n.attr("epsilon", 1e-5)).rsqrt()
  y = ((f - mean) * inv).cast(t.dtype) * tensor(n, scale)
  if bias is not None: y = y + tensor(n, bias)
  return y, mean, inv


@op("GroupNormalization")
def group_norm(n: Node, x: Any, scale: Any, bias: Any) -> Tensor:
  t = tensor(n, x)
  g, (N, C) = n.attr("num_groups"), t.shape[:2]
  f = t.float() if n.attr("stash_type", 1) == 1 else t
  grouped = f.reshape(N, g, -1)
  mean = grouped.mean(-1, keepdim=True)
  var = ((grouped - mean) ** 2).mean(-1, keepdim=True)
  y = ((grouped - mean) / (var + n.attr("epsilon", 1e-5)).sqrt()).reshape(t.shape).cast(t.dtype)
  sc, bi = tensor(n, scale), tensor(n, bias)
  if sc.shape[0] != C:  # opset 18: one scale per group
    sc = sc.reshape(g, 1).expand(g, C // g).reshape(C)
    bi = bi.reshape(g, 1).expand(g, C // g).reshape(C)
  return y * _channel(sc, t.ndim) + _channel(bi, t.ndim)


@op("LRN")
def lrn(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  size = n.attr("size")
  alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
  before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
  sq = (t * t).pad([(0, 0), (before, after)] + [(0, 0)] * (t.ndim - 2))
  moved = sq.permute(0, *range(2, t.ndim), 1)
  sums = pool(moved, [size], [1], [1]).sum(-1)
  sums = sums.permute(0, t.ndim - 1, *range(1, t.ndim - 1))
  return t / (bias + alpha / size * sums) ** beta


@op("MatMul")
def matmul(n: Node, a: Any, b: Any) -> Tensor: return tensor(n, a) @ tensor(n, b)


@op("Gemm")
def gemm(n: Node, a: Any, b: Any, c: Any = None) -> Tensor:
  x, y = tensor(n, a), tensor(n, b)
  if n.attr("transA", 0): x = x.T
  if n.attr("transB", 0): y = y.T
  out = x @ y
  alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
  if alpha != 1.0: out = out * alpha
  if c is not None: out = out + (tensor(n, c) * beta if beta != 1.0 else tensor(n, c))
  return out


@op("Einsum")
def einsum(n: Node, *xs: Any) -> Tensor:
  return Tensor.einsum(n.attr("equation"), *[tensor(n, x) for x in xs])


@op("Dropout")
def dropout(n: Node, x: Any, ratio: Any = None, training: Any = None) -> Any:
  t = tensor(n, x)
  rate = float(scalar(n, ratio, "ratio")) if ratio is not None else n.attr("ratio", 0.5)
  if training is not None and bool(scalar(n, training, "training_mode")) and rate > 0:
    raise n.error("training_mode=True with a ratio above 0 (random dropout) is not supported")
  if len(n.outputs) > 1 and n.outputs[1]:
    return t, Tensor.ones(*t.shape, dtype=dtypes.bool, device=t.device)
  return t
