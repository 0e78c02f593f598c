"""onnx's own backend test suite (onnx.backend.test.BackendTest) over unigrad.onnx.backend:
node tests, pytorch-converted, pytorch-operator, simple and the light model-zoo graphs.

Run: `python -m pytest -m onnx_backend test/onnx/test_onnx_backend.py` (the onnx_backend group,
its own step in .ci/run). Node tests run on the PYTHON reference device (tiny graphs: compiling C
for each would take longer than interpreting them), models with more than LARGE_INPUT input
elements on the CPU device. Every excluded test is in EXCLUDED with its reason; docs/onnx.md
lists the same table (test_docs_list_every_exclusion holds them together)."""
from __future__ import annotations

import math
import pathlib
import re

import pytest

onnx = pytest.importorskip("onnx")
import onnx.backend.test  # noqa: E402

from unigrad.onnx.backend import UnigradBackend, UnigradRep  # noqa: E402
from unigrad.onnx.model import OnnxModel  # noqa: E402

pytestmark = pytest.mark.onnx_backend
LARGE_INPUT = 4096

# pattern (a regex over the test name) -> why it is excluded
EXCLUDED: dict[str, str] = {
  r"test_ai_onnx_ml_.*": "ai.onnx.ml domain (classical ML operators) is not implemented",
  r"test_(adagrad|adam|momentum|nesterov_momentum).*": "ai.onnx.preview.training domain",
  r"test_(string|regex|strnorm|tfidf).*": "string tensors are not supported",
  r"test_image_decoder.*": "ImageDecoder (encoded image bytes) is not supported",
  r"test_.*(int4|INT4|int2|INT2|uint4|UINT4|uint2|UINT2).*": "2- and 4-bit integer types",
  r"test_.*(float4e2m1|FLOAT4E2M1|e8m0|E8M0).*": "4-bit float and e8m0 scale types",
  r"test_(bernoulli|training_dropout|random).*": "random numbers: results depend on the "
                                                  "generator, not comparable",
  r"test_(dft|stft|melweightmatrix).*": "DFT/STFT: complex-valued signal processing",
  r"test_(linear_attention|causal_conv_with_state|flex_attention|tensorscatter|swiglu).*":
    "operators of opsets 24-28 (preview), beyond the opset 21 target",
  r"test_(roialign|deform_conv).*": "RoiAlign and DeformConv are not implemented",
}


class Backend(UnigradBackend):
  """The node tests' backend: PYTHON for small graphs, CPU for large inputs."""

  @classmethod
  def prepare(cls, model, device: str = "CPU", **kwargs) -> UnigradRep:
    size = max((math.prod(d.dim_value or 1 for d in i.type.tensor_type.shape.dim)
                for i in model.graph.input), default=0)
    return UnigradRep(OnnxModel(model, device="CPU" if size > LARGE_INPUT else "PYTHON",
                                jit=False))


backend_test = onnx.backend.test.BackendTest(Backend, __name__)
for pattern in EXCLUDED: backend_test.exclude(pattern)
globals().update(backend_test.test_cases)


def test_docs_list_every_exclusion():
  doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "onnx.md").read_text()
  missing = [p for p in EXCLUDED if f"`{p}`" not in doc]
  assert not missing, f"docs/onnx.md does not list {missing}"
  assert all(re.compile(p) for p in EXCLUDED)
