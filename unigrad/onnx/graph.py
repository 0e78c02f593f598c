"""Running an ONNX graph on unigrad Tensors: each node's operator called on its inputs' values.

A value is a `Tensor`, a numpy array (a *static* value: known while the graph is traced, such as
an initializer, a Constant or a Shape), a list (an ONNX sequence) or None (an absent optional).
Operators that need numbers rather than tensors (Reshape's shape, Slice's starts, TopK's k) read
static values; a node whose inputs are all static is folded on the host by the onnx package's
reference implementation, so shape arithmetic never becomes kernels. Which graph inputs must be
static (passed as numpy arrays, one trace per value) is found at load time by `static_names`.

A graph whose output shapes depend on tensor values (NonZero, Unique, NonMaxSuppression,
Compress, Loop with a computed condition) cannot be traced into one @function: `needs_eager`
says so, and the model then runs node by node, reading those values."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from onnx import GraphProto, NodeProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from unigrad.frontend.tensor import Tensor
from unigrad.onnx.convert import to_numpy, to_tensor
from unigrad.onnx.node import Node, OnnxError

__all__ = ["Graph", "static_names", "needs_eager", "STATIC_SLOTS", "PREFERRED_SLOTS", "value_of"]

# operator -> the input slots whose values (not only shapes) the operator reads
STATIC_SLOTS: dict[str, tuple[int, ...]] = {
  "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3),
  "ConstantOfShape": (0,), "Range": (0, 1, 2), "TopK": (1,), "Resize": (1, 2, 3),
  "Upsample": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
  "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,),
  "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "Split": (1,),
  "OneHot": (1,), "CenterCropPad": (1,), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,),
  "Col2Im": (1, 2, 3), "DFT": (1, 2), "STFT": (1, 2, 3), "MelWeightMatrix": (0, 1, 2, 3, 4),
  "HannWindow": (0,),
  "HammingWindow": (0,), "BlackmanWindow": (0,), "SplitToSequence": (1,), "SequenceAt": (1,),
  "SequenceInsert": (2,), "SequenceErase": (1,), "MaxUnpool": (2,), "AffineGrid": (1,),
  "NonMaxSuppression": (2, 3, 4), "Loop": (0,), "Dropout": (1, 2),
}
SHAPE_SOURCES = frozenset({"Shape", "Size"})  # static outputs whatever their inputs
DATA_DEPENDENT = frozenset({"NonZero", "Unique", "NonMaxSuppression", "Compress", "Loop",
                            "SequenceMap", "Det"})  # Det: QR steps realize one by one
NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Bernoulli", "Multinomial", "If", "Loop", "Scan", "SequenceMap", "Constant",
                     "Identity", "Optional", "OptionalGetElement", "OptionalHasElement"})


def _all_nodes(g: GraphProto) -> Iterable[NodeProto]:
  for n in g.node:
    yield n
    for a in n.attribute:
      if a.g.node: yield from _all_nodes(a.g)
      for sub in a.graphs: yield from _all_nodes(sub)


def needs_eager(g: GraphProto) -> bool:
  """Whether some node's output shape depends on tensor values."""
  return any(n.op_type in DATA_DEPENDENT for n in _all_nodes(g))


# slots read as numbers when they can be (an If's condition computed from an integer input,
# such as a sample rate, picks its branch while tracing; from float data, both branches run)
PREFERRED_SLOTS: dict[str, tuple[int, ...]] = {"If": (0,)}


def static_names(g: GraphProto, slots: dict[str, tuple[int, ...]] = STATIC_SLOTS) -> set[str]:
  """The names of the values some operator reads as numbers (`slots`), and of everything they
  are computed from (stopping at Shape and Size), in this graph and its subgraphs."""
  needed: set[str] = set()
  nodes = list(_all_nodes(g))
  for _ in range(2):  # a subgraph can read an outer name computed later in the walk order
    for n in reversed(nodes):
      for k in slots.get(n.op_type, ()):
        if k < len(n.input) and n.input[k]: needed.add(n.input[k])
      if n.op_type in SHAPE_SOURCES: continue
      if any(o in needed for o in n.output): needed.update(i for i in n.input if i)
  return needed


def value_of(n: Node, v: Any, what: str) -> np.ndarray:
  """A static input's value as a numpy array; a Tensor's only when the graph runs eagerly."""
  if isinstance(v, np.ndarray): return v
  if isinstance(v, Tensor):
    if n.eager: return to_numpy(v)
    raise n.error(f"{what} must be known when the graph is traced (a constant, an initializer "
                  "or computed from shapes), but it is computed from tensor values")
  if v is None: raise n.error(f"{what} is missing")
  return np.asarray(v)


def conv_weights(g: GraphProto) -> set[str]:
  """The names of the weights of this graph's dense (group 1) Conv nodes."""
  out = set()
  for n in g.node:
    group = next((a.i for a in n.attribute if a.name == "group"), 1)
    if n.op_type == "Conv" and group == 1 and len(n.input) > 1: out.add(n.input[1])
  return out


def is_stored_as_kernel(w: np.ndarray) -> bool:
  """Whether a convolution weight (cout, cin, *window) is stored as (cin, *window, cout): the
  layout conv2d's kernel reads (whole vectors of output channels; frontend/nnops.py `_conv`).
  Stored as it is, conv2d copied it into that layout at every call; an initializer never
  changes, so it is moved once, at load, and conv2d reads it in place."""
  return w.ndim >= 3 and w.dtype.kind == "f"


class Graph:
  """A parsed GraphProto: its nodes, initializers (numpy arrays) and input and output names."""

  def __init__(self, g: GraphProto, opsets: dict[str, int], device: str,
               ops: dict[str, Callable[..., Any]]) -> None:
    self.proto, self.opsets, self.device, self.ops = g, opsets, device, ops
    self.initializers = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    self.nodes = [Node.from_proto(p, opsets, device) for p in g.node]
    self.protos = list(g.node)
    self.input_names = [i.name for i in g.input if i.name not in self.initializers]
    self.output_names = [o.name for o in g.output]
    self._subgraphs: dict[int, Graph] = {}
    self._weights: dict[str, Tensor] = {}
    self._conv_weights = conv_weights(g)
    self._kernels: set[str] = set()  # weights stored as convolution kernels (is_stored_as_kernel)
    self.static: set[str] = set()  # the names read as numbers (the model's static_names)

  def subgraph(self, g: GraphProto) -> Graph:
    sub = self._subgraphs.get(id(g))
    if sub is None:
      sub = self._subgraphs[id(g)] = Graph(g, self.opsets, self.device, self.ops)
      sub.static = self.static
    return sub

  def weights(self, static: set[str]) -> dict[str, Any]:
    """Initializers: numpy arrays where read as numbers, else Tensors (uploaded once). A
    convolution's weight is stored in the layout its kernel reads (is_stored_as_kernel)."""
    out: dict[str, Any] = {}
    for name, arr in self.initializers.items():
      if name in static or arr.dtype.kind in "USO": out[name] = arr
      else:
        if name not in self._weights: self._weights[name] = self._upload(name, arr)
        w = self._weights[name]
        # the view is made at each call, where the graph runs: a traced call then captures the
        # buffer itself (a captured view is copied into a buffer of its own by every call)
        out[name] = w.permute(w.ndim - 1, *range(w.ndim - 1)) if name in self._kernels else w
    return out

  def _upload(self, name: str, arr: np.ndarray) -> Tensor:
    if name not in self._conv_weights or not is_stored_as_kernel(arr):
      return to_tensor(arr, self.device).realize()
    self._kernels.add(name)
    # moved on the host: a permuting kernel per weight shape compiled 64 kernels at nudenet's load
    return to_tensor(np.ascontiguousarray(np.moveaxis(arr, 0, -1)), self.device).realize()

  def run(self, env: dict[str, Any], eager: bool) -> list[Any]:
    """Run every node, reading and writing `env` (name -> value); the outputs' values."""
    for node, proto in zip(self.nodes, self.protos):
      node.eager = eager
      args = []
      for name in node.inputs:
        if name and name not in env: raise node.error(f"input {name!r} is not defined")
        args.append(env[name] if name else None)
      out = self._dispatch(node, proto, args, env, eager)
      outs = out if isinstance(out, tuple) else (out,)
      for name, v in zip(node.outputs, outs):
        if name: env[name] = v
    return [env[name] for name in self.output_names]

  def _dispatch(self, node: Node, proto: NodeProto, args: list[Any], env: dict[str, Any],
                eager: bool) -> Any:
    if _foldable(node, args):
      try: return tuple(_fold(proto, self.opsets, args))
      except Exception: pass  # noqa: S110 (the reference cannot run it: unigrad's op does)
    impl = self.ops.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if impl is None: raise node.error("operator not supported")
    if node.subgraphs:
      node.attrs["__run__"] = lambda g, values: self._run_subgraph(g, env, values, eager)
    try: return impl(node, *args)
    except OnnxError: raise
    except Exception as e: raise node.error(f"{type(e).__name__}: {e}") from e
    finally: node.attrs.pop("__run__", None)  # (its scope's tensors must not outlive the trace)


  def _run_subgraph(self, g: GraphProto, env: dict[str, Any], values: dict[str, Any],
                    eager: bool) -> list[Any]:
    """A subgraph in the scope of this one: its own initializers, then its inputs' values."""
    sub = self.subgraph(g)
    return sub.run({**env, **sub.weights(self.static), **values}, eager)


def _foldable(node: Node, args: list[Any]) -> bool:
  if node.op_type in NO_FOLD or node.subgraphs or not args: return False
  return all(a is None or isinstance(a, np.ndarray) for a in args) and \
    any(isinstance(a, np.ndarray) for a in args)


def _fold(proto: NodeProto, opsets: dict[str, int], args: list[Any]) -> list[Any]:
  feeds = {name: a for name, a in zip(proto.input, args) if name}
  outs = ReferenceEvaluator(proto, opsets=opsets).run(None, feeds)
  return [np.asarray(o) if o is not None and not isinstance(o, list) else o for o in outs]
