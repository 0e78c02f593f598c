"""tinygrad's own example programs run on unigrad with only their import lines changed.

The programs are tinygrad's files, kept unchanged (with tinygrad's MIT licence) under
`tinygrad_programs/`. `ported()` reads one, points each `from tinygrad... import` line at unigrad
(`IMPORT_PATHS`: the module paths unigrad spells differently; `ABSENT`: names unigrad leaves out on
purpose, dropped from the import line, which the program then never calls here) and, for a cheap
run, substitutes a few constants (layer widths, episode counts), each replacement checked to
apply exactly once. Nothing else of a program changes: what one needs of unigrad is unigrad's to
provide.

- `beautiful_mnist.py`: the MNIST CNN under `@function`, a `@TinyJit` train step under
  `@Context(TRAINING=1)` returning `loss.realize(*opt.schedule_step())`, `trange`, and
  `nn.datasets.mnist` reading MNIST-format files the test writes from the shipped UCI digits.
- `beautiful_cartpole.py`: PPO on gymnasium's CartPole (no download; the `gymnasium` package),
  two TinyJits (one reset every episode), `multinomial`, `Tensor(numpy_array)`.
- `gradaccum_mnist.py` (SLOW=1): gradient accumulation over micro-batches in TinyJits that take
  no arguments.
- `gpt2.py`: the GPT-2 model classes and generation loop (a KV cache written by a symbolic
  slice's `assign`, `Variable`s bound per step, a token passed as a bound UOp into a TinyJit) on
  a small random model, checked token for token against GPT-2 written in PyTorch with the same
  weights (loaded by the program's `load_state_dict`, transposed as `GPT2.build` does).

Tried and not here: `beautiful_mnist_multigpu.py` runs unchanged on two CPU devices (`GPUS`
CPU:0 and CPU:1), but its first steps take over a minute (multi-device scheduling), too slow for
the suite; `stunning_mnist.py` (the whole training as one lazy graph, realized at the end) stops
with VariableBindError: its steps bind one Variable to different values in one schedule, and
`sparse_categorical_crossentropy`'s eager check of the labels runs kernels where the program
asserts that none ran.
"""
import gzip
import math
import re
import runpy
import struct
import sys
import types
from pathlib import Path

import pytest

from unigrad.knobs import UNIGRAD_DATA
from unigrad.nn.datasets import digits

PROGRAMS = Path(__file__).parent / "tinygrad_programs"
# tinygrad's module paths that unigrad spells differently (docs/api.md, "Package and module
# paths"); any other `tinygrad` prefix becomes `unigrad`
IMPORT_PATHS = {"tinygrad.uop.ops": "unigrad.ops", "tinygrad.llm.gguf": "unigrad.nn.gguf"}
# names unigrad leaves out on purpose (docs/api.md, "Deliberately absent"): downloads
ABSENT = {"fetch"}
_IMPORT = re.compile(r"^(\s*)from (tinygrad[\w.]*) import (.+)$")


def port_import(line: str) -> str:
  """One line of a program: a `from tinygrad... import ...` line pointed at unigrad."""
  m = _IMPORT.match(line)
  if m is None:
    assert not re.match(r"\s*import tinygrad", line), line
    return line
  indent, module, names = m.groups()
  module = IMPORT_PATHS.get(module, "unigrad" + module[len("tinygrad"):])
  kept = [n.strip() for n in names.split(",") if n.strip() not in ABSENT]
  return f"{indent}from {module} import {', '.join(kept)}"


def ported(name: str, replacements: dict[str, str], tmp_path: Path) -> Path:
  """tinygrad_programs/NAME.py with its imports pointed at unigrad and each of `replacements`
  (text -> text, for smaller sizes) made exactly once, written to tmp_path."""
  text = "\n".join(port_import(line) for line in (PROGRAMS / f"{name}.py").read_text().splitlines())
  for old, new in replacements.items():
    assert text.count(old) == 1, f"{name}.py: {old!r} occurs {text.count(old)} times"
    text = text.replace(old, new)
  path = tmp_path / f"{name}.py"
  path.write_text(text + "\n")
  return path


def test_port_import_rewrites_only_import_lines():
  assert port_import("from tinygrad import Tensor, nn") == "from unigrad import Tensor, nn"
  assert port_import("  from tinygrad.uop.ops import UOp") == "  from unigrad.ops import UOp"
  assert port_import("from tinygrad.helpers import getenv, fetch, trange") == \
    "from unigrad.helpers import getenv, trange"
  assert port_import("x = 'from tinygrad import Tensor'") == "x = 'from tinygrad import Tensor'"


# ---- beautiful_mnist.py ----

def write_digits_as_mnist(directory: Path, n_train: int = 256, n_test: int = 64) -> None:
  """MNIST's four gzipped IDX files from the digits: 8x8 scaled 3x (24x24), padded to 28x28."""
  xtr, ytr, xte, yte = digits()
  directory.mkdir(parents=True)
  for name, x, y, n in (("train", xtr, ytr, n_train), ("t10k", xte, yte, n_test)):
    small = x[:n].numpy().reshape(n, 8, 8)
    big = bytearray(n * 28 * 28)
    for k in range(n):
      for r in range(24):
        row = bytes(int(small[k, r // 3, c // 3]) for c in range(24))
        start = k * 784 + (r + 2) * 28 + 2
        big[start:start + 24] = row
    (directory / f"{name}-images-idx3-ubyte.gz").write_bytes(
      gzip.compress(struct.pack(">4I", 0x803, n, 28, 28) + bytes(big)))
    (directory / f"{name}-labels-idx1-ubyte.gz").write_bytes(
      gzip.compress(struct.pack(">2I", 0x801, n) + bytes(y[:n].tolist())))


# the layers narrowed from 32 and 64 channels to 4 and 8: every construct at a fraction of the
# compile and run time
MNIST_NARROW = {"nn.Conv2d(1, 32, 5)": "nn.Conv2d(1, 4, 5)",
                "nn.Conv2d(32, 32, 5)": "nn.Conv2d(4, 4, 5)",
                "nn.BatchNorm(32)": "nn.BatchNorm(4)", "nn.Conv2d(32, 64, 3)": "nn.Conv2d(4, 8, 3)",
                "nn.Conv2d(64, 64, 3)": "nn.Conv2d(8, 8, 3)", "nn.BatchNorm(64)": "nn.BatchNorm(8)",
                "nn.Linear(576, 10)": "nn.Linear(72, 10)"}


def _run_mnist(tmp_path, monkeypatch, capsys, replacements: dict[str, str]) -> dict:
  """beautiful_mnist.py as a script on the digits written as MNIST: ten steps of 16 (the test
  accuracy is read at step ten; TinyJit replays from step three). Checks the progress bar's last
  line and that BatchNorm's running statistics were written at every step."""
  write_digits_as_mnist(tmp_path / "data" / "mnist")
  program = ported("beautiful_mnist", replacements, tmp_path)
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path / "data"))
  for k, v in {"STEPS": "10", "BS": "16", "TARGET_EVAL_ACC_PCT": "1"}.items():
    monkeypatch.setenv(k, v)
  env = runpy.run_path(str(program), run_name="__main__")
  out = capsys.readouterr()
  last = out.err.rstrip("\n").split("\r")[-1]
  assert "100%|" in last and " 10/10 [" in last, last
  loss = float(last.split("loss:")[1].split()[0])
  acc = float(last.split("test_accuracy:")[1].split("%")[0])
  assert math.isfinite(loss) and 0 <= acc <= 100
  assert "test_acc=" in out.out  # the program's own check of TARGET_EVAL_ACC_PCT passed
  bn = env["model"].layers[4]
  assert bn.num_batches_tracked.item() == 10
  return env


@pytest.mark.slow
def test_tinygrad_beautiful_mnist_runs(tmp_path, monkeypatch, capsys):
  """The program at its full width (about a minute from a cold compile cache here)."""
  _run_mnist(tmp_path, monkeypatch, capsys, {})


def test_tinygrad_beautiful_mnist_runs_narrow(tmp_path, monkeypatch, capsys):
  _run_mnist(tmp_path, monkeypatch, capsys, MNIST_NARROW)


@pytest.mark.slow
def test_tinygrad_gradaccum_mnist_runs(tmp_path, monkeypatch, capsys):
  """gradaccum_mnist.py (narrowed): gradients accumulated over micro-batches by a TinyJit that
  takes no arguments and assigns into tensors made outside it, a functional Adam on the CPU in a
  second TinyJit, parameters split from buffers by `is_param` (about 40 s from a cold cache)."""
  write_digits_as_mnist(tmp_path / "data" / "mnist")
  program = ported("gradaccum_mnist", MNIST_NARROW, tmp_path)
  monkeypatch.setattr(UNIGRAD_DATA, "value", str(tmp_path / "data"))
  for k, v in {"STEPS": "3", "BS": "32", "ACC_STEPS": "2"}.items(): monkeypatch.setenv(k, v)
  env = runpy.run_path(str(program), run_name="__main__")
  out = capsys.readouterr()
  assert "params: 14 buffers: 6" in out.out  # weights and biases; BatchNorm's statistics
  last = out.err.rstrip("\n").split("\r")[-1]
  assert " 3/3 [" in last and math.isfinite(float(last.split("loss:")[1].split()[0])), last
  assert env["optimizer"].captured is not None


# ---- beautiful_cartpole.py ----

CARTPOLE_SMALL = {"BATCH_SIZE = 256": "BATCH_SIZE = 32", "EPISODES = 40": "EPISODES = 2",
                  "TRAIN_STEPS = 5": "TRAIN_STEPS = 3"}


def test_tinygrad_beautiful_cartpole_runs(tmp_path, monkeypatch, capsys):
  """Two episodes of three PPO steps (train_step replays from its third call; get_action, reset
  every episode, replays within each), then the program's closing evaluation. There is no
  display here: its `render_mode='human'` environment is made without rendering."""
  gym = pytest.importorskip("gymnasium")
  make = gym.make
  monkeypatch.setattr(gym, "make", lambda name, render_mode=None, **kw: make(name, **kw))
  program = ported("beautiful_cartpole", CARTPOLE_SMALL, tmp_path)
  env = runpy.run_path(str(program), run_name="__main__")
  out = capsys.readouterr()
  last = out.err.rstrip("\n").split("\r")[-1]
  assert "100%|" in last and " 2/2 [" in last, last
  for name in ("action_loss", "entropy_loss", "critic_loss"):
    assert math.isfinite(float(last.split(f"{name}:")[1].split()[0])), last
  reward = float(out.out.split("test reward:")[1])
  assert 1 <= reward <= 500
  assert env["train_step"].captured is not None


# ---- gpt2.py ----

GPT2_SMALL = dict(n_layers=2, n_heads=4, dim=32, norm_eps=1e-5, vocab_size=64)
MAX_CONTEXT = 32


class CharTokenizer:
  """tiktoken's two calls that GPT2.generate makes, over 64 characters (' ' to '_')."""
  def encode(self, text: str, allowed_special: object = None) -> list[int]:
    return [ord(c) - 32 for c in text]

  def decode(self, ids: list[int]) -> str: return "".join(chr(i + 32) for i in ids)


def _bench_log_stub() -> types.ModuleType:
  """tinygrad's `extra.bench_log` (its repository's benchmark logger, no part of the package):
  the two names gpt2.py uses, doing nothing."""
  mod = types.ModuleType("extra.bench_log")
  mod.BenchEvent = types.SimpleNamespace(LOAD_WEIGHTS="load_weights", STEP="step")
  mod.WallTimeEvent = lambda event: __import__("contextlib").nullcontext()
  return mod


def _random_gpt2_weights(torch) -> dict:
  """A GPT-2 state dict of GPT2_SMALL's size in the layout of the published checkpoints (the
  keys of HF's `pytorch_model.bin`; its Conv1D weights are (in, out)), random values (larger
  than GPT-2's initial ones, so that greedy choices are far from ties)."""
  d, v = GPT2_SMALL["dim"], GPT2_SMALL["vocab_size"]
  shapes = {"wte.weight": (v, d), "wpe.weight": (MAX_CONTEXT, d),
            "ln_f.weight": (d,), "ln_f.bias": (d,)}
  for i in range(GPT2_SMALL["n_layers"]):
    shapes.update({f"h.{i}.{k}": s for k, s in {
      "ln_1.weight": (d,), "ln_1.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
      "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
      "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
      "mlp.c_fc.weight": (d, 4 * d), "mlp.c_fc.bias": (4 * d,),
      "mlp.c_proj.weight": (4 * d, d), "mlp.c_proj.bias": (d,)}.items()})
  gen = torch.Generator().manual_seed(0)
  return {k: torch.randn(s, generator=gen) * 0.3 for k, s in shapes.items()}


def _gpt2_logits(torch, w: dict, ids: list[int]):
  """GPT-2's next-token logits, written from its definition in PyTorch: pre-norm blocks of
  causal multi-head attention and an exact-GELU MLP (unigrad's `gelu()` is PyTorch's exact
  form), tied output embedding."""
  F, (d, heads, eps), t = torch.nn.functional, (GPT2_SMALL[k] for k in ("dim", "n_heads",
                                                                         "norm_eps")), len(ids)
  def norm(x, name): return F.layer_norm(x, (d,), w[f"{name}.weight"], w[f"{name}.bias"], eps)
  def lin(x, name): return x @ w[f"{name}.weight"] + w[f"{name}.bias"]
  def split(x): return x.view(t, heads, d // heads).transpose(0, 1)
  x = w["wte.weight"][ids] + w["wpe.weight"][:t]
  for i in range(GPT2_SMALL["n_layers"]):
    q, k, v = lin(norm(x, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn").split(d, -1)
    a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    x = x + lin(a.transpose(0, 1).reshape(t, d), f"h.{i}.attn.c_proj")
    x = x + lin(F.gelu(lin(norm(x, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc")), f"h.{i}.mlp.c_proj")
  return norm(x, "ln_f")[-1] @ w["wte.weight"].T


def _greedy(torch, w: dict, ids: list[int], n: int) -> list[int]:
  ids = list(ids)
  for _ in range(n): ids.append(int(_gpt2_logits(torch, w, ids).argmax()))
  return ids


def test_tinygrad_gpt2_generates_like_pytorch(tmp_path, monkeypatch, capsys):
  """GPT2.generate over the program's Transformer (two layers of width 32, a 64-token vocabulary,
  MAX_CONTEXT 32), with random weights in the published checkpoints' layout loaded as GPT2.build
  loads the downloaded ones: eight greedy tokens equal those of GPT-2 written in PyTorch. The
  prompt runs uncached, then each token goes through the jitted forward as a bound Variable (an
  eager call, a capture, then replays with new `tokens` and `start_pos` values)."""
  torch = pytest.importorskip("torch")
  monkeypatch.setenv("MAX_CONTEXT", str(MAX_CONTEXT))
  monkeypatch.setitem(sys.modules, "extra", types.ModuleType("extra"))
  monkeypatch.setitem(sys.modules, "extra.bench_log", _bench_log_stub())
  program = ported("gpt2", {"VOCAB_SIZE = 50257": "VOCAB_SIZE = 64"}, tmp_path)
  g = runpy.run_path(str(program), run_name="gpt2_program")
  w = _random_gpt2_weights(torch)
  weights = {k: g["Tensor"](v.numpy()) for k, v in w.items()}
  transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
  for k in weights:  # GPT2.build's lines after its download
    if k.endswith(transposed): weights[k] = weights[k].T
  weights['lm_head.weight'] = weights['wte.weight']
  model = g["Transformer"](**GPT2_SMALL, max_seq_len=MAX_CONTEXT)
  g["load_state_dict"](model, weights)
  tok, prompt = CharTokenizer(), "HELLO, WORLD"
  text, = g["GPT2"](model, tok).generate(prompt, 8, temperature=0.0)
  assert tok.encode(text) == _greedy(torch, w, tok.encode(prompt), 8)
  assert model.forward_jit.captured is not None
  assert " 8/8 [" in capsys.readouterr().err
