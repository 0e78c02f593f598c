"""Reductions, arg-reductions, scans, softmax family, TopK and normalizations over axes."""
from __future__ import annotations

import math
from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, dtypes, ints, op, scalar, tensor


def _axes(n: Node, t: Tensor, axes_in: Any) -> tuple[int, ...] | None:
  """The reduced axes (canonical); None: reduce nothing (noop_with_empty_axes)."""
  if n.op_type != "ReduceSum" and n.opset < 18 or n.op_type == "ReduceSum" and n.opset < 13:
    axes = n.attr("axes", None)
  else: axes = ints(n, axes_in, "axes") if axes_in is not None else None
  if not axes:
    if n.attr("noop_with_empty_axes", 0): return None
    return tuple(range(t.ndim))
  return tuple(sorted(a + t.ndim if a < 0 else a for a in axes))


_EMPTY = {"ReduceSum": 0, "ReduceProd": 1, "ReduceMax": -math.inf, "ReduceMin": math.inf,
          "ReduceL1": 0, "ReduceL2": 0, "ReduceLogSum": -math.inf, "ReduceLogSumExp": -math.inf,
          "ReduceSumSquare": 0, "ReduceMean": math.nan}


@op(*_EMPTY)
def reduce(n: Node, x: Any, axes_in: Any = None) -> Tensor:
  t = tensor(n, x)
  axes = _axes(n, t, axes_in)
  keep = bool(n.attr("keepdims", 1))
  if axes is None: return t
  if any(t.shape[a] == 0 for a in axes):
    shape = tuple(1 if a in axes else s for a, s in enumerate(t.shape) if keep or a not in axes)
    fill = _EMPTY[n.op_type]
    if not dtypes.is_float(t.dtype) and math.isinf(fill):
      fill = t.dtype.min if fill < 0 else t.dtype.max
    return Tensor.full(shape, fill, dtype=t.dtype, device=t.device)
  return _reduce(n.op_type, t, axes, keep)


def _reduce(kind: str, t: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
  dt = t.dtype
  if kind == "ReduceSum": return t.sum(axes, keep, dtype=dt)
  if kind == "ReduceProd": return t.prod(axes, keep, dtype=dt)
  if kind == "ReduceMax": return t.max(axes, keep) if dt != dtypes.bool else t.any(axes, keep)
  if kind == "ReduceMin": return t.min(axes, keep) if dt != dtypes.bool else t.all(axes, keep)
  if kind == "ReduceMean":
    return t.mean(axes, keep) if dtypes.is_float(dt) else t.float().mean(axes, keep).cast(dt)
  if kind == "ReduceL1": return t.abs().sum(axes, keep, dtype=dt)
  if kind == "ReduceL2":
    f = t if dtypes.is_float(dt) else t.float()
    return (f * f).sum(axes, keep).sqrt().cast(dt)
  if kind == "ReduceSumSquare": return (t * t).sum(axes, keep, dtype=dt)
  if kind == "ReduceLogSum": return t.sum(axes, keep).log()
  return t.logsumexp(axes, keep)


@op("ArgMax", "ArgMin")
def arg_reduce(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  axis, keep = n.attr("axis", 0), bool(n.attr("keepdims", 1))
  axis = axis + t.ndim if axis < 0 else axis
  if n.op_type == "ArgMin":
    t = t.logical_not() if t.dtype == dtypes.bool else -t if dtypes.is_float(t.dtype) or \
      dtypes.is_int(t.dtype) and not dtypes.is_unsigned(t.dtype) else t.bitwise_not()
  if n.attr("select_last_index", 0):
    size = t.shape[axis]
    return (size - 1 - t.flip(axis).argmax(axis, keep)).cast(dtypes.int64)
  return t.argmax(axis, keep).cast(dtypes.int64)


@op("CumSum", "CumProd")
def cumulative(n: Node, x: Any, axis_in: Any) -> Tensor:
  t = tensor(n, x)
  axis = int(scalar(n, axis_in, "axis"))
  axis = axis + t.ndim if axis < 0 else axis
  rev = bool(n.attr("reverse", 0))
  if rev: t = t.flip(axis)
  out = t.cumsum(axis, dtype=t.dtype) if n.op_type == "CumSum" else t.cumprod(axis).cast(t.dtype)
  if n.attr("exclusive", 0):
    ident = 0 if n.op_type == "CumSum" else 1
    pads = [(0, 0)] * t.ndim
    pads[axis] = (1, -1)
    out = out.pad(pads, value=ident)
  return out.flip(axis) if rev else out


def _flat2d(n: Node, t: Tensor, fn: Any) -> Tensor:
  """Opset < 13: the operator works on the input flattened to 2-D at `axis`."""
  axis = n.attr("axis", 1)
  axis = axis + t.ndim if axis < 0 else axis
  shape = t.shape
  rows = math.prod(shape[:axis])
  return fn(t.reshape(rows, -1), 1).reshape(shape)


@op("Softmax", "LogSoftmax", "Hardmax")
def softmax(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  fn = {"Softmax": _softmax, "LogSoftmax": _log_softmax, "Hardmax": _hardmax}[n.op_type]
  if n.opset < 13: return _flat2d(n, t, fn)
  return fn(t, n.attr("axis", -1))


def _softmax(t: Tensor, axis: int) -> Tensor: return t.softmax(axis)
def _log_softmax(t: Tensor, axis: int) -> Tensor: return t.log_softmax(axis)


def _hardmax(t: Tensor, axis: int) -> Tensor:
  axis = axis + t.ndim if axis < 0 else axis
  idx = t.argmax(axis, keepdim=True)
  ar = Tensor.arange(t.shape[axis], device=t.device).reshape(
    *[t.shape[axis] if i == axis else 1 for i in range(t.ndim)])
  return (ar == idx).cast(t.dtype)


@op("TopK")
def topk(n: Node, x: Any, k_in: Any) -> tuple[Tensor, Tensor]:
  t = tensor(n, x)
  k = int(scalar(n, k_in, "k")) if n.opset >= 10 else n.attr("k")
  axis = n.attr("axis", -1)
  v, i = t.topk(k, axis, largest=bool(n.attr("largest", 1)), sorted=True)
  return v, i.cast(dtypes.int64)


@op("LpNormalization")
def lp_normalization(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  p, axis = n.attr("p", 2), n.attr("axis", -1)
  norm = t.abs().sum(axis, keepdim=True) if p == 1 else (t * t).sum(axis, keepdim=True).sqrt()
  return (norm == 0).where(0.0, t / norm).cast(t.dtype)


@op("MeanVarianceNormalization")
def mvn(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  axes = tuple(n.attr("axes", [0, 2, 3]))
  mean = t.mean(axes, keepdim=True)
  var = ((t - mean) ** 2).mean(axes, keepdim=True)
  return (t - mean) / (var.sqrt() + 1e-9)
