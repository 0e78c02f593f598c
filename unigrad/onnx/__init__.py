"""unigrad.onnx: run ONNX models (the `onnx` extra: `pip install unigrad[onnx]`).

`OnnxModel(path_or_bytes_or_ModelProto, device=None)` builds the graph once as a unigrad
function of its inputs, run under TinyJit; calling it with named inputs returns a dict of output
Tensors. `unigrad.onnx.backend` is the `onnx.backend.base.Backend` the onnx test suite drives;
`python -m unigrad.onnx MODEL.onnx` inspects and runs a model."""
from unigrad.onnx.model import InputSpec, OnnxModel, load_model
from unigrad.onnx.node import OnnxError

__all__ = ["OnnxModel", "OnnxError", "InputSpec", "load_model"]
