"""llm/completion.py: stop strings cut streamed text before them (held back while they may still
complete), and a Completion over the packaged model gives the Generator's ids, their text, the
finish reason and its timings; generation stops at SmolLM2's end-of-turn token."""
import pytest

from unigrad.llm.completion import Completion, StopStrings, stop_token_ids
from unigrad.llm.generate import SamplingParams

PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def pushed(stops, pieces):
  """What StopStrings gives out for each piece, then its flush (when no stop string came)."""
  s = StopStrings(stops)
  out = [s.push(p) for p in pieces]
  return out + ([] if s.stopped else [s.flush()]), s.stopped


def test_stop_string_inside_one_piece():
  assert pushed(["."], ["Paris. The"]) == (["Paris"], True)


def test_stop_string_across_pieces_is_held_back_then_cut():
  assert pushed(["###"], ["a #", "#", "# b"]) == (["a ", "", ""], True)


def test_a_held_tail_that_does_not_complete_comes_out():
  assert pushed(["###"], ["a #", "# b", "#c"]) == (["a ", "## b", "#c", ""], False)
  assert pushed(["END"], ["xE", "N"]) == (["x", "", "EN"], False)  # flushed at the end


def test_the_earliest_stop_string_wins():
  assert pushed(["world", "lo"], ["hello world"]) == (["hel"], True)
  assert pushed(["bc", "abcd"], ["xab", "cd"]) == (["x", ""], True)


def test_no_stop_strings_passes_text_through():
  assert pushed([], ["a", "b"]) == (["a", "b", ""], False)
  assert pushed([""], ["a"]) == (["a", ""], False)  # an empty stop string is ignored


def test_nothing_after_the_stop():
  s = StopStrings(["x"])
  assert (s.push("axb"), s.push("more"), s.stopped) == ("a", "", True)


def test_stop_token_ids_are_eos_and_end_of_turn(tok):
  assert tok.decode([tok.eos_id]) == "<|im_end|>"
  assert stop_token_ids(tok) == {tok.eos_id, tok.vocab["<|endoftext|>"]}


@pytest.fixture(scope="module")
def greedy(llm):
  """The Generator's greedy ids for PROMPT (12 tokens)."""
  return list(llm.generator.generate(PROMPT, SamplingParams(max_tokens=12)))


def complete(llm, params, stop=()):
  return Completion(llm.generator, llm.tokenizer, PROMPT, params, stop).run()


def test_completion_gives_the_generators_ids_and_their_text(llm, greedy):
  done = complete(llm, SamplingParams(max_tokens=12))
  assert done.ids == greedy
  assert done.text == llm.tokenizer.decode(greedy) and done.text.startswith(" Paris")
  assert done.finish_reason == "length"
  assert done.first_token_s > 0 and done.prefill_tok_s > 0 and done.decode_tok_s > 0


def test_completion_stops_at_a_stop_string(llm, greedy):
  done = complete(llm, SamplingParams(max_tokens=12), stop=["answer", "."])
  assert (done.text, done.finish_reason) == (" Paris", "stop")
  assert done.ids == greedy[:2]  # " Paris" and "." (the token that completed the stop string)


def test_completion_stops_at_the_end_of_turn_token(llm):
  tok = llm.tokenizer
  prompt = tok.encode(llm.chat.apply([{"role": "user", "content": "What is 2+2?"}]),
                      add_special_tokens=False)
  params = SamplingParams(max_tokens=64, stop_ids=stop_token_ids(tok))
  done = Completion(llm.generator, tok, prompt, params).run()
  assert done.finish_reason == "stop" and done.ids[-1] == tok.vocab["<|im_end|>"]
  assert "<|im_end|>" not in done.text and done.text == tok.decode(done.ids[:-1])


def test_streamed_pieces_join_to_the_text(llm):
  c = Completion(llm.generator, llm.tokenizer, PROMPT, SamplingParams(max_tokens=6))
  pieces = list(c)
  assert len(pieces) > 1 and "".join(pieces) == c.text


def test_no_decode_step_after_the_last_token(llm, monkeypatch):
  gen, calls = llm.generator, []
  for name in ("decode", "decode_greedy", "decode_draw"):  # the greedy and device samplers' steps
    step = getattr(gen, name)
    monkeypatch.setattr(gen, name, lambda tok, pos, *a, step=step: calls.append(pos)
                        or step(tok, pos, *a))
  assert len(list(gen.generate(PROMPT, SamplingParams(max_tokens=3)))) == 3
  assert calls == [5, 6]
  for params in (SamplingParams(max_tokens=3, temperature=1, seed=0),
                 SamplingParams(max_tokens=3, temperature=1, top_k=5, seed=0)):
    calls.clear()
    assert len(list(gen.generate(PROMPT, params))) == 3
    assert calls == [5, 6]
