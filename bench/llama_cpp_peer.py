"""llama.cpp's side of bench/llm.py: run by the python of the benchmark's own virtual environment
(where llama-cpp-python was built from source), never imported by unigrad.

  <venv>/bin/python bench/llama_cpp_peer.py MODEL.gguf --ids 1,2,3 --decode-tokens 32 \
      --threads 2 --repeat 3 --context 2048

Prints one JSON line: the fastest prefill (seconds, one batch over the prompt, its last logits
read) and the fastest seconds per decoded token (greedy: argmax of each step's logits, fed back)
of `--repeat` runs after a warm-up run, the KV cache cleared before each run.
"""
from __future__ import annotations

import argparse
import json
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("model")
  p.add_argument("--ids", required=True, help="the prompt's token ids, comma separated")
  p.add_argument("--decode-tokens", type=int, default=32)
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--repeat", type=int, default=3)
  p.add_argument("--context", type=int, default=2048)
  args = p.parse_args()
  ids = [int(i) for i in args.ids.split(",")]
  llm = Llama(args.model, n_ctx=args.context, n_batch=max(512, len(ids)), n_threads=args.threads,
              n_threads_batch=args.threads, verbose=False)

  def last_logits() -> np.ndarray:
    # the last evaluated token's logits, from the context itself: without logits_all (which
    # would add the head over every prompt token to the prefill) llama-cpp-python 0.3 keeps no
    # copy in `scores`, which stay zero (the greedy loop fed token 0 at every step)
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))

  def run(steps: int) -> tuple[float, float]:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    logits = last_logits()
    t1 = time.perf_counter()
    for _ in range(steps):
      llm.eval([int(np.argmax(logits))])
      logits = last_logits()
    return t1 - t0, (time.perf_counter() - t1) / steps

  run(3)
  times = [run(args.decode_tokens) for _ in range(args.repeat)]
  print(json.dumps({"prefill_s": min(t[0] for t in times), "decode_s": min(t[1] for t in times),
                    "version": __import__("llama_cpp").__version__}))


if __name__ == "__main__":
  main()
