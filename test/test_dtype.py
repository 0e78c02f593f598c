"""dtype.py: limits, sizes, vectors, pointers, PyTorch promotion, numpy names, value rounding."""
import itertools
import math
import struct

import pytest

from unigrad.dtype import (ALL_SCALARS, AddrSpace, DType, PtrDType, bf16_to_float, dtypes,
                           finite_max, float_to_bf16, from_bytes, from_numpy_name,
                           least_upper_dtype, least_upper_float, sum_acc_dtype, to_bytes,
                           to_dtype, to_numpy_name, truncate)

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
         "float16", "bfloat16", "float32", "float64"]


def ug(name: str) -> DType: return getattr(dtypes, name)


def th(name: str) -> "torch.dtype": return getattr(torch, name)


# ---- limits and sizes ----

@pytest.mark.parametrize("name", [n for n in NAMES if n != "bool" and not n.startswith(("f", "b"))])
def test_int_limits_match_torch(name: str) -> None:
  info = torch.iinfo(th(name))
  assert (ug(name).min, ug(name).max) == (info.min, info.max)
  assert type(ug(name).min) is int and type(ug(name).max) is int


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_float_limits(name: str) -> None:
  assert (ug(name).min, ug(name).max) == (-math.inf, math.inf)
  assert finite_max(ug(name)) == torch.finfo(th(name)).max


def test_bool_and_index_limits() -> None:
  assert (dtypes.bool.min, dtypes.bool.max) == (False, True)
  assert (dtypes.index.min, dtypes.index.max) == (-(2 ** 63), 2 ** 63 - 1)
  with pytest.raises(TypeError): _ = dtypes.void.min
  with pytest.raises(TypeError): _ = dtypes.float32.ptr().max


@pytest.mark.parametrize("name", NAMES)
def test_itemsize_matches_torch(name: str) -> None:
  assert ug(name).itemsize == th(name).itemsize


def test_aliases() -> None:
  assert dtypes.float is dtypes.float32 and dtypes.half is dtypes.float16
  assert dtypes.double is dtypes.float64 and dtypes.int is dtypes.int32
  assert dtypes.long is dtypes.int64 and dtypes.uchar is dtypes.uint8
  assert dtypes.from_name("float32") is dtypes.float32 and dtypes.from_name("int") is dtypes.int32
  with pytest.raises(ValueError): dtypes.from_name("float128")
  with pytest.raises(ValueError): dtypes.from_name("is_float")


def test_predicates() -> None:
  assert all(dtypes.is_float(ug(n)) for n in ("float16", "bfloat16", "float32", "float64"))
  assert not dtypes.is_float(dtypes.int32) and not dtypes.is_int(dtypes.bool)
  assert dtypes.is_int(dtypes.index) and dtypes.is_unsigned(dtypes.uint8)
  assert not dtypes.is_unsigned(dtypes.int8) and dtypes.is_bool(dtypes.bool)
  assert dtypes.is_float(dtypes.float32.vec(4)) and dtypes.is_int(dtypes.int8.vec(2))


# ---- vectors and pointers ----

@pytest.mark.parametrize("dt", ALL_SCALARS)
def test_vec(dt: DType) -> None:
  v = dt.vec(4)
  assert v.count == 4 and v.itemsize == 4 * dt.itemsize and v.scalar() is dt
  assert v == dt.vec(4) and hash(v) == hash(dt.vec(4)) and v != dt.vec(2) and v != dt
  assert dt.vec(1) is dt and repr(v) == f"{dt!r}.vec(4)"
  assert (v.min, v.max) == (dt.min, dt.max)
  assert eval(repr(v), {"dtypes": dtypes}) == v


def test_vec_errors() -> None:
  with pytest.raises(ValueError): dtypes.float32.vec(0)
  with pytest.raises(ValueError): dtypes.float32.vec(2.0)  # type: ignore[arg-type]
  with pytest.raises(TypeError): dtypes.float32.vec(4).vec(2)
  with pytest.raises(TypeError): dtypes.float32.ptr().vec(2)
  assert dtypes.void.vec(4) is dtypes.void


@pytest.mark.parametrize("space", list(AddrSpace))
def test_ptr(space: AddrSpace) -> None:
  p = dtypes.float32.ptr(space)
  assert isinstance(p, PtrDType) and p.base is dtypes.float32 and p.addrspace is space
  assert p.size == -1 and p == dtypes.float32.ptr(space) and p != dtypes.float32
  assert p != dtypes.int32.ptr(space) and p.itemsize == 4
  assert eval(repr(p), {"dtypes": dtypes, "AddrSpace": AddrSpace}) == p
  sized = dtypes.int8.vec(4).ptr(space, 16)
  assert sized.size == 16 and sized.base == dtypes.int8.vec(4) and sized.count == 4
  assert eval(repr(sized), {"dtypes": dtypes, "AddrSpace": AddrSpace}) == sized
  with pytest.raises(TypeError): p.ptr()
  assert dtypes.float32.ptr() == dtypes.float32.ptr(AddrSpace.GLOBAL)


# ---- promotion: PyTorch's promote_types for every pair and triple ----

def _torch_fold(names: tuple[str, ...]) -> str | None:
  try:
    out = th(names[0])
    for n in names[1:]: out = torch.promote_types(out, th(n))
  except RuntimeError:
    return None
  return str(out).removeprefix("torch.")


def _unigrad(names: tuple[str, ...]) -> str | None:
  try: out = least_upper_dtype(*(ug(n) for n in names))
  except TypeError: return None
  return next(n for n in NAMES if ug(n) == out)


@pytest.mark.parametrize("a,b", list(itertools.product(NAMES, repeat=2)))
def test_promotion_pairs_match_torch(a: str, b: str) -> None:
  assert _unigrad((a, b)) == _torch_fold((a, b))


def test_promotion_triples_match_torch() -> None:
  bad = [t for t in itertools.product(NAMES, repeat=3) if _unigrad(t) != _torch_fold(t)]
  assert not bad, bad[:10]


def test_promotion_raises_type_error() -> None:
  for a, b in [("uint16", "int8"), ("uint32", "bool"), ("uint64", "int64"), ("uint64", "uint8")]:
    with pytest.raises(TypeError, match="not defined"): least_upper_dtype(ug(a), ug(b))
  with pytest.raises(ValueError): least_upper_dtype()


def test_promotion_misc() -> None:
  assert least_upper_dtype(dtypes.float32) is dtypes.float32
  assert least_upper_dtype(dtypes.index, dtypes.int32) is dtypes.index
  assert least_upper_dtype(dtypes.bool, dtypes.index) is dtypes.index
  assert least_upper_dtype(dtypes.float32.vec(4), dtypes.int8) is dtypes.float32
  assert dtypes.least_upper_dtype(dtypes.int8, dtypes.uint8) is dtypes.int16
  assert least_upper_float(dtypes.int32) is dtypes.float32
  assert least_upper_float(dtypes.float16) is dtypes.float16


@pytest.mark.parametrize("name", NAMES)
def test_sum_dtype_matches_torch(name: str) -> None:
  want = str(torch.zeros(2, dtype=th(name)).sum().dtype).removeprefix("torch.")
  assert sum_acc_dtype(ug(name)) == ug(want)


def test_from_py_matches_torch() -> None:
  for v in [True, 1, 1.5, [1, 2], [1, 2.0], [True, 1], [[True], [False]], []]:
    want = str(torch.tensor(v).dtype).removeprefix("torch.")
    assert dtypes.from_py(v) == ug(want), v
  with pytest.raises(TypeError): dtypes.from_py("x")


# ---- numpy names ----

@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
def test_numpy_names_both_ways(name: str) -> None:
  assert to_numpy_name(ug(name)) == np.dtype(name).name
  assert from_numpy_name(np.dtype(name)) is ug(name)
  assert from_numpy_name(name) is ug(name)
  assert from_numpy_name(np.dtype(name).type) is ug(name)
  assert to_dtype(np.dtype(name)) is ug(name) and to_dtype(name) is ug(name)
  assert to_dtype(ug(name)) is ug(name)


def test_numpy_names_unsupported() -> None:
  assert to_numpy_name(dtypes.bfloat16) == "float32"  # numpy has no bfloat16: read as float32
  with pytest.raises(TypeError): to_numpy_name(dtypes.index)
  with pytest.raises(TypeError): from_numpy_name(np.dtype("complex64"))
  with pytest.raises(TypeError): from_numpy_name("float128")


# ---- values ----

@pytest.mark.parametrize("name", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                  "uint64"])
def test_truncate_wraps_like_torch(name: str) -> None:
  dt = ug(name)
  for v in [0, 1, -1, dt.max, dt.max + 1, dt.min - 1, 2 ** 70 + 3, -(2 ** 70) - 3, 12345678901]:
    want = torch.tensor(v & 0xFFFFFFFFFFFFFFFF, dtype=torch.uint64).to(torch.int64).to(th(name))
    assert truncate(dt, v) == want.item(), (name, v)
    assert dt.min <= truncate(dt, v) <= dt.max


def test_truncate_misc() -> None:
  assert truncate(dtypes.bool, 2) is True and truncate(dtypes.bool, 0.0) is False
  assert truncate(dtypes.index, 2 ** 70) == 2 ** 70  # index is unbounded: no wrap
  assert truncate(dtypes.int32, 2.7) == 2 and truncate(dtypes.int32, -2.7) == -2
  assert type(truncate(dtypes.float32, 1)) is float
  with pytest.raises(TypeError): truncate(dtypes.void, 1)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_float_rounding_matches_torch(name: str) -> None:
  vals = [0.1, 1 / 3, 1.00390625, 1.00390625 + 2 ** -40, 1.01171875, 65504.0, 65519.99, 65520.0,
          3.3895313892515355e38, 3.4e38, 3.5e38, 1e-8, 1e-40, -2.5e-45, 6e-8, -0.0, 1e300,
          math.inf, -math.inf, 123456.789]
  for v in vals:
    want = torch.tensor(v, dtype=torch.float64).to(th(name)).item()
    got = truncate(ug(name), v)
    assert struct.pack("<d", got) == struct.pack("<d", want), (name, v, got, want)
  assert math.isnan(truncate(ug(name), math.nan))


def test_bfloat16_bits() -> None:
  assert float_to_bf16(1.0) == 0x3F80 and bf16_to_float(0x3F80) == 1.0
  assert float_to_bf16(1.00390625) == 0x3F80  # a tie rounds to even
  assert float_to_bf16(1.01171875) == 0x3F82  # a tie rounds to even (up)
  assert float_to_bf16(-1.0) == 0xBF80 and float_to_bf16(1e39) == 0x7F80
  assert float_to_bf16(-1e39) == 0xFF80 and math.isnan(bf16_to_float(float_to_bf16(math.nan)))
  for bits in range(0, 0x10000, 97):  # every bfloat16 value survives a round trip
    x = bf16_to_float(bits)
    if not math.isnan(x): assert float_to_bf16(x) == bits


def test_bytes_roundtrip() -> None:
  assert from_bytes(dtypes.int16, to_bytes(dtypes.int16, [1, -2, 40000])) == [1, -2, 40000 - 65536]
  assert from_bytes(dtypes.bfloat16, to_bytes(dtypes.bfloat16, [1.0, 0.1])) == [1.0, 0.10009765625]
  assert from_bytes(dtypes.bool, to_bytes(dtypes.bool, [True, 0])) == [True, False]
  assert to_bytes(dtypes.float32, [1.0]) == struct.pack("<f", 1.0)
  with pytest.raises(TypeError): to_bytes(dtypes.index, [1])
  with pytest.raises(TypeError): from_bytes(dtypes.index, b"\0" * 8)


def test_dtype_order_and_identity() -> None:
  assert sorted([dtypes.float32, dtypes.bool, dtypes.int8]) == [dtypes.bool, dtypes.int8,
                                                                dtypes.float32]
  assert DType(13, 4, "float", "f") == dtypes.float32
  assert repr(dtypes.float32) == "dtypes.float" and repr(AddrSpace.LOCAL) == "AddrSpace.LOCAL"
  with pytest.raises(AttributeError): dtypes.float32.itemsize = 8  # type: ignore[misc]
