"""One ONNX node as the operator implementations see it: its attributes read once into Python
values, its opset, and what a clear error about it names."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx import AttributeProto, GraphProto, NodeProto, helper, numpy_helper

__all__ = ["OnnxError", "Node", "read_attribute"]


class OnnxError(ValueError):
  """A model unigrad cannot load or run: the operator, its domain and opset, the node's name."""


def read_attribute(a: AttributeProto) -> Any:
  """An attribute's value: numbers, strings (decoded), lists, numpy arrays for tensors, the
  GraphProto of a subgraph."""
  if a.type == AttributeProto.TENSOR: return numpy_helper.to_array(a.t)
  if a.type == AttributeProto.TENSORS: return [numpy_helper.to_array(t) for t in a.tensors]
  if a.type == AttributeProto.GRAPH: return a.g
  if a.type == AttributeProto.GRAPHS: return list(a.graphs)
  if a.type == AttributeProto.SPARSE_TENSOR:
    raise OnnxError(f"attribute {a.name}: sparse tensors are not supported")
  v = helper.get_attribute_value(a)
  if isinstance(v, bytes): return v.decode()
  if isinstance(v, list) and v and isinstance(v[0], bytes): return [s.decode() for s in v]
  return v


@dataclass
class Node:
  """A node of a graph: op_type, domain, the opset of its domain, input and output names ('' for
  an absent optional one), attributes by name, and the device its tensors live on."""
  op_type: str
  domain: str
  opset: int
  name: str
  inputs: list[str]
  outputs: list[str]
  attrs: dict[str, Any] = field(default_factory=dict)
  device: str = "CPU"
  eager: bool = False  # values of computed tensors may be read (no @function trace)

  @staticmethod
  def from_proto(p: NodeProto, opsets: dict[str, int], device: str) -> Node:
    domain = "" if p.domain == "ai.onnx" else p.domain
    attrs = {a.name: read_attribute(a) for a in p.attribute}
    return Node(p.op_type, domain, opsets.get(domain, 0), p.name, list(p.input), list(p.output),
                attrs, device)

  def attr(self, name: str, default: Any = None) -> Any:
    return self.attrs.get(name, default)

  @property
  def subgraphs(self) -> list[GraphProto]:
    out: list[GraphProto] = []
    for v in self.attrs.values():
      if isinstance(v, GraphProto): out.append(v)
      elif isinstance(v, list) and v and isinstance(v[0], GraphProto): out.extend(v)
    return out

  def where(self) -> str:
    """The node as an error names it."""
    dom = self.domain or "ai.onnx"
    return f"{self.op_type} (domain {dom}, opset {self.opset}, node {self.name or '<unnamed>'!r})"

  def error(self, what: str) -> OnnxError:
    return OnnxError(f"{self.where()}: {what}")
