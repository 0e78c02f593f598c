"""Real models from PyPI packages against onnxruntime (the onnx_backend group: run with
`python -m pytest -m onnx_backend test/onnx`; CI installs the packages with --no-deps).

magika 1.0.3 (content-type classifier, int32 bytes), nudenet 3.4.2 (YOLOv8n-style detector,
boxes within 1e-3), silero-vad 6.2.3 (every ONNX variant, streamed over 512-sample chunks of a
10 s signal with the recurrent state carried between calls, probabilities within 1e-5)."""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from unigrad.onnx import OnnxModel  # noqa: E402

pytestmark = pytest.mark.onnx_backend


def package_file(package: str, *parts: str) -> pathlib.Path:
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None:
    pytest.skip(f"{package} is not installed (pip install --no-deps {package})")
  path = pathlib.Path(spec.origin).parent.joinpath(*parts)
  if not path.exists(): pytest.skip(f"{path} is missing")
  return path


def session(path: pathlib.Path) -> ort.InferenceSession:
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 2
  return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("batch", [1, 3])
def test_magika_matches_onnxruntime(batch):
  path = package_file("magika", "models", "standard_v3_3", "model.onnx")
  rng = np.random.default_rng(batch)
  x = rng.integers(0, 257, (batch, 2048)).astype(np.int32)
  ref = session(path).run(None, {"bytes": x})[0]
  model = OnnxModel(path)
  for _ in range(3):  # eager, capture, replay
    out = model(bytes=x)["target_label"].numpy()
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-4)


def test_nudenet_matches_onnxruntime():
  path = package_file("nudenet", "320n.onnx")
  rng = np.random.default_rng(0)
  x = rng.random((1, 3, 320, 320), dtype=np.float32)
  ref = session(path).run(None, {"images": x})[0]
  out = OnnxModel(path)(images=x)["output0"].numpy()
  np.testing.assert_allclose(out[:, :4], ref[:, :4], atol=1e-3)  # box coordinates
  np.testing.assert_allclose(out[:, 4:], ref[:, 4:], atol=1e-4)  # class scores


SILERO = ["silero_vad.onnx", "silero_vad_16k_op15.onnx", "silero_vad_16k_sequence.onnx",
          "silero_vad_half.onnx", "silero_vad_op18_ifless.onnx", "silero_vad_openvino_16k.onnx"]


def _signal(seconds: float = 10.0, rate: int = 16000) -> np.ndarray:
  rng = np.random.default_rng(0)
  t = np.arange(int(seconds * rate)) / rate
  voiced = (np.sin(2 * np.pi * 0.3 * t) > 0).astype(np.float32)  # speech-like bursts
  tone = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
  return (voiced * tone + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.mark.parametrize("name", SILERO)
def test_silero_vad_streams_like_onnxruntime(name):
  """Stream 512-sample chunks (with the 64-sample context the 576-wide variants take) and carry
  each variant's recurrent state (state, or h and c) from call to call, on both sides."""
  path = package_file("silero_vad", "data", name)
  sess = session(path)
  inputs = {i.name: i for i in sess.get_inputs()}
  width = inputs["input"].shape[-1]
  context = width - 512 if isinstance(width, int) else 0
  model = OnnxModel(path)
  states = [k for k in ("state", "h", "c") if k in inputs]
  shapes = {"state": (2, 1, 128), "h": (1, 1, 128), "c": (1, 1, 128)}
  ref_state = {k: np.zeros(shapes[k], np.float32) for k in states}
  our_state: dict = dict(ref_state)
  audio = np.concatenate([np.zeros(context, np.float32), _signal()])
  outs_ref = [o.name for o in sess.get_outputs()]
  for c in range(160000 // 512):
    x = audio[c * 512:c * 512 + 512 + context].reshape(1, -1)
    feeds = {"input": x, **({"sr": np.array(16000, np.int64)} if "sr" in inputs else {})}
    ref = dict(zip(outs_ref, sess.run(None, {**feeds, **ref_state})))
    out = model({**feeds, **our_state})
    np.testing.assert_allclose(out[outs_ref[0]].numpy().astype(np.float32).reshape(-1),
                               ref[outs_ref[0]].astype(np.float32).reshape(-1), atol=1e-5,
                               err_msg=f"{name}, chunk {c}")
    for k, o in zip(states, outs_ref[1:]):
      ref_state[k], our_state[k] = ref[o], out[o]


def test_silero_vad_second_batch_size_traces_again():
  """Regression: the first trace's tensors stayed alive in the If node's subgraph scope, and
  the trace of a second batch size raised FunctionError (they looked written)."""
  path = package_file("silero_vad", "data", "silero_vad.onnx")
  sess, model = session(path), OnnxModel(path)
  rng = np.random.default_rng(0)
  for batch in (1, 3, 1):
    feeds = {"input": rng.standard_normal((batch, 512)).astype(np.float32) * 0.1,
             "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)}
    np.testing.assert_allclose(model(feeds)["output"].numpy(), sess.run(None, feeds)[0],
                               atol=1e-5)
