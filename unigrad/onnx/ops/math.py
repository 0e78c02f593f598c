"""Elementwise operators: arithmetic, comparisons, logic, bit operations, activations."""
from __future__ import annotations

from typing import Any

from unigrad.onnx.ops.registry import Node, Tensor, dtypes, op, tensor

_UNARY = {
  "Abs": Tensor.abs, "Neg": Tensor.neg, "Exp": Tensor.exp, "Log": Tensor.log,
  "Sqrt": Tensor.sqrt, "Floor": Tensor.floor, "Ceil": Tensor.ceil,
  "Round": Tensor.round_half_even, "Sign": Tensor.sign, "Sin": Tensor.sin, "Cos": Tensor.cos,
  "Tan": Tensor.tan, "Asin": Tensor.asin, "Acos": Tensor.acos, "Atan": Tensor.atan,
  "Sinh": Tensor.sinh, "Cosh": Tensor.cosh, "Asinh": Tensor.asinh, "Acosh": Tensor.acosh,
  "Atanh": Tensor.atanh, "Erf": Tensor.erf, "Relu": Tensor.relu, "Sigmoid": Tensor.sigmoid,
  "Tanh": Tensor.tanh, "Softsign": Tensor.softsign, "IsNaN": Tensor.isnan,
  "Not": Tensor.logical_not, "BitwiseNot": Tensor.bitwise_not, "Mish": Tensor.mish,
  "HardSwish": Tensor.hardswish,
}


def _unary(name: str) -> None:
  fn = _UNARY[name]
  op(name)(lambda n, x: fn(tensor(n, x)))


for _name in _UNARY: _unary(_name)


@op("Reciprocal")
def reciprocal(n: Node, x: Any) -> Tensor: return tensor(n, x).reciprocal()


@op("Softplus")
def softplus(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return (t.maximum(0) + (-t.abs()).exp().add(1).log()).cast(t.dtype)


@op("IsInf")
def isinf(n: Node, x: Any) -> Tensor:
  return tensor(n, x).isinf(bool(n.attr("detect_positive", 1)),
                            bool(n.attr("detect_negative", 1)))


@op("Identity")
def identity(n: Node, x: Any) -> Any: return x


_BINARY = {
  "Add": Tensor.add, "Sub": Tensor.sub, "Mul": Tensor.mul,
  "Equal": Tensor.eq, "Less": Tensor.lt, "LessOrEqual": Tensor.le, "Greater": Tensor.gt,
  "GreaterOrEqual": Tensor.ge, "And": Tensor.bitwise_and, "Or": Tensor.bitwise_or,
  "Xor": Tensor.bitwise_xor, "BitwiseAnd": Tensor.bitwise_and, "BitwiseOr": Tensor.bitwise_or,
  "BitwiseXor": Tensor.bitwise_xor,
}


def _binary(name: str) -> None:
  fn = _BINARY[name]
  op(name)(lambda n, a, b: fn(tensor(n, a), tensor(n, b)))


for _name in _BINARY: _binary(_name)


@op("Div")
def div(n: Node, a: Any, b: Any) -> Tensor:
  x, y = tensor(n, a), tensor(n, b)
  if dtypes.is_float(x.dtype): return x / y
  return x.div(y, rounding_mode="trunc")


@op("Mod")
def mod(n: Node, a: Any, b: Any) -> Tensor:
  x, y = tensor(n, a), tensor(n, b)
  if n.attr("fmod", 0): return x.fmod(y)
  if dtypes.is_float(x.dtype):  # numpy's float mod: fmod moved to the divisor's sign
    r = x.fmod(y)
    r = ((r != 0) & ((r < 0) != (y < 0))).where(r + y, r)
    return (r == 0).where(Tensor.zeros_like(r).copysign(y), r)
  return x.mod(y)


@op("Pow")
def pow_(n: Node, a: Any, b: Any) -> Tensor:
  x, y = tensor(n, a), tensor(n, b)
  if dtypes.is_float(x.dtype) or not dtypes.is_float(y.dtype):
    return x.pow(y.cast(x.dtype) if dtypes.is_float(x.dtype) else y).cast(x.dtype)
  return x.cast(y.dtype).pow(y).cast(x.dtype)


@op("BitShift")
def bitshift(n: Node, a: Any, b: Any) -> Tensor:
  x, y = tensor(n, a), tensor(n, b)
  return x.lshift(y) if n.attr("direction") == "LEFT" else x.rshift(y)


@op("Max", "Min", "Sum", "Mean")
def variadic(n: Node, *xs: Any) -> Tensor:
  ts = [tensor(n, x) for x in xs]
  out = ts[0]
  for t in ts[1:]:
    if n.op_type == "Max": out = out.maximum(t)
    elif n.op_type == "Min": out = out.minimum(t)
    else: out = out + t
  return out / len(ts) if n.op_type == "Mean" else out


@op("Where")
def where(n: Node, c: Any, a: Any, b: Any) -> Tensor:
  return tensor(n, c).where(tensor(n, a), tensor(n, b))


@op("Clip")
def clip(n: Node, x: Any, lo: Any = None, hi: Any = None) -> Tensor:
  t = tensor(n, x)
  if n.opset < 11: lo, hi = n.attr("min", None), n.attr("max", None)
  if lo is not None: t = t.maximum(tensor(n, lo).cast(t.dtype) if not isinstance(lo, float)
                                   else lo)
  if hi is not None: t = t.minimum(tensor(n, hi).cast(t.dtype) if not isinstance(hi, float)
                                   else hi)
  return t


# ---- activations with attributes ----

@op("LeakyRelu")
def leaky_relu(n: Node, x: Any) -> Tensor:
  return tensor(n, x).leaky_relu(n.attr("alpha", 0.01))


@op("Elu")
def elu(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return (t > 0).where(t, (t.exp() - 1) * n.attr("alpha", 1.0))


@op("Celu")
def celu(n: Node, x: Any) -> Tensor: return tensor(n, x).celu(n.attr("alpha", 1.0))


@op("Selu")
def selu(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  alpha = n.attr("alpha", 1.67326319217681884765625)
  gamma = n.attr("gamma", 1.05070102214813232421875)
  return (t > 0).where(t * gamma, (t.exp() * alpha - alpha) * gamma)


@op("ThresholdedRelu")
def thresholded_relu(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return (t > n.attr("alpha", 1.0)).where(t, 0)


@op("HardSigmoid")
def hard_sigmoid(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return (t * n.attr("alpha", 0.2) + n.attr("beta", 0.5)).clamp(0, 1)


@op("Gelu")
def gelu(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return t.gelu("tanh" if n.attr("approximate", "none") == "tanh" else "none")


@op("Shrink")
def shrink(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  bias, lambd = n.attr("bias", 0.0), n.attr("lambd", 0.5)
  out = (t < -lambd).where(t + bias, (t > lambd).where(t - bias, 0))
  return out.cast(t.dtype)


@op("PRelu")
def prelu(n: Node, x: Any, slope: Any) -> Tensor:
  t, s = tensor(n, x), tensor(n, slope)
  if n.opset < 7 and s.ndim == 1 and t.ndim > 2 and s.shape[0] == t.shape[1]:
    s = s.reshape(-1, *[1] * (t.ndim - 2))  # before opset 7: one slope per channel (axis 1)
  return (t < 0).where(t * s, t)


@op("Swish")
def swish(n: Node, x: Any) -> Tensor:
  t = tensor(n, x)
  return t * (t * n.attr("alpha", 1.0)).sigmoid()


@op("Det")
def det(n: Node, x: Any) -> Tensor: return tensor(n, x).det()

