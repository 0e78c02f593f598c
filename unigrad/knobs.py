"""Every environment variable unigrad reads, declared once, and `Context` to override them.

A knob is read from the environment the first time it is used; `Context(DEBUG=4)` overrides it
for a `with` block or a decorated function. `python -m unigrad.knobs` lists them all.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any


# counts the knob values set (Context, an assignment to `.value`): a hot path that reads several
# knobs keeps what it read while the count is unchanged (engine/programs.py's settings)
generation = 0


@dataclass(eq=False)
class Knob:
  """One setting: its name, type, default and help text. Compare it like its value."""
  name: str
  kind: type
  default: Any
  help: str
  _value: Any = field(default=None, repr=False)
  _loaded: bool = field(default=False, repr=False)

  @property
  def value(self) -> Any:
    if not self._loaded:
      raw = os.environ.get(self.name)
      self._value = self.default if raw is None else _parse(self.kind, raw, self.name)
      self._loaded = True
    return self._value

  @value.setter
  def value(self, v: Any) -> None:
    global generation
    self._value, self._loaded = v, True
    generation += 1

  def __bool__(self) -> bool: return bool(self.value)
  def __int__(self) -> int: return int(self.value)
  def __index__(self) -> int: return int(self.value)
  def __str__(self) -> str: return str(self.value)
  def __eq__(self, other: object) -> bool: return self.value == other
  def __hash__(self) -> int: return hash(self.name)
  def __lt__(self, other: Any) -> bool: return self.value < other
  def __le__(self, other: Any) -> bool: return self.value <= other
  def __gt__(self, other: Any) -> bool: return self.value > other
  def __ge__(self, other: Any) -> bool: return self.value >= other


def _parse(kind: type, raw: str, name: str) -> Any:
  try:
    if kind is bool: return raw.strip().lower() not in ("", "0", "false", "no")
    return kind(raw)
  except ValueError:
    raise ValueError(f"environment variable {name}={raw!r} "
                     f"is not a valid {kind.__name__}") from None


KNOBS: dict[str, Knob] = {}


def knob(name: str, kind: type, default: Any, help: str) -> Knob:  # noqa: A002
  k = Knob(name, kind, default, help)
  KNOBS[name] = k
  return k


DEBUG = knob("DEBUG", int, 0, "1 devices and stage timings, 2 per-kernel time, 3 opts and AST, "
             "4 rendered source, 5 UOp graph per stage, 6 linear listing")
SPEC = knob("SPEC", int, 0, "1 runs each stage's spec verifier on its output")
DEV = knob("DEV", str, "", "default device (CPU, PYTHON, NULL, CL, CUDA); empty picks CPU when a "
           "C compiler is found, else PYTHON")
CC = knob("CC", str, "", "C compiler for the CPU device; empty tries clang, then gcc")
MARCH = knob("MARCH", str, "native", "target ISA of the CPU device's C compiler (its "
             "-march): native, x86-64-v3 (AVX2), x86-64-v4 (AVX-512), ...; the heuristics' "
             "vector width and register count follow it")
CACHEDIR = knob("CACHEDIR", str, "", "directory for the on-disk caches; empty uses "
                "$XDG_CACHE_HOME/unigrad or ~/.cache/unigrad")
UNIGRAD_DATA = knob("UNIGRAD_DATA", str, "", "directory nn.datasets reads (mnist/, fashion-mnist/, "
                    "cifar-10/); empty uses ~/.cache/unigrad/datasets")
CACHELEVEL = knob("CACHELEVEL", int, 2, "on-disk caches: 0 none, 1 compiled binaries and BEAM "
                  "choices, 2 also schedules and rendered kernels (skips scheduling and codegen)")
TRACK_MATCH_STATS = knob("TRACK_MATCH_STATS", int, 0, "1 records which rewrite rule fired, where, "
                         "with the node before and after")
VIZ = knob("VIZ", int, 0, "1 records every schedule's and kernel's rewrites and, at exit, serves "
           "the graph viewer (python -m unigrad.viz; VIZ_PORT sets its port)")
VIZ_PORT = knob("VIZ_PORT", int, 8000, "port of the viewer that VIZ=1 serves at exit")
PROFILE = knob("PROFILE", int, 0, "1 records every kernel launch, copy and compile; at exit writes "
               "a Chrome trace (PROFILE_PATH) and prints the top kernels")
PROFILE_PATH = knob("PROFILE_PATH", str, "profile.json", "where PROFILE=1 writes its trace")
PROFILE_TOP = knob("PROFILE_TOP", int, 20, "rows of the kernel table PROFILE=1 prints at exit")
NOOPT = knob("NOOPT", bool, False, "skip kernel optimizations (heuristics and BEAM)")
BEAM = knob("BEAM", int, 0, "beam width for the kernel optimizer search; 0 uses the heuristics")
BEAM_BUDGET = knob("BEAM_BUDGET", float, 30.0, "seconds BEAM may spend searching one kernel")
PREFETCH = knob("PREFETCH", int, 16384, "bytes the CPU's streamed loads (each element read once, "
                "as a matrix-vector product reads its weight) prefetch ahead of their loop, all "
                "together; 0 leaves prefetching to the hardware")
THREADS = knob("THREADS", int, 0, "CPU threads for THREAD axes; 0 uses every core")
LRU = knob("LRU", bool, True, "reuse freed device buffers of the same size")
CHECK_OOB = knob("CHECK_OOB", bool, False, "every generated load and store checks its index "
                 "against its buffer's size; an access outside raises OutOfBoundsError naming the "
                 "kernel, the buffer and the index (the PYTHON device always checks)")
REWRITE_STACK_LIMIT = knob("REWRITE_STACK_LIMIT", int, 250_000, "graph_rewrite work-stack limit "
                           "that turns a rewrite loop into an error")
JIT = knob("JIT", int, 1, "0 makes TinyJit run its function eagerly on every call (no capture)")
TRAINING = knob("TRAINING", bool, False, "training mode: the same switch as `Tensor.training` and "
                "`Tensor.train()` (dropout and BatchNorm's batch statistics are on)")
DEFAULT_FLOAT = knob("DEFAULT_FLOAT", str, "float32", "dtype of Python floats and float "
                     "creation functions (`dtypes.default_float`, like torch.set_default_dtype): "
                     "float16, bfloat16, float32 or float64")
DEFAULT_INT = knob("DEFAULT_INT", str, "int64", "dtype of Python ints and integer creation "
                   "functions (`dtypes.default_int`): any integer dtype name")
EMULATED_DTYPES = knob("EMULATED_DTYPES", str, "", "comma-separated dtypes every renderer emulates "
                       "(stored in memory as their bits, computed in float32); float16 and "
                       "bfloat16 are emulated on every target already")
IGNORE_BEAM_CACHE = knob("IGNORE_BEAM_CACHE", bool, False, "BEAM searches again instead of "
                         "reading its on-disk choices (the new choice is still stored)")
JIT_CAPTURES = knob("JIT_CAPTURES", int, 8, "input signatures one TinyJit keeps captured programs "
                    "for (the oldest is dropped)")
SEED = knob("SEED", int, 0, "default random seed")
INT8_MATVEC = knob("INT8_MATVEC", bool, True, "a packed Q4_0/Q4_1/Q8_0 weight times fewer than 16 "
                   "rows (LLM decoding) quantizes the rows to int8 per block of 32, as llama.cpp "
                   "does, and multiplies with byte dot products where the CPU has them (AVX2, "
                   "VNNI): several times faster, within about 1e-2 relative of float32; 0 "
                   "dequantizes to float32 in registers instead (within 1e-5)")
FUZZ_EXAMPLES = knob("FUZZ_EXAMPLES", int, 100, "programs the differential fuzzer test "
                     "(test/test_fuzz_differential.py) tries; raise it for a longer hunt")
CUDA_COMPILE_ONLY = knob("CUDA_COMPILE_ONLY", bool, False, "open CUDA without a GPU: every kernel "
                         "is rendered and compiled (NVRTC or nvcc, sm_90 PTX and SASS), none runs")
CUDA_ARCH = knob("CUDA_ARCH", str, "", "GPU architecture CUDA compiles for (e.g. sm_90); empty "
                 "asks the GPU, or sm_90 in compile-only mode")
EMULATE = knob("EMULATE", str, "", "CUDA or CL: the PYTHON device lowers kernels like that GPU "
               "target (work groups, LOCAL memory, tensor cores) and runs them in lockstep")
XDG_CACHE_HOME = knob("XDG_CACHE_HOME", str, "", "standard cache directory root")
HOME = knob("HOME", str, "", "the user's home directory (for the cache)")


def getenv(name: str, default: Any = 0) -> Any:
  """A declared knob's value, or an undeclared variable parsed like `default`."""
  if name in KNOBS: return KNOBS[name].value
  raw = os.environ.get(name)
  return default if raw is None else _parse(type(default), raw, name)


class Context(contextlib.ContextDecorator):
  """Override knobs for a block: `with Context(DEBUG=2): ...` or `@Context(NOOPT=1)`."""

  def __init__(self, **overrides: Any) -> None:
    unknown = [k for k in overrides if k not in KNOBS]
    if unknown: raise ValueError(f"unknown knob(s) {unknown}; known: {sorted(KNOBS)}")
    self.overrides = overrides
    self._saved: list[dict[str, Any]] = []

  def __enter__(self) -> Context:
    self._saved.append({k: KNOBS[k].value for k in self.overrides})
    for k, v in self.overrides.items():
      knob_ = KNOBS[k]
      knob_.value = _parse(knob_.kind, v, k) if isinstance(v, str) else knob_.kind(v)
    return self

  def __exit__(self, *exc: object) -> None:
    for k, v in self._saved.pop().items(): KNOBS[k].value = v


def main(out: Any = sys.stdout) -> None:
  for k in KNOBS.values():
    print(f"{k.name:20s} {k.kind.__name__:6s} default={k.default!r:8}  {k.help}", file=out)


if __name__ == "__main__": main()
