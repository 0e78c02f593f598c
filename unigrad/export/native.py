"""Native: compile an exported C source into a shared library and call its public function.

Consumes: the source and public name of an exported function, its input and output specs.
Produces: a `NativeFunction` that takes CPU Tensors and returns new CPU Tensors (no numpy: the
arrays are the Tensors' own buffers, passed by address).
Invariants: the library is compiled once per source (flags: `BUILD_FLAGS`, the flags the
exported file documents); calls are serialized (the function keeps its intermediates in static
arrays); inputs are validated against the specs before any native code runs.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field

from unigrad.engine.buffers import buffer_of
from unigrad.export.trace import EXPORT_DEVICE, ExportError, TensorSpec
from unigrad.frontend.tensor import Tensor
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.schedule.callify import is_plain_buffer

__all__ = ["BUILD_FLAGS", "NativeFunction", "compile_library"]

# -ffp-contract=off: no fused multiply-adds the kernels did not ask for (the CPU device's flag),
# so results match unigrad's bit for bit; -fwrapv: integers wrap like the CPU device's;
# -march=native: the vector registers and FMA instructions the kernels were shaped for (without
# it the results are the same, but a target with no FMA computes each fmaf in software)
BUILD_FLAGS: tuple[str, ...] = ("-std=c11", "-O2", "-march=native", "-ffp-contract=off", "-fwrapv")


def compile_library(source: str, name: str) -> ctypes.CDLL:
  """Build `source` as a shared library in a scratch directory and load it (the directory is
  removed once the library is mapped)."""
  cc = find_c_compiler()
  if cc is None: raise ExportError("no C compiler found (set CC, or install clang or gcc)")
  with tempfile.TemporaryDirectory(prefix=f"unigrad_export_{name}_") as folder:
    src, lib = os.path.join(folder, f"{name}.c"), os.path.join(folder, f"lib{name}.so")
    with open(src, "w") as f: f.write(source)
    cmd = [cc, *BUILD_FLAGS, "-fPIC", "-shared", src, "-o", lib, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
      raise ExportError(f"compiling the exported {name}.c failed ({' '.join(cmd)}):\n"
                        f"{proc.stderr}")
    return ctypes.CDLL(lib)


@dataclass
class NativeFunction:
  """The compiled public function with its specs; `mapped` (svmap): it takes the batch size
  first, and the outputs and the mapped inputs have it as their first axis."""
  function: ctypes._CFuncPtr
  ins: tuple[TensorSpec, ...]
  outs: tuple[TensorSpec, ...]
  mapped: tuple[bool, ...] | None
  lock: threading.Lock = field(default_factory=threading.Lock)

  def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
    batch = self._check(inputs)
    lead = (batch,) if self.mapped is not None else ()
    args = [_contiguous(t) for t in inputs]
    results = [Tensor.empty(*lead, *s.shape, dtype=s.dtype, device=EXPORT_DEVICE)
               for s in self.outs]
    ptrs = [ctypes.c_void_p(buffer_of(t.uop).ensure_allocated().address())
            for t in (*args, *results)]
    with self.lock:
      if self.mapped is not None: self.function(ctypes.c_int(batch), *ptrs)
      else: self.function(*ptrs)
    return tuple(results)

  def _check(self, inputs: tuple[Tensor, ...]) -> int:
    """The batch size (0 when not batched), after checking every input against its spec."""
    if len(inputs) != len(self.ins):
      raise TypeError(f"expected {len(self.ins)} input tensors, got {len(inputs)}")
    batches = set()
    for i, (t, s) in enumerate(zip(inputs, self.ins)):
      if not isinstance(t, Tensor): raise TypeError(f"input {i}: expected a Tensor, got {t!r}")
      shape, mapped = tuple(t.shape), self.mapped is not None and self.mapped[i]
      if mapped and shape: batches.add(shape[0])
      if (shape[1:] if mapped else shape) != s.shape or t.dtype != s.dtype:
        want = ("(batch, " + ", ".join(map(str, s.shape)) + ")") if mapped else s.shape
        raise ValueError(f"input {i}: expected shape {want} dtype {s.dtype!r}, got {shape} "
                         f"{t.dtype!r}")
    if len(batches) > 1: raise ValueError(f"inputs disagree on the batch size: {sorted(batches)}")
    batch = batches.pop() if batches else 0
    if batch >= 2 ** 31: raise ValueError(f"batch {batch} does not fit the C int argument")
    return batch


def _contiguous(t: Tensor) -> Tensor:
  """`t` as a realized row-major CPU buffer (itself when it already is one)."""
  if t.device == EXPORT_DEVICE and is_plain_buffer(t.uop): return t
  return t.to(EXPORT_DEVICE).contiguous().realize()
