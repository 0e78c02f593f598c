"""Data types: scalars, vectors, pointers, PyTorch-style promotion and numpy interop.

A `DType` is an immutable value. Scalars are the singletons on `dtypes`; `dt.vec(n)` makes an
n-lane vector and `dt.ptr(addrspace)` a pointer into memory of that address space. `index` is the
type of loop counters, shapes and address arithmetic: a mathematical integer that codegen narrows
to int32 or int64 from its proven range.

The 8-bit floats (`fp8e4m3`, `fp8e5m2` and the `fnuz` variants, PyTorch's `float8_e4m3fn`,
`float8_e5m2`, `float8_e4m3fnuz`, `float8_e5m2fnuz`) convert exactly like PyTorch: a value reaches
them through float32, rounded to nearest even; e4m3fn saturates to +-448 (infinities too), e5m2
overflows to +-inf, the fnuz formats to their only NaN (0x80, which is also why they have no -0).
Python scalars take part in promotion as PyTorch's "wrapped numbers" (frontend/dtypes.py
`result_type`), not as tinygrad's weakint/weakfloat dtypes.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from unigrad.knobs import DEFAULT_FLOAT, DEFAULT_INT, Knob


class AddrSpace(Enum):
  """Where a value lives: device memory, workgroup-shared memory, or registers."""
  GLOBAL = 0
  LOCAL = 1
  REG = 2
  __hash__ = object.__hash__  # members are singletons: identity hashing (Enum's hashes the name)

  def __repr__(self) -> str: return f"AddrSpace.{self.name}"


class InvalidType:
  """The value of an index that must not be dereferenced (a padded or dead position)."""
  _instance: InvalidType | None = None

  def __new__(cls) -> InvalidType:
    if cls._instance is None: cls._instance = super().__new__(cls)
    return cls._instance

  def __repr__(self) -> str: return "Invalid"
  def __reduce__(self) -> str: return "Invalid"


Invalid = InvalidType()


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

  def __post_init__(self) -> None:
    # every UOp's hash-cons key hashes its dtype: the generated field hash took 1.3 us, so it is
    # computed once. Equal types have equal fields; the name's crc (not hash(str)) keeps it the
    # same in every process
    h = hash((self.priority, self.itemsize, self.count, zlib.crc32(self.name.encode())))
    object.__setattr__(self, "_hash", h)

  def __hash__(self) -> int: return self._hash  # type: ignore[attr-defined]

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


_knob_dtypes: dict[tuple[str, Any], DType] = {}  # (knob, its value) -> the dtype it names


def _knob_dtype(knob: Knob, is_kind: Any, kind: str) -> DType:
  """The dtype a DEFAULT_FLOAT/DEFAULT_INT knob names (`float16`, `HALF`, `dtypes.half`); read
  once per value (every op with a Python float asks)."""
  key = (knob.name, knob.value)
  if (dt := _knob_dtypes.get(key)) is not None: return dt
  name = str(knob.value).strip().lower().removeprefix("dtypes.")
  dt = getattr(dtypes, name, None)
  if not isinstance(dt, DType) or not is_kind(dt) or dt.count != 1:
    raise ValueError(f"{knob.name}={knob.value!r} is not a{kind} dtype name")
  _knob_dtypes[key] = dt
  return dt


def _set_knob_dtype(knob: Knob, dt: Any, is_kind: Any, kind: str) -> None:
  if not isinstance(dt, DType) or not is_kind(dt):
    raise TypeError(f"{knob.name}: only{kind} dtypes can be the default, got {dt!r}")
  knob.value = dt.name


class _DTypesMeta(type):
  """`dtypes.default_float` and `dtypes.default_int` are the DEFAULT_FLOAT and DEFAULT_INT knobs:
  assigning one (`dtypes.default_float = dtypes.float16`, like torch.set_default_dtype) sets the
  knob, and `Context(DEFAULT_FLOAT="half")` scopes it."""

  @property
  def default_float(cls) -> DType: return _knob_dtype(DEFAULT_FLOAT, cls.is_float, " float")

  @default_float.setter
  def default_float(cls, dt: DType) -> None:
    _set_knob_dtype(DEFAULT_FLOAT, dt, cls.is_float, " floating-point")

  @property
  def default_int(cls) -> DType: return _knob_dtype(DEFAULT_INT, cls.is_int, "n integer")

  @default_int.setter
  def default_int(cls, dt: DType) -> None: _set_knob_dtype(DEFAULT_INT, dt, cls.is_int, " integer")


class dtypes(metaclass=_DTypesMeta):  # noqa: N801 (the public name, as in tinygrad)
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
  fp8e4m3: Final = _scalar(10, 1, "fp8e4m3", None)
  fp8e5m2: Final = _scalar(10, 1, "fp8e5m2", None)
  fp8e4m3fnuz: Final = _scalar(10, 1, "fp8e4m3fnuz", None)
  fp8e5m2fnuz: Final = _scalar(10, 1, "fp8e5m2fnuz", None)
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
  float8_e4m3fn = fp8e4m3  # PyTorch's names
  float8_e5m2 = fp8e5m2
  float8_e4m3fnuz = fp8e4m3fnuz
  float8_e5m2fnuz = fp8e5m2fnuz

  @staticmethod
  def is_float(dt: DType) -> bool: return dt.scalar() in FLOAT_SET

  @staticmethod
  def is_int(dt: DType) -> bool: return dt.scalar() in INT_SET

  @staticmethod
  def is_unsigned(dt: DType) -> bool: return dt.scalar() in UINT_SET

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
  def is_fp8(dt: DType) -> bool: return dt.scalar() in FP8S

  @staticmethod
  def least_upper_dtype(*dts: DType) -> DType: return least_upper_dtype(*dts)

  @staticmethod
  def finfo(dt: DType) -> FInfo:
    """Machine limits of a float dtype, like `torch.finfo`: `dtypes.finfo(dtypes.half).eps`.
    It also unpacks as tinygrad's `(exponent bits, mantissa bits)` pair."""
    return finfo(dt)


UINTS: Final = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
SINTS: Final = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
INTS: Final = (*SINTS, *UINTS, dtypes.index)
FP8S: Final = (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz)
FLOATS: Final = (*FP8S, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
ALL_SCALARS: Final = (dtypes.bool, *SINTS, *UINTS, *FLOATS)
# the same as sets, for membership tests (a hash, not one __eq__ per element: a hot path)
FLOAT_SET, INT_SET, UINT_SET = frozenset(FLOATS), frozenset(INTS), frozenset(UINTS)
SINT_SET = frozenset(SINTS)
# tinygrad's tuples on the namespace (dtypes.floats, ...) and its name -> dtype table
dtypes.floats, dtypes.ints, dtypes.sints, dtypes.uints, dtypes.fp8s = (
  FLOATS, (*SINTS, *UINTS), SINTS, UINTS, FP8S)
DTYPES_DICT: Final = {k: v for k, v in vars(dtypes).items()
                      if isinstance(v, DType) and k not in ("void", "index")}
ConstType = bool | int | float  # the value of a CONST (spec 002: UOp.ssimplify's result)
ConstFloat = float
# floats that compute in float32 registers and round to their own format after every op
LOW_FLOATS: Final = (dtypes.float16, dtypes.bfloat16, *FP8S)
# exponent and mantissa bits of each float type
FLOAT_BITS: Final = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23),
                     dtypes.float64: (11, 52), dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2),
                     dtypes.fp8e4m3fnuz: (4, 3), dtypes.fp8e5m2fnuz: (5, 2)}


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
  if dt.scalar() in FP8_FORMATS: return FP8_FORMATS[dt.scalar()].max
  exp, man = FLOAT_BITS[dt.scalar()]
  return (2 - 2.0 ** -man) * 2.0 ** (2 ** (exp - 1) - 1)


# ---- 8-bit floats ----

@dataclass(frozen=True)
class FP8Format:
  """An 8-bit float: 1 sign, `exp` exponent and `man` mantissa bits, exponent `bias`. `inf`:
  IEEE-like infinities (e5m2); `fnuz`: no infinity and no -0, 0x80 is the one NaN; otherwise
  (e4m3fn) S.1111.111 is NaN and overflow saturates to the largest finite value."""
  exp: int
  man: int
  bias: int
  inf: bool
  fnuz: bool

  @property
  def emin(self) -> int: return 1 - self.bias  # the exponent of the smallest normal

  @property
  def max_code(self) -> int:
    """The bits of the largest finite value."""
    if self.fnuz: return 0x7F
    top = (1 << (self.exp + self.man)) - 1  # all exponent and mantissa bits set
    return top - (1 << self.man) if self.inf else top - 1

  @property
  def max(self) -> float: return _decode(self, self.max_code)

  def nan_code(self, sign: int) -> int: return 0x80 if self.fnuz else sign | 0x7F

  def overflow_code(self, sign: int) -> int:
    """What a value above the largest finite one (or an infinity) becomes."""
    if self.fnuz: return 0x80
    return sign | (self.max_code + 1 if self.inf else self.max_code)


FP8_FORMATS: Final = {dtypes.fp8e4m3: FP8Format(4, 3, 7, False, False),
                      dtypes.fp8e5m2: FP8Format(5, 2, 15, True, False),
                      dtypes.fp8e4m3fnuz: FP8Format(4, 3, 8, False, True),
                      dtypes.fp8e5m2fnuz: FP8Format(5, 2, 16, False, True)}


def _fp8_format(dt: DType) -> FP8Format:
  if dt.scalar() not in FP8_FORMATS: raise TypeError(f"{dt!r} is not an 8-bit float dtype")
  return FP8_FORMATS[dt.scalar()]


def float_to_fp8(x: float, dtype: DType) -> int:
  """The bits of `x` as the 8-bit float `dtype`: through float32 (as PyTorch converts), then
  rounded to nearest even. `float_to_fp8(1.0, dtypes.fp8e4m3)` is 0x38."""
  f = _fp8_format(dtype)
  x = _roundtrip("f", float(x))
  sign = 0x80 if math.copysign(1.0, x) < 0 else 0
  if math.isnan(x): return f.nan_code(sign)
  if math.isinf(x): return f.overflow_code(sign)
  zero = 0 if f.fnuz else sign
  if x == 0: return zero
  e = max(math.frexp(abs(x))[1] - 1, f.emin)  # the exponent of the leading bit, or of subnormals
  n = round(math.ldexp(abs(x), f.man - e))  # the significand in units of the last place: exact
  if n == 0: return zero
  if n == 2 << f.man: e, n = e + 1, 1 << f.man  # rounded up into the next binade
  code = n if n < 1 << f.man else ((e + f.bias) << f.man) | (n - (1 << f.man))
  return f.overflow_code(sign) if code > f.max_code else sign | code


def _decode(f: FP8Format, b: int) -> float:
  sign = -1.0 if b & 0x80 else 1.0
  e, m = (b >> f.man) & ((1 << f.exp) - 1), b & ((1 << f.man) - 1)
  if (f.fnuz and b == 0x80) or (not f.fnuz and not f.inf and b & 0x7F == 0x7F): return math.nan
  if f.inf and e == (1 << f.exp) - 1: return sign * math.inf if m == 0 else math.nan
  if e == 0: return sign * math.ldexp(m, f.emin - f.man)
  return sign * math.ldexp((1 << f.man) | m, e - f.bias - f.man)


def fp8_to_float(x: int, dtype: DType) -> float:
  """The value of the 8-bit float bits `x` (0..255) of `dtype` (exact: every one is a float).
  `fp8_to_float(0x38, dtypes.fp8e4m3)` is 1.0."""
  if not isinstance(x, int) or not 0 <= x <= 0xFF:
    raise ValueError(f"fp8_to_float: expected the bits of one byte (0..255), got {x!r}")
  return _decode(_fp8_format(dtype), x)


# ---- finfo ----

@dataclass(frozen=True)
class FInfo:
  """Machine limits of a float dtype, as `torch.finfo` names them. Unpacking it gives tinygrad's
  `(exponent bits, mantissa bits)`."""
  bits: int
  eps: float  # the distance from 1.0 to the next value
  max: float  # the largest finite value
  min: float  # -max
  tiny: float  # the smallest positive normal (= smallest_normal)
  smallest_normal: float
  resolution: float  # 10 ** -(decimal digits of precision)
  dtype: str
  nexp: int
  nmant: int

  def __iter__(self) -> Any: return iter((self.nexp, self.nmant))


# PyTorch's finfo (and ml_dtypes') gives float8_e5m2fnuz the eps of a 3-bit mantissa
_FINFO_EPS: Final = {dtypes.fp8e5m2fnuz: 0.125}
_TORCH_NAMES: Final = {dtypes.fp8e4m3: "float8_e4m3fn", dtypes.fp8e5m2: "float8_e5m2",
                       dtypes.fp8e4m3fnuz: "float8_e4m3fnuz", dtypes.fp8e5m2fnuz: "float8_e5m2fnuz",
                       dtypes.float16: "float16", dtypes.bfloat16: "bfloat16",
                       dtypes.float32: "float32", dtypes.float64: "float64"}


def finfo(dt: DType) -> FInfo:
  """`dtypes.finfo(dt)`: machine limits of the float dtype `dt` (a TypeError for others)."""
  if not isinstance(dt, DType) or dt.scalar() not in FLOAT_BITS or dt.count != 1:
    raise TypeError(f"finfo: expected a float dtype, got {dt!r}")
  exp, man = FLOAT_BITS[dt]
  emin = FP8_FORMATS[dt].emin if dt in FP8_FORMATS else 2 - 2 ** (exp - 1)
  top = finite_max(dt)
  tiny = math.ldexp(1.0, emin)
  return FInfo(8 * dt.itemsize, _FINFO_EPS.get(dt, 2.0 ** -man), top, -top, tiny, tiny,
               10.0 ** -math.floor(man * math.log10(2)), _TORCH_NAMES[dt], exp, man)


# ---- promotion (PyTorch's rules) ----

def _category(dt: DType) -> int:
  return 0 if dt == dtypes.bool else 2 if dt in FLOAT_SET else 1


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
  if a != b and (a in FP8S or b in FP8S):  # PyTorch promotes no 8-bit float with anything else
    raise TypeError(f"promotion of {a!r} with {b!r} is not defined (PyTorch raises too: 8-bit "
                    "floats promote with no other dtype): cast one of them first")
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
  if dt == dtypes.bool or dt in SINT_SET or dt in UINT_SET: return dtypes.int64
  return dt


# ---- Python values ----

def truncate(dt: DType, x: Any) -> Any:
  """`x` converted to what a `dt` register would hold (wraps ints, rounds floats)."""
  dt = dt.scalar()
  if dt == dtypes.bool: return bool(x)
  if dt in FLOAT_SET: return _round_float(dt, float(x))
  if dt == dtypes.index: return int(x)
  if dt in INT_SET:
    bits = 8 * dt.itemsize
    v = int(x) & ((1 << bits) - 1)
    return v - (1 << bits) if dt in SINT_SET and v >= 1 << (bits - 1) else v
  raise TypeError(f"cannot hold a value in {dt!r}")


def _round_float(dt: DType, x: float) -> float:
  if math.isnan(x): return x  # keeps its sign bit for the store's encoding
  # before infinities pass: e4m3fn has none (it saturates to +-448), the fnuz formats give NaN
  if dt in FP8_FORMATS: return fp8_to_float(float_to_fp8(x, dt), dt)
  if dt == dtypes.float64 or math.isinf(x): return x
  if dt == dtypes.float32: return _roundtrip("f", x)
  if dt == dtypes.float16:
    return _roundtrip("e", x) if abs(x) < 65520.0 else math.copysign(math.inf, x)
  # like PyTorch, a double reaches bfloat16 through float32 (rounded twice)
  return bf16_to_float(float_to_bf16(x))


def float_to_fp16(x: float) -> float:
  """`x` rounded to the nearest float16 value (ties to even; overflow to +-inf), as a float."""
  return _roundtrip("e", x)


def can_lossless_cast(src: DType, dst: DType) -> bool:
  """Every value of `src` is exactly a value of `dst` (so a cast there and back is the identity)."""
  src, dst = src.scalar(), dst.scalar()
  if src == dst or src == dtypes.bool: return True
  if dst == dtypes.bool or src == dtypes.index or dst == dtypes.index: return False
  if src in INTS:
    bits = 8 * src.itemsize - (src in SINTS)  # magnitude bits
    if dst in FLOATS: return bits <= FLOAT_BITS[dst][1] + 1
    wider, same = dst.itemsize > src.itemsize, dst.itemsize == src.itemsize
    if src in UINTS: return wider or (same and dst in UINTS)  # a signed one needs a sign bit more
    return dst in SINTS and (wider or same)
  if src in FLOATS and dst in FLOATS:
    (se, sm), (de, dm) = FLOAT_BITS[src], FLOAT_BITS[dst]
    return de >= se and dm >= sm and not (src in FP8S and dst in FP8S)
  return False


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


MAX_BUFFER_BYTES = 2 ** 63 - 1  # the most bytes an allocation can ask for (a C ssize_t)


def buffer_nbytes(size: int, dt: DType, device: Any) -> int:
  """The bytes of a buffer of `size` `dt` elements on `device`; MemoryError naming the size when
  no address space holds them, raised before anything is allocated."""
  nbytes = size * dt.itemsize
  if nbytes > MAX_BUFFER_BYTES:
    raise MemoryError(f"{device}: a buffer of {size} {dt.name} elements ({nbytes} bytes) is "
                      f"larger than an address space ({MAX_BUFFER_BYTES} bytes); nothing was "
                      "allocated")
  return nbytes


def to_bytes(dt: DType, values: list) -> bytes:
  """Pack Python values as `dt` elements (little endian)."""
  if dt == dtypes.bfloat16:
    return struct.pack(f"<{len(values)}H", *(float_to_bf16(float(v)) for v in values))
  if dt in FP8_FORMATS: return bytes(float_to_fp8(float(v), dt) for v in values)
  if dt.fmt is None: raise TypeError(f"{dt!r} has no memory layout")
  return struct.pack(f"<{len(values)}{dt.fmt}", *(truncate(dt, v) for v in values))


def from_bytes(dt: DType, data: bytes | memoryview) -> list:
  """Unpack `dt` elements into Python values."""
  n = len(data) // dt.itemsize
  if dt == dtypes.bfloat16: return [bf16_to_float(b) for b in struct.unpack(f"<{n}H", data)]
  if dt in FP8_FORMATS: return [_decode(FP8_FORMATS[dt], b) for b in bytes(data[:n])]
  if dt.fmt is None: raise TypeError(f"{dt!r} has no memory layout")
  return list(struct.unpack(f"<{n}{dt.fmt}", data))


# ---- numpy interop (numpy is optional: only names are used here) ----

_NP_NAMES: Final = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8",
                    dtypes.int16: "int16", dtypes.uint16: "uint16", dtypes.int32: "int32",
                    dtypes.uint32: "uint32", dtypes.int64: "int64", dtypes.uint64: "uint64",
                    dtypes.float16: "float16", dtypes.float32: "float32", dtypes.float64: "float64"}
_FROM_NP: Final = {v: k for k, v in _NP_NAMES.items()}


def to_numpy_name(dt: DType) -> str:
  """The numpy dtype name holding `dt` (bfloat16 and the 8-bit floats have none: they are read
  as float32)."""
  if dt in (dtypes.bfloat16, *FP8S): return "float32"
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
