"""`onnx.backend.base.Backend` over unigrad: what `onnx.backend.test.BackendTest` drives.

>>> from unigrad.onnx.backend import UnigradBackend
>>> outputs = UnigradBackend.run_model(model_proto, [x])

The device argument is ONNX's ("CPU", "CUDA"); unigrad's device comes from `DEV` (the default
device) unless the backend's `device` class attribute names one (the test suite's node tests
set it to PYTHON for speed)."""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto
from onnx.backend.base import Backend, BackendRep

from unigrad.onnx.convert import to_numpy
from unigrad.onnx.model import OnnxModel

__all__ = ["UnigradBackend", "UnigradRep", "prepare", "run_model", "supports_device"]


class UnigradRep(BackendRep):
  """A prepared model: `run(inputs)` takes the graph's inputs in order (or by name)."""

  def __init__(self, model: OnnxModel) -> None:
    self.model = model

  def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
    if isinstance(inputs, dict): feeds = dict(inputs)
    else:
      if not isinstance(inputs, (list, tuple)): inputs = [inputs]
      feeds = {spec.name: v for spec, v in zip(self.model.inputs, inputs)}
    outs = self.model(feeds)
    return tuple(_result(outs[name]) for name in self.model.output_names)


def _result(v: Any) -> Any:
  if isinstance(v, list): return [_result(x) for x in v]
  if v is None: return None
  out = to_numpy(v)
  return out if isinstance(out, np.ndarray) else np.asarray(out)


class UnigradBackend(Backend):
  """Runs ONNX models with unigrad on `UnigradBackend.device` (None: the default device)."""
  device: str | None = None
  jit: bool = False  # one run per prepared model in the test suite: no capture

  @classmethod
  def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> UnigradRep:
    return UnigradRep(OnnxModel(model, device=cls.device, jit=cls.jit))

  @classmethod
  def supports_device(cls, device: str) -> bool:
    return device == "CPU"


prepare = UnigradBackend.prepare
run_model = UnigradBackend.run_model
supports_device = UnigradBackend.supports_device
