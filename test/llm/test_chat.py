"""llm/chat.py: the GGUF chat template rendered as transformers' `apply_chat_template(...,
tokenize=False)` renders it: SmolLM2's template for several conversations, and hand-written
templates that use what transformers gives templates (special tokens, `raise_exception`,
`tojson`, loop controls, trimmed blocks)."""
import pytest

from unigrad.llm import ChatTemplate
from unigrad.nn.state import FormatError

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
CONVERSATIONS = {
  "system+user": [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
  "user only": [{"role": "user", "content": "Hello!"}],
  "multi-turn": [SYSTEM, {"role": "user", "content": "Name a prime."},
                 {"role": "assistant", "content": "7"},
                 {"role": "user", "content": "Another one, in 日本語 please 🎉"}],
  "whitespace": [{"role": "user", "content": "  spaced\n\n\ttabbed  "},
                 {"role": "assistant", "content": ""}],
}
# a Mistral-style template: alternation enforced with raise_exception, bos/eos tokens, trim
MISTRAL_LIKE = (
  "{{ bos_token }}{% for message in messages %}\n"
  "  {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
  "    {{ raise_exception('Conversation roles must alternate user/assistant/...') }}\n"
  "  {% endif %}\n"
  "  {% if message['role'] == 'user' %}\n"
  "    {{ '[INST] ' + message['content'] | trim + ' [/INST]' }}\n"
  "  {% elif message['role'] == 'assistant' %}\n"
  "    {{ message['content'] + eos_token }}\n"
  "  {% endif %}\n"
  "{% endfor %}")
# tojson without HTML escaping and keeping non-ASCII, loop controls, namespaces, generation prompt
TOOLS_LIKE = (
  "{% set ns = namespace(n=0) %}{% for m in messages %}\n"
  "{% if loop.index > 3 %}{% break %}{% endif %}"
  "{% if m.role == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
  "<{{ m.role }}>{{ m | tojson }}</{{ m.role }}>\n{% endfor %}"
  "{{ ns.n }} {{ messages | tojson(indent=2) }}{% if add_generation_prompt %}<bot>{% endif %}")


@pytest.fixture(scope="module")
def chat(model_path) -> ChatTemplate:
  return ChatTemplate.from_gguf(model_path)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_smollm2_template_equals_transformers(chat, hf_tok, name, generation_prompt):
  messages = CONVERSATIONS[name]
  want = hf_tok.apply_chat_template(messages, tokenize=False,
                                    add_generation_prompt=generation_prompt)
  assert chat.apply(messages, add_generation_prompt=generation_prompt) == want


def test_smollm2_template_text(chat):
  assert chat.special_tokens["bos_token"] == "<|im_start|>"
  assert chat.apply([{"role": "user", "content": "Hi"}]) == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [MISTRAL_LIKE, TOOLS_LIKE], ids=["mistral", "tools"])
def test_handwritten_templates_equal_transformers(chat, hf_tok, template):
  ours = ChatTemplate(template, chat.special_tokens)
  for messages in CONVERSATIONS.values():
    if template is MISTRAL_LIKE and messages[0]["role"] == "system": continue
    for gen in (True, False):
      want = hf_tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                        add_generation_prompt=gen)
      assert ours.apply(messages, add_generation_prompt=gen) == want


def test_raise_exception_and_bad_messages_are_errors():
  ours = ChatTemplate(MISTRAL_LIKE, {"bos_token": "<s>", "eos_token": "</s>"})
  # lstrip_blocks/trim_blocks remove the indentation and newline around {% %} tags, not {{ }}'s
  assert ours.apply([{"role": "user", "content": " hi "}]) == "<s>    [INST] hi [/INST]\n"
  with pytest.raises(ValueError, match="rendering failed: Conversation roles must alternate"):
    ours.apply([SYSTEM])
  with pytest.raises(TypeError, match="list of dicts"): ours.apply("hello")
  with pytest.raises(TypeError, match=r"messages\[0\] must be a dict with a 'role'"):
    ours.apply([{"content": "no role"}])


def test_templates_run_sandboxed():
  escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
  with pytest.raises(ValueError, match="rendering failed"): ChatTemplate(escape).apply([])
  with pytest.raises(ValueError, match="rendering failed"):
    ChatTemplate("{% set _ = messages.append(1) %}").apply([])


def test_missing_or_broken_template_raises_naming_file_and_field():
  with pytest.raises(FormatError, match=r"m\.gguf: field tokenizer\.chat_template: missing"):
    ChatTemplate.from_metadata({}, "m.gguf")
  with pytest.raises(FormatError, match=r"m\.gguf: field tokenizer\.chat_template: not a valid"):
    ChatTemplate.from_metadata({"tokenizer.chat_template": "{% for %}"}, "m.gguf")
