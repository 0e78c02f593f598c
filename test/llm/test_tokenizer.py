"""llm/tokenizer.py: the GGUF byte-level BPE tokenizer against the `tokenizers` package.

The references are transformers' GGUF tokenizer for the same SmolLM2 file (its vocabulary, merges
and added tokens, converted by transformers from transformers' own reading of the file) with the
pre-tokenizer SmolLM2's tokenizer.json declares (every digit alone, then GPT-2's split: what
llama.cpp calls `smollm`), and with transformers' pre-tokenizers for `gpt-2`, `llama-bpe` and
`qwen2`. Ids, decoded text and streamed text are compared on a corpus of Unicode, emoji, CJK,
whitespace runs, tabs and newlines, long numbers, code, contractions and special tokens; a tiny
hand-made vocabulary runs the same comparison without the model file.
"""
import dataclasses
import random
import re
import struct
import time

import numpy as np
import pytest
from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from unigrad.llm import Tokenizer
from unigrad.llm.tokenizer import BYTE_SYMBOLS, PRE_TOKENIZERS, pre_tokenize, to_symbols
from unigrad.nn.state import FormatError

CORPUS = [
  "",
  "Hello world",
  "Hello, world! How are you doing today?",
  "Ünïcödé façade naïve café résumé Straße ÆØÅ œuvre",
  "Ελληνικά και русский текст, עברית и العربية, हिन्दी, ไทย",
  "e\u0301 a\u0308 combining marks, zero\u200bwidth\u200djoiner \ufeffbom",
  "🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🤖: emoji!",
  "日本語のテキストと中文文本，还有한국어 텍스트。「引用」",
  "a  b   c    d     e",
  "   leading spaces",
  "trailing spaces   ",
  "  \n\n\t  x",
  "a \n b \n\n c\n",
  "line1\nline2\r\nline3\n\n\nend\t\tx\t",
  "\ttabbed\tcolumns\t\t\tand\n\ttab-indented\n",
  "\u00a0nbsp\u3000ideographic\u2009thin\u2028sep\x85nel",
  "\x1c\x1d\x1e\x1f\x0b\x0c odd whitespace \x00\x01\x7f controls",
  "3.14159265358979 1,000,000 2024-01-15 0x1F 1e-10 -42 +7",
  "12345678901234567890123456789012345678901234567890",
  "x  2024 then   3 and 4\n5 \t6",
  "²³ ½ ٣٤ ४२ Ⅻ numerals",
  "def f(x):\n    return x**2  # square\n\nclass A:\n\tpass\n",
  'if (a != b && c <= d) { x += 1; } else { y->z = arr[i++]; }',
  '{"key": [1, 2.5, null], "nested": {"a": "b"}}',
  "<html><body class='x'>&amp; &lt;</body></html>",
  "https://example.com/path?q=1&r=2#frag user@example.org",
  "I'm, you're, he's, we've, they'll, I'd, don't, can't, won't",
  "IT'S WE'VE THEY'LL I'D It'S 'quoted' ''double''",
  "!!!??? ... --- *** ### <<>> ~~~ ___",
  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
  "text<|endoftext|>more text",
  "<|im_start|><|im_end|><|endoftext|>",
  "almost <|im_start and <|im_end|>> and <|IM_END|>",
  "<repo_name>unigrad<file_sep>main.py<filename>x",
  "The year 1984 and 2001: A Space Odyssey. π≈3.14, ∑x², ∞ ≠ 0",
]
PARAGRAPH = (
  "The workload people most often run on a small tensor library today is a decoder-only language "
  "model on their own machine. It reads a GGUF file (98 MB), tokenizes the prompt with byte-level "
  "BPE, and generates one token at a time: 30 blocks, width 576, 9 query heads and 3 KV heads. "
  "Numbers like 49,152 and 1e5 appear; so do contractions (it's, don't) and code: `x = f(y)`.\n")
SMOLLM_PRE = pre_tokenizers.Sequence([  # SmolLM2's tokenizer.json pre_tokenizer
  pre_tokenizers.Digits(individual_digits=True),
  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def random_texts(n: int, seed: int) -> list[str]:
  """Strings drawn from a pool of ASCII, whitespace, digits, accents, CJK, emoji and specials."""
  rng = random.Random(seed)
  pool = (list("abcXYZ'.,;!?-_()[]{}<>|/\\\"#$%^&*=+~`") + [" ", "  ", "\n", "\t", "\r\n"] +
          list("0123456789") + list("éüßñøłж") + list("日本中文한") + ["🎉", "👍🏽", "🇫🇷"] +
          ["<|im_start|>", "<|im_end|>", "'s", "'ll", "\u00a0", "\u3000", "²"])
  return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(n)]


FUZZ = random_texts(300, seed=0)


@pytest.fixture(scope="module")
def ref(hf_build):
  """transformers' GGUF tokenizer with SmolLM2's own pre-tokenizer."""
  t = hf_build()
  t.backend_tokenizer.pre_tokenizer = SMOLLM_PRE
  return t


# ---- the SmolLM2 file ----

def test_reads_the_files_tokenizer(tok, metadata):
  # ids transformers' AutoTokenizer.from_pretrained(folder, gguf_file=name) gives (no reader here)
  assert tok.encode("Hello world 12345 it's") == [19556, 905, 216, 33, 34, 35, 36, 37, 357, 506]
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (49152, 1, 2, 0, 2)
  assert tok.spec.pre == "smollm" and not tok.spec.add_bos
  assert tok.tokens[1] == "<|im_start|>" and tok.special_ids == frozenset(range(17))
  assert len(tok.spec.merges) == len(metadata["tokenizer.ggml.merges"])


@pytest.mark.parametrize("texts", [CORPUS, FUZZ], ids=["corpus", "fuzz"])
def test_ids_equal_tokenizers_with_smollm_pre_tokenizer(tok, ref, texts):
  for text in texts:
    assert tok.encode(text) == ref.encode(text, add_special_tokens=True), repr(text)


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe"])
def test_ids_equal_transformers_gguf_tokenizer_per_pre_tokenizer(tok, hf_tok, hf_build, pre):
  """The same vocabulary under transformers' pre-tokenizer of each name (for `gpt-2`: GPT-2's
  split, what transformers uses for `smollm` too). The other names' splits are compared below."""
  ours = Tokenizer(dataclasses.replace(tok.spec, pre=pre))
  theirs = hf_tok if pre == "gpt-2" else hf_build(pre)
  # transformers' conversion leaves ignore_merges off; Llama-3's tokenizer.json has it on (no
  # SmolLM2 token needs it: BPE builds every one from its own spelling)
  if pre == "llama-bpe": theirs.backend_tokenizer.model.ignore_merges = True
  for text in CORPUS + FUZZ[:100]:
    assert ours.encode(text) == theirs.encode(text), (pre, text)


def test_smollm_differs_from_gpt2_where_digits_follow_spaces(tok, hf_tok):
  """Digits split before GPT-2's regex: `\\s+(?!\\S)` then sees the end of a piece."""
  assert pre_tokenize("x  2", "smollm") == ["x", "  ", "2"]
  assert pre_tokenize("x  2", "gpt-2") == ["x", " ", " 2"]
  assert tok.encode("x  2") != hf_tok.encode("x  2")


def has_tokens(tok: Tokenizer, text: str) -> str:
  """`text` without the characters whose bytes have no token."""
  return "".join(c for c in text if all(s in tok.vocab for s in to_symbols(c)))


def test_decode_inverts_encode_and_equals_tokenizers(tok, ref):
  assert has_tokens(tok, "a\x1db\x04") == "ab"  # SmolLM2 has no token for a few control bytes
  for text in CORPUS + FUZZ:
    ids = tok.encode(text)
    assert tok.decode(ids) == has_tokens(tok, text), repr(text)
    assert tok.decode(ids) == ref.backend_tokenizer.decode(ids, skip_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == ref.backend_tokenizer.decode(ids), text


def byte_ids(tok: Tokenizer, first: int = 0) -> list[int]:
  """The ids of the single-byte tokens for bytes `first` and above."""
  return [tok.vocab[s] for s in BYTE_SYMBOLS[first:] if s in tok.vocab]


def test_decode_of_arbitrary_ids_replaces_broken_utf8_as_tokenizers_does(tok, ref):
  """Single bytes of multi-byte characters, in any order: U+FFFD as Rust's from_utf8_lossy."""
  rng = random.Random(1)
  high = byte_ids(tok, 0x80)
  for _ in range(200):
    ids = [rng.choice(high) if rng.random() < 0.6 else rng.randrange(tok.vocab_size)
           for _ in range(rng.randint(1, 12))]
    assert tok.decode(ids) == ref.backend_tokenizer.decode(ids, skip_special_tokens=False), ids


def stream_pieces(tok: Tokenizer, ids: list[int], skip: bool = False) -> list[str]:
  stream = tok.stream(skip_special_tokens=skip)
  return [stream.feed(i) for i in ids] + [stream.flush()]


def test_stream_decoder_gives_decode_without_broken_characters(tok):
  rng = random.Random(2)
  cases = [tok.encode(t) for t in CORPUS + FUZZ]
  cases += [[rng.choice(byte_ids(tok)) for _ in range(10)] for _ in range(100)]
  for ids in cases:
    for skip in (False, True):
      pieces = stream_pieces(tok, ids, skip)
      full = tok.decode(ids, skip_special_tokens=skip)
      assert "".join(pieces) == full, ids
      if "\ufffd" not in full: assert all("\ufffd" not in p for p in pieces), ids


def test_stream_decoder_holds_a_character_until_its_last_byte(tok):
  ids = [tok.vocab[to_symbols("🎉")[i]] for i in range(4)]  # the emoji byte by byte
  assert stream_pieces(tok, ids) == ["", "", "", "🎉", ""]
  assert stream_pieces(tok, ids[:2]) == ["", "", "\ufffd"]  # an unfinished one at the end
  stream = tok.stream()
  assert "".join(stream.feed(i) for i in tok.encode("日本 🎉")) == stream.text == "日本 🎉"
  assert stream.flush() == "" and stream.feed(ids[0]) == "" and stream.flush() == "\ufffd"
  assert stream.text == "日本 🎉\ufffd"


def test_special_tokens_whole_skipped_or_spelled_out(tok):
  user = tok.vocab["user"]
  assert tok.encode("<|im_start|>user<|im_end|>") == [1, user, 2]
  assert tok.decode([1, user, 2], skip_special_tokens=True) == "user"
  spelled = tok.encode("<|im_end|>", parse_special=False)
  assert 2 not in spelled and tok.decode(spelled) == "<|im_end|>"
  with_bos = Tokenizer(dataclasses.replace(tok.spec, add_bos=True, add_eos=True))
  assert with_bos.encode("Hi") == [1, *tok.encode("Hi"), 2]
  assert with_bos.encode("Hi", add_special_tokens=False) == tok.encode("Hi")
  with pytest.raises(ValueError, match="token id 49152 is not in 0..49151"): tok.decode([49152])
  with pytest.raises(ValueError, match="token id 1.0 is not"): tok.decode([1.0])
  assert tok.decode(np.array(tok.encode("numpy ids"))) == "numpy ids"


def test_encode_is_fast(tok):
  """A paragraph in a few ms with a cold cache, far less once its words are cached."""
  fresh = Tokenizer(tok.spec)
  start = time.perf_counter()
  ids = fresh.encode(PARAGRAPH)
  cold = time.perf_counter() - start
  start = time.perf_counter()
  assert fresh.encode(PARAGRAPH) == ids
  warm = time.perf_counter() - start
  assert cold < 0.1 and warm < 0.02, (cold, warm)


def test_long_runs_take_linearithmic_time(tok):
  for text in (" " * 20000, "a" * 20000, "日" * 5000):
    start = time.perf_counter()
    assert tok.decode(tok.encode(text)) == text
    assert time.perf_counter() - start < 2.0


# ---- pre-tokenizers against tokenizers' ----

def reference_pre_tokenizer(pre: str):
  """tokenizers' pre-tokenizer for a llama.cpp name: transformers' split regex where it has one,
  SmolLM2's for the names llama.cpp groups with it, GPT-2's ByteLevel for the rest."""
  splits = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping",
                               reason="transformers' pre-tokenizer table").GGUF_PRE_TOKENIZER_SPLITS
  if pre in splits:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(splits[pre]), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=False)])
  if pre in ("smollm", "starcoder", "refact", "command-r"): return SMOLLM_PRE
  assert pre in ("gpt-2", "phi-2"), pre
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_pre_tokenizer_splits_equal_tokenizers(pre):
  ref_pre = reference_pre_tokenizer(pre)
  for text in CORPUS + FUZZ:
    ours = [to_symbols(p) for p in pre_tokenize(text, pre)]
    assert ours == [p for p, _ in ref_pre.pre_tokenize_str(text)], (pre, text)


# ---- a tiny vocabulary: no model file needed ----

TINY_MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġa n", "Ġan d", "1 2", "Ġ Ġ", "ĠĠ Ġ", "e r"]


def tiny_metadata(**over) -> dict:
  tokens = ["<s>", "</s>", "<tool>"] + list(BYTE_SYMBOLS)
  tokens += ["".join(m.split(" ")) for m in TINY_MERGES]
  kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": TINY_MERGES,
        "tokenizer.ggml.token_type": [3, 3, 4] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
  return {**kv, **over}


def test_tiny_vocabulary_equals_tokenizers_bpe():
  kv = tiny_metadata()
  ours = Tokenizer.from_metadata(kv)
  vocab = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"])}
  ref = HFTokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in TINY_MERGES]))
  ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  ref.decoder = decoders.ByteLevel()
  ref.add_special_tokens(["<s>", "</s>"])
  ref.add_tokens(["<tool>"])
  for text in CORPUS + FUZZ + [" the and in there  ", "<tool>x<s>"]:
    assert ours.encode(text) == ref.encode(text).ids, repr(text)
    assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text).ids, False)
  assert ours.encode("<s><tool>", parse_special=False)[-1] == 2  # user-defined: always whole
  assert ours.decode([0, 2, 1], skip_special_tokens=True) == "<tool>"


def test_llama3_pre_tokenizers_take_whole_tokens_before_merges():
  """`ignore_merges`: a token no merge builds ("Ġhe" here) is still taken whole."""
  kv = tiny_metadata(**{"tokenizer.ggml.pre": "llama-bpe"})
  kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"] + ["Ġhe"]
  kv["tokenizer.ggml.token_type"] = kv["tokenizer.ggml.token_type"] + [1]
  vocab = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"])}
  merges = [tuple(m.split(" ")) for m in TINY_MERGES]
  for pre, ignore in (("llama-bpe", True), ("dbrx", False)):
    ours = Tokenizer.from_metadata({**kv, "tokenizer.ggml.pre": pre})
    ref = HFTokenizer(models.BPE(vocab, merges, ignore_merges=ignore))
    ref.pre_tokenizer = reference_pre_tokenizer(pre)
    for text in [" he said", " the hero", "he he  he"] + CORPUS:
      assert ours.encode(text) == ref.encode(text).ids, (pre, text)
    assert (vocab["Ġhe"] in ours.encode(" he")) == ignore


# ---- bad input ----

def gguf_string(x: str) -> bytes:
  return struct.pack("<Q", len(x.encode())) + x.encode()


def gguf_value(v) -> bytes:
  if isinstance(v, bool): return struct.pack("<I?", 7, v)
  if isinstance(v, int): return struct.pack("<Ii", 5, v)
  if isinstance(v, str): return struct.pack("<I", 8) + gguf_string(v)
  if all(isinstance(x, str) for x in v):
    return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(map(gguf_string, v))
  return struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v)


def write_gguf_metadata(kv: dict) -> bytes:
  """A GGUF file of metadata (strings, bools, ints, string and int arrays) and no tensors."""
  items = b"".join(gguf_string(k) + gguf_value(v) for k, v in kv.items())
  return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + items


def test_gguf_file_with_another_tokenizer_model_raises_naming_file_and_field(tmp_path):
  path = tmp_path / "spm.gguf"
  path.write_bytes(write_gguf_metadata(tiny_metadata(**{"tokenizer.ggml.model": "llama"})))
  with pytest.raises(FormatError, match=r"spm\.gguf.*tokenizer\.ggml\.model.*'llama'.*'gpt2'"):
    Tokenizer.from_gguf(path)
  ok = tmp_path / "tiny.gguf"
  ok.write_bytes(write_gguf_metadata(tiny_metadata()))
  assert Tokenizer.from_gguf(ok).encode(" the") == [3 + 256 + 2]


@pytest.mark.parametrize("field, value, match", [
  ("tokenizer.ggml.model", None, ": missing"),
  ("tokenizer.ggml.pre", "klingon", ": unknown pre-tokenizer 'klingon'; known: .*smollm"),
  ("tokenizer.ggml.tokens", "abc", ": expected an array of strings"),
  ("tokenizer.ggml.merges", ["Ġ t", "h"], r"\[1\]: 'h' is not two tokens"),
  ("tokenizer.ggml.merges", ["Ġ t", "q z"], r"\[1\]: 'q z' joins tokens that are not in the"),
  ("tokenizer.ggml.token_type", [1, 2], ": expected .* integers \\(one per token\\)"),
  ("tokenizer.ggml.eos_token_id", 10 ** 6, ": 1000000 is not a token id"),
  ("tokenizer.ggml.add_bos_token", 1, ": expected a bool"),
])
def test_malformed_metadata_raises_naming_the_field(field, value, match):
  kv = tiny_metadata(**{field: value})
  with pytest.raises(FormatError, match=rf"Tokenizer: tiny\.gguf: field {re.escape(field)}{match}"):
    Tokenizer.from_metadata(kv, "tiny.gguf")


def test_a_byte_without_a_token_is_dropped_as_tokenizers_drops_it():
  tokens = tiny_metadata()["tokenizer.ggml.tokens"]
  kv = tiny_metadata(**{"tokenizer.ggml.tokens": [t if t != "Ā" else "<dup>" for t in tokens]})
  tok = Tokenizer.from_metadata(kv)  # byte 0x00 has no token
  assert tok.encode("a\x00b") == [tok.vocab["a"], tok.vocab["b"]]
