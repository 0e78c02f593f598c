"""PyTorch's result_type: how tensors, 0-dim tensors and Python scalars promote together.

Dimensioned tensors, 0-dim tensors and Python scalars form three priority groups. Within a group
dtypes promote with `least_upper_dtype`; across groups a lower group only matters when it is of a
higher category (bool < integer < float), as in PyTorch.
"""
from __future__ import annotations

from typing import Any

from unigrad.dtype import DType, dtypes, least_upper_dtype
from unigrad.uop import UOp


def dtype_category(dt: DType) -> int:
  return 0 if dt == dtypes.bool else 2 if dtypes.is_float(dt) else 1


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
  if higher is None: return lower
  if lower is None or dtypes.is_float(higher): return higher
  if higher == dtypes.bool or dtypes.is_float(lower): return least_upper_dtype(higher, lower)
  return higher


def _group(dts: list[DType]) -> DType | None:
  return least_upper_dtype(*dts) if dts else None


def scalar_dtype(x: Any) -> DType:
  """The dtype a Python scalar takes part in promotion with (the default int/float)."""
  if isinstance(x, bool): return dtypes.bool
  if isinstance(x, int): return dtypes.default_int
  if isinstance(x, float): return dtypes.default_float
  if isinstance(x, UOp) and x.dtype == dtypes.index and x.shape == (): return dtypes.default_int
  raise TypeError(f"expected a Tensor or a Python number, got {type(x).__name__}")


def result_type(*operands: Any) -> DType:
  """The dtype PyTorch gives an op over `operands` (Tensors or Python numbers)."""
  dims: list[DType] = []
  zeros: list[DType] = []
  wrapped: list[DType] = []
  for x in operands:
    if hasattr(x, "uop"): (dims if x.ndim else zeros).append(x.dtype)
    else: wrapped.append(scalar_dtype(x))
  out = _combine(_group(dims), _combine(_group(zeros), _group(wrapped)))
  if out is None: raise TypeError("result_type needs at least one operand")
  return out
