"""Data types: scalars, vectors, pointers, PyTorch-style promotion and numpy interop.

A `DType` is an immutable value. Scalars are the singletons on `dtypes`; `dt.vec(n)` makes an
n-lane vector and `dt.ptr(addrspace)` a pointer into memory of that address space. `index` is the
type of loop counters, shapes and address arithmetic: a mathematical integer that codegen narrows
to int32 or int64 from its proven range.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final


class AddrSpace(Enum):
  """Where a value lives: device memory, workgroup-shared memory, or registers."""
  GLOBAL = 0
  LOCAL = 1
  REG = 2

  def __repr__(self) -> str: return f"AddrSpace.{self.name}"


@dataclass(frozen=True, eq=True)
class DType:
  """A scalar or vector type. `count` > 1 means a vector of `count` lanes of `scalar()`."""
  priority: int  # position in the promotion lattice, also a deterministic sort key
  itemsize: int  # bytes per element (all lanes for a vector)
  name: str
  fmt: str | None  # struct/memoryview format character, None when there is none
  count: int = 1
  _scalar: DType | None = None

  def __repr__(self) -> str:
    if self.count > 1: return f"{self.scalar()!r}.vec({self.count})"
    return f"dtypes.{self.name}"

  def __lt__(self, other: DType) -> bool: return self._key() < other._key()

  def __eq__(self, other: object) -> bool:
    # a hot path of the compiler (`dt == dtypes.index`, `dt in FLOATS`): identity, then the name
    # tells most unequal types apart before the fields are compared
    if self is other: return True
    if other.__class__ is not self.__class__: return NotImplemented
    return self.name == other.name and self._fields() == other._fields()  # type: ignore[attr-defined]

  def _fields(self) -> tuple:
    return (self.priority, self.itemsize, self.fmt, self.count, self._scalar)

  def __hash__(self) -> int:
    # every UOp's hash-cons key hashes its dtype: the generated field hash took 1.3 us. Equal
    # types have equal fields; the name's crc (not hash(str)) keeps it the same in every process
    if (h := self.__dict__.get("_hash")) is not None: return h
    h = hash((self.priority, self.itemsize, self.count, zlib.crc32(self.name.encode())))
    object.__setattr__(self, "_hash", h)
    return h

  def _key(self) -> tuple:
    return (self.priority, self.itemsize, self.name, self.count)

  @property
  def base(self) -> DType: return self

  def scalar(self) -> DType: return self._scalar if self._scalar is not None else self

  def vec(self, n: int) -> DType:
    """The n-lane vector of this scalar type (n == 1 gives the scalar)."""
    if not isinstance(n, int) or n < 1:
      raise ValueError(f"vector width must be an int >= 1, got {n!r}")
    if self.count != 1: raise TypeError(f"cannot make a vector of the vector type {self!r}")
    if n == 1 or self == dtypes.void: return self
    return DType(self.priority, self.itemsize * n, f"{self.name}{n}", None, n, self)

  def ptr(self, addrspace: AddrSpace = AddrSpace.GLOBAL, size: int = -1) -> PtrDType:
    """A pointer to elements of this type in `addrspace`; `size` elements when known (-1 if not)."""
    return PtrDType(self.priority, self.itemsize, self.name, self.fmt, self.count, None,
                    self, addrspace, size)

  @property
  def min(self) -> int | float | bool: return dtype_min(self)

  @property
  def max(self) -> int | float | bool: return dtype_max(self)


@dataclass(frozen=True, eq=True, repr=False)
class PtrDType(DType):
  """A pointer to `_base` elements in `addrspace`; `size` is the element count or -1."""
  _base: DType | None = None
  addrspace: AddrSpace = AddrSpace.GLOBAL
  size: int = -1

  def __repr__(self) -> str:
    args = f"{self.addrspace!r}" + (f", {self.size}" if self.size != -1 else "")
    return f"{self.base!r}.ptr({args})"

  @property
  def base(self) -> DType:
    assert self._base is not None
    return self._base

  def vec(self, n: int) -> DType: raise TypeError(f"cannot make a vector of the pointer {self!r}")

  def ptr(self, addrspace: AddrSpace = AddrSpace.GLOBAL, size: int = -1) -> PtrDType:
    raise TypeError(f"cannot make a pointer to the pointer {self!r}")


def _scalar(priority: int, itemsize: int, name: str, fmt: str | None) -> DType:
  return DType(priority, itemsize, name, fmt)


class dtypes:  # noqa: N801 (the public name, as in tinygrad)
  """The scalar dtypes and the predicates over them."""
  void: Final = _scalar(-1, 0, "void", None)
  bool: Final = _scalar(0, 1, "bool", "?")
  int8: Final = _scalar(1, 1, "char", "b")
  uint8: Final = _scalar(2, 1, "uchar", "B")
  int16: Final = _scalar(3, 2, "short", "h")
  uint16: Final = _scalar(4, 2, "ushort", "H")
  int32: Final = _scalar(5, 4, "int", "i")
  uint32: Final = _scalar(6, 4, "uint", "I")
  int64: Final = _scalar(7, 8, "long", "q")
  uint64: Final = _scalar(8, 8, "ulong", "Q")
  index: Final = _scalar(9, 8, "index", None)
  float16: Final = _scalar(11, 2, "half", "e")
  bfloat16: Final = _scalar(12, 2, "bfloat16", None)
  float32: Final = _scalar(13, 4, "float", "f")
  float64: Final = _scalar(14, 8, "double", "d")
  # aliases
  half = float16
  float = float32
  double = float64
  char = int8
  uchar = uint8
  short = int16
  ushort = uint16
  int = int32
  uint = uint32
  long = int64
  ulong = uint64
  default_float: DType = float32
  default_int: DType = int64

  @staticmethod
  def is_float(dt: DType) -> bool: return dt.scalar() in FLOATS

  @staticmethod
  def is_int(dt: DType) -> bool: return dt.scalar() in INTS

  @staticmethod
  def is_unsigned(dt: DType) -> bool: return dt.scalar() in UINTS

  @staticmethod
  def is_bool(dt: DType) -> bool: return dt.scalar() == dtypes.bool

  @staticmethod
  def from_py(x: Any) -> DType:
    """The dtype PyTorch gives a Python value (nested lists look at every element)."""
    if isinstance(x, (list, tuple)):
      return max((dtypes.from_py(v) for v in x), default=dtypes.default_float)
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    raise TypeError(f"cannot infer a dtype for {type(x).__name__} value {x!r}")

  @staticmethod
  def from_name(name: str) -> DType:
    dt = getattr(dtypes, name, None)
    if not isinstance(dt, DType): raise ValueError(f"unknown dtype name {name!r}")
    return dt

  @staticmethod
  def least_upper_dtype(*dts: DType) -> DType: return least_upper_dtype(*dts)


UINTS: Final = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
SINTS: Final = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
INTS: Final = (*SINTS, *UINTS, dtypes.index)
FLOATS: Final = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
ALL_SCALARS: Final = (dtypes.bool, *SINTS, *UINTS, *FLOATS)
# exponent and mantissa bits of each float type
FLOAT_BITS: Final = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23),
                     dtypes.float64: (11, 52)}


def dtype_min(dt: DType) -> int | float | bool:
  dt = dt.scalar()
  if dt == dtypes.bool: return False
  if dt == dtypes.index: return -(2 ** 63)
  if dt in UINTS: return 0
  if dt in SINTS: return -(2 ** (8 * dt.itemsize - 1))
  if dt in FLOATS: return -math.inf
  raise TypeError(f"{dt!r} has no minimum")


def dtype_max(dt: DType) -> int | float | bool:
  dt = dt.scalar()
  if dt == dtypes.bool: return True
  if dt == dtypes.index: return 2 ** 63 - 1
  if dt in UINTS: return 2 ** (8 * dt.itemsize) - 1
  if dt in SINTS: return 2 ** (8 * dt.itemsize - 1) - 1
  if dt in FLOATS: return math.inf
  raise TypeError(f"{dt!r} has no maximum")


def finite_max(dt: DType) -> float:
  """The largest finite value of a float dtype."""
  exp, man = FLOAT_BITS[dt.scalar()]
  return (2 - 2.0 ** -man) * 2.0 ** (2 ** (exp - 1) - 1)


# ---- promotion (PyTorch's rules) ----

def _category(dt: DType) -> int:
  return 0 if dt == dtypes.bool else 2 if dt in FLOATS else 1


# PyTorch's "barebones" unsigned types: promoting them with any other non-float type raises
BAREBONES_UINTS: Final = (dtypes.uint16, dtypes.uint32, dtypes.uint64)


def _no_promotion(a: DType, b: DType) -> TypeError:
  return TypeError(f"promotion of {a!r} with {b!r} is not defined (PyTorch raises too): "
                   "cast one of them first")


def _promote_ints(a: DType, b: DType) -> DType:
  if a == b: return a
  if a == dtypes.index or b == dtypes.index: return dtypes.index
  if a in BAREBONES_UINTS or b in BAREBONES_UINTS: raise _no_promotion(a, b)
  ua, ub = a in UINTS, b in UINTS
  if ua == ub: return a if a.itemsize >= b.itemsize else b
  u, s = (a, b) if ua else (b, a)
  if s.itemsize > u.itemsize: return s
  return {1: dtypes.int16, 2: dtypes.int32, 4: dtypes.int64}[u.itemsize]


def _promote_floats(a: DType, b: DType) -> DType:
  if a == b: return a
  if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
  return a if a.itemsize >= b.itemsize else b


def _promote2(a: DType, b: DType) -> DType:
  ca, cb = _category(a), _category(b)
  if ca != cb and 2 in (ca, cb): return a if ca > cb else b  # a float wins over bool and ints
  if ca == 2: return _promote_floats(a, b)
  if a == b: return a
  if ca == 0 or cb == 0:  # bool meets an integer: the integer
    i = b if ca == 0 else a
    if i in BAREBONES_UINTS: raise _no_promotion(a, b)
    return i
  return _promote_ints(a, b)


def least_upper_dtype(*dts: DType) -> DType:
  """The dtype PyTorch's `promote_types` gives for all of `dts` together."""
  if not dts: raise ValueError("least_upper_dtype needs at least one dtype")
  out = dts[0].scalar()
  for dt in dts[1:]: out = _promote2(out, dt.scalar())
  return out


def least_upper_float(dt: DType) -> DType:
  """`dt` if it is a float, else the default float (what PyTorch gives `sqrt` of an int)."""
  return dt if dtypes.is_float(dt) else dtypes.default_float


def sum_acc_dtype(dt: DType) -> DType:
  """The dtype PyTorch's `sum` returns: bool and every integer type (unsigned too) give int64."""
  if dt == dtypes.bool or dt in SINTS or dt in UINTS: return dtypes.int64
  return dt


# ---- Python values ----

def truncate(dt: DType, x: Any) -> Any:
  """`x` converted to what a `dt` register would hold (wraps ints, rounds floats)."""
  dt = dt.scalar()
  if dt == dtypes.bool: return bool(x)
  if dt in FLOATS: return _round_float(dt, float(x))
  if dt == dtypes.index: return int(x)
  if dt in INTS:
    bits = 8 * dt.itemsize
    v = int(x) & ((1 << bits) - 1)
    return v - (1 << bits) if dt in SINTS and v >= 1 << (bits - 1) else v
  raise TypeError(f"cannot hold a value in {dt!r}")


def _round_float(dt: DType, x: float) -> float:
  if dt == dtypes.float64 or math.isnan(x) or math.isinf(x): return x
  if dt == dtypes.float32: return _roundtrip("f", x)
  if dt == dtypes.float16:
    return _roundtrip("e", x) if abs(x) < 65520.0 else math.copysign(math.inf, x)
  # like PyTorch, a double reaches bfloat16 through float32 (rounded twice)
  return bf16_to_float(float_to_bf16(x))


def _roundtrip(fmt: str, x: float) -> float:
  try: return struct.unpack(fmt, struct.pack(fmt, x))[0]
  except OverflowError: return math.copysign(math.inf, x)


def float_to_bf16(x: float) -> int:
  """The bfloat16 bits of `x`, rounded to nearest even (nan stays nan)."""
  if math.isnan(x): return 0x7FC0
  try: bits = struct.unpack("<I", struct.pack("<f", x))[0]
  except OverflowError: return 0x7F80 if x > 0 else 0xFF80
  bits += 0x7FFF + ((bits >> 16) & 1)
  return (bits >> 16) & 0xFFFF


def bf16_to_float(b: int) -> float:
  return struct.unpack("<f", struct.pack("<I", (b & 0xFFFF) << 16))[0]


def to_bytes(dt: DType, values: list) -> bytes:
  """Pack Python values as `dt` elements (little endian)."""
  if dt == dtypes.bfloat16:
    return struct.pack(f"<{len(values)}H", *(float_to_bf16(float(v)) for v in values))
  if dt.fmt is None: raise TypeError(f"{dt!r} has no memory layout")
  return struct.pack(f"<{len(values)}{dt.fmt}", *(truncate(dt, v) for v in values))


def from_bytes(dt: DType, data: bytes | memoryview) -> list:
  """Unpack `dt` elements into Python values."""
  n = len(data) // dt.itemsize
  if dt == dtypes.bfloat16: return [bf16_to_float(b) for b in struct.unpack(f"<{n}H", data)]
  if dt.fmt is None: raise TypeError(f"{dt!r} has no memory layout")
  return list(struct.unpack(f"<{n}{dt.fmt}", data))


# ---- numpy interop (numpy is optional: only names are used here) ----

_NP_NAMES: Final = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8",
                    dtypes.int16: "int16", dtypes.uint16: "uint16", dtypes.int32: "int32",
                    dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
                    dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}
_FROM_NP: Final = {v: k for k, v in _NP_NAMES.items()}


def to_numpy_name(dt: DType) -> str:
  """The numpy dtype name holding `dt` (bfloat16 has none: it is read as float32)."""
  if dt == dtypes.bfloat16: return "float32"
  if dt not in _NP_NAMES: raise TypeError(f"{dt!r} has no numpy equivalent")
  return _NP_NAMES[dt]


def from_numpy_name(name: Any) -> DType:
  """The dtype for a numpy dtype, a numpy scalar type (`np.float32`) or a name."""
  if isinstance(name, type): name = name.__name__.removesuffix("_")  # np.bool_ in numpy 1.x
  key = str(getattr(name, "name", name))
  if key not in _FROM_NP: raise TypeError(f"numpy dtype {key!r} is not supported")
  return _FROM_NP[key]


def to_dtype(x: DType | str | Any) -> DType:
  """Accept a DType, a dtype name (`"float32"`) or a numpy dtype."""
  if isinstance(x, DType): return x
  if isinstance(x, str): return dtypes.from_name(x)
  return from_numpy_name(x)
