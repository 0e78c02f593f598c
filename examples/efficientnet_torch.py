"""EfficientNet-Lite0 in plain torch.nn: the reference that the EfficientNet test and
bench/models.py compare examples/efficientnet.py with.

The lukemelas EfficientNet-PyTorch layout (`_conv_stem`, `_bn0`, `_blocks.N.*`, `_conv_head`,
`_bn1`, `_fc`), so the packaged checkpoint loads with `load_state_dict(torch.load(path))`; SAME
padding is computed from each input as lukemelas' dynamic-padding convolution does.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's usual name)
from torch import nn


class SameConv2d(nn.Conv2d):
  """Conv2d with TensorFlow's SAME padding (the odd pixel after) for the input's size."""

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    pads: list[int] = []
    for size, k, s in zip(x.shape[:1:-1], self.kernel_size[::-1], self.stride[::-1]):
      total = max((-(-size // s) - 1) * s + k - size, 0)
      pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), self.weight, None, self.stride, 0, 1, self.groups)


class MBConvBlock(nn.Module):
  def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int,
               eps: float) -> None:
    super().__init__()
    mid, self.residual = c_in * expand, stride == 1 and c_in == c_out
    self.expand = expand != 1
    if self.expand:
      self._expand_conv = SameConv2d(c_in, mid, 1, bias=False)
      self._bn0 = nn.BatchNorm2d(mid, eps=eps)
    self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid, bias=False)
    self._bn1 = nn.BatchNorm2d(mid, eps=eps)
    self._project_conv = SameConv2d(mid, c_out, 1, bias=False)
    self._bn2 = nn.BatchNorm2d(c_out, eps=eps)

  def forward(self, inputs: torch.Tensor) -> torch.Tensor:
    x = F.relu6(self._bn0(self._expand_conv(inputs))) if self.expand else inputs
    x = F.relu6(self._bn1(self._depthwise_conv(x)))
    x = self._bn2(self._project_conv(x))
    return x + inputs if self.residual else x


class EfficientNetLite0(nn.Module):
  """`stages`: (repeats, kernel, stride, expand, c_in, c_out) per stage, as the STAGES of
  examples/efficientnet.py."""

  def __init__(self, stages: Sequence[tuple[int, int, int, int, int, int]], eps: float) -> None:
    super().__init__()
    self._conv_stem = SameConv2d(3, 32, 3, 2, bias=False)
    self._bn0 = nn.BatchNorm2d(32, eps=eps)
    blocks = [MBConvBlock(c_in if i == 0 else c_out, c_out, k, s if i == 0 else 1, e, eps)
              for repeats, k, s, e, c_in, c_out in stages for i in range(repeats)]
    self._blocks = nn.ModuleList(blocks)
    self._conv_head = SameConv2d(stages[-1][-1], 1280, 1, bias=False)
    self._bn1 = nn.BatchNorm2d(1280, eps=eps)
    self._fc = nn.Linear(1280, 1000)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = F.relu6(self._bn0(self._conv_stem(x)))
    for block in self._blocks: x = block(x)
    return self._fc(F.relu6(self._bn1(self._conv_head(x))).mean((2, 3)))


def load(path: str | Path, stages: Sequence[tuple[int, int, int, int, int, int]],
         eps: float) -> EfficientNetLite0:
  """The model in eval mode with the checkpoint at `path` (strict: every key must match)."""
  model = EfficientNetLite0(stages, eps).eval()
  model.load_state_dict(torch.load(path, map_location="cpu"))
  return model
