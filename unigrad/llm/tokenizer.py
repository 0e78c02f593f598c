"""The GGUF tokenizer: byte-level BPE (GPT-2's scheme) from a file's `tokenizer.ggml.*` metadata.

Encoding a text, stage by stage:
1. special tokens: control, user-defined and unknown tokens are found whole in the text (the
   longest one at the leftmost position) and become their ids; the text between them goes on
   (`tokenizers`' added tokens; `parse_special=False` leaves control tokens to be spelled out);
2. pre-tokenize: the pre-tokenizer named by `tokenizer.ggml.pre` cuts each text into pieces by a
   sequence of regexes, each cutting the pieces of the one before (a regex's matches and the
   spans between them are pieces, as `tokenizers`' Split with behaviour "isolated"); for the
   llama3 names a piece that is a token as a whole is that token (`ignore_merges`);
3. symbols: a piece's UTF-8 bytes become the printable characters GPT-2 maps bytes to;
4. BPE: the adjacent pair with the lowest merge rank is joined, the leftmost of equal ranks first,
   until no pair has a rank (a heap over a linked list, O(n log n)); each piece's ids are cached.
   A byte whose symbol is not a token is dropped, as `tokenizers` (without an unknown token) and
   llama.cpp drop it: SmolLM2's vocabulary lacks a few control characters (0x04, 0x1d, ...) and
   bytes no UTF-8 text holds; the merges, checked on reading, make no other symbol without a token.
Decoding maps tokens back to bytes and decodes UTF-8 with U+FFFD for invalid bytes, as
`tokenizers`' ByteLevel decoder does; `StreamDecoder` does it one token at a time.
Reading the metadata checks every field it uses: a file that is not byte-level BPE, or whose
tokens, merges or ids are malformed, raises FormatError naming the file and the field.
"""
from __future__ import annotations

import codecs
import functools
import heapq
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from unigrad.nn.state import FileLike, FormatError, gguf_metadata
from unigrad.nn.tensor_io import source_name

try:
  import regex
except ImportError as e:  # pragma: no cover - the `llm` extra installs it
  raise ImportError("unigrad.llm's tokenizer needs the `regex` package (Unicode classes such as "
                    "\\p{L}): pip install 'unigrad[llm]'") from e

__all__ = ["Tokenizer", "TokenizerSpec", "StreamDecoder", "PreTokenizer", "PRE_TOKENIZERS",
           "TokenType", "tokenizer_spec", "pre_tokenize", "to_symbols"]


class TokenType:
  """`tokenizer.ggml.token_type` values (llama.cpp's llama_token_type)."""
  NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


# ---- pre-tokenizers: each is a sequence of split regexes ----

# GPT-2's split (tokenizers' ByteLevel(use_regex=True))
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# every digit alone (tokenizers' Digits(individual_digits=True))
DIGIT_SPLIT = r"\p{N}"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")



@dataclass(frozen=True)
class PreTokenizer:
  """How text is cut before BPE: split regexes applied in order, and whether a piece that is a
  token as a whole takes that token without BPE (`ignore_merges`, as Llama-3's tokenizer.json and
  llama.cpp's llama3 type do; a vocabulary can hold tokens its merges never build)."""
  splits: tuple[str, ...]
  ignore_merges: bool = False


GPT2 = PreTokenizer((GPT2_SPLIT,))
SMOLLM = PreTokenizer((DIGIT_SPLIT, GPT2_SPLIT))
LLAMA3 = PreTokenizer((LLAMA3_SPLIT,), ignore_merges=True)
# `tokenizer.ggml.pre` -> its pre-tokenizer, as llama.cpp groups the names
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
  "gpt-2": GPT2, "phi-2": GPT2,
  "smollm": SMOLLM, "starcoder": SMOLLM, "refact": SMOLLM, "command-r": SMOLLM,
  "llama-bpe": LLAMA3, "llama3": LLAMA3, "llama-v3": LLAMA3, "falcon3": LLAMA3, "pixtral": LLAMA3,
  "dbrx": PreTokenizer((LLAMA3_SPLIT,)), "smaug-bpe": PreTokenizer((LLAMA3_SPLIT,)),
  "qwen2": PreTokenizer((QWEN2_SPLIT,)), "deepseek-r1-qwen": PreTokenizer((QWEN2_SPLIT,)),
}
DEFAULT_PRE = "gpt-2"  # a file without `tokenizer.ggml.pre` (transformers' choice too)


def split_pieces(pieces: list[str], pattern: regex.Pattern) -> list[str]:
  """Each piece cut by `pattern`: its matches and the non-empty spans between them, in order."""
  out: list[str] = []
  for p in pieces:
    pos = 0
    for m in pattern.finditer(p):
      if m.start() > pos: out.append(p[pos:m.start()])
      if m.end() > m.start(): out.append(m.group())
      pos = m.end()
    if pos < len(p): out.append(p[pos:])
  return out


@functools.cache
def _compiled(pre: str) -> tuple[regex.Pattern, ...]:
  return tuple(regex.compile(p) for p in PRE_TOKENIZERS[pre].splits)


def pre_tokenize(text: str, pre: str) -> list[str]:
  """`text` cut into pieces by the pre-tokenizer named `pre` (a key of PRE_TOKENIZERS).
  `pre_tokenize("it's 42", "smollm")` -> `["it", "'s", " ", "4", "2"]`"""
  pieces = [text] if text else []
  for pattern in _compiled(pre): pieces = split_pieces(pieces, pattern)
  return pieces


# ---- GPT-2's bytes <-> printable characters ----

def _byte_symbols() -> tuple[str, ...]:
  """The character each byte is spelled with: printable Latin-1 bytes as themselves, the others
  (controls, space, NBSP, soft hyphen) as U+0100 onwards, in byte order."""
  kept = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
  out: list[str] = []
  moved = 0
  for b in range(256):
    out.append(chr(b) if b in kept else chr(0x100 + moved))
    moved += b not in kept
  return tuple(out)


BYTE_SYMBOLS = _byte_symbols()
SYMBOL_BYTES = {s: b for b, s in enumerate(BYTE_SYMBOLS)}
_LATIN1_TO_SYMBOLS = str.maketrans({chr(b): s for b, s in enumerate(BYTE_SYMBOLS)})


def to_symbols(text: str) -> str:
  """`text`'s UTF-8 bytes spelled in GPT-2's byte alphabet (`" a"` -> `"Ġa"`)."""
  return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_SYMBOLS)


def symbol_bytes(token: str) -> bytes:
  """The bytes a token stands for: its characters read back through the byte alphabet, or (for a
  token with a character outside it, such as an added token holding a real space) its own UTF-8,
  as `tokenizers`' ByteLevel decoder does."""
  try: return bytes([SYMBOL_BYTES[c] for c in token])
  except KeyError: return token.encode("utf-8")


# ---- the metadata ----

@dataclass(frozen=True)
class TokenizerSpec:
  """A byte-level BPE tokenizer as a GGUF file describes it, checked. `source` names the file."""
  tokens: tuple[str, ...]
  merges: tuple[tuple[str, str], ...]
  token_types: tuple[int, ...]
  pre: str
  bos_id: int | None
  eos_id: int | None
  unk_id: int | None
  pad_id: int | None
  add_bos: bool
  add_eos: bool
  source: str


def _fail(source: str, field: str, msg: str) -> FormatError:
  return FormatError(f"Tokenizer: {source}: field {field}: {msg}")


def _string_list(kv: dict[str, Any], key: str, source: str) -> list[str]:
  v = kv.get(key)
  if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
    raise _fail(source, key, f"expected an array of strings, got {type(v).__name__}")
  return v


def _token_id(kv: dict[str, Any], key: str, n: int, source: str) -> int | None:
  v = kv.get(key)
  if v is None: return None
  if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
    raise _fail(source, key, f"{v!r} is not a token id in 0..{n - 1}")
  return v


def _flag(kv: dict[str, Any], key: str, default: bool, source: str) -> bool:
  v = kv.get(key, default)
  if not isinstance(v, bool): raise _fail(source, key, f"expected a bool, got {v!r}")
  return v


def _merges(kv: dict[str, Any], vocab: dict[str, int], source: str) -> tuple[tuple[str, str], ...]:
  """`"a b"` strings -> pairs; both sides and their join must be tokens (`tokenizers` checks the
  same), so every symbol BPE makes has an id."""
  key = "tokenizer.ggml.merges"
  out: list[tuple[str, str]] = []
  for i, m in enumerate(_string_list(kv, key, source)):
    pair = m.split(" ")
    if len(pair) != 2 or not pair[0] or not pair[1]:
      raise _fail(source, f"{key}[{i}]", f"{m!r} is not two tokens separated by one space")
    if pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
      raise _fail(source, f"{key}[{i}]", f"{m!r} joins tokens that are not in the vocabulary")
    out.append((pair[0], pair[1]))
  return tuple(out)


def _token_types(kv: dict[str, Any], n: int, source: str) -> tuple[int, ...]:
  key = "tokenizer.ggml.token_type"
  v = kv.get(key)
  if v is None: return (TokenType.NORMAL,) * n
  if not isinstance(v, list) or len(v) != n or not all(isinstance(x, int) for x in v):
    raise _fail(source, key, f"expected {n} integers (one per token)")
  return tuple(v)


def _pre(kv: dict[str, Any], source: str) -> str:
  key = "tokenizer.ggml.pre"
  pre = kv.get(key, DEFAULT_PRE)
  if pre not in PRE_TOKENIZERS:
    raise _fail(source, key, f"unknown pre-tokenizer {pre!r}; known: "
                             f"{', '.join(sorted(PRE_TOKENIZERS))}")
  return pre


def tokenizer_spec(kv: dict[str, Any], source: str = "<metadata>") -> TokenizerSpec:
  """The tokenizer a GGUF file's metadata (`gguf_metadata`) describes; FormatError naming
  `source` and the field when it is not byte-level BPE or is malformed. A missing
  `tokenizer.ggml.pre` means GPT-2's split, a missing `add_bos_token` no BOS (transformers)."""
  model = kv.get("tokenizer.ggml.model")
  if model != "gpt2":
    what = "missing (the file carries no tokenizer)" if model is None else f"is {model!r}"
    raise _fail(source, "tokenizer.ggml.model", f"{what}; only 'gpt2' (byte-level BPE) is "
                                                "supported")
  tokens = _string_list(kv, "tokenizer.ggml.tokens", source)
  if not tokens: raise _fail(source, "tokenizer.ggml.tokens", "empty vocabulary")
  vocab = {t: i for i, t in enumerate(tokens)}
  n = len(tokens)
  ids = {k: _token_id(kv, f"tokenizer.ggml.{k}_token_id", n, source)
         for k in ("bos", "eos", "unknown", "padding")}
  return TokenizerSpec(tuple(tokens), _merges(kv, vocab, source), _token_types(kv, n, source),
                       _pre(kv, source), ids["bos"], ids["eos"], ids["unknown"], ids["padding"],
                       _flag(kv, "tokenizer.ggml.add_bos_token", False, source),
                       _flag(kv, "tokenizer.ggml.add_eos_token", False, source), source)


# ---- the tokenizer ----

CACHE_SIZE = 1 << 16  # pieces whose ids are kept; the cache starts over when full
MATCHED_TYPES = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
SKIPPED_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN)  # `skip_special_tokens` drops these


def _alternation(tokens: Iterable[str]) -> regex.Pattern | None:
  """One pattern matching any of `tokens`, the longest first where several start at a place."""
  ordered = sorted(set(tokens), key=len, reverse=True)
  return regex.compile("|".join(regex.escape(t) for t in ordered)) if ordered else None


class Tokenizer:
  """Byte-level BPE as a GGUF file describes it (`tokenizer.ggml.*`): ids equal to
  `tokenizers`' (and llama.cpp's) for the same vocabulary, merges and pre-tokenizer.

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("Hello world")          # [19556, 905]
    tok.decode(ids)                          # "Hello world"
  """

  def __init__(self, spec: TokenizerSpec) -> None:
    self.spec = spec
    self.tokens = spec.tokens
    self.vocab = {t: i for i, t in enumerate(spec.tokens)}
    self.bos_id, self.eos_id, self.unk_id, self.pad_id = (spec.bos_id, spec.eos_id, spec.unk_id,
                                                         spec.pad_id)
    self._ranks = {pair: rank for rank, pair in enumerate(spec.merges)}
    self._ignore_merges = PRE_TOKENIZERS[spec.pre].ignore_merges
    types = spec.token_types
    self.special_ids = frozenset(i for i, t in enumerate(types) if t in SKIPPED_TYPES)
    matched = [i for i, t in enumerate(types) if t in MATCHED_TYPES and spec.tokens[i]]
    self._special = {spec.tokens[i]: i for i in matched}
    self._all_special = _alternation(spec.tokens[i] for i in matched)
    self._user_defined = _alternation(spec.tokens[i] for i in matched
                                      if types[i] == TokenType.USER_DEFINED)
    self._bytes = [symbol_bytes(t) for t in spec.tokens]
    self._cache: dict[str, tuple[int, ...]] = {}

  @classmethod
  def from_gguf(cls, fn: FileLike) -> Tokenizer:
    """The tokenizer of a GGUF file (a path, its bytes or a uint8 Tensor), from its metadata."""
    return cls(tokenizer_spec(gguf_metadata(fn), source_name(fn)))

  @classmethod
  def from_metadata(cls, kv: dict[str, Any], source: str = "<metadata>") -> Tokenizer:
    """The tokenizer a GGUF metadata dict describes; `source` names it in errors."""
    return cls(tokenizer_spec(kv, source))

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  def __repr__(self) -> str:
    return (f"Tokenizer({self.spec.source}, {self.vocab_size} tokens, pre={self.spec.pre!r}, "
            f"bos={self.bos_id}, eos={self.eos_id})")

  # encoding

  def encode(self, text: str, add_special_tokens: bool = True,
             parse_special: bool = True) -> list[int]:
    """The ids of `text`. `add_special_tokens` adds BOS/EOS where the file asks for them
    (`tokenizer.ggml.add_bos_token`/`add_eos_token`); `parse_special=False` spells control tokens
    written in the text out as text (user input that must not inject `<|im_end|>`)."""
    if not isinstance(text, str): raise TypeError(f"encode: expected a str, got {type(text)}")
    ids: list[int] = []
    if add_special_tokens and self.spec.add_bos and self.bos_id is not None: ids.append(self.bos_id)
    pattern = self._all_special if parse_special else self._user_defined
    pos = 0
    for m in pattern.finditer(text) if pattern is not None else ():
      self._encode_text(text[pos:m.start()], ids)
      ids.append(self._special[m.group()])
      pos = m.end()
    self._encode_text(text[pos:], ids)
    if add_special_tokens and self.spec.add_eos and self.eos_id is not None: ids.append(self.eos_id)
    return ids

  def _encode_text(self, text: str, out: list[int]) -> None:
    """Appends the ids of `text`, which holds no special token, to `out`."""
    cache = self._cache
    for piece in pre_tokenize(text, self.spec.pre):
      ids = cache.get(piece)
      if ids is None:
        ids = self._piece_ids(to_symbols(piece))
        if len(cache) >= CACHE_SIZE: cache.clear()
        cache[piece] = ids
      out.extend(ids)

  def _piece_ids(self, word: str) -> tuple[int, ...]:
    """The ids of one piece spelled in the byte alphabet."""
    if self._ignore_merges and word in self.vocab: return (self.vocab[word],)
    return tuple(self.vocab[s] for s in self._merge(word) if s in self.vocab)

  def _merge(self, word: str) -> list[str]:
    """BPE over one piece's symbols: `prev`/`nxt` link the live symbols, the heap holds (rank,
    left position) of candidate pairs; an entry whose pair has changed since is dropped."""
    syms, ranks, n = list(word), self._ranks, len(word)
    if n < 2: return syms
    nxt, prev = list(range(1, n + 1)), list(range(-1, n - 1))
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((syms[i], syms[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
      rank, i = heapq.heappop(heap)
      j = nxt[i]
      if j >= n or not syms[i] or ranks.get((syms[i], syms[j])) != rank: continue
      syms[i], syms[j] = syms[i] + syms[j], ""
      nxt[i] = k = nxt[j]
      if k < n: prev[k] = i
      if (p := prev[i]) >= 0 and (r := ranks.get((syms[p], syms[i]))) is not None:
        heapq.heappush(heap, (r, p))
      if k < n and (r := ranks.get((syms[i], syms[k]))) is not None: heapq.heappush(heap, (r, i))
    return [s for s in syms if s]

  # decoding

  def token_bytes(self, token_id: int, skip_special_tokens: bool = False) -> bytes:
    """The bytes one token stands for (empty for a skipped special token). Any integer type
    is an id (numpy's too); anything else, or an id outside the vocabulary, is a ValueError."""
    try: i = operator.index(token_id)
    except TypeError: i = -1
    if not 0 <= i < len(self._bytes):
      raise ValueError(f"decode: token id {token_id!r} is not in 0..{len(self._bytes) - 1}")
    if skip_special_tokens and i in self.special_ids: return b""
    return self._bytes[i]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD. `skip_special_tokens`
    drops control (and unknown) tokens such as `<|im_end|>`."""
    data = b"".join(self.token_bytes(i, skip_special_tokens) for i in ids)
    return data.decode("utf-8", "replace")

  def stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
    """An incremental decoder for ids generated one at a time."""
    return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
  """Text from ids fed one at a time, never a broken character: `feed(id)` returns the text
  completed by that token (a character whose bytes span tokens comes out whole with its last
  byte), `flush()` what is left (U+FFFD for an unfinished character). The pieces joined equal
  `decode` of all the ids; `text` is what has come out so far.

    stream = tok.stream()
    for i in ids: print(stream.feed(i), end="")
    print(stream.flush())
  """

  def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
    self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
    self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    self._pieces: list[str] = []

  @property
  def text(self) -> str:
    """All the text given out since the stream started (what stop strings are searched in)."""
    return "".join(self._pieces)

  def feed(self, token_id: int) -> str:
    """The text that `token_id` completes (often "" inside a multi-byte character)."""
    out = self._utf8.decode(self.tokenizer.token_bytes(token_id, self.skip_special_tokens))
    if out: self._pieces.append(out)
    return out

  def flush(self) -> str:
    """The end of the stream: bytes of an unfinished character become U+FFFD (and join `text`).
    Ids fed after it start on a character boundary again."""
    out = self._utf8.decode(b"", final=True)
    self._utf8.reset()
    if out: self._pieces.append(out)
    return out
