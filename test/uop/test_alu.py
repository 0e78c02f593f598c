"""alu.py: the meaning of every ALU op on Python scalars, checked against PyTorch (CPU)."""
import itertools
import math
import struct

import pytest

from unigrad.dtype import DType, dtypes, truncate
from unigrad.uop import Ops
from unigrad.uop.alu import (PYTHON_ALU, exec_alu, exec_bitcast, exec_cast, float_bits,
                             threefry2x32)

torch = pytest.importorskip("torch")

INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64]
FLOAT_DTYPES = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
SPECIAL = [0.0, -0.0, 1.0, -1.5, 2.5, 3.0, -7.25, 1e-3, 65504.0, 1e30, -1e30, math.inf, -math.inf,
           math.nan]


TORCH_NAMES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
               "float16", "bfloat16", "float32", "float64"]


def tdt(dt: DType) -> "torch.dtype":
  return next(getattr(torch, n) for n in TORCH_NAMES if getattr(dtypes, n) == dt)


def same(a: object, b: object) -> bool:
  """Equal, with nan == nan and -0.0 != 0.0."""
  if isinstance(a, float) or isinstance(b, float):
    if math.isnan(a) or math.isnan(b): return math.isnan(a) and math.isnan(b)
    return struct.pack("<d", a) == struct.pack("<d", b)
  return a == b


def int_values(dt: DType) -> list[int]:
  return sorted({0, 1, -1 % (dt.max + 1) if dt.min == 0 else -1, 2, 7, -7 if dt.min < 0 else 9,
                 dt.max, dt.min, dt.max - 3, dt.min + 5})


TORCH_BINARY = {Ops.ADD: torch.add, Ops.SUB: torch.sub, Ops.MUL: torch.mul, Ops.MAX: torch.maximum,
                Ops.CMPLT: torch.lt, Ops.CMPNE: torch.ne, Ops.CMPEQ: torch.eq, Ops.CMPGT: torch.gt,
                Ops.CMPGE: torch.ge, Ops.CMPLE: torch.le, Ops.XOR: torch.bitwise_xor,
                Ops.OR: torch.bitwise_or, Ops.AND: torch.bitwise_and, Ops.IDIV: torch.floor_divide,
                Ops.MOD: torch.remainder,
                Ops.CDIV: lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                Ops.CMOD: torch.fmod, Ops.DIV: torch.div, Ops.POW: torch.pow}
COMPARE = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.CMPGT, Ops.CMPGE, Ops.CMPLE}


def torch_binary(op: Ops, dt: DType, a: object, b: object) -> object:
  ta, tb = torch.tensor([a], dtype=tdt(dt)), torch.tensor([b], dtype=tdt(dt))
  return TORCH_BINARY[op](ta, tb).item()


@pytest.mark.parametrize("dt", INT_DTYPES)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
                                Ops.CMPGT, Ops.CMPGE, Ops.CMPLE, Ops.XOR, Ops.OR, Ops.AND, Ops.IDIV,
                                Ops.MOD, Ops.CDIV, Ops.CMOD])
def test_int_binary_matches_torch(op: Ops, dt: DType) -> None:
  out = dtypes.bool if op in COMPARE else dt
  for a, b in itertools.product(int_values(dt), repeat=2):
    if b == 0 and op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD): continue
    if op in (Ops.IDIV, Ops.CDIV) and a == dt.min and b == -1: continue  # overflow traps in torch
    got = exec_alu(op, out, (a, b))
    assert got == torch_binary(op, dt, a, b), (op, dt, a, b, got)
    assert type(got) is (bool if out == dtypes.bool else int)


@pytest.mark.parametrize("dt", INT_DTYPES)
def test_int_shifts_and_pow_match_torch(dt: DType) -> None:
  bits = 8 * dt.itemsize
  for a, s in itertools.product(int_values(dt), range(0, bits)):
    ta = torch.tensor([a], dtype=tdt(dt))
    assert exec_alu(Ops.SHL, dt, (a, s)) == torch.bitwise_left_shift(ta, s).item(), (a, s)
    assert exec_alu(Ops.SHR, dt, (a, s)) == torch.bitwise_right_shift(ta, s).item(), (a, s)
  for a, e in itertools.product([0, 1, -1, 2, 3, -3, 7] if dt.min < 0 else [0, 1, 2, 3, 7],
                                range(0, 45, 4)):
    want = torch.pow(torch.tensor([a], dtype=tdt(dt)), e).item()
    assert exec_alu(Ops.POW, dt, (a, e)) == want, (a, e)  # exact, then wrapped


def test_int_division_by_zero_is_zero() -> None:
  for op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD):
    assert exec_alu(op, dtypes.int32, (7, 0)) == 0


@pytest.mark.parametrize("dt", FLOAT_DTYPES)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                                Ops.IDIV, Ops.MOD, Ops.POW])
def test_float_binary_matches_torch(op: Ops, dt: DType) -> None:
  vals = [truncate(dt, v) for v in SPECIAL]
  out = dtypes.bool if op in COMPARE else dt
  for a, b in itertools.product(vals, repeat=2):
    got, want = exec_alu(op, out, (a, b)), torch_binary(op, dt, a, b)
    if op is Ops.POW and dt in (dtypes.float16, dtypes.bfloat16) and math.isfinite(want):
      assert math.isclose(got, want, rel_tol=1e-2), (op, dt, a, b, got, want)
      continue
    assert same(got, want), (op, dt, a, b, got, want)


TORCH_UNARY = {Ops.RECIP: torch.reciprocal, Ops.TRUNC: torch.trunc, Ops.NEG: torch.neg,
               Ops.SQRT: torch.sqrt, Ops.EXP2: torch.exp2, Ops.LOG2: torch.log2, Ops.SIN: torch.sin}


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("op", list(TORCH_UNARY))
def test_float_unary_matches_torch(op: Ops, dt: DType) -> None:
  exact = op in (Ops.RECIP, Ops.TRUNC, Ops.NEG)
  for a in [truncate(dt, v) for v in SPECIAL + [0.5, 100.0, -100.0, 1e-40, 128.0, -150.0]]:
    got = exec_alu(op, dt, (a,))
    want = TORCH_UNARY[op](torch.tensor([a], dtype=tdt(dt))).item()
    if exact or not math.isfinite(want) or want == 0: assert same(got, want), (op, a, got, want)
    else: assert math.isclose(got, want, rel_tol=2 ** -22, abs_tol=1e-30), (op, a, got, want)


def test_sqrt_correctly_rounded() -> None:
  np = pytest.importorskip("numpy")
  for v in (65504.0, 2.0, 3.0, 1e-40, 1e30, 12345.678):
    x = truncate(dtypes.float32, v)
    assert exec_alu(Ops.SQRT, dtypes.float32, (x,)) == float(np.sqrt(np.float32(x)))


def test_int_unary() -> None:
  assert exec_alu(Ops.NEG, dtypes.int8, (-128,)) == -128  # wraps
  assert exec_alu(Ops.NEG, dtypes.uint8, (1,)) == 255
  assert exec_alu(Ops.NOT, dtypes.bool, (True,)) is False
  assert exec_alu(Ops.NOT, dtypes.int8, (5,)) == -6 and exec_alu(Ops.TRUNC, dtypes.int32, (3,)) == 3


def test_ternary_and_vectors() -> None:
  assert exec_alu(Ops.WHERE, dtypes.float32, (True, 1.5, 2.5)) == 1.5
  assert exec_alu(Ops.WHERE, dtypes.int8, (False, 1, 300)) == 44
  assert exec_alu(Ops.MULACC, dtypes.int8, (100, 2, 1)) == -55
  assert exec_alu(Ops.MULACC, dtypes.float32, (0.1, 3.0, 1.0)) == truncate(dtypes.float32, 1.3)
  assert exec_alu(Ops.ADD, dtypes.int8.vec(3), ((1, 2, 127), 1)) == (2, 3, -128)
  assert exec_alu(Ops.CMPLT, dtypes.bool.vec(2), ((1, 5), (2, 2))) == (True, False)
  assert exec_alu(Ops.ADD, dtypes.float32, (True, 1)) == 2.0  # float results from mixed inputs


def test_every_alu_op_has_a_meaning() -> None:
  from unigrad.uop.ops import GroupOp  # noqa: PLC0415 (only this test needs it)
  assert set(GroupOp.ALU) <= set(PYTHON_ALU)


def test_threefry_known_answers() -> None:
  # Random123 known-answer vectors for threefry2x32 with 20 rounds: (ctr, key) -> out, as 2x32
  kat = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
         ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
         ((0x243f6a88, 0x85a308d3), (0x13198a2e, 0x03707344), (0xc4923a9c, 0x483df7a0))]
  for (c0, c1), (k0, k1), (o0, o1) in kat:
    assert threefry2x32(c1 << 32 | c0, k1 << 32 | k0) == o1 << 32 | o0
  assert exec_alu(Ops.THREEFRY, dtypes.uint64, (0, 0)) == 0x99ba4efe6b200159


@pytest.mark.parametrize("src,dst", [(s, d) for s in INT_DTYPES + FLOAT_DTYPES + [dtypes.bool]
                                     for d in INT_DTYPES + FLOAT_DTYPES + [dtypes.bool]])
def test_cast_matches_torch(src: DType, dst: DType) -> None:
  if dtypes.is_float(src):
    vals = [truncate(src, v) for v in (0.0, -0.0, 1.5, -2.5, 100.7, math.nan)]
  elif src == dtypes.bool: vals = [False, True]
  else: vals = int_values(src)
  for v in vals:
    got = exec_cast(v, src, dst)
    if dtypes.is_float(src) and not dtypes.is_float(dst) and dst != dtypes.bool:
      if math.isnan(v) or not dst.min <= math.trunc(v) <= dst.max: continue  # undefined in C
    want = torch.tensor([v], dtype=tdt(src)).to(tdt(dst)).item()
    assert same(got, want), (src, dst, v, got, want)


def test_cast_saturates_nonfinite() -> None:
  assert exec_cast(math.nan, dtypes.float32, dtypes.int32) == 0
  assert exec_cast(math.inf, dtypes.float32, dtypes.int8) == 127
  assert exec_cast(-math.inf, dtypes.float32, dtypes.uint8) == 0
  assert exec_cast(math.nan, dtypes.float32, dtypes.bool) is True


BITCASTS = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32),
            (dtypes.float16, dtypes.int16), (dtypes.bfloat16, dtypes.uint16),
            (dtypes.float64, dtypes.uint64), (dtypes.uint8, dtypes.int8)]


@pytest.mark.parametrize("src,dst", BITCASTS)
def test_bitcast_matches_torch(src: DType, dst: DType) -> None:
  vals = [truncate(src, v) for v in ([1.5, -2.0, math.inf, 0.1] if dtypes.is_float(src)
                                     else [0, 1, src.max, src.min + 3])]
  for v in vals:
    want = torch.tensor([v], dtype=tdt(src)).view(tdt(dst)).item()
    assert same(exec_bitcast(v, src, dst), want), (src, dst, v)
  with pytest.raises(TypeError): exec_bitcast(1, dtypes.int8, dtypes.int16)


def test_float_bits() -> None:
  assert float_bits(0.0) != float_bits(-0.0) and float_bits(math.nan) == float_bits(-math.nan)
  assert float_bits(1.0) == struct.pack("<d", 1.0)
