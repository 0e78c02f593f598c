"""Operators of transformer models added after opset 21: RMSNormalization, RotaryEmbedding,
Attention (opset 23), BitCast."""
from __future__ import annotations

import math
from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, dtypes, onnx_dtype, op, tensor


@op("RMSNormalization")
def rms_norm(n: Node, x: Any, scale: Any) -> Tensor:
  t = tensor(n, x)
  axis = n.attr("axis", -1)
  axis = axis + t.ndim if axis < 0 else axis
  f = t.float() if t.dtype != dtypes.float64 else t
  ms = (f * f).mean(tuple(range(axis, t.ndim)), keepdim=True)
  return (f * (ms + n.attr("epsilon", 1e-5)).sqrt().reciprocal() * tensor(n, scale)).cast(t.dtype)


@op("BitCast")
def bitcast(n: Node, x: Any) -> Tensor:
  return tensor(n, x).bitcast(onnx_dtype(n.attr("to")))


@op("RotaryEmbedding")
def rotary_embedding(n: Node, x: Any, cos: Any, sin: Any, pos: Any = None) -> Tensor:
  t = tensor(n, x)
  shape = t.shape
  if t.ndim == 4: t = t.permute(0, 2, 1, 3)
  else:
    heads = n.attr("num_heads")
    t = t.reshape(shape[0], shape[1], heads, shape[2] // heads)
  head = t.shape[3]
  rd = n.attr("rotary_embedding_dim", 0) or head
  c, s = tensor(n, cos), tensor(n, sin)
  if pos is not None:
    p = tensor(n, pos).cast(dtypes.int64)
    c, s = c[p], s[p]
  c, s = c.unsqueeze(2), s.unsqueeze(2)
  rot, keep = t[..., :rd], t[..., rd:]
  if n.attr("interleaved", 0):
    pairs = rot.reshape(*rot.shape[:3], rd // 2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
  else: x1, x2 = rot[..., :rd // 2], rot[..., rd // 2:]
  real, imag = c * x1 - s * x2, s * x1 + c * x2
  if n.attr("interleaved", 0): rot = Tensor.stack(real, imag, dim=-1).reshape(rot.shape)
  else: rot = real.cat(imag, dim=-1)
  out = rot.cat(keep, dim=-1) if keep.shape[-1] else rot
  return out.reshape(shape) if len(shape) == 3 else out.permute(0, 2, 1, 3)


def _heads(t: Tensor, heads: int) -> Tensor:
  b, s, h = t.shape
  return t.reshape(b, s, heads, h // heads).permute(0, 2, 1, 3)


@op("Attention")
def attention(n: Node, q_in: Any, k_in: Any, v_in: Any, mask: Any = None, past_k: Any = None,
              past_v: Any = None, nonpad: Any = None) -> tuple[Any, ...]:
  q, k, v = tensor(n, q_in), tensor(n, k_in), tensor(n, v_in)
  three = q.ndim == 3
  if three:
    q, k, v = _heads(q, n.attr("q_num_heads")), _heads(k, n.attr("kv_num_heads")), \
      _heads(v, n.attr("kv_num_heads"))
  if past_k is not None: k = tensor(n, past_k).cat(k, dim=2)
  if past_v is not None: v = tensor(n, past_v).cat(v, dim=2)
  present_k, present_v = k, v
  scale = n.attr("scale", None)
  scale = 1 / math.sqrt(q.shape[3]) if scale is None else scale
  groups = q.shape[1] // k.shape[1]
  kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
  vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
  sq = math.sqrt(scale)
  qk = (q * sq) @ (kk * sq).transpose(-1, -2)
  qs, ks = qk.shape[-2], qk.shape[-1]
  bias = None
  if mask is not None:
    m = tensor(n, mask)
    if m.shape[-1] < ks:
      fill = False if m.dtype == dtypes.bool else -math.inf
      m = m.pad([(0, 0)] * (m.ndim - 1) + [(0, ks - m.shape[-1])], value=fill)
    bias = m.where(0.0, -math.inf).cast(qk.dtype) if m.dtype == dtypes.bool else m.cast(qk.dtype)
  if n.attr("is_causal", 0):
    offset = ks - qs if past_k is not None else 0
    ii = Tensor.arange(qs, device=q.device).reshape(qs, 1)
    jj = Tensor.arange(ks, device=q.device).reshape(1, ks)
    causal = (jj <= ii + offset).where(0.0, -math.inf).cast(qk.dtype)
    bias = causal if bias is None else bias + causal
  if nonpad is not None:
    lens = tensor(n, nonpad).cast(dtypes.int64).reshape(-1, 1, 1, 1)
    jj = Tensor.arange(ks, device=q.device).reshape(1, 1, 1, ks)
    pad = (jj < lens).where(0.0, -math.inf).cast(qk.dtype)
    bias = pad if bias is None else bias + pad
  mode = n.attr("qk_matmul_output_mode", 0)
  scores = qk + bias if bias is not None else qk
  cap = n.attr("softcap", 0.0)
  capped = (scores / cap).tanh() * cap if cap > 0 else scores
  prec = n.attr("softmax_precision", None)
  sm_in = capped.cast(onnx_dtype(prec)) if prec else capped
  mx = sm_in.max(-1, keepdim=True)
  safe = mx.isinf().where(0.0, mx)
  e = (sm_in - safe).exp()
  total = e.sum(-1, keepdim=True)
  probs = (e / (total == 0).where(1.0, total)).cast(qk.dtype)
  y = probs @ vv
  if three: y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
  qk_out = {0: qk, 1: scores, 2: capped, 3: probs}.get(mode, qk)
  outs: list[Any] = [y, present_k, present_v, qk_out]
  return tuple(outs[:max(1, len(n.outputs))])
