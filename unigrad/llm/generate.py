"""Generation: the prompt prefilled in one pass, then one token per step under TinyJit.

The decode step takes the position as a bound `Variable`, so the kernels captured on its second
call serve every later position (no recompile, no recapture: the position is a launch
argument). Greedy decoding takes the argmax on the device, in the same captured step, and reads
back one id (reading 49152 logits into a Python list and scanning it took a seventh of a
SmolLM2 step); sampling (temperature, top-k, top-p) runs on the host over the last logits, with
a `random.Random` seeded per request: the same seed gives the same tokens.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from unigrad.dtype import dtypes
from unigrad.frontend.jit import TinyJit
from unigrad.frontend.tensor import Tensor
from unigrad.llm.model import Transformer
from unigrad.uop import UOp
from unigrad.uop.variable import Variable

__all__ = ["SamplingParams", "Generator", "sample", "prefill_bucket", "PREFILL_BUCKET"]


@dataclass(frozen=True)
class SamplingParams:
  """How to pick each token: temperature 0 is greedy; top_k 0 and top_p 1 keep every token."""
  max_tokens: int = 128
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int | None = None
  stop_ids: frozenset[int] = field(default_factory=frozenset)

  def __post_init__(self) -> None:
    if self.max_tokens < 1:
      raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
    if self.temperature < 0: raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0: raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1: raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sample(logits: list[float], params: SamplingParams, rng: random.Random) -> int:
  """The next token from one position's logits."""
  best = max(range(len(logits)), key=logits.__getitem__)
  if params.temperature == 0: return best
  order = sorted(range(len(logits)), key=logits.__getitem__, reverse=True)
  if params.top_k: order = order[:params.top_k]
  top = logits[best]
  weights = [math.exp((logits[i] - top) / params.temperature) for i in order]
  if params.top_p < 1:
    total, acc, keep = sum(weights), 0.0, 0
    while keep < len(order) and acc < params.top_p * total:
      acc += weights[keep]
      keep += 1
    order, weights = order[:keep], weights[:keep]
  return rng.choices(order, weights)[0]


# prompts are padded to a bucket's length, so that a few compiled prefills serve every length
# (each new length compiled its own kernels: about 12 s cold for SmolLM2): the next power of two
# up to PREFILL_BUCKET, then multiples of it. The padding is causal-masked away from the real
# tokens, and the keys and values it writes past the prompt are overwritten by the decode steps
# before any position reads them.
PREFILL_BUCKET = 256


def prefill_bucket(n: int) -> int:
  """The padded length of an n-token prompt."""
  if n <= PREFILL_BUCKET: return 1 << (n - 1).bit_length()
  return -(-n // PREFILL_BUCKET) * PREFILL_BUCKET


class Generator:
  """Generates tokens from a model: `for tok in Generator(model).generate(ids, params): ...`.
  One conversation at a time: each call starts from position 0 (the prompt is the history)."""

  def __init__(self, model: Transformer) -> None:
    self.model = model
    # the variable is the length attended over (position + 1): the cache is read as [0, end), a
    # plain variable size whose index arithmetic folds (end = start_pos + 1 kept a division)
    self.length = Variable("end", 2, model.max_context)
    self.decode_step = TinyJit(self._decode)
    self.greedy_step = TinyJit(self._greedy)
    self.last = Variable("last", 0, model.max_context - 1)  # a padded prompt's last token

  def _decode(self, token: Tensor, end: UOp) -> Tensor:
    return self.model(token, end - 1, last_only=True).realize()

  def _greedy(self, token: Tensor, end: UOp) -> Tensor:
    return self.model(token, end - 1, last_only=True).argmax(-1).realize()

  def _prefill(self, prompt: list[int]) -> Tensor:
    """The prompt's last logits (1, vocab), lazy; the keys and values it writes are pending."""
    if not prompt: raise ValueError("the prompt has no tokens")
    if len(prompt) >= self.model.max_context:
      raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds "
                       f"{self.model.max_context} (prompt and generated tokens together)")
    n = len(prompt)
    padded = min(prefill_bucket(n), self.model.max_context)
    tokens = Tensor([prompt + [0] * (padded - n)], dtype=dtypes.int32)
    last = self.last.bind(n - 1)
    return self.model(tokens, 0, last_only=True, last=last)

  def prefill(self, prompt: list[int]) -> list[float]:
    """Run the prompt through the model (writing its keys and values); the last logits."""
    return self._prefill(prompt).tolist()[0]

  def prefill_greedy(self, prompt: list[int]) -> int:
    """`prefill`, then the id of the largest logit (the first of equals), found on the device."""
    return int(self._prefill(prompt).argmax(-1).item())

  def decode(self, token: int, pos: int) -> list[float]:
    """One token at position `pos` (the positions before it are in the cache): its logits."""
    tokens = Tensor([[token]], dtype=dtypes.int32)
    return self.decode_step(tokens, self.length.bind(pos + 1)).tolist()[0]

  def decode_greedy(self, token: int, pos: int) -> int:
    """`decode`, then the id of the largest logit (the first of equals), found on the device:
    one id read back instead of the logits."""
    tokens = Tensor([[token]], dtype=dtypes.int32)
    return int(self.greedy_step(tokens, self.length.bind(pos + 1)).item())

  def generate(self, prompt: list[int], params: SamplingParams) -> Iterator[int]:
    """The generated tokens, one at a time, until a stop token, `max_tokens` or a full context."""
    rng, greedy, pos = random.Random(params.seed), params.temperature == 0, len(prompt)
    tok = self.prefill_greedy(prompt) if greedy else sample(self.prefill(prompt), params, rng)
    for n in range(1, params.max_tokens + 1):
      yield tok
      # no decode step after the last token: its logits would go unread
      if tok in params.stop_ids or n == params.max_tokens or pos >= self.model.max_context: return
      tok = (self.decode_greedy(tok, pos) if greedy
             else sample(self.decode(tok, pos), params, rng))
      pos += 1
