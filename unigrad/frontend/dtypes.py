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


INT64_MIN, UINT64_END = -2 ** 63, 2 ** 64  # a Python int operand must fit int64 or uint64


def check_int_operand(value: Any, dt: DType) -> None:
  """A Python int that becomes a constant of an integer or bool `dt` (an operand of +, <, where,
  ...) must fit in 64 bits, int64 or uint64; inside them it wraps to `dt` as in PyTorch
  (`uint8 + 300` adds 44). Beyond them nothing is left to wrap (`Tensor([1]) + 2**70` would add
  0): OverflowError, PyTorch's "int too big to convert". A float `dt` takes any int."""
  if type(value) is not int or dtypes.is_float(dt) or dt == dtypes.index: return
  if INT64_MIN <= value < UINT64_END: return
  raise OverflowError(f"Python int {value} does not fit in 64 bits (int64 or uint64), so it cannot "
                      f"become a {dt!r} constant: pass one in [{INT64_MIN}, {UINT64_END - 1}] "
                      "or a float")


def check_int_value(value: Any, dt: DType) -> None:
  """A Python int stored as a value of an integer `dt` (full, masked_fill, a where branch, a
  clamp bound, a setitem) must be one `dt` holds, or for an unsigned `dt` minus one (it wraps:
  `uint8` -1 is 255): RuntimeError otherwise, as PyTorch's checked conversion raises. Beyond 64
  bits, OverflowError (`check_int_operand`)."""
  check_int_operand(value, dt)
  if type(value) is not int or not dtypes.is_int(dt) or dt == dtypes.index: return
  lo = -dt.max if dtypes.is_unsigned(dt) else dt.min
  if lo <= value <= dt.max: return
  raise RuntimeError(f"value {value} cannot be converted to {dt!r} without overflow (expected "
                     f"an integer in [{lo}, {dt.max}])")
