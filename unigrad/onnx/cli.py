"""`python -m unigrad.onnx MODEL.onnx [--shape name=1x3x224x224] [--compare] [--runs N]`:
print the model's inputs, outputs and opsets, run it on random inputs of the declared shapes
(`--shape` gives symbolic or unknown sizes), and with `--compare` check the outputs against
onnxruntime (when installed), printing the largest differences and both runtimes' times."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from unigrad.onnx.convert import numpy_dtype_of
from unigrad.onnx.model import InputSpec, OnnxModel
from unigrad.onnx.node import OnnxError

__all__ = ["main", "random_inputs"]


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
  name, sep, dims = text.rpartition("=")
  if not sep or not name: raise argparse.ArgumentTypeError(f"--shape {text!r}: expected NAME=AxBxC")
  try: shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
  except ValueError:
    raise argparse.ArgumentTypeError(f"--shape {text!r}: sizes must be integers") from None
  return name, shape


def random_inputs(specs: list[InputSpec], shapes: dict[str, tuple[int, ...]],
                  seed: int = 0) -> dict[str, np.ndarray]:
  """Random arrays of each input's declared dtype and shape (`shapes` overrides/fills sizes)."""
  rng = np.random.default_rng(seed)
  out = {}
  for s in specs:
    if s.name in shapes: shape = shapes[s.name]
    elif s.shape is None or not all(isinstance(d, int) and d > 0 for d in s.shape):
      raise OnnxError(f"input {s!r} has symbolic or unknown sizes: give them with "
                      f"--shape {s.name}=...")
    else: shape = tuple(s.shape)
    if s.dtype is None: raise OnnxError(f"input {s.name!r} is not a tensor")
    dt = numpy_dtype_of(s.dtype)
    if np.dtype(dt).kind == "f" or s.dtype.name in ("bfloat16",):
      out[s.name] = rng.standard_normal(shape).astype(dt)
    elif np.dtype(dt).kind == "b": out[s.name] = rng.integers(0, 2, shape).astype(bool)
    else: out[s.name] = rng.integers(0, 100, shape).astype(dt)
  return out


def _time(fn: Any, runs: int) -> tuple[Any, float, float]:
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  best = first
  for _ in range(runs):
    t0 = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t0)
  return out, first, best


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m unigrad.onnx", description=__doc__)
  ap.add_argument("model", help="an .onnx file")
  ap.add_argument("--shape", action="append", type=_parse_shape, default=[],
                  help="NAME=AxBxC: the shape of an input with symbolic sizes")
  ap.add_argument("--compare", action="store_true", help="check against onnxruntime")
  ap.add_argument("--runs", type=int, default=3, help="timed runs after the first (default 3)")
  ap.add_argument("--device", default=None, help="unigrad device (default: the default device)")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  try: model = OnnxModel(args.model, device=args.device)
  except (OnnxError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"model: {args.model}")
  print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in model.opsets.items()))
  for s in model.inputs: print(f"input  {s!r}")
  for name in model.output_names: print(f"output {name}")
  try: feeds = random_inputs(model.inputs, dict(args.shape), args.seed)
  except OnnxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1

  def run() -> dict[str, np.ndarray]:
    return {k: np.array(v.numpy(), copy=True) for k, v in model(feeds).items()}
  outs, first, best = _time(run, args.runs)
  for k, v in outs.items(): print(f"  {k}: shape {tuple(v.shape)} dtype {v.dtype}")
  print(f"unigrad: first call {first * 1e3:.1f} ms, best of {args.runs} {best * 1e3:.2f} ms")
  if args.compare: return _compare(args, feeds, outs)
  return 0


def _compare(args: argparse.Namespace, feeds: dict[str, np.ndarray],
             outs: dict[str, np.ndarray]) -> int:
  try: import onnxruntime as ort  # noqa: PLC0415 (optional: only --compare needs it)
  except ImportError:
    print("--compare: onnxruntime is not installed", file=sys.stderr)
    return 1
  sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
  names = [o.name for o in sess.get_outputs()]
  ref, first, best = _time(lambda: dict(zip(names, sess.run(None, feeds))), args.runs)
  print(f"onnxruntime: first call {first * 1e3:.1f} ms, best of {args.runs} {best * 1e3:.2f} ms")
  for k, v in outs.items():
    r = np.asarray(ref[k])
    diff = np.abs(v.astype(np.float64) - r.astype(np.float64)).max() if v.size else 0.0
    print(f"  {k}: max abs difference {diff:.3g}")
  return 0
