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

pytest.importorskip("onnx")
from onnx.backend.test import BackendTest  # noqa: E402

from unigrad.onnx.backend import UnigradBackend, UnigradRep  # noqa: E402
from unigrad.onnx.model import OnnxModel  # noqa: E402

pytestmark = pytest.mark.onnx_backend
LARGE_INPUT = 4096

ATTENTION_24 = ("test_attention_(3d_local_window|3d_with_past_and_present_qk_matmul_softcap|"
                "4d_causal_nonpad_(attn_mask_composition|batch_prefill|continued_prefill|"
                "negative_offset_structural_empty)|4d_causal_padded_kv_bf16|"
                "4d_gqa_causal_nonpad_decode(_fp16)?|4d_softcap_neginf_mask(_poison)?|"
                "4d_with_past_and_present_qk_matmul_bias_[34]d_mask_causal|"
                "4d_with_qk_matmul_softcap|bidirectional_window|local_window(_ext_cache_rank2_mask|"
                "_ext_cache_rank3_head_mask|_ext_cache_rank4_batch_mask|_gqa_rank4_mask|"
                "_rank1_boolean_mask|_with_past)?)_cpu")

# pattern (a regex over the test name) -> why it is excluded
EXCLUDED: dict[str, str] = {
  r"test_ai_onnx_ml_": "ai.onnx.ml domain (classical ML operators) is not implemented",
  r"test_(adagrad|adam|momentum|nesterov_momentum|gradient_of)":
    "ai.onnx.preview.training domain (optimizers, Gradient)",
  r"test_(string|regex|strnorm|tfidf|equal_string)": "string tensors are not supported",
  r"test_image_decoder": "ImageDecoder (encoded image bytes) is not supported",
  r"test_.*(int4|INT4|int2|INT2|uint4|UINT4|uint2|UINT2)": "2- and 4-bit integer types",
  r"test_.*(float4e2m1|FLOAT4E2M1|e8m0|E8M0)": "4-bit float and e8m0 scale types",
  r"test_(bernoulli|random)|test_training_dropout(?!_zero_ratio)":
    "random numbers: results depend on the generator, not comparable",
  r"test_(dft|stft|melweightmatrix)": "DFT/STFT/MelWeightMatrix: complex-valued signal processing",
  r"test_(linear_attention|causal_conv_with_state|swiglu|tensorscatter|flexattention)"
  r"(?!.*_expanded_)":
    "operators of opsets 24-28 and ai.onnx.preview, beyond the opset 21 target (their "
    "_expanded variants, made of older operators, run)",
  ATTENTION_24: "Attention (opset 23) features of opsets 24-25: sliding windows, "
                "nonpad_kv_seqlen, softcap with qk outputs, causal masks combined with past and "
                "bias (their _expanded variants run)",
  r"test_attention_4d_causal_fp16_expanded":
    "float16 rounding of the expanded graph's intermediate casts differs from the reference's",
  r"test_roialign|test_basic_deform_conv|test_deform_conv":
    "RoiAlign and DeformConv are not implemented",
  r"test_affine_grid_.*_expanded":
    "the expanded graph computes Expand's/ConstantOfShape's shape from a tensor value that the "
    "static-value analysis does not reach (the AffineGrid operator itself passes)",
  r"test_scan_sum": "Scan of opset 8 (batched, with sequence_lens) is not implemented; "
                    "Scan 9+ is",
  r"test_loop16_seq_none": "a Loop carrying an empty optional sequence",
}


class Backend(UnigradBackend):
  """The node tests' backend: PYTHON for small graphs, CPU for large inputs."""

  @classmethod
  def prepare(cls, model, device: str = "CPU", **kwargs) -> UnigradRep:
    size = max((math.prod(d.dim_value or 1 for d in i.type.tensor_type.shape.dim)
                for i in model.graph.input), default=0)
    return UnigradRep(OnnxModel(model, device="CPU" if size > LARGE_INPUT else "PYTHON",
                                jit=False))


backend_test = BackendTest(Backend, __name__)
for pattern in EXCLUDED: backend_test.exclude(pattern)
globals().update(backend_test.test_cases)


def test_docs_list_every_exclusion():
  doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "onnx.md").read_text()
  missing = [p for p in EXCLUDED if f"`{p}`" not in doc]
  assert not missing, f"docs/onnx.md does not list {missing}"
  assert all(re.compile(p) for p in EXCLUDED)
