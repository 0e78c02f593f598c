"""The chat template: a GGUF file's `tokenizer.chat_template` (Jinja) rendered as transformers'
`apply_chat_template(..., tokenize=False)` renders it.

The template is untrusted code from a file, so it runs in Jinja's immutable sandbox, with the
environment transformers gives templates: `trim_blocks` and `lstrip_blocks`, the loop controls
(`break`, `continue`), a `tojson` that keeps non-ASCII text and takes `indent`, `separators` and
`sort_keys`, and the globals `raise_exception(message)` (a TemplateError, which `apply` reports as
a ValueError) and `strftime_now(format)`. It sees `messages`, `add_generation_prompt`, `tools`,
`documents` and the special tokens' texts (`bos_token`, `eos_token`, `unk_token`, `pad_token`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from unigrad.nn.state import FileLike, FormatError, gguf_metadata
from unigrad.nn.tensor_io import source_name

try:
  import jinja2
  import jinja2.ext
  from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover - the `llm` extra installs it
  raise ImportError("unigrad.llm's chat template needs `jinja2`: pip install 'unigrad[llm]'") from e

__all__ = ["ChatTemplate"]

TEMPLATE_KEY = "tokenizer.chat_template"
SPECIAL_TOKEN_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                      "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def _raise_exception(message: str) -> None:
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
  # unlike Jinja's own tojson, no HTML escaping: the output is a prompt, not a web page
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
  return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env


def _special_tokens(kv: dict[str, Any]) -> dict[str, str]:
  """The texts of the special tokens the metadata names (`bos_token` -> `"<|im_start|>"`)."""
  tokens = kv.get("tokenizer.ggml.tokens")
  if not isinstance(tokens, list): return {}
  out = {}
  for name, key in SPECIAL_TOKEN_KEYS.items():
    i = kv.get(f"tokenizer.ggml.{key}")
    if isinstance(i, int) and 0 <= i < len(tokens): out[name] = tokens[i]
  return out


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
    raise TypeError(f"ChatTemplate.apply: messages must be a list of dicts, got {type(messages)}")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m:
      raise TypeError(f"ChatTemplate.apply: messages[{i}] must be a dict with a 'role', got {m!r}")
  return [dict(m) for m in messages]


class ChatTemplate:
  """A chat template and the special tokens' texts it may use.

    chat = ChatTemplate.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    prompt = chat.apply([{"role": "user", "content": "Hi"}])
    # '<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n'
    # '<|im_start|>assistant\\n'
  """

  def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
               name: str = "<template>") -> None:
    self.source, self.name = source, name
    self.special_tokens = dict(special_tokens or {})
    try: self._template = _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
      raise FormatError(f"ChatTemplate: {name}: field {TEMPLATE_KEY}: not a valid Jinja "
                        f"template (line {e.lineno}: {e.message})") from None

  @classmethod
  def from_metadata(cls, kv: dict[str, Any], source: str = "<metadata>") -> ChatTemplate:
    """The template in a GGUF metadata dict; FormatError naming `source` when there is none."""
    template = kv.get(TEMPLATE_KEY)
    if not isinstance(template, str):
      what = "missing" if template is None else f"not a string ({type(template).__name__})"
      raise FormatError(f"ChatTemplate: {source}: field {TEMPLATE_KEY}: {what}")
    return cls(template, _special_tokens(kv), source)

  @classmethod
  def from_gguf(cls, fn: FileLike) -> ChatTemplate:
    """The template of a GGUF file (a path, its bytes or a uint8 Tensor)."""
    return cls.from_metadata(gguf_metadata(fn), source_name(fn))

  def apply(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
            **kwargs: Any) -> str:
    """The prompt text for `messages` (dicts with `role` and `content`), ending with the
    assistant's header when `add_generation_prompt`. Other keyword arguments reach the template
    as variables (`tools=...`). A template's `raise_exception` (or any error while rendering)
    becomes a ValueError."""
    variables = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
    try:
      return self._template.render(messages=_check_messages(messages),
                                   add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
      raise ValueError(f"ChatTemplate.apply: {self.name}: rendering failed: {e}") from None

  def __repr__(self) -> str:
    return f"ChatTemplate({self.name}, {len(self.source)} characters)"
