"""Whole models as a user writes them: unigrad vs PyTorch (CPU) in the same run.

  python bench/models.py [--repeat 10] [--only minilm] [--no-first-call]
  THREADS=1 python bench/models.py      # both libraries on one thread (a busy machine)
  THREADS=1 python bench/models.py --cpu-time   # ... timed by the thread's CPU time (a loaded
                                                # machine's preemption does not count)

Each case is a row of CASES: a name and a builder that returns unigrad's step and PyTorch's step
on the same weights and inputs: the MiniLM forward (eager as a user writes it: on one batch again
and again, and on new input tensors at every call; and under TinyJit), EfficientNet-Lite0
inference at batch 1 and 8 and depthwise convolutions (3x3 and 5x5, stride 1 and 2, the shapes of
its blocks) against torch eager and torch.compile, and the training steps of bench/train_step.py
(the digits CNN with Adam, an MLP with SGD). Steady state: the best of
`--repeat` calls after a warm-up (the schedule and program caches are warm), ratio > 1 when
unigrad is faster; torch runs with as many threads as unigrad's kernels (`THREADS`, default every
core). First call: the case is built and called once in a fresh process (python -c), with
CACHEDIR an empty temporary directory (cold: every kernel compiles) and then the same directory
again (warm: schedules, kernels and binaries come from disk), for the MiniLM cases and
EfficientNet at batch 1; `--no-first-call` skips it.

MiniLM (examples/minilm.py) uses the packaged all-MiniLM-L6-v2 weights when `unigrad[minilm]` is
installed, EfficientNet (examples/efficientnet.py) the packaged Lite0 checkpoint with
`unigrad[efficientnet]`, else each its own random initialization (the same work either way).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import CLOCK, best_of, row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import efficientnet  # noqa: E402
from minilm import BertConfig, MiniLM, SentenceEncoder  # noqa: E402
from train_step import both_steps, cnn_case, mlp_case  # noqa: E402

from unigrad import Tensor, TinyJit, dtypes  # noqa: E402
from unigrad.nn.state import get_state_dict  # noqa: E402
from unigrad.runtime.ops_cpu import cpu_threads  # noqa: E402

Step = Callable[[], Any]
Peers = Step | dict[str, Step] | None  # torch's step, or one per torch mode ("torch.compile")
Builder = Callable[[Any], tuple[Step, Peers]]


@dataclass(frozen=True)
class Case:
  """A benchmark row: `build(torch)` -> (unigrad step, torch's step, a dict of torch steps by
  name, or None without torch). A step runs the whole model call and waits for its result."""
  name: str
  build: Builder


# ---- MiniLM ----

def minilm_encoder() -> SentenceEncoder:
  """The packaged all-MiniLM-L6-v2 when installed, else a randomly initialized one (realized)."""
  try: return MiniLM.load().model
  except ModuleNotFoundError:
    model = SentenceEncoder(BertConfig())
    Tensor.realize_all(*get_state_dict(model).values())
    return model


def token_batch(batch: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
  """Random token ids (CLS first) and an attention mask padding the later rows by up to half."""
  rng = np.random.default_rng(0)
  ids = rng.integers(1000, 30000, size=(batch, seq)).astype(np.int32)
  ids[:, 0] = 101
  lengths = seq - (np.arange(batch) * (seq // 2) // max(batch - 1, 1))
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  return ids * mask, mask


def minilm_forward(batch: int, seq: int, new_inputs: bool = False) -> Builder:
  """The forward on one token batch; with `new_inputs`, unigrad's step makes its input tensors
  from the arrays at every call (as a loop over tokenized batches does: no graph is the same as
  the last one), torch's wraps them as well."""
  def build(torch: Any) -> tuple[Step, Peers]:
    model = minilm_encoder()
    ids, mask = token_batch(batch, seq)
    u_ids, u_mask = Tensor(ids, dtype=dtypes.int32), Tensor(mask, dtype=dtypes.int32)
    def same_inputs() -> Any: return model(u_ids, u_mask).realize()
    def new_tensors() -> Any:
      return model(Tensor(ids, dtype=dtypes.int32), Tensor(mask, dtype=dtypes.int32)).realize()
    ours: Step = new_tensors if new_inputs else same_inputs
    if torch is None: return ours, None
    from minilm_torch import torch_embed  # noqa: PLC0415 (needs torch, which is optional)
    weights = {k: torch.from_numpy(v.numpy()) for k, v in get_state_dict(model).items()}
    t_ids, t_mask = torch.from_numpy(ids).long(), torch.from_numpy(mask).long()

    def theirs() -> Any:
      with torch.inference_mode():
        if new_inputs: return torch_embed(weights, BertConfig(), torch.from_numpy(ids).long(),
                                          torch.from_numpy(mask).long())
        return torch_embed(weights, BertConfig(), t_ids, t_mask)
    return ours, theirs
  return build


def jitted(build: Builder) -> Builder:
  """The same case with unigrad's step under TinyJit (replays its captured kernels)."""
  def build_jit(torch: Any) -> tuple[Step, Peers]:
    ours, theirs = build(torch)
    return TinyJit(ours), theirs
  return build_jit


# ---- EfficientNet-Lite0 and depthwise convolutions ----

def efficientnet_model() -> efficientnet.EfficientNetLite0:
  """The packaged EfficientNet-Lite0 when installed, else a randomly initialized one (realized)."""
  try: return efficientnet.load()
  except ModuleNotFoundError:
    model = efficientnet.EfficientNetLite0()
    Tensor.realize_all(*get_state_dict(model).values())
    return model


def efficientnet_forward(batch: int) -> Builder:
  """Inference on one (batch, 3, 224, 224) batch; torch runs the same weights in torch.nn
  (examples/efficientnet_torch.py), eagerly and compiled."""
  def build(torch: Any) -> tuple[Step, Peers]:
    model = efficientnet_model()
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    u_x = Tensor(x).realize()
    def ours() -> Any: return model(u_x).realize()
    if torch is None: return ours, None
    import efficientnet_torch  # noqa: PLC0415 (needs torch, which is optional)
    ref = efficientnet_torch.EfficientNetLite0(efficientnet.STAGES, efficientnet.BN_EPS).eval()
    ref.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in
                         get_state_dict(model).items()})
    return ours, _bound(torch, ref, torch.from_numpy(x))
  return build


def _bound(torch: Any, module: Any, *args: Any) -> dict[str, Step]:
  """torch's steps: `module(*args)` eagerly and under torch.compile, in inference mode."""
  compiled = torch.compile(module)
  def step(fn: Any) -> Step:
    def run() -> Any:
      with torch.inference_mode(): return fn(*args)
    return run
  return {"torch": step(module), "torch.compile": step(compiled)}


def depthwise_conv(channels: int, size: int, kernel: int, stride: int) -> Builder:
  """One depthwise convolution (groups == channels, batch 1, padding kernel // 2) with its
  weights, as EfficientNet's blocks run them."""
  def build(torch: Any) -> tuple[Step, Peers]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    w = rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32)
    u_x, u_w = Tensor(x).realize(), Tensor(w).realize()
    def ours() -> Any: return u_x.conv2d(u_w, None, channels, stride, 1, kernel // 2).realize()
    if torch is None: return ours, None
    t_x, t_w = torch.from_numpy(x), torch.from_numpy(w)
    def conv(a: Any, b: Any) -> Any:
      return torch.nn.functional.conv2d(a, b, None, stride, kernel // 2, 1, channels)
    return ours, _bound(torch, conv, t_x, t_w)
  return build


# ---- training steps (bench/train_step.py's cases) ----

def train_step(case: Callable[[Any], tuple], jit: bool) -> Builder:
  """A whole training step (forward, backward, optimizer update) on both sides."""
  def build(torch: Any) -> tuple[Step, Peers]:
    if torch is None: raise SystemExit("training-step cases compare against torch")
    ours, theirs = both_steps(case, torch)
    return (TinyJit(ours) if jit else ours), theirs
  return build


CASES: list[Case] = [
  Case("minilm forward 8x32", minilm_forward(8, 32)),
  Case("minilm 8x32 new inputs", minilm_forward(8, 32, new_inputs=True)),
  Case("minilm forward 1x128", minilm_forward(1, 128)),
  Case("minilm 8x32 TinyJit", jitted(minilm_forward(8, 32))),
  Case("efficientnet-lite0 b1", efficientnet_forward(1)),
  Case("efficientnet-lite0 b8", efficientnet_forward(8)),
  Case("efficientnet-lite0 b1 TinyJit", jitted(efficientnet_forward(1))),
  Case("efficientnet-lite0 b8 TinyJit", jitted(efficientnet_forward(8))),
  Case("depthwise 3x3 s1 144x56x56", depthwise_conv(144, 56, 3, 1)),
  Case("depthwise 3x3 s2 96x112x112", depthwise_conv(96, 112, 3, 2)),
  Case("depthwise 5x5 s1 240x28x28", depthwise_conv(240, 28, 5, 1)),
  Case("depthwise 5x5 s2 144x56x56", depthwise_conv(144, 56, 5, 2)),
  Case("digits CNN step", train_step(cnn_case, jit=False)),
  Case("digits CNN step TinyJit", train_step(cnn_case, jit=True)),
  Case("MLP step", train_step(mlp_case, jit=False)),
  Case("MLP step TinyJit", train_step(mlp_case, jit=True)),
]
# the fresh-process first-call timings are for the model cases
FIRST_CALL = ("minilm forward 8x32", "minilm forward 1x128", "efficientnet-lite0 b1")


# ---- running ----

def try_torch() -> Any:
  """torch with as many threads as unigrad's kernels use, or None when it is not installed."""
  try:
    import torch  # noqa: PLC0415 (optional: compared only when installed)
  except ImportError:
    return None
  torch.set_num_threads(cpu_threads())
  return torch


def first_call(name: str) -> None:
  """In this (fresh) process: build case `name` and call its unigrad step twice; print the times
  as JSON (build: model and inputs, first: the first call with its compiles, then a warm call)."""
  case = next(c for c in CASES if c.name == name)
  t0 = time.perf_counter()
  ours, _ = case.build(None)
  t1 = time.perf_counter()
  ours()
  t2 = time.perf_counter()
  ours()
  t3 = time.perf_counter()
  print(json.dumps({"build": t1 - t0, "first": t2 - t1, "second": t3 - t2}))


def fresh_process(name: str, cachedir: str) -> dict[str, float]:
  code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import models; " \
         f"models.first_call({name!r})"
  env = {**os.environ, "CACHEDIR": cachedir, "PYTHONPATH": str(ROOT)}
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True, cwd=ROOT)
  res = json.loads(out.stdout.strip().splitlines()[-1])
  res["process"] = time.perf_counter() - t0
  return res


def report_first_call(name: str) -> None:
  with tempfile.TemporaryDirectory(prefix="unigrad-bench-cache-") as cachedir:
    for label in ("cold", "warm"):
      r = fresh_process(name, cachedir)
      print(f"  first call, {label} cache: {r['first']:7.2f} s  (build {r['build']:.2f} s, "
            f"second call {r['second'] * 1e3:.1f} ms, whole process {r['process']:.2f} s)")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--repeat", type=int, default=10)
  p.add_argument("--only", default="", help="run the cases whose name contains this")
  p.add_argument("--no-first-call", action="store_true", help="skip the fresh-process timings")
  p.add_argument("--cpu-time", action="store_true",
                 help="steady state timed by the calling thread's CPU time; needs THREADS=1 "
                      "(every kernel, unigrad's and torch's, then runs on the calling thread)")
  args = p.parse_args()
  if args.cpu_time:
    if cpu_threads() != 1: raise SystemExit("--cpu-time needs THREADS=1 (one thread each)")
    CLOCK[0] = time.thread_time
  torch = try_torch()
  print(f"unigrad and torch threads: {cpu_threads()}" + ("" if torch else " (torch missing)"))
  for case in CASES:
    if args.only not in case.name: continue
    ours, theirs = case.build(torch)
    if theirs is None: theirs = {}
    elif not isinstance(theirs, dict): theirs = {"torch": theirs}
    peers = {lib: best_of(step, args.repeat) for lib, step in theirs.items()}
    row(case.name, best_of(ours, args.repeat), peers)
    if not args.no_first_call and case.name in FIRST_CALL: report_first_call(case.name)


if __name__ == "__main__":
  main()
