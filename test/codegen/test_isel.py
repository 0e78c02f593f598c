"""Instruction selection rules (codegen/isel.py): Horner steps fused into MULACC."""
from __future__ import annotations

import math

import numpy as np

from unigrad import Tensor
from unigrad.codegen.isel import pm_fma_horner
from unigrad.dtype import dtypes
from unigrad.uop import Ops, UOp, graph_rewrite


def _x() -> UOp: return UOp.variable("x", -math.inf, math.inf, dtypes.float32)


def _c(v: float) -> UOp: return UOp.const(dtypes.float32, v)


def test_horner_chain_becomes_mulacc() -> None:
  x = _x()
  p = (x * _c(0.5) + _c(0.25)) * x + _c(1.0)
  out = graph_rewrite(p, pm_fma_horner)
  assert out.op is Ops.MULACC and out.src[0].op is Ops.MULACC
  assert Ops.ADD not in {u.op for u in out.toposort()}


def test_lone_mul_add_keeps_two_roundings() -> None:
  x, y = _x(), UOp.variable("y", -math.inf, math.inf, dtypes.float32)
  for u in (x * _c(0.5) + _c(0.25), (x * y + y) * x + y):
    assert graph_rewrite(u, pm_fma_horner) is u


def test_gelu_cpu_matches_python_and_erf_reference() -> None:
  v = np.linspace(-7, 7, 1001, dtype=np.float32)  # odd size: a vector tail
  cpu = Tensor(v).gelu().numpy()
  py = Tensor(v, device="PYTHON").gelu().numpy()
  ref = v.astype(np.float64) * 0.5 * (1 + np.vectorize(math.erf)(v.astype(np.float64) / 2**0.5))
  np.testing.assert_allclose(cpu, py, rtol=0, atol=2e-7)
  np.testing.assert_allclose(cpu, ref, rtol=2e-7, atol=2e-7)
