"""OpenAI's HTTP API, the bodies: requests read and checked, responses and stream chunks built.

No HTTP here (server.py does that). `parse_completion` and `parse_chat` turn a request body
(already decoded JSON) into a `GenerationRequest`: the prompt's ids, the `SamplingParams`, the
stop strings, whether to stream. Every field a request may carry is checked for its type and
range; a bad one raises `APIError`, which carries the HTTP status and the error body OpenAI
sends (`{"error": {"message", "type", "param", "code"}}`). Fields this server does not know are
ignored, as OpenAI-compatible servers do (clients send many).

Defaults follow OpenAI: temperature 1, top_p 1, max_tokens 16 for completions and the rest of
the context for chat. `top_k` is accepted as vLLM and llama.cpp accept it.
"""
from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from unigrad.llm.chat import ChatTemplate
from unigrad.llm.completion import Completion
from unigrad.llm.generate import SamplingParams
from unigrad.llm.tokenizer import Tokenizer

__all__ = ["APIError", "GenerationRequest", "ModelInfo", "parse_completion", "parse_chat",
           "completion_body", "completion_chunk", "chat_body", "chat_chunk", "usage_chunk",
           "models_body", "completion_events", "chat_events", "new_id"]

MAX_STOP_STRINGS = 4  # OpenAI's limit
ROLES = ("system", "user", "assistant", "tool", "developer")


class APIError(Exception):
  """A request the server refuses: the HTTP status and OpenAI's error fields."""

  def __init__(self, status: int, message: str, param: str | None = None,
               code: str | None = None, kind: str = "invalid_request_error") -> None:
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

  def body(self) -> dict[str, Any]:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


def bad(param: str, message: str) -> APIError:
  """A 400 for one field: `param` names it, the message says what was expected."""
  return APIError(400, f"'{param}': {message}", param=param)


@dataclass(frozen=True)
class ModelInfo:
  """What the server serves: the model's name, its context and its tokenizer's stop ids."""
  name: str
  max_context: int
  stop_ids: frozenset[int]
  created: int = 0


@dataclass(frozen=True)
class GenerationRequest:
  """A checked request: what to generate and how to answer."""
  prompt_ids: list[int]
  params: SamplingParams
  stop: tuple[str, ...]
  stream: bool
  include_usage: bool  # stream_options.include_usage: a last chunk with the usage


# ---- fields ----

def _int(body: dict[str, Any], name: str, default: int | None,
         minimum: int | None = None) -> int | None:
  value = body.get(name)
  if value is None: return default
  if isinstance(value, bool) or not isinstance(value, int): raise bad(name, "must be an integer")
  if minimum is not None and value < minimum:
    raise bad(name, f"must be at least {minimum}, got {value}")
  return value


def _number(body: dict[str, Any], name: str, default: float,
            ok: Callable[[float], bool], expected: str) -> float:
  value = body.get(name)
  if value is None: return default
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise bad(name, "must be a number")
  if not math.isfinite(value) or not ok(value): raise bad(name, f"must be {expected}, got {value}")
  return float(value)


def _bool(body: dict[str, Any], name: str) -> bool:
  value = body.get(name, False)
  if value is None: return False
  if not isinstance(value, bool): raise bad(name, "must be true or false")
  return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
  value = body.get("stop")
  if value is None: return ()
  if isinstance(value, str): value = [value]
  if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
    raise bad("stop", "must be a string or a list of strings")
  if len(value) > MAX_STOP_STRINGS: raise bad("stop", f"at most {MAX_STOP_STRINGS} strings")
  return tuple(s for s in value if s)


def _include_usage(body: dict[str, Any]) -> bool:
  options = body.get("stream_options")
  if options is None: return False
  if not isinstance(options, dict): raise bad("stream_options", "must be an object")
  value = options.get("include_usage", False)
  if not isinstance(value, bool): raise bad("stream_options.include_usage", "must be a boolean")
  return value


def _check_model(body: dict[str, Any], info: ModelInfo) -> None:
  """A request may leave `model` out; naming another model is a 404."""
  name = body.get("model")
  if name is None or name == info.name: return
  if not isinstance(name, str): raise bad("model", "must be a string")
  raise APIError(404, f"The model '{name}' does not exist; this server serves '{info.name}'",
                 param="model", code="model_not_found")


def _request(body: dict[str, Any], info: ModelInfo, prompt_ids: list[int],
             max_tokens: int | None, prompt_param: str) -> GenerationRequest:
  """The checked sampling fields around a prompt's ids (`prompt_param` names the prompt)."""
  if not prompt_ids: raise bad(prompt_param, "the prompt has no tokens")
  room = info.max_context - len(prompt_ids)
  if room <= 0:
    raise APIError(400, f"The prompt has {len(prompt_ids)} tokens; this model's context holds "
                   f"{info.max_context} (prompt and completion together)", param=prompt_param,
                   code="context_length_exceeded")
  if _int(body, "n", 1, 1) != 1: raise bad("n", "only 1 is supported")
  params = SamplingParams(
    max_tokens=min(max_tokens or room, room + 1),  # the token sampled after the last position
    temperature=_number(body, "temperature", 1.0, lambda t: t >= 0, "at least 0"),
    top_p=_number(body, "top_p", 1.0, lambda p: 0 < p <= 1, "in (0, 1]"),
    top_k=_int(body, "top_k", 0, 0), seed=_int(body, "seed", None),
    stop_ids=info.stop_ids)
  return GenerationRequest(prompt_ids, params, _stop(body), _bool(body, "stream"),
                           _include_usage(body))


# ---- requests ----

def _prompt_ids(prompt: Any, tok: Tokenizer) -> list[int]:
  """A completion's prompt: a string, a list of token ids, or a list holding one of those."""
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
    prompt = prompt[0]
  if isinstance(prompt, str): return tok.encode(prompt)
  if isinstance(prompt, list) and all(type(i) is int for i in prompt):
    if any(not 0 <= i < tok.vocab_size for i in prompt):
      raise bad("prompt", f"token ids must be in [0, {tok.vocab_size})")
    return prompt
  if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
    raise bad("prompt", "only one prompt per request is supported")
  raise bad("prompt", "must be a string or a list of token ids")


def parse_completion(body: Any, tok: Tokenizer, info: ModelInfo) -> GenerationRequest:
  """A `POST /v1/completions` body, checked."""
  if not isinstance(body, dict): raise APIError(400, "The request body must be a JSON object")
  _check_model(body, info)
  if body.get("prompt") is None: raise bad("prompt", "is required")
  if _int(body, "best_of", 1, 1) != 1: raise bad("best_of", "only 1 is supported")
  if _bool(body, "echo"): raise bad("echo", "is not supported")
  return _request(body, info, _prompt_ids(body["prompt"], tok), _int(body, "max_tokens", 16, 1),
                  "prompt")


def _content(content: Any, i: int) -> str:
  """A message's content: a string, null, or a list of text parts (joined)."""
  if content is None: return ""
  if isinstance(content, str): return content
  where = f"messages[{i}].content"
  if not isinstance(content, list): raise bad(where, "must be a string or a list of parts")
  texts = []
  for part in content:
    if not isinstance(part, dict) or part.get("type") != "text" or \
        not isinstance(part.get("text"), str):
      raise bad(where, "only text parts ({'type': 'text', 'text': ...}) are supported")
    texts.append(part["text"])
  return "".join(texts)


def _messages(messages: Any) -> list[dict[str, str]]:
  if messages is None: raise bad("messages", "is required")
  if not isinstance(messages, list) or not messages:
    raise bad("messages", "must be a non-empty list of messages")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict): raise bad(f"messages[{i}]", "must be an object")
    if m.get("role") not in ROLES:
      raise bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
    out.append({"role": m["role"], "content": _content(m.get("content"), i)})
  return out


def parse_chat(body: Any, tok: Tokenizer, chat: ChatTemplate, info: ModelInfo) -> GenerationRequest:
  """A `POST /v1/chat/completions` body, checked; the messages rendered by the chat template."""
  if not isinstance(body, dict): raise APIError(400, "The request body must be a JSON object")
  _check_model(body, info)
  messages = _messages(body.get("messages"))
  try: text = chat.apply(messages, add_generation_prompt=True)
  except ValueError as e: raise bad("messages", str(e)) from None
  max_tokens = _int(body, "max_completion_tokens", None, 1)
  max_tokens = _int(body, "max_tokens", max_tokens, 1)
  return _request(body, info, tok.encode(text, add_special_tokens=False), max_tokens,
                  "messages")


# ---- responses ----

def new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(done: Completion) -> dict[str, int]:
  n, m = len(done.prompt_ids), len(done.ids)
  return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}


def _head(rid: str, kind: str, model: str) -> dict[str, Any]:
  return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def completion_body(rid: str, model: str, done: Completion) -> dict[str, Any]:
  choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": done.finish_reason}
  return {**_head(rid, "text_completion", model), "choices": [choice], "usage": usage(done)}


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict[str, Any]:
  choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
  return {**_head(rid, "text_completion", model), "choices": [choice]}


def chat_body(rid: str, model: str, done: Completion) -> dict[str, Any]:
  choice = {"index": 0, "message": {"role": "assistant", "content": done.text},
            "logprobs": None, "finish_reason": done.finish_reason}
  return {**_head(rid, "chat.completion", model), "choices": [choice], "usage": usage(done)}


def chat_chunk(rid: str, model: str, delta: dict[str, str], finish: str | None) -> dict[str, Any]:
  choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
  return {**_head(rid, "chat.completion.chunk", model), "choices": [choice]}


def usage_chunk(rid: str, model: str, kind: str, done: Completion) -> dict[str, Any]:
  """The last chunk of a stream asked for with `stream_options.include_usage`."""
  return {**_head(rid, kind, model), "choices": [], "usage": usage(done)}


def models_body(info: ModelInfo) -> dict[str, Any]:
  return {"object": "list", "data": [{"id": info.name, "object": "model",
                                      "created": info.created, "owned_by": "unigrad"}]}


# ---- streams: the chunks of a streamed answer, generated as they are read ----

def completion_events(rid: str, model: str, done: Completion,
                      include_usage: bool) -> Iterator[dict[str, Any]]:
  """A streamed completion's chunks: one per piece of text, the finish reason, the usage."""
  for piece in done: yield completion_chunk(rid, model, piece, None)
  yield completion_chunk(rid, model, "", done.finish_reason)
  if include_usage: yield usage_chunk(rid, model, "text_completion", done)


def chat_events(rid: str, model: str, done: Completion,
                include_usage: bool) -> Iterator[dict[str, Any]]:
  """A streamed chat answer's chunks: the role, one per piece, the finish reason, the usage."""
  yield chat_chunk(rid, model, {"role": "assistant", "content": ""}, None)
  for piece in done: yield chat_chunk(rid, model, {"content": piece}, None)
  yield chat_chunk(rid, model, {}, done.finish_reason)
  if include_usage: yield usage_chunk(rid, model, "chat.completion.chunk", done)
