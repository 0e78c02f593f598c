"""`OnnxModel`: an ONNX model as one unigrad function of its inputs, run under TinyJit.

>>> model = OnnxModel("model.onnx")
>>> outputs = model(input=np.zeros((1, 3, 224, 224), np.float32))   # {name: Tensor}

The graph is interpreted once per input signature (shapes, dtypes, and the values of the inputs
read as numbers) inside `@function`, so it becomes one FUNCTION node; TinyJit captures its kernels
on the second call and replays them afterwards: a call with the same shapes launches kernels and
runs no graph code. The returned Tensors are the jit's buffers, overwritten by the next call
(`.clone()` or `.numpy().copy()` keeps one). A graph whose output shapes depend on values
(NonZero, NonMaxSuppression, Loop ...) runs node by node instead, eagerly."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto

from unigrad.dtype import dtypes
from unigrad.runtime.device import Device
from unigrad.frontend.function import flatten_results, function
from unigrad.frontend.jit import TinyJit
from unigrad.frontend.tensor import Tensor
from unigrad.onnx.convert import UnsupportedType, array_dtype, onnx_dtype, to_tensor
from unigrad.onnx.graph import PREFERRED_SLOTS, Graph, needs_eager, static_names
from unigrad.onnx.node import OnnxError
from unigrad.onnx.ops import OPS, check_node

__all__ = ["OnnxModel", "load_model", "InputSpec"]


def load_model(model: str | os.PathLike | bytes | ModelProto) -> ModelProto:
  """A ModelProto from a path, serialized bytes or a ModelProto; a clear error for a file that is
  not an ONNX model."""
  if isinstance(model, ModelProto): return model
  what = "the given bytes" if isinstance(model, (bytes, bytearray)) else f"file {str(model)!r}"
  try:
    if isinstance(model, (bytes, bytearray)): proto = onnx.load_from_string(bytes(model))
    else: proto = onnx.load(os.fspath(model))
  except FileNotFoundError: raise
  except Exception as e:
    raise OnnxError(f"{what} is not a readable ONNX model ({type(e).__name__}: {e})") from e
  if not proto.graph.node and not proto.graph.output:
    raise OnnxError(f"{what} is not an ONNX model (no graph)")
  return proto


class InputSpec:
  """A graph input as declared: name, unigrad dtype (None for sequences/optionals) and shape
  (ints, or strings for symbolic sizes, None for unknown)."""

  def __init__(self, vi: onnx.ValueInfoProto) -> None:
    self.name = vi.name
    t = vi.type
    self.dtype = None
    self.shape: tuple[Any, ...] | None = None
    if t.HasField("tensor_type"):
      try: self.dtype = onnx_dtype(t.tensor_type.elem_type)
      except UnsupportedType: self.dtype = None
      if t.tensor_type.HasField("shape"):
        self.shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                           for d in t.tensor_type.shape.dim)

  def __repr__(self) -> str:
    dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
    return f"{self.name}: {self.dtype} [{dims}]"


class OnnxModel:
  """An ONNX model (a path, bytes or a ModelProto) run by unigrad on `device`. Calling it with the
  graph's inputs by name (numpy arrays, Tensors, Python lists for sequences) returns a dict of
  output name -> Tensor. `jit=False` runs without TinyJit (each call schedules the traced
  function again)."""

  def __init__(self, model: str | os.PathLike | bytes | ModelProto, device: str | None = None,
               jit: bool = True) -> None:
    self.proto = load_model(model)
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version
                   for o in self.proto.opset_import}
    if "" not in self.opsets: self.opsets[""] = 1
    self.graph = Graph(self.proto.graph, self.opsets, self.device, OPS)
    _check_supported(self.graph)
    self.inputs = [InputSpec(vi) for vi in self.proto.graph.input
                   if vi.name not in self.graph.initializers]
    self.output_names = list(self.graph.output_names)
    self.static = static_names(self.proto.graph)
    self.static |= {s.name for s in self.inputs if s.name in static_names(
      self.proto.graph, PREFERRED_SLOTS) and s.dtype is not None and not dtypes.is_float(s.dtype)}
    self.eager = needs_eager(self.proto.graph)
    self.graph.static = self.static
    self.weights = self.graph.weights(self.static)
    _upload_subgraph_weights(self.graph, self.static)
    self._fn = function(self._run_traced)
    self._jit = TinyJit(self._fn) if jit and not self.eager else None

  def __repr__(self) -> str:
    return f"OnnxModel(inputs={self.inputs}, outputs={self.output_names}, opsets={self.opsets})"

  def __call__(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    feeds = {**(inputs or {}), **kw}
    values = self._check_inputs(feeds)
    if self.eager: return self._run(values, eager=True)
    return self._call(values)

  def _run_traced(self, values: dict[str, Any]) -> dict[str, Any]:
    out = self._run(values, eager=False)
    # a FUNCTION needs a Tensor result: a graph of sequences and optionals only gets a dummy
    if not any(isinstance(v, Tensor) for v in flatten_results(out)):
      out[_NO_TENSOR] = Tensor.zeros(1, device=self.device)
    return out

  def _call(self, values: dict[str, Any]) -> dict[str, Any]:
    out = self._jit(values) if self._jit is not None else self._fn(values)
    out.pop(_NO_TENSOR, None)
    return out

  def _run(self, values: dict[str, Any], eager: bool) -> dict[str, Any]:
    env: dict[str, Any] = {**self.graph.weights(self.static), **values}
    outs = self.graph.run(env, eager)
    return {name: _output(v, self.device) for name, v in zip(self.output_names, outs)}

  def _check_inputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
    known = {s.name: s for s in self.inputs}
    unknown = [k for k in feeds if k not in known]
    if unknown:
      raise OnnxError(f"unknown input {unknown[0]!r}; the graph's inputs are "
                      f"{', '.join(known) or 'none'}")
    values: dict[str, Any] = {}
    for name, spec in known.items():
      if name not in feeds:
        raise OnnxError(f"missing input {name!r} (the graph declares {spec!r})")
      values[name] = self._input_value(spec, feeds[name])
    return values

  def _input_value(self, spec: InputSpec, v: Any) -> Any:
    if v is None or isinstance(v, list): return [self._input_value(spec, x) for x in v] \
      if isinstance(v, list) else None
    if isinstance(v, Tensor): dt, shape = v.dtype, tuple(v.shape)
    else:
      v = np.asarray(v)
      dt, shape = array_dtype(v), v.shape
    if spec.dtype is not None and dt != spec.dtype:
      raise OnnxError(f"input {spec.name!r} has dtype {dt}, the graph declares {spec!r}")
    if spec.shape is not None:
      ok = len(shape) == len(spec.shape) and all(
        not isinstance(d, int) or d == 0 or d == s for d, s in zip(spec.shape, shape))
      if not ok: raise OnnxError(f"input {spec.name!r} has shape {shape}, the graph declares "
                                 f"{spec!r}")
    if spec.name in self.static: return v if isinstance(v, np.ndarray) else v.numpy().copy()
    return to_tensor(v, self.device)


_NO_TENSOR = "\0no tensor"


def _output(v: Any, device: str) -> Any:
  if isinstance(v, list): return [_output(x, device) for x in v]
  if isinstance(v, np.ndarray): return to_tensor(v, device)
  return v


def _check_supported(g: Graph) -> None:
  """Every node (subgraphs too) names an implemented operator with supported attributes."""
  for node in g.nodes:
    check_node(node)
    for sub in node.subgraphs: _check_supported(g.subgraph(sub))


def _upload_subgraph_weights(g: Graph, static: set[str]) -> None:
  """Make the subgraphs' initializer Tensors now, outside any trace (a Tensor made and realized
  while one trace runs would be seen as written by the next)."""
  for node in g.nodes:
    for sub in node.subgraphs:
      child = g.subgraph(sub)
      child.weights(static)
      _upload_subgraph_weights(child, static)


