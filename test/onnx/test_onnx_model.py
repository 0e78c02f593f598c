"""unigrad.onnx's model API on small graphs built with onnx.helper: results against
onnxruntime, the function/TinyJit path, static inputs, and the errors for bad models and inputs.
Few distinct kernels, tiny shapes: this file runs in the default suite."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from unigrad import Tensor  # noqa: E402
from unigrad.onnx import OnnxError, OnnxModel  # noqa: E402
from unigrad.onnx.backend import UnigradBackend  # noqa: E402
from unigrad.onnx.cli import main as cli_main  # noqa: E402


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
  graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, dt, shape):
  return helper.make_tensor_value_info(name, dt, shape)


def linear_model():
  w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
  nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"]),
           helper.make_node("Relu", ["y0"], ["y"])]
  return make_model(nodes, [vi("x", TensorProto.FLOAT, [2, 4])], [vi("y", TensorProto.FLOAT,
                                                                     [2, 3])],
                    [onnx.numpy_helper.from_array(w, "w")]), w


def test_model_runs_and_matches_numpy():
  proto, w = linear_model()
  model = OnnxModel(proto, device="PYTHON")
  x = np.array([[1, -2, 3, 4], [-1, 0, 2, -3]], np.float32)
  out = model(x=x)["y"]
  np.testing.assert_allclose(out.numpy(), np.maximum(x @ w, 0), rtol=1e-6)


def test_model_accepts_bytes_path_and_tensor_inputs(tmp_path):
  proto, w = linear_model()
  path = tmp_path / "m.onnx"
  onnx.save(proto, str(path))
  x = np.ones((2, 4), np.float32)
  for src in (proto.SerializeToString(), str(path), path):
    out = OnnxModel(src, device="PYTHON")({"x": Tensor(x, device="PYTHON")})["y"]
    np.testing.assert_allclose(out.numpy(), np.maximum(x @ w, 0), rtol=1e-6)


def test_second_call_replays_without_tracing():
  proto, w = linear_model()
  model = OnnxModel(proto, device="PYTHON")
  xs = [np.full((2, 4), float(i), np.float32) for i in range(4)]
  for x in xs:
    np.testing.assert_allclose(model(x=x)["y"].numpy(), np.maximum(x @ w, 0), rtol=1e-6)
  assert model._fn.trace_count == 1  # one trace; later calls replay the jit's capture


def test_static_shape_input_is_read_as_numbers():
  nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [2, 3]), vi("s", TensorProto.INT64, [2])],
                     [vi("y", TensorProto.FLOAT, None)])
  model = OnnxModel(proto, device="PYTHON")
  assert "s" in model.static
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  assert model(x=x, s=np.array([3, 2]))["y"].numpy().shape == (3, 2)
  assert model(x=x, s=np.array([1, 6]))["y"].numpy().shape == (1, 6)


def test_if_with_computed_condition_selects():
  then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                           [vi("t", TensorProto.FLOAT, [3])])
  other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                            [vi("e", TensorProto.FLOAT, [3])])
  nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
           helper.make_node("Greater", ["s", "zero"], ["c"]),
           helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
  zero = onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [3])], [vi("y", TensorProto.FLOAT, [3])],
                     [zero])
  model = OnnxModel(proto, device="PYTHON")
  for x in ([1, 2, -1], [-3, 1, 1]):
    a = np.array(x, np.float32)
    want = -a if a.sum() > 0 else np.abs(a)
    np.testing.assert_allclose(model(x=a)["y"].numpy(), want)


def test_matches_onnxruntime_on_a_small_cnn():
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(0)
  w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
           helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2]),
           helper.make_node("Flatten", ["p"], ["f"]),
           helper.make_node("Softmax", ["f"], ["y"], axis=-1)]
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                     [vi("y", TensorProto.FLOAT, None)], [onnx.numpy_helper.from_array(w, "w")])
  x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
  ref = ort.InferenceSession(proto.SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  np.testing.assert_allclose(OnnxModel(proto, device="PYTHON")(x=x)["y"].numpy(), ref,
                             rtol=1e-5, atol=1e-6)


def test_backend_runs_a_node():
  proto, w = linear_model()
  (y,) = UnigradBackend.run_model(proto, [np.ones((2, 4), np.float32)])
  np.testing.assert_allclose(y, np.maximum(np.ones((2, 4)) @ w, 0), rtol=1e-6)


# ---- bad input ----

def test_unsupported_operator_raises_at_load_naming_the_node():
  nodes = [helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")]
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, [1])])
  with pytest.raises(OnnxError, match=r"NoSuchOp \(domain ai.onnx, opset 17, node 'mystery'\)"):
    OnnxModel(proto, device="PYTHON")


def test_unsupported_attribute_value_raises_at_load():
  nodes = [helper.make_node("Pad", ["x", "p"], ["y"], mode="mirror", name="pad0")]
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [2]), vi("p", TensorProto.INT64, [2])],
                     [vi("y", TensorProto.FLOAT, None)])
  with pytest.raises(OnnxError, match="Pad .*'pad0'.*mode 'mirror'"):
    OnnxModel(proto, device="PYTHON")


def test_wrong_inputs_raise_naming_the_input():
  model = OnnxModel(linear_model()[0], device="PYTHON")
  with pytest.raises(OnnxError, match="unknown input 'z'"):
    model(z=np.ones((2, 4), np.float32))
  with pytest.raises(OnnxError, match="missing input 'x'"):
    model()
  with pytest.raises(OnnxError, match="input 'x' has shape \\(3, 4\\)"):
    model(x=np.ones((3, 4), np.float32))
  with pytest.raises(OnnxError, match="input 'x' has dtype dtypes.int"):
    model(x=np.ones((2, 4), np.int32))


def test_truncated_file_raises_naming_the_file(tmp_path):
  path = tmp_path / "bad.onnx"
  path.write_bytes(linear_model()[0].SerializeToString()[:40])
  with pytest.raises(OnnxError, match="bad.onnx"):
    OnnxModel(str(path), device="PYTHON")
  text = tmp_path / "text.onnx"
  text.write_text("not a model at all")
  with pytest.raises(OnnxError, match="text.onnx"):
    OnnxModel(str(text), device="PYTHON")


def test_cli_prints_and_runs(tmp_path, capsys):
  path = tmp_path / "m.onnx"
  onnx.save(linear_model()[0], str(path))
  assert cli_main([str(path), "--device", "PYTHON", "--runs", "1"]) == 0
  out = capsys.readouterr().out
  assert "input  x: dtypes.float [2x4]" in out and "y: shape (2, 3)" in out


def test_new_shapes_trace_again_through_a_subgraph():
  then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                           [vi("t", TensorProto.FLOAT, None)])
  other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                            [vi("e", TensorProto.FLOAT, None)])
  nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
           helper.make_node("Greater", ["s", "zero"], ["c"]),
           helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
  zero = onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, ["n"])], [vi("y", TensorProto.FLOAT,
                                                                     None)], [zero])
  model = OnnxModel(proto, device="PYTHON")
  for x in ([1, 2, -1], [-3, 1, 1, 0.5], [2, 2]):
    a = np.array(x, np.float32)
    np.testing.assert_allclose(model(x=a)["y"].numpy(), -a if a.sum() > 0 else np.abs(a))


@pytest.mark.parametrize("k", [3, 1])
def test_a_convolution_weight_is_laid_out_once_at_load(k):
  # stored (cout, cin, kh, kw), the weight was copied to the kernel's (cin, kh, kw, cout) layout
  # by a transposing kernel at every call; an initializer is stored so at load instead
  rng = np.random.default_rng(0)
  w = rng.standard_normal((16, 8, k, k)).astype(np.float32)
  pad = k // 2
  nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4)]
  proto = make_model(nodes, [vi("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                     [vi("y", TensorProto.FLOAT, None)], [onnx.numpy_helper.from_array(w, "w")])
  model = OnnxModel(proto, device="PYTHON")
  x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
  for _ in range(3): y = model(x=x)["y"].numpy()
  kernels = [r.name for r in model._jit.captured.executor.runners if r is not None]
  # the padded input (read without bounds checks) and the convolution: no copy of the weight
  assert len(kernels) == 1 + (pad > 0) and kernels[-1].startswith("r_"), kernels
  torch = pytest.importorskip("torch")
  want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=pad).numpy()
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
