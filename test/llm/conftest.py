"""Shared fixtures of the unigrad.llm tests: the packaged SmolLM2 file, its metadata and
tokenizer (read once per session), and transformers' tokenizer for the same file as the
reference. Each skips, saying why, when its package is missing."""
import pytest

from unigrad.llm import Tokenizer, default_model_path
from unigrad.llm.cli import DEFAULT_CONTEXT, load_model
from unigrad.nn.state import gguf_metadata


@pytest.fixture(scope="session")
def model_path() -> str:
  try: return default_model_path()
  except FileNotFoundError as e: pytest.skip(f"no model file: {e}")


@pytest.fixture(scope="session")
def metadata(model_path) -> dict:
  return gguf_metadata(model_path)


@pytest.fixture(scope="session")
def tok(model_path, metadata) -> Tokenizer:
  return Tokenizer.from_metadata(metadata, model_path)


@pytest.fixture(scope="session")
def hf_build(model_path):
  """A function building transformers' tokenizer for the file from its GGUF metadata, read once
  by transformers' own reader (`tokenizer.ggml.pre` replaced when `pre` is given), as a
  `PreTrainedTokenizerFast`. `AutoTokenizer.from_pretrained(folder, gguf_file=name)` calls these
  same functions, after also reading the whole file for the model config (7 s here)."""
  transformers = pytest.importorskip("transformers", reason="the reference is transformers'")
  ggml = pytest.importorskip("transformers.integrations.gguf",
                             reason="this transformers has no GGUF tokenizer conversion")
  arch, tokenizer_dict, config = ggml.get_gguf_tokenizer(model_path)

  def build(pre: str | None = None):
    d = tokenizer_dict if pre is None else {**tokenizer_dict, "pre_tokenizer_type": pre}
    backend, _ = ggml.convert_gguf_tokenizer(arch, d)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **config)
  return build


@pytest.fixture(scope="session")
def hf_tok(hf_build):
  """transformers' GGUF tokenizer for the file as it converts it: its pre-tokenizer for `smollm`
  is GPT-2's split (transformers does not know the name)."""
  return hf_build()


@pytest.fixture(scope="session")
def llm(model_path):
  """The packaged model loaded as the command line loads it (its default context, so the
  kernels it compiles are the ones `python -m unigrad.llm` finds in the cache), shared by the
  generation, command-line and server tests."""
  return load_model(model_path, DEFAULT_CONTEXT)
