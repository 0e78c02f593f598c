"""ONNX element types, numpy arrays and unigrad Tensors converted into each other.

ONNX names element types by TensorProto enum values; numpy (with ml_dtypes, which the onnx package
depends on) holds bfloat16 and the 8-bit floats. unigrad Tensors hold every one of them except
the 2-, 4- and 6-bit types, strings and complex numbers (`UnsupportedType`)."""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper

from unigrad.dtype import DType, dtypes, to_numpy_name
from unigrad.frontend.tensor import Tensor

__all__ = ["ONNX_DTYPES", "UnsupportedType", "onnx_dtype", "to_tensor", "to_numpy",
           "numpy_dtype_of"]

ONNX_DTYPES: dict[int, DType] = {
  TensorProto.FLOAT: dtypes.float32, TensorProto.DOUBLE: dtypes.float64,
  TensorProto.FLOAT16: dtypes.float16, TensorProto.BFLOAT16: dtypes.bfloat16,
  TensorProto.FLOAT8E4M3FN: dtypes.fp8e4m3, TensorProto.FLOAT8E5M2: dtypes.fp8e5m2,
  TensorProto.FLOAT8E4M3FNUZ: dtypes.fp8e4m3fnuz, TensorProto.FLOAT8E5M2FNUZ: dtypes.fp8e5m2fnuz,
  TensorProto.INT8: dtypes.int8, TensorProto.INT16: dtypes.int16, TensorProto.INT32: dtypes.int32,
  TensorProto.INT64: dtypes.int64, TensorProto.UINT8: dtypes.uint8,
  TensorProto.UINT16: dtypes.uint16, TensorProto.UINT32: dtypes.uint32,
  TensorProto.UINT64: dtypes.uint64, TensorProto.BOOL: dtypes.bool,
}
# dtypes numpy holds only through ml_dtypes: moved as their bits
_BITS = {dtypes.bfloat16: np.uint16, dtypes.fp8e4m3: np.uint8, dtypes.fp8e5m2: np.uint8,
         dtypes.fp8e4m3fnuz: np.uint8, dtypes.fp8e5m2fnuz: np.uint8}
_ML_NAMES = {"bfloat16": dtypes.bfloat16, "float8_e4m3fn": dtypes.fp8e4m3,
             "float8_e5m2": dtypes.fp8e5m2, "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
             "float8_e5m2fnuz": dtypes.fp8e5m2fnuz}


class UnsupportedType(TypeError):
  """An ONNX element type unigrad has no dtype for."""


def onnx_dtype(elem_type: int) -> DType:
  """The unigrad dtype of an ONNX element type (TensorProto.FLOAT -> dtypes.float32)."""
  dt = ONNX_DTYPES.get(elem_type)
  if dt is None:
    name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() \
      else str(elem_type)
    raise UnsupportedType(f"ONNX element type {name} is not supported (supported: "
                          f"{', '.join(TensorProto.DataType.Name(k) for k in ONNX_DTYPES)})")
  return dt


def numpy_dtype_of(dt: DType) -> Any:
  """The numpy dtype ONNX uses for a unigrad dtype (ml_dtypes' for bfloat16 and fp8)."""
  for k, v in ONNX_DTYPES.items():
    if v == dt: return helper.tensor_dtype_to_np_dtype(k)
  raise UnsupportedType(f"no ONNX element type for {dt}")


def array_dtype(arr: np.ndarray) -> DType:
  """The unigrad dtype of a numpy array (ml_dtypes' names included)."""
  name = arr.dtype.name
  if name in _ML_NAMES: return _ML_NAMES[name]
  if arr.dtype.kind in "USO": raise UnsupportedType(f"{arr.dtype} arrays are not supported")
  if arr.dtype.kind == "c": raise UnsupportedType("complex arrays are not supported")
  dt = _NUMPY.get(name)
  if dt is None: raise UnsupportedType(f"{name} arrays are not supported")
  return dt


_NUMPY = {"float32": dtypes.float32, "float64": dtypes.float64, "float16": dtypes.float16,
          "int8": dtypes.int8, "int16": dtypes.int16, "int32": dtypes.int32,
          "int64": dtypes.int64, "uint8": dtypes.uint8, "uint16": dtypes.uint16,
          "uint32": dtypes.uint32, "uint64": dtypes.uint64, "bool": dtypes.bool}


def to_tensor(arr: Any, device: str) -> Tensor:
  """A Tensor holding a numpy array's values (bfloat16 and fp8 arrays by their bits)."""
  if isinstance(arr, Tensor): return arr if arr.device == device else arr.to(device)
  arr = np.asarray(arr)
  dt = array_dtype(arr)
  if dt in _BITS:
    bits = np.ascontiguousarray(arr).view(_BITS[dt]).reshape(arr.shape)
    return Tensor(bits, device=device).bitcast(dt)
  # (ascontiguousarray makes a 0-d array 1-d)
  return Tensor(np.ascontiguousarray(arr).reshape(arr.shape), device=device, dtype=dt)


def to_numpy(t: Any) -> Any:
  """A numpy copy of a Tensor's values in ONNX's numpy dtype (ml_dtypes for bfloat16 and fp8);
  lists (sequences) element by element; numpy arrays and None as they are."""
  if t is None or isinstance(t, np.ndarray): return t
  if isinstance(t, (list, tuple)): return [to_numpy(x) for x in t]
  if not isinstance(t, Tensor): return np.asarray(t)
  if t.dtype in _BITS:
    bits = t.bitcast(to_numpy_name_of(_BITS[t.dtype])).numpy().copy()
    return bits.view(numpy_dtype_of(t.dtype))
  return np.array(t.numpy(), dtype=to_numpy_name(t.dtype), copy=True)


def to_numpy_name_of(np_type: Any) -> DType:
  return dtypes.uint16 if np_type is np.uint16 else dtypes.uint8
