"""The operator table: ONNX op_type -> implementation, and helpers the implementations share.

An implementation is `fn(node, *inputs) -> value or tuple of values`; inputs are Tensors, numpy
arrays (static values), lists (sequences) or None (absent optional inputs)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unigrad.dtype import DType, dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.onnx.convert import onnx_dtype, to_tensor
from unigrad.onnx.graph import value_of
from unigrad.onnx.node import Node, OnnxError

__all__ = ["OPS", "CHECKS", "op", "check", "check_node", "tensor", "ints", "scalar", "axis_of",
           "Node", "Tensor", "dtypes", "DType", "np", "onnx_dtype", "value_of"]

OPS: dict[str, Callable[..., Any]] = {}
CHECKS: dict[str, Callable[[Node], str | None]] = {}
DOMAINS = ("", "ai.onnx")


def op(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Register an implementation under one or more op_types."""
  def register(fn: Callable[..., Any]) -> Callable[..., Any]:
    for name in names: OPS[name] = fn
    return fn
  return register


def check(*names: str) -> Callable[[Callable[[Node], str | None]], Callable[[Node], str | None]]:
  """Register a load-time check: returns what is unsupported about a node, or None."""
  def register(fn: Callable[[Node], str | None]) -> Callable[[Node], str | None]:
    for name in names: CHECKS[name] = fn
    return fn
  return register


def check_node(node: Node) -> None:
  """Raise OnnxError for an operator or attribute value unigrad does not implement."""
  if node.domain not in DOMAINS or node.op_type not in OPS:
    raise node.error("operator not supported")
  if (fn := CHECKS.get(node.op_type)) is not None and (why := fn(node)) is not None:
    raise node.error(why)


def tensor(n: Node, x: Any) -> Tensor:
  """A value as a Tensor on the node's device."""
  if isinstance(x, Tensor): return x
  if x is None: raise OnnxError(f"{n.where()}: a required input is missing")
  return to_tensor(np.asarray(x), n.device)


def ints(n: Node, x: Any, what: str = "input") -> list[int]:
  """A static integer input as a list of Python ints."""
  return [int(v) for v in value_of(n, x, what).reshape(-1)]


def scalar(n: Node, x: Any, what: str = "input") -> Any:
  """A static scalar input as a Python number."""
  return value_of(n, x, what).reshape(-1)[0].item()


def axis_of(axis: int, ndim: int) -> int:
  return axis + ndim if axis < 0 else axis


def shape_of(x: Any) -> tuple[int, ...]:
  return tuple(x.shape)


def as_seq(v: Any) -> Sequence[Any]:
  return v if isinstance(v, (list, tuple)) else [v]
