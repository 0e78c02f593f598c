"""Generation: the prompt prefilled in one pass, then one token per step under TinyJit.

The decode step takes the position as a bound `Variable`, so the kernels captured on its second
call serve every later position (no recompile, no recapture: the position is a launch
argument). Greedy decoding takes the argmax on the device, in the same captured step, and reads
back one id (reading 49152 logits into a Python list and scanning it took a seventh of a
SmolLM2 step). Sampling from every token (top-k 0, top-p 1: the OpenAI API's default) draws on
the device too (`draw`: one uniform number from the request's generator per token); with a top-k
or a top-p it runs on the host over the last logits (sorting them: about 15-30 ms a token).
Either way a `random.Random` is seeded per request: the same seed gives the same tokens.
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

__all__ = ["SamplingParams", "Generator", "sample", "draw", "prefill_bucket", "PREFILL_BUCKET"]


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


DRAW_BLOCK = 256  # tokens per block of `draw`'s two-level search


def draw(logits: Tensor, inv_temperature: Tensor, u: Tensor) -> Tensor:
  """The id (an int32 Tensor of one element) drawn from softmax(logits * inv_temperature) at the
  uniform number `u` in [0, 1) by inverse CDF, in id order, all on the device: the weights
  exp((logit - max) * inv_temperature) summed per block of DRAW_BLOCK ids, the block where
  u * total falls, then the id within it (prefix sums of a few hundred values, never of the
  whole vocabulary). `logits` holds one position's logits; both scalars are (1,) Tensors, so a
  captured step serves every temperature."""
  x = logits.reshape(-1)
  vocab = x.shape[0]
  nb = -(-vocab // DRAW_BLOCK)
  w = ((x - x.max()) * inv_temperature).exp().pad(((0, nb * DRAW_BLOCK - vocab),))
  w = w.reshape(nb, DRAW_BLOCK)
  sums = w.sum(-1)
  upto = sums.cumsum(0)  # the mass of blocks 0..b
  r = u * upto[-1]
  b = (upto <= r).sum(dtype=dtypes.int32).minimum(nb - 1)
  pick = Tensor.arange(nb, device=x.device, dtype=dtypes.int32) == b
  row = (w * pick.reshape(nb, 1)).sum(0)
  rest = r - (pick.where(upto - sums, 0)).sum()  # u * total less the blocks before b
  i = (row.cumsum(0) <= rest).sum(dtype=dtypes.int32).minimum(DRAW_BLOCK - 1)
  return (b * DRAW_BLOCK + i).minimum(vocab - 1).reshape(1)


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
    self.draw_step = TinyJit(self._draw)
    self.prefill_step = TinyJit(self._prefill_padded)
    self.last = Variable("last", 0, model.max_context - 1)  # a padded prompt's last token

  @Tensor.no_grad()
  def _decode(self, token: Tensor, end: UOp) -> Tensor:
    return self.model(token, end - 1, last_only=True).realize()

  @Tensor.no_grad()
  def _greedy(self, token: Tensor, end: UOp) -> Tensor:
    # (the logits realized as they are: the argmax's long reduction is split in two kernels,
    # and its (256, 192) view of them, stored through, cut the head's 16 output lanes to 8)
    return self.model(token, end - 1, last_only=True).contiguous().argmax(-1).realize()

  @Tensor.no_grad()
  def _draw(self, token: Tensor, end: UOp, inv_t: Tensor, u: Tensor) -> Tensor:
    return draw(self.model(token, end - 1, last_only=True), inv_t, u).realize()

  @Tensor.no_grad()
  def _prefill_padded(self, tokens: Tensor, last: UOp) -> Tensor:
    return self.model(tokens, 0, last_only=True, last=last).realize()

  @Tensor.no_grad()  # as the steps: a jit's signature holds the grad mode
  def _prefill(self, prompt: list[int]) -> Tensor:
    """The prompt's last logits (1, vocab), realized (the keys and values written): a prompt
    padded to a bucket's length whose bucket ran before replays that prefill's captured kernels
    (a chat's or a server's prompts: 128 tokens, 0.73 s eagerly, 0.37 s of it building and
    scheduling the graph)."""
    if not prompt: raise ValueError("the prompt has no tokens")
    if len(prompt) >= self.model.max_context:
      raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds "
                       f"{self.model.max_context} (prompt and generated tokens together)")
    n = len(prompt)
    padded = min(prefill_bucket(n), self.model.max_context)
    tokens = Tensor([prompt + [0] * (padded - n)], dtype=dtypes.int32)
    return self.prefill_step(tokens, self.last.bind(n - 1))

  def prefill(self, prompt: list[int]) -> list[float]:
    """Run the prompt through the model (writing its keys and values); the last logits."""
    return self._prefill(prompt).tolist()[0]

  @Tensor.no_grad()
  def prefill_greedy(self, prompt: list[int]) -> int:
    """`prefill`, then the id of the largest logit (the first of equals), found on the device."""
    return int(self._prefill(prompt).argmax(-1).item())

  @Tensor.no_grad()
  def prefill_draw(self, prompt: list[int], temperature: float, u: float) -> int:
    """`prefill`, then the id `draw` picks at `u` from the logits at `temperature` (> 0)."""
    return int(draw(self._prefill(prompt), *self._draw_args(temperature, u)).item())

  def decode(self, token: int, pos: int) -> list[float]:
    """One token at position `pos` (the positions before it are in the cache): its logits."""
    tokens = Tensor([[token]], dtype=dtypes.int32)
    return self.decode_step(tokens, self.length.bind(pos + 1)).tolist()[0]

  def decode_greedy(self, token: int, pos: int) -> int:
    """`decode`, then the id of the largest logit (the first of equals), found on the device:
    one id read back instead of the logits."""
    tokens = Tensor([[token]], dtype=dtypes.int32)
    return int(self.greedy_step(tokens, self.length.bind(pos + 1)).item())

  def decode_draw(self, token: int, pos: int, temperature: float, u: float) -> int:
    """`decode`, then the id `draw` picks at `u` from the logits at `temperature` (> 0)."""
    tokens = Tensor([[token]], dtype=dtypes.int32)
    return int(self.draw_step(tokens, self.length.bind(pos + 1),
                              *self._draw_args(temperature, u)).item())

  def _draw_args(self, temperature: float, u: float) -> tuple[Tensor, Tensor]:
    if temperature <= 0: raise ValueError(f"drawing needs a temperature above 0, got {temperature}")
    return Tensor([1 / temperature]), Tensor([u])

  def generate(self, prompt: list[int], params: SamplingParams) -> Iterator[int]:
    """The generated tokens, one at a time, until a stop token, `max_tokens` or a full context."""
    rng, pos, t = random.Random(params.seed), len(prompt), params.temperature
    every = params.top_k == 0 and params.top_p == 1  # drawn from every token: on the device
    if t == 0: tok = self.prefill_greedy(prompt)
    elif every: tok = self.prefill_draw(prompt, t, rng.random())
    else: tok = sample(self.prefill(prompt), params, rng)
    for n in range(1, params.max_tokens + 1):
      yield tok
      # no decode step after the last token: its logits would go unread
      if tok in params.stop_ids or n == params.max_tokens or pos >= self.model.max_context: return
      if t == 0: tok = self.decode_greedy(tok, pos)
      elif every: tok = self.decode_draw(tok, pos, t, rng.random())
      else: tok = sample(self.decode(tok, pos), params, rng)
      pos += 1
