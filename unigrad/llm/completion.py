"""Text completion: a Generator's tokens decoded as they come, cut at stop strings, timed.

What the command line and the server share. A `Completion` is iterated for the pieces of text
that are safe to show: never half a character (the tokenizer's `StreamDecoder`), never the start
of a stop string that may yet complete (`StopStrings` holds such a tail back until it is known).
Generation ends at a stop token (not shown), at a stop string (the text is cut before it), at
`max_tokens` or at a full context; afterwards the completion holds the ids, the text, why it
finished (OpenAI's `finish_reason`: "stop" or "length") and how long prefill and decode took.

  done = Completion(gen, tok, tok.encode("The capital of France is"),
                    SamplingParams(max_tokens=32, stop_ids=stop_token_ids(tok)), stop=["\\n"])
  for piece in done: print(piece, end="", flush=True)
  print(done.finish_reason, done.decode_tok_s)
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from unigrad.llm.generate import Generator, SamplingParams
from unigrad.llm.tokenizer import Tokenizer

__all__ = ["Completion", "StopStrings", "stop_token_ids", "END_OF_TURN_TOKENS"]

# the texts of the special tokens that end an assistant's turn in common chat templates
# (ChatML's `<|im_end|>`: SmolLM2, Qwen; Llama-3's `<|eot_id|>`; Phi-3's `<|end|>`; Gemma's
# `<end_of_turn>`) and the end of a document
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def stop_token_ids(tok: Tokenizer) -> frozenset[int]:
  """The ids generation stops at: the tokenizer's EOS and the end-of-turn tokens its vocabulary
  has as special (control) tokens (for SmolLM2: `<|im_end|>`, its EOS, and `<|endoftext|>`)."""
  ids = {tok.vocab[t] for t in END_OF_TURN_TOKENS if tok.vocab.get(t) in tok.special_ids}
  if tok.eos_id is not None: ids.add(tok.eos_id)
  return frozenset(ids)


class StopStrings:
  """Cuts streamed text before the first of several stop strings. `push(text)` returns what
  can be shown now and holds back a tail that may be the start of a stop string; `stopped` is
  set once one has appeared (the text from it on is never returned); `flush()` returns the
  held tail when the text ends without one.

    s = StopStrings(["###"])
    s.push("a #"), s.push("# b"), s.push("#c")   # ("a ", "", "# b#c"): no stop string
    s = StopStrings(["###"])
    s.push("a ##"), s.push("#c"), s.stopped      # ("a ", "", True)
  """

  def __init__(self, stops: Sequence[str]) -> None:
    self.stops = tuple(s for s in stops if s)
    self.held = ""
    self.stopped = False

  def push(self, text: str) -> str:
    """The part of the text so far that no stop string can start in, not given out before."""
    if self.stopped: return ""
    buf = self.held + text
    # the held tail holds no whole stop string, and no stop string starts in what was given
    # out, so the first match in `buf` is the first in the whole text
    found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
    if found:
      self.held, self.stopped = "", True
      return buf[:min(found)]
    keep = self._partial_tail(buf)
    self.held = buf[len(buf) - keep:]
    return buf[:len(buf) - keep]

  def _partial_tail(self, buf: str) -> int:
    """The length of the longest end of `buf` that begins some stop string (0 if none)."""
    longest = max((len(s) for s in self.stops), default=1) - 1
    for k in range(min(longest, len(buf)), 0, -1):
      if any(s.startswith(buf[-k:]) for s in self.stops): return k
    return 0

  def flush(self) -> str:
    """The held tail, at the end of a text in which no stop string appeared."""
    out, self.held = self.held, ""
    return out


class Completion:
  """One generation's text, streamed: iterate it once for the pieces as they become safe to
  show; then `ids` (every generated id, a stop token included), `text` (the pieces joined),
  `finish_reason` ("stop" or "length"; None while running or when the consumer stopped early)
  and the timings `prefill_s` (prompt and first token) and `decode_s` (the later tokens, the
  consumer's time between pieces left out)."""

  def __init__(self, generator: Generator, tokenizer: Tokenizer, prompt_ids: Sequence[int],
               params: SamplingParams, stop: Sequence[str] = ()) -> None:
    self.generator, self.tokenizer, self.params = generator, tokenizer, params
    self.prompt_ids = list(prompt_ids)
    self.stop = tuple(stop)
    self.ids: list[int] = []
    self.text = ""
    self.finish_reason: str | None = None
    self.prefill_s = self.decode_s = 0.0
    self.started_at = self.first_token_at = 0.0  # time.perf_counter() readings

  @property
  def first_token_s(self) -> float:
    """Seconds from the start of the iteration to the first token (the prompt's prefill)."""
    return self.first_token_at - self.started_at

  @property
  def prefill_tok_s(self) -> float:
    """Prompt tokens per second of the prefill (the first token's sampling included)."""
    return len(self.prompt_ids) / self.prefill_s if self.prefill_s else 0.0

  @property
  def decode_tok_s(self) -> float | None:
    """Tokens per second after the first (None with fewer than two tokens)."""
    return (len(self.ids) - 1) / self.decode_s if len(self.ids) > 1 and self.decode_s else None

  def __iter__(self) -> Iterator[str]:
    self.started_at = time.perf_counter()
    tokens = self.generator.generate(self.prompt_ids, self.params)
    stream = self.tokenizer.stream(skip_special_tokens=True)
    stops = StopStrings(self.stop)
    try:
      for tok in self._timed(tokens):
        self.ids.append(tok)
        if tok in self.params.stop_ids: break
        piece = stops.push(stream.feed(tok))
        if piece: yield self._emit(piece)
        if stops.stopped: break
      if not stops.stopped:
        piece = stops.push(stream.flush())
        piece += "" if stops.stopped else stops.flush()
        if piece: yield self._emit(piece)
      self.finish_reason = self._finish(stops.stopped)
    finally:
      tokens.close()

  def _timed(self, tokens: Iterator[int]) -> Iterator[int]:
    """The tokens, each one's production timed (the first is the prefill's)."""
    while True:
      t0 = time.perf_counter()
      tok = next(tokens, None)
      dt = time.perf_counter() - t0
      if tok is None: return
      if self.ids: self.decode_s += dt
      else: self.prefill_s, self.first_token_at = dt, t0 + dt
      yield tok

  def _emit(self, piece: str) -> str:
    self.text += piece
    return piece

  def _finish(self, stopped_by_string: bool) -> str:
    """OpenAI's finish_reason: "stop" at a stop token or string, else "length"."""
    if stopped_by_string or (self.ids and self.ids[-1] in self.params.stop_ids): return "stop"
    return "length"

  def run(self) -> Completion:
    """Generate to the end without looking at the pieces; the finished completion."""
    for _ in self: pass
    return self
