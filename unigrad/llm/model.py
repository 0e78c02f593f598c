"""A llama-family decoder (llama, SmolLM, TinyLlama, Mistral without sliding windows) written with
unigrad.nn, configured from a GGUF file's metadata and loaded from its tensors.

Layout of one block: `h = x + attention(rms_norm(x))`, `out = h + ffn(rms_norm(h))`, with
grouped-query attention (fewer key/value heads than query heads, each serving a group of query
heads), rotary position embeddings and a SwiGLU feed-forward network. The keys and values of
every position seen so far live in a preallocated cache per block (`max_context` positions); a
forward pass of `T` tokens at `start_pos` writes their keys and values at
`[start_pos, start_pos + T)` and attends over `[0, start_pos + T)`. `start_pos` may be a bound
`Variable`: one compiled program then serves every position (generate.py's decode step).

Rotary embeddings rotate adjacent pairs `(x[2i], x[2i+1])`: GGUF files store the query and key
weights of llama models permuted for that form (llama.cpp's "normal" rope), where the Hugging
Face checkpoints they come from rotate the halves of each head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import dtypes
from unigrad.frontend.tensor import Tensor
from unigrad.nn.layers import RMSNorm, embedding
from unigrad.nn.quantized import PackedWeight, Weight, as_tensor, fuse_rows, linear, packed_weight
from unigrad.nn.tensor_io import FormatError
from unigrad.uop import UOp

__all__ = ["LlamaConfig", "Transformer"]

ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class LlamaConfig:
  """The shape of a llama-family model, as its GGUF metadata gives it."""
  n_layers: int
  dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  vocab_size: int
  context_length: int
  rope_base: float
  rope_scale: float  # positions are divided by it (linear RoPE scaling; 1: none)
  norm_eps: float
  tied_output: bool  # the output head is the token embedding

  @staticmethod
  def from_gguf(kv: dict[str, Any], weights: dict[str, Tensor], source: str) -> LlamaConfig:
    """The configuration of the model in a GGUF file (`kv` its metadata, `weights` its tensors);
    FormatError naming `source` and the field for an architecture or a field that is not here."""
    arch = kv.get("general.architecture")
    if arch not in ARCHITECTURES:
      raise FormatError(f"{source}: general.architecture is {arch!r}; supported: "
                        f"{', '.join(ARCHITECTURES)}")

    def field(name: str, default: Any = None) -> Any:
      value = kv.get(f"{arch}.{name}", default)
      if value is None: raise FormatError(f"{source}: metadata field {arch}.{name} is missing")
      return value
    dim, n_heads = int(field("embedding_length")), int(field("attention.head_count"))
    if "token_embd.weight" not in weights:
      raise FormatError(f"{source}: tensor token_embd.weight is missing")
    vocab = int(weights["token_embd.weight"].shape[0])
    scaling = kv.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
      raise FormatError(f"{source}: {arch}.rope.scaling.type {scaling!r} is not supported "
                        "(none, linear)")
    scale = float(kv.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
    cfg = LlamaConfig(
      n_layers=int(field("block_count")), dim=dim, n_heads=n_heads,
      n_kv_heads=int(field("attention.head_count_kv", n_heads)),
      head_dim=int(field("rope.dimension_count", dim // n_heads)),
      ffn_dim=int(field("feed_forward_length")), vocab_size=vocab,
      context_length=int(field("context_length")), rope_base=float(field("rope.freq_base", 1e4)),
      rope_scale=scale, norm_eps=float(field("attention.layer_norm_rms_epsilon", 1e-5)),
      tied_output="output.weight" not in weights)
    if cfg.n_heads % cfg.n_kv_heads or cfg.head_dim % 2:
      raise FormatError(f"{source}: {cfg.n_heads} query heads over {cfg.n_kv_heads} key/value "
                        f"heads of size {cfg.head_dim}: the heads must split evenly, the size "
                        "be even")
    return cfg


def rope_tables(cfg: LlamaConfig, n: int) -> tuple[Tensor, Tensor]:
  """cos and sin of every position's rotation angles: (n, head_dim / 2) each, realized."""
  half = cfg.head_dim // 2
  inv = Tensor([cfg.rope_base ** (-2 * i / cfg.head_dim) for i in range(half)])
  angles = (Tensor.arange(n).float() / cfg.rope_scale).reshape(n, 1) * inv.reshape(1, half)
  cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
  Tensor.realize_all(cos, sin)
  return cos, sin


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
  """Rotary embedding of x (B, T, H, D) by angle tables (T, D / 2): adjacent pairs rotated."""
  b, t, h, d = x.shape
  pairs = x.reshape(b, t, h, d // 2, 2)
  x0, x1 = pairs[..., 0], pairs[..., 1]
  c, s = cos.reshape(1, t, 1, d // 2), sin.reshape(1, t, 1, d // 2)
  return (x0 * c - x1 * s).stack(x0 * s + x1 * c, dim=-1).reshape(b, t, h, d)


class Attention:
  """Grouped-query self-attention with a key/value cache of `max_context` positions."""

  def __init__(self, cfg: LlamaConfig, max_context: int, batch: int) -> None:
    self.cfg = cfg
    # keys (0) and values (1) in one buffer, written by one kernel (one realize) per step;
    # realized by the Transformer
    self.cache_kv = Tensor.zeros(2, batch, max_context, cfg.n_kv_heads, cfg.head_dim).contiguous()
    self.wq: Weight = Tensor.empty(0)
    self.wk: Weight = Tensor.empty(0)
    self.wv: Weight = Tensor.empty(0)
    self.wo: Weight = Tensor.empty(0)
    # q, k and v stacked along their rows where they are packed alike (wq, wk, wv then view it):
    # one matvec, one launch and one graph for the three projections
    self.wqkv: PackedWeight | None = None

  def __call__(self, x: Tensor, start_pos: int | UOp, cos: Tensor, sin: Tensor) -> Tensor:
    cfg = self.cfg
    b, t, _ = x.shape
    # the projections are materialized before the rotation reads each output twice (fused, a
    # pair's two dot products would be computed for each of its two outputs), and before the
    # cache write reads v as (heads, head_dim): a matmul storing into two output axes is tiled
    # with its weight read across rows (a packed Q4_1 wv: 20x slower than with one axis)
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    if self.wqkv is not None:
      qkv = linear(x, self.wqkv).contiguous()
      q, k, v = qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]
    else:
      q, k, v = (linear(x, w).contiguous() for w in (self.wq, self.wk, self.wv))
    q = q.reshape(b, t, cfg.n_heads, cfg.head_dim)
    k, v = (a.reshape(b, t, cfg.n_kv_heads, cfg.head_dim) for a in (k, v))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    end = start_pos + t
    self.cache_kv[:, :b, start_pos:end].assign(k.stack(v))
    keys, values = self.cache_kv[0, :b, 0:end], self.cache_kv[1, :b, 0:end]
    mask = None if t == 1 else causal_mask(t, start_pos, end, x.device)
    out = grouped_attention(q, keys, values, mask)
    # materialized as (b, t, heads * head_dim): read through the heads' permutation, the output
    # projection's reduce index is not seen to be contiguous, and its weight is read across rows
    return linear(out.reshape(b, t, cfg.n_heads * cfg.head_dim).contiguous(), self.wo)


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
  """softmax(q k^T / sqrt(d) + mask) v for q (B, T, H, D) and keys, values (B, L, KV, D), each
  key/value head serving H / KV query heads: the query heads are grouped (B, KV, H/KV, T, D) and
  the keys broadcast over a group, so no axis of the cache length L is merged with another (a
  merged symbolic axis costs a division per element). Returns (B, T, H, D)."""
  b, t, h, d = q.shape
  kv, length = keys.shape[2], keys.shape[1]
  qg = q.permute(0, 2, 1, 3).reshape(b, kv, h // kv, t, d)
  k = keys.permute(0, 2, 3, 1).reshape(b, kv, 1, d, length)
  v = values.permute(0, 2, 1, 3).reshape(b, kv, 1, length, d)
  scores = (qg @ k) * (1 / math.sqrt(d))
  if mask is not None: scores = mask.where(scores, -math.inf)
  out = scores.softmax(-1) @ v
  return out.reshape(b, h, t, d).permute(0, 2, 1, 3)


def causal_mask(t: int, start_pos: int | UOp, end: int | UOp, device: str) -> Tensor:
  """(t, end) bool: query i (at position start_pos + i) sees keys at positions <= its own."""
  rows = Tensor.arange(t, device=device).reshape(t, 1) + start_pos
  return Tensor.arange(end, device=device).reshape(1, end) <= rows


class Block:
  """One transformer block: attention and a SwiGLU feed-forward network, each pre-normed."""

  def __init__(self, cfg: LlamaConfig, max_context: int, batch: int) -> None:
    self.attention = Attention(cfg, max_context, batch)
    self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
    self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
    self.w_gate: Weight = Tensor.empty(0)
    self.w_up: Weight = Tensor.empty(0)
    self.w_down: Weight = Tensor.empty(0)
    self.w_gate_up: PackedWeight | None = None  # gate and up stacked, as Attention.wqkv

  def __call__(self, x: Tensor, start_pos: int | UOp, cos: Tensor, sin: Tensor) -> Tensor:
    # the normed inputs are made contiguous: fused into the projections, the norm's reduction
    # would be computed again for every output element
    h = x + self.attention(self.attention_norm(x).contiguous(), start_pos, cos, sin)
    n = self.ffn_norm(h).contiguous()
    # gate and up are materialized (stacked: one matvec) before the product reads them; the
    # gate apart is materialized before the up projection reads it: fused, the two matvecs are
    # sibling reductions of one kernel, and only one of them gets the vector partial sums
    # (SmolLM2: 1.9 ms per block where the two apart take 0.3)
    if self.w_gate_up is not None:
      gate_up = linear(n, self.w_gate_up).contiguous()
      f = self.w_gate_up.shape[0] // 2
      gate, up = gate_up[..., :f], gate_up[..., f:]
    else: gate, up = linear(n, self.w_gate).contiguous(), linear(n, self.w_up)
    # the product materialized: the int8 matvec's three quantization kernels (and a prompt's
    # matmul tiles) would each compute its exp again
    return h + linear((gate.silu() * up).contiguous(), self.w_down)


class Transformer:
  """A llama-family decoder. `Transformer.from_gguf(path)` builds and loads one;
  `model(tokens, start_pos)` gives the logits of every position of `tokens` (B, T)."""

  def __init__(self, cfg: LlamaConfig, max_context: int | None = None, batch: int = 1) -> None:
    self.cfg = cfg
    self.max_context = min(max_context or cfg.context_length, cfg.context_length)
    self.layers = [Block(cfg, self.max_context, batch) for _ in range(cfg.n_layers)]
    self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
    self.tok_embeddings: Weight = Tensor.empty(0)
    self.output: Weight = self.tok_embeddings
    self.cos, self.sin = rope_tables(cfg, self.max_context)
    # one realize for every cache (a realize walks the live lazy graphs: a GGUF's weights are)
    Tensor.realize_all(*(blk.attention.cache_kv for blk in self.layers))

  @staticmethod
  def from_gguf(path: str, max_context: int | None = None, batch: int = 1,
                packed: bool = True) -> Transformer:
    """The model in a llama-architecture GGUF file. `packed` (the default): quantized weights
    stay in their blocks (`gguf_load(dequantize=False)`), dequantized in registers by the
    kernels that read them; else dequantized to float32 at load."""
    from unigrad.nn.gguf import gguf_load  # noqa: PLC0415 (the GGUF reader is only needed here)
    kv, weights = gguf_load(path, dequantize=not packed)
    model = Transformer(LlamaConfig.from_gguf(kv, weights, str(path)), max_context, batch)
    model.load_gguf_weights(weights, str(path))
    model.metadata = kv
    return model

  def load_gguf_weights(self, weights: dict[str, Tensor], source: str) -> None:
    """Take the tensors of a GGUF file (llama.cpp's names), each realized in a buffer of its own,
    except packed weights (`gguf_load(dequantize=False)`), kept as their parts (PackedWeight):
    realizing one would write the float32 copy they exist to avoid, and a lazy Tensor would be
    walked by every realize."""
    def tensor(name: str, shape: tuple[int, ...]) -> Tensor:
      if name not in weights: raise FormatError(f"{source}: tensor {name} is missing")
      w = weights[name]
      if tuple(w.shape) != shape:
        raise FormatError(f"{source}: tensor {name} has shape {tuple(w.shape)}, expected {shape}")
      return w

    def get(name: str, shape: tuple[int, ...]) -> Weight:
      w = tensor(name, shape)
      pw = packed_weight(w)
      if pw is not None: return pw
      loaded.append(w := w.cast(dtypes.float32).contiguous())
      return w

    def norm(name: str, dim: int) -> Tensor:
      loaded.append(w := tensor(name, (dim,)).cast(dtypes.float32).contiguous())
      return w
    cfg, loaded = self.cfg, list[Tensor]()
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    self.tok_embeddings = get("token_embd.weight", (cfg.vocab_size, cfg.dim))
    self.output = self.tok_embeddings if cfg.tied_output else \
      get("output.weight", (cfg.vocab_size, cfg.dim))
    self.norm.weight = norm("output_norm.weight", cfg.dim)
    for i, blk in enumerate(self.layers):
      p, att = f"blk.{i}.", blk.attention
      att.wq = get(p + "attn_q.weight", (q, cfg.dim))
      att.wk = get(p + "attn_k.weight", (kv, cfg.dim))
      att.wv = get(p + "attn_v.weight", (kv, cfg.dim))
      att.wo = get(p + "attn_output.weight", (cfg.dim, q))
      blk.attention_norm.weight = norm(p + "attn_norm.weight", cfg.dim)
      blk.ffn_norm.weight = norm(p + "ffn_norm.weight", cfg.dim)
      blk.w_gate = get(p + "ffn_gate.weight", (cfg.ffn_dim, cfg.dim))
      blk.w_up = get(p + "ffn_up.weight", (cfg.ffn_dim, cfg.dim))
      blk.w_down = get(p + "ffn_down.weight", (cfg.dim, cfg.ffn_dim))
    Tensor.realize_all(*loaded)
    # each layer's q, k, v and its gate, up stacked where they are packed alike, in one realize
    groups = [ws for blk in self.layers for ws in ((blk.attention.wq, blk.attention.wk,
                                                    blk.attention.wv), (blk.w_gate, blk.w_up))]
    fused = fuse_rows(groups)
    f = cfg.ffn_dim
    for blk, qkv, gate_up in zip(self.layers, fused[0::2], fused[1::2]):
      att = blk.attention
      if qkv is not None:
        att.wqkv, att.wq, att.wk, att.wv = qkv, qkv.rows(0, q), qkv.rows(q, q + kv), \
          qkv.rows(q + kv, q + 2 * kv)
      if gate_up is not None:
        blk.w_gate_up, blk.w_gate, blk.w_up = gate_up, gate_up.rows(0, f), gate_up.rows(f, 2 * f)

  def __call__(self, tokens: Tensor, start_pos: int | UOp = 0, last_only: bool = False,
               last: int | UOp = -1) -> Tensor:
    """Logits (B, T, vocab) for `tokens` (B, T) at positions start_pos...; `last_only`: those
    of one position only (B, vocab), what generation reads: index `last` of `tokens` (the
    last one by default; a prompt padded to a bucket's length reads its own last token, as a
    bound Variable so that every length of the bucket runs the same kernels)."""
    _, t = tokens.shape
    x = embedding(tokens, as_tensor(self.tok_embeddings))
    cos, sin = self.cos[start_pos:start_pos + t], self.sin[start_pos:start_pos + t]
    # each block's output is realized: the cache writes of the next block run at once (a slice
    # write, frontend/writes.py), and the graph they compute stops at this buffer
    for blk in self.layers: x = blk(x, start_pos, cos, sin).realize()
    if last_only:
      x = x[:, last] if isinstance(last, int) else x[:, last:last + 1].reshape(-1, x.shape[2])
    # the logits' activations in two int8 passes (about 15 bits): in one (7 bits, as the
    # blocks' matvecs take them, and llama.cpp its head's) SmolLM2's first answer to "What is
    # the capital of France?" moved from " The" to " L'Étoile", two tokens 0.08 apart. The
    # normed input is materialized, as in Block
    return linear(self.norm(x).contiguous(), self.output, int8_passes=2)
