"""ONNX operator implementations on unigrad Tensors, registered by op_type in `OPS`."""
from unigrad.onnx.ops import (control, math, misc, nn, quant, reduce, resize, rnn,  # noqa: F401
                              shape, transformer)
from unigrad.onnx.ops.registry import CHECKS, OPS, check_node

__all__ = ["OPS", "CHECKS", "check_node"]
