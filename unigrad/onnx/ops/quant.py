"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, MatMulInteger, ConvInteger. Integer products accumulate in int32."""
from __future__ import annotations

from typing import Any

from unigrad.onnx.ops.nn import conv
from unigrad.onnx.ops.shape import cast_fp8
from unigrad.onnx.ops.registry import Node, Tensor, axis_of, dtypes, onnx_dtype, op, tensor


def _per_axis(n: Node, v: Tensor, x: Tensor) -> Tensor:
  """A scale or zero point broadcast against x: a scalar, per `axis`, or blocked."""
  if v.ndim == 0 or v.numel() == 1 and n.attr("block_size", 0) == 0: return v.reshape(())
  axis = axis_of(n.attr("axis", 1), x.ndim)
  block = n.attr("block_size", 0)
  if block:
    v = v.repeat_interleave(block, dim=axis)
    return v.shrink([(0, s) for s in x.shape])
  return v.reshape(*[x.shape[axis] if k == axis else 1 for k in range(x.ndim)])


def _saturate(v: Tensor, dt: Any) -> Tensor:
  return v.clamp(dt.min, dt.max).cast(dt)


@op("QuantizeLinear")
def quantize_linear(n: Node, x: Any, scale: Any, zp: Any = None) -> Tensor:
  t, s = tensor(n, x), tensor(n, scale)
  if "output_dtype" in n.attrs and n.attr("output_dtype"): dt = onnx_dtype(n.attr("output_dtype"))
  elif zp is not None: dt = tensor(n, zp).dtype
  else: dt = dtypes.uint8
  y = t.float() / _per_axis(n, s, t).float()
  if dtypes.is_fp8(dt): return cast_fp8(y, dt, bool(n.attr("saturate", 1)))
  y = y.round_half_even()
  if zp is not None: y = y + _per_axis(n, tensor(n, zp), t).float()
  return _saturate(y, dt)


@op("DequantizeLinear")
def dequantize_linear(n: Node, x: Any, scale: Any, zp: Any = None) -> Tensor:
  t, s = tensor(n, x), tensor(n, scale)
  v = t.float()
  if zp is not None: v = v - _per_axis(n, tensor(n, zp), t).float()
  return (v * _per_axis(n, s, t).float()).cast(s.dtype)


@op("DynamicQuantizeLinear")
def dynamic_quantize_linear(n: Node, x: Any) -> tuple[Tensor, Tensor, Tensor]:
  t = tensor(n, x).float()
  lo, hi = t.min().minimum(0), t.max().maximum(0)
  scale = (hi - lo) / 255
  zp = _saturate((-lo / scale).round_half_even(), dtypes.uint8)
  y = _saturate((t / scale).round_half_even() + zp.float(), dtypes.uint8)
  return y, scale, zp


def _centered(n: Node, v: Any, zp: Any, x: Tensor | None = None) -> Tensor:
  t = tensor(n, v).cast(dtypes.int32)
  if zp is None: return t
  z = tensor(n, zp).cast(dtypes.int32)
  if z.numel() > 1 and x is not None: return t - z.reshape(-1, *[1] * (t.ndim - 1))
  if z.numel() > 1 and t.ndim >= 2: return t - z.reshape(*[1] * (t.ndim - 1), -1) \
    if z.shape[-1] == t.shape[-1] else t - z.reshape(-1, 1)
  return t - z.reshape(())


@op("MatMulInteger")
def matmul_integer(n: Node, a: Any, b: Any, azp: Any = None, bzp: Any = None) -> Tensor:
  x = tensor(n, a).cast(dtypes.int32)
  if azp is not None:
    z = tensor(n, azp).cast(dtypes.int32)
    x = x - (z.reshape(-1, 1) if z.numel() > 1 else z.reshape(()))
  y = tensor(n, b).cast(dtypes.int32)
  if bzp is not None:
    z = tensor(n, bzp).cast(dtypes.int32)
    y = y - (z.reshape(1, -1) if z.numel() > 1 else z.reshape(()))
  return x @ y


@op("ConvInteger")
def conv_integer(n: Node, x: Any, w: Any, xzp: Any = None, wzp: Any = None) -> Tensor:
  xt = tensor(n, x).cast(dtypes.int32)
  if xzp is not None: xt = xt - tensor(n, xzp).cast(dtypes.int32).reshape(())
  wt = tensor(n, w).cast(dtypes.int32)
  if wzp is not None:
    z = tensor(n, wzp).cast(dtypes.int32)
    wt = wt - (z.reshape(-1, *[1] * (wt.ndim - 1)) if z.numel() > 1 else z.reshape(()))
  return conv(n, xt, wt, None)


def _requantize(acc: Tensor, mult: Tensor, zp: Any, n: Node, like: Tensor) -> Tensor:
  y = (acc.float() * mult).round_half_even()
  dt = tensor(n, zp).dtype if zp is not None else dtypes.uint8
  if zp is not None: y = y + tensor(n, zp).float().reshape(())
  return _saturate(y, dt)


@op("QLinearMatMul")
def qlinear_matmul(n: Node, a: Any, a_s: Any, a_zp: Any, b: Any, b_s: Any, b_zp: Any, y_s: Any,
                   y_zp: Any) -> Tensor:
  acc = matmul_integer(n, a, b, a_zp, b_zp)
  sa, sb, sy = (tensor(n, v).float() for v in (a_s, b_s, y_s))
  mult = sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(())
  mult = mult * (sb.reshape(1, -1) if sb.numel() > 1 else sb.reshape(())) / sy.reshape(())
  return _requantize(acc, mult, y_zp, n, acc)


@op("QLinearConv")
def qlinear_conv(n: Node, x: Any, x_s: Any, x_zp: Any, w: Any, w_s: Any, w_zp: Any, y_s: Any,
                 y_zp: Any, b: Any = None) -> Tensor:
  acc = conv_integer(n, x, w, x_zp, w_zp)
  if b is not None: acc = acc + tensor(n, b).cast(dtypes.int32).reshape(1, -1,
                                                                        *[1] * (acc.ndim - 2))
  sx, sw, sy = (tensor(n, v).float() for v in (x_s, w_s, y_s))
  sw = sw.reshape(1, -1, *[1] * (acc.ndim - 2)) if sw.numel() > 1 else sw.reshape(())
  return _requantize(acc, sx.reshape(()) * sw / sy.reshape(()), y_zp, n, acc)


__all__ = ["Tensor"]
