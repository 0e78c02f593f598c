"""SmolLM2-135M-Instruct (its packaged GGUF file): unigrad.llm against transformers (PyTorch eager,
float32) on the same file and prompt, and the first token of a fresh `python -m unigrad.llm`.

  python bench/llm.py [--threads 2] [--prompt-tokens 128] [--decode-tokens 32] [--repeat 3]
                      [--no-fresh] [--no-torch] [--no-float32] [--no-float-matvec]
                      [--no-matvec] [--matvec-only]
                      [--llama-cpp-venv DIR | --no-llama-cpp] [--setup-llama-cpp]

unigrad runs on packed weights (the default: quantized blocks read by the matmuls; decoding's
matvecs over Q4_0/Q4_1/Q8_0 take int8 activations on a CPU with byte dot products, as llama.cpp's
do, the output head's two int8 passes),
on packed weights with float32 matvecs ("fp mv": INT8_MATVEC=0, `--no-float-matvec` skips it),
and with the weights dequantized to float32 at load (`--no-float32` skips it). For each: the bytes
its weights take and the KV cache a decoded token reads (its keys and values of every position
before it, on average over the run's positions), and the share of this machine's read bandwidth
(a unigrad sum over a 256 MiB float32 buffer, best of 5, measured before and after the runs: the
higher counts) its decode speed implies, with and without the cache. A matrix-vector
micro-benchmark per block format (a 4096x4096 packed weight times a vector under TinyJit,
float32 and, for Q4_0/Q4_1/Q8_0, int8): GB/s of packed bytes read.

Steady state, each library with `--threads` threads (unigrad's THREADS knob, torch's
set_num_threads): prefill tokens/s (one pass over a `--prompt-tokens` prompt, its last logits read)
and decode tokens/s (greedy, one token a step after the prompt: unigrad's Generator.decode_greedy
under TinyJit, the argmax on the device; transformers' forward with its KV cache and torch's
argmax; llama.cpp's eval and numpy's argmax of its logits), the best of `--repeat` runs after a
warm-up; ratio > 1 when unigrad is faster. unigrad's model is loaded with the command line's
context (2048), so both share compiled kernels. transformers dequantizes the file to float32
(`from_pretrained(folder, gguf_file=name, dtype=torch.float32)`); unigrad too (at load). On a busy
2-core machine two threads a side are at the mercy of preemption (a parallel region waits for a
descheduled thread: here torch's 576x1536 matrix-vector product took 0.14 ms on one thread and 8 ms
on two with the machine loaded), so run `--threads 1` as well and read the load average printed.

llama.cpp, the peer every CPU user compares with, runs the same GGUF file, prompt ids and thread
count (bench/llama_cpp_peer.py, in a subprocess) from llama-cpp-python built from source in the
benchmark's own virtual environment, never a project dependency: `--setup-llama-cpp` creates it
(LLAMA_CPP_VENV, 10-25 minutes of compiling on 2 cores; the build targets this CPU's extensions as
/proc/cpuinfo lists them, AMX aside). Without that environment the llama.cpp row is skipped with a
message saying so.

Fresh process: `python -m unigrad.llm --prompt ... --json --max-tokens 1` in a subprocess, with
CACHEDIR an empty temporary directory (cold: every kernel compiles) and then the same directory
again (warm): its first_token_s (from the command's start, the model's loading included) and the
subprocess's wall time (the interpreter's start and exit included).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import SETTLE_S

from unigrad import Context, Tensor, TinyJit
from unigrad.knobs import INT8_MATVEC, THREADS
from unigrad.llm import Tokenizer, default_model_path
from unigrad.llm.cli import DEFAULT_CONTEXT
from unigrad.llm.generate import Generator
from unigrad.llm.model import Transformer
from unigrad.nn.quantized import (INT8_FORMATS, QUANT_FORMATS, as_tensor, byte_dot, linear,
                                   pack, packed_nbytes, packed_weight)

ROOT = Path(__file__).resolve().parents[1]
# the benchmark's own virtual environment holding llama-cpp-python (see --setup-llama-cpp)
LLAMA_CPP_VENV = Path.home() / ".cache" / "unigrad" / "bench-llama-cpp"
LLAMA_CPP_VERSION = "0.3.36"
FIRST_TOKEN_PROMPT = "The capital of France is"
# the prompt text: cut to the first `--prompt-tokens` of its tokens (repeated if it is short)
PROMPT_TEXT = (
  "The history of computing is a story of layers. Transistors became gates, gates became "
  "arithmetic units, and arithmetic units became processors that run programs written in "
  "languages their designers never imagined. Each layer hides the one below it, and each one "
  "is rewritten when the layer above asks for something new: vector units for graphics, "
  "tensor cores for neural networks, and compilers that turn a few lines of Python into "
  "kernels for all of them. ")

Timed = Callable[[list[int], int], tuple[float, float]]


def prompt_ids(tok: Tokenizer, n: int) -> list[int]:
  """The first `n` ids of PROMPT_TEXT (repeated as often as needed)."""
  ids: list[int] = []
  while len(ids) < n: ids += tok.encode(PROMPT_TEXT)
  return ids[:n]


def weight_bytes(model: Transformer) -> int:
  """The bytes of the model's weights (packed parts or float32 buffers): what a token reads."""
  ws = [model.tok_embeddings, model.norm.weight]
  for b in model.layers:
    a = b.attention
    ws += [a.wq, a.wk, a.wv, a.wo, b.w_gate, b.w_up, b.w_down, b.attention_norm.weight,
           b.ffn_norm.weight]
  return packed_nbytes(*(as_tensor(w) for w in ws))  # (a stacked q/k/v buffer counted once)


def kv_bytes_per_position(model: Transformer) -> int:
  """The bytes of the KV cache one position holds over every layer: what a decoded token reads
  per position before it (its keys and its values)."""
  cfg, cache = model.cfg, model.layers[0].attention.cache_kv
  return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * cache.dtype.itemsize


def unigrad_run(path: str, packed: bool, int8: bool) -> tuple[Timed, int, int]:
  """A function timing unigrad on a prompt: (prefill seconds, seconds per decoded token); the
  bytes of its weights and of one position of its KV cache; `int8`: the INT8_MATVEC knob, at
  load and in every run."""
  with Context(INT8_MATVEC=int8):
    model = Transformer.from_gguf(path, max_context=DEFAULT_CONTEXT, packed=packed)
  gen = Generator(model)

  def run(ids: list[int], steps: int) -> tuple[float, float]:
    with Context(INT8_MATVEC=int8):
      t0 = time.perf_counter()
      tok = gen.prefill_greedy(ids)
      t1 = time.perf_counter()
      for pos in range(len(ids), len(ids) + steps): tok = gen.decode_greedy(tok, pos)
      return t1 - t0, (time.perf_counter() - t1) / steps
  return run, weight_bytes(model), kv_bytes_per_position(model)


def read_bandwidth(repeat: int = 5) -> float:
  """This machine's read bandwidth as unigrad sees it: bytes/s of a sum over 256 MiB of float32."""
  x = Tensor.ones(64 << 20).contiguous().realize()
  total = TinyJit(lambda t: t.sum().realize())
  for _ in range(3): total(x)
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    total(x)
    times.append(time.perf_counter() - t0)
  return x.nbytes() / min(times)


def report_matvec(repeat: int) -> None:
  """GB/s of packed bytes read by a 4096x4096 quantized matrix-vector product, per format: float32
  in registers, and for Q4_0/Q4_1/Q8_0 on a CPU with byte dot products the int8 matvec too."""
  print("quantized matvec 4096x4096 (nn.quantized.linear(x, W), W packed), TinyJit, best of "
        f"{repeat * 10} calls:")
  rng = random.Random(0)
  for name, fmt in QUANT_FORMATS.items():
    rows = cols = 4096
    nb = rows * cols // fmt.block
    block = bytearray(rng.randbytes(fmt.block_bytes * nb))
    for at in (208,) if name == "Q6_K" else (0, 2):  # float16 scales 2**-7: values stay finite
      block[at::fmt.block_bytes], block[at + 1::fmt.block_bytes] = bytes(nb), b"\x20" * nb
    for int8 in (False, True) if name in INT8_FORMATS and byte_dot("CPU") else (False,):
      with Context(INT8_MATVEC=int8):
        w = packed_weight(pack(Tensor(bytes(block)), fmt, (rows, cols)))
        assert w is not None
        x = Tensor.ones(1, cols).contiguous().realize()
        mv = TinyJit(lambda v, w=w: linear(v, w).realize())
        for _ in range(3): mv(x)
        times = []
        for _ in range(repeat * 10):
          t0 = time.perf_counter()
          mv(x)
          times.append(time.perf_counter() - t0)
      size = w.nbytes()
      print(f"  {name:5s} {'int8 ' if int8 else 'float'} {size / 2**20:6.1f} MiB  "
            f"{min(times) * 1e3:7.3f} ms  {size / min(times) / 1e9:6.2f} GB/s")


def torch_run(torch: Any, path: str) -> Timed:
  """The same for transformers: the file dequantized to float32, eager, its own KV cache."""
  from transformers import AutoModelForCausalLM  # noqa: PLC0415 (optional peer)
  model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                               gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()

  @torch.no_grad()
  def run(ids: list[int], steps: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    # the last position's logits only, as unigrad's prefill (and transformers' generate) computes
    out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
    t1 = time.perf_counter()
    for _ in range(steps):
      nxt = out.logits[:, -1].argmax(-1, keepdim=True)
      out = model(nxt, cache=out.cache, use_cache=True)
    return t1 - t0, (time.perf_counter() - t1) / steps
  return run


def venv_python(venv: Path) -> Path: return venv / "bin" / "python"


# /proc/cpuinfo flag -> the ggml build option using it
GGML_ISA_OPTIONS = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
                    "avx512f": "GGML_AVX512", "avx512_vnni": "GGML_AVX512_VNNI",
                    "avx512_bf16": "GGML_AVX512_BF16", "avx_vnni": "GGML_AVX_VNNI"}


def llama_cpp_cmake_args() -> str:
  """The ggml build options for this CPU: each x86 extension /proc/cpuinfo lists, AMX left out
  (GGML_NATIVE's -march=native compiles AMX tiles in where the CPU lists them, and a virtual
  machine that lists them without the kernel granting them dies of SIGILL on the first matmul);
  elsewhere GGML_NATIVE."""
  try: text = Path("/proc/cpuinfo").read_text()
  except OSError: return "-DGGML_NATIVE=ON"
  flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                if line.startswith("flags")), set())
  if "avx2" not in flags: return "-DGGML_NATIVE=ON"
  return " ".join(["-DGGML_NATIVE=OFF",
                   *(f"-D{opt}=ON" for flag, opt in GGML_ISA_OPTIONS.items() if flag in flags)])


def setup_llama_cpp(venv: Path) -> None:
  """Create `venv` and build llama-cpp-python from source into it, for this CPU."""
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
  env = {**os.environ, "CMAKE_ARGS": llama_cpp_cmake_args(),
         "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
  subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--no-binary",
                  "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_VERSION}"], env=env,
                 check=True)


def llama_cpp_row(venv: Path, path: str, ids: list[int], args: argparse.Namespace
                  ) -> tuple[float, float] | None:
  """llama.cpp's fastest (prefill seconds, seconds per decoded token) on `ids`, or None (with a
  message) when `venv` holds no llama-cpp-python."""
  python = venv_python(venv)
  if not python.exists():
    print(f"(no llama.cpp environment at {venv}: `python bench/llm.py --setup-llama-cpp` builds "
          "one; llama.cpp is not compared)")
    return None
  time.sleep(SETTLE_S)
  cmd = [str(python), str(ROOT / "bench" / "llama_cpp_peer.py"), path,
         "--ids", ",".join(map(str, ids)), "--decode-tokens", str(args.decode_tokens),
         "--threads", str(args.threads), "--repeat", str(args.repeat),
         "--context", str(DEFAULT_CONTEXT)]
  out = subprocess.run(cmd, capture_output=True, text=True)
  if out.returncode != 0:
    last = (out.stderr.strip().splitlines() or [""])[-1]
    print(f"(llama.cpp failed with exit status {out.returncode}, not compared: {last})")
    return None
  r = json.loads(out.stdout.strip().splitlines()[-1])
  print(f"(llama.cpp: llama-cpp-python {r['version']} built from source in {venv})")
  return r["prefill_s"], r["decode_s"]


def best(run: Timed, ids: list[int], steps: int, repeat: int) -> tuple[float, float]:
  """The fastest prefill and per-token decode of `repeat` runs after a warm-up run (unigrad's
  first decode steps capture the jit)."""
  time.sleep(SETTLE_S)
  run(ids, 3)
  times = [run(ids, steps) for _ in range(repeat)]
  return min(t[0] for t in times), min(t[1] for t in times)


def report_steady(args: argparse.Namespace, path: str) -> None:
  ids = prompt_ids(Tokenizer.from_gguf(path), args.prompt_tokens)
  bandwidth = read_bandwidth()  # measured again at the end: the higher one counts
  rows, sizes, kv = {}, {}, {}
  variants = [("unigrad", True, bool(INT8_MATVEC)), ("unigrad f32", False, False)]
  if INT8_MATVEC and byte_dot("CPU") and not args.no_float_matvec:
    variants.insert(1, ("unigrad fp mv", True, False))
  for name, packed, int8 in variants:
    if not packed and args.no_float32: continue
    run, sizes[name], kv[name] = unigrad_run(path, packed, int8)
    rows[name] = best(run, ids, args.decode_tokens, args.repeat)
    del run
  ours = rows["unigrad"]
  torch = None if args.no_torch else try_torch(args.threads)
  if torch is not None: rows["transformers"] = best(torch_run(torch, path), ids,
                                                    args.decode_tokens, args.repeat)
  if not args.no_llama_cpp and (row := llama_cpp_row(args.llama_cpp_venv, path, ids, args)):
    rows["llama.cpp"] = row
  load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
  print(f"{len(ids)}-token prompt, {args.decode_tokens} decoded tokens, {args.threads} threads "
        f"(load average {load} on {os.cpu_count()} cores: other work inflates times)")
  for name, (prefill, decode) in rows.items():
    print(f"  {name:13s} prefill {len(ids) / prefill:8.1f} tok/s ({prefill * 1e3:7.1f} ms)  "
          f"decode {1 / decode:7.1f} tok/s ({decode * 1e3:6.1f} ms/token)")
  for peer in ("transformers", "llama.cpp"):
    if peer not in rows: continue
    (p0, d0), (p1, d1) = ours, rows[peer]
    print(f"  unigrad / {peer}: prefill x{p1 / p0:.2f}, decode x{d1 / d0:.2f}")
  bandwidth = max(bandwidth, read_bandwidth())
  print(f"read bandwidth (unigrad sum of 256 MiB float32, the higher of two measurements, before "
        f"and after the runs): {bandwidth / 1e9:.2f} GB/s; "
        f"file {os.path.getsize(path) / 1e6:.1f} MB")
  # a token decoded at position p reads the cache's p + 1 positions: on average over the run's
  # positions len(ids) .. len(ids) + steps - 1
  positions = len(ids) + (args.decode_tokens + 1) / 2
  for name, size in sizes.items():
    cache = kv[name] * positions
    per_s, weights_per_s = (size + cache) / rows[name][1], size / rows[name][1]
    print(f"  {name:13s} weights {size / 1e6:7.1f} MB + KV cache {cache / 1e6:4.1f} MB read per "
          f"decoded token: {per_s / 1e9:6.2f} GB/s, {per_s / bandwidth:6.1%} of the read "
          f"bandwidth (the weights alone: {weights_per_s / bandwidth:6.1%})")


def try_torch(threads: int) -> Any:
  """torch on `threads` threads, or None without torch, transformers or gguf."""
  for name in ("torch", "transformers", "gguf", "accelerate"):
    if importlib.util.find_spec(name) is None:
      print(f"({name} is not installed: transformers is not compared)")
      return None
  import torch  # noqa: PLC0415 (optional peer)
  torch.set_num_threads(threads)
  return torch


# ---- the first token of a fresh process ----

def fresh_process(path: str, cachedir: str, threads: int) -> tuple[dict[str, Any], float]:
  """`python -m unigrad.llm ... --json --max-tokens 1` with CACHEDIR: its JSON and wall time."""
  env = {**os.environ, "CACHEDIR": cachedir, "PYTHONPATH": str(ROOT), "THREADS": str(threads)}
  cmd = [sys.executable, "-m", "unigrad.llm", "--prompt", FIRST_TOKEN_PROMPT, "--json",
         "--max-tokens", "1", "--model", path]
  t0 = time.perf_counter()
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
  return json.loads(out.stdout), time.perf_counter() - t0


def report_fresh(path: str, threads: int) -> None:
  print(f"first token of a fresh `python -m unigrad.llm --prompt {FIRST_TOKEN_PROMPT!r} --json "
        "--max-tokens 1`")
  with tempfile.TemporaryDirectory(prefix="unigrad-bench-cache-") as cachedir:
    for label in ("cold", "warm"):
      r, wall = fresh_process(path, cachedir, threads)
      print(f"  {label} compile cache: first_token_s {r['first_token_s']:6.2f} s (loading "
            f"{r['load_s']:.2f} s)  wall {wall:6.2f} s")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--threads", type=int, default=2, help="threads of each library (default 2)")
  p.add_argument("--prompt-tokens", type=int, default=128)
  p.add_argument("--decode-tokens", type=int, default=32)
  p.add_argument("--repeat", type=int, default=3)
  p.add_argument("--no-fresh", action="store_true", help="skip the fresh-process timings")
  p.add_argument("--no-torch", action="store_true", help="unigrad alone")
  p.add_argument("--no-float32", action="store_true", help="skip unigrad on float32 weights")
  p.add_argument("--no-matvec", action="store_true", help="skip the quantized matvec per format")
  p.add_argument("--no-float-matvec", action="store_true",
                 help="skip unigrad on packed weights with float32 matvecs (INT8_MATVEC=0)")
  p.add_argument("--matvec-only", action="store_true", help="the quantized matvecs alone")
  p.add_argument("--llama-cpp-venv", type=Path, default=LLAMA_CPP_VENV,
                 help=f"the virtual environment of llama-cpp-python (default {LLAMA_CPP_VENV})")
  p.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp")
  p.add_argument("--setup-llama-cpp", action="store_true",
                 help="build llama-cpp-python from source into --llama-cpp-venv first")
  args = p.parse_args()
  if args.setup_llama_cpp: setup_llama_cpp(args.llama_cpp_venv)
  THREADS.value = args.threads
  if not args.no_matvec: report_matvec(args.repeat)
  if args.matvec_only: return
  path = default_model_path()
  report_steady(args, path)
  if not args.no_fresh: report_fresh(path, args.threads)


if __name__ == "__main__":
  main()
