"""Helpers for tests that run single kernels: buffer params and random inputs for them."""
import numpy as np

from unigrad import dtypes
from unigrad.uop import Ops, UOp


def params_of(kernel: UOp) -> list[UOp]:
  """The kernel's buffer PARAMs in slot order."""
  return sorted((u for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.name is None),
                key=lambda p: p.arg.slot)


def inputs_for(kernel: UOp, seed: int = 0) -> list[np.ndarray]:
  """Random contents for each buffer param: bools, normal floats, ints in [-50, 50)."""
  rng = np.random.default_rng(seed)
  out = []
  for p in params_of(kernel):
    n, dt = p.shape[0], p.dtype
    if dt == dtypes.bool: out.append(rng.random(n) < 0.5)
    elif dtypes.is_float(dt): out.append(rng.standard_normal(n).astype(dt.fmt))
    else: out.append(rng.integers(-50, 50, n).astype(np.dtype(dt.fmt)))
  return out
