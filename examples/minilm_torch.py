"""all-MiniLM-L6-v2 in plain PyTorch (functional, no transformers): the reference that the MiniLM
test and bench/models.py compare examples/minilm.py with.

`torch_embed(weights, cfg, ids, mask, types)` runs BERT's embeddings, its post-LayerNorm encoder
layers with a padding mask (exact gelu), mean pooling over the real tokens and L2 normalization,
as sentence-transformers does; `weights` is the checkpoint's state dict of torch tensors.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's usual name)

StateDict = dict[str, torch.Tensor]


def _linear(x: torch.Tensor, sd: StateDict, name: str) -> torch.Tensor:
  return F.linear(x, sd[f"{name}.weight"], sd[f"{name}.bias"])


def _layernorm(x: torch.Tensor, sd: StateDict, name: str, eps: float) -> torch.Tensor:
  return F.layer_norm(x, x.shape[-1:], sd[f"{name}.weight"], sd[f"{name}.bias"], eps)


def _attention(x: torch.Tensor, sd: StateDict, p: str, heads: int,
               keep: torch.Tensor) -> torch.Tensor:
  b, t, c = x.shape

  def proj(name: str) -> torch.Tensor:
    return _linear(x, sd, f"{p}.{name}").reshape(b, t, heads, c // heads).transpose(1, 2)
  scores = proj("query") @ proj("key").transpose(-1, -2) / math.sqrt(c // heads)
  probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
  return (probs @ proj("value")).transpose(1, 2).reshape(b, t, c)


def bert_layer(x: torch.Tensor, sd: StateDict, p: str, heads: int, eps: float,
               keep: torch.Tensor) -> torch.Tensor:
  """One encoder layer `p` (e.g. "encoder.layer.0"); `keep` (b, 1, 1, t) masks the keys."""
  ctx = _linear(_attention(x, sd, f"{p}.attention.self", heads, keep), sd,
                f"{p}.attention.output.dense")
  h = _layernorm(ctx + x, sd, f"{p}.attention.output.LayerNorm", eps)
  inter = F.gelu(_linear(h, sd, f"{p}.intermediate.dense"))
  return _layernorm(_linear(inter, sd, f"{p}.output.dense") + h, sd, f"{p}.output.LayerNorm", eps)


def torch_embed(sd: StateDict, cfg: Any, ids: torch.Tensor, mask: torch.Tensor,
                types: torch.Tensor | None = None) -> torch.Tensor:
  """(batch, hidden) unit-norm sentence embeddings of int64 (batch, seq) token ids."""
  if types is None: types = torch.zeros_like(ids)
  x = (sd["embeddings.word_embeddings.weight"][ids] +
       sd["embeddings.position_embeddings.weight"][:ids.shape[1]][None] +
       sd["embeddings.token_type_embeddings.weight"][types])
  x = _layernorm(x, sd, "embeddings.LayerNorm", cfg.layer_norm_eps)
  keep = mask.bool()[:, None, None, :]
  for i in range(cfg.num_hidden_layers):
    x = bert_layer(x, sd, f"encoder.layer.{i}", cfg.num_attention_heads, cfg.layer_norm_eps, keep)
  m = mask[..., None].to(x.dtype)
  pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
  return F.normalize(pooled, p=2, dim=1)
