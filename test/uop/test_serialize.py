"""serialize.py: graphs round-trip through canonical bytes; content digests are stable keys;
bad input is a SerializeError, never another exception."""
import json
import math
import os
import subprocess
import sys

import pytest

from unigrad import Tensor
from unigrad.codegen.opt import Opt
from unigrad.dtype import AddrSpace, dtypes
from unigrad.uop import (AxisType, CallInfo, Invalid, KernelInfo, Ops, ParamArg, ReduceArg, UOp,
                         shape_uop)
from unigrad.uop.serialize import SerializeError, content_digest, dumps, loads

f32, i32, idx = dtypes.float32, dtypes.int32, dtypes.index


def c(v: object, dt=i32) -> UOp: return UOp.const(dt, v)


def graphs() -> list[UOp]:
  a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 3, i32)
  r0, r1 = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  x = UOp(Ops.BUFFER, f32, (shape_uop((4, 8)),), ParamArg(0, f32, "CPU"))
  return [
    c(1), c(1.0, f32), c(True, dtypes.bool), c(-0.0, f32), c(0.0, f32), c(math.inf, f32),
    c(-math.inf, f32), c(math.nan, f32), c(Invalid, idx), c(2 ** 62, dtypes.int64),
    c(float.fromhex("0x1.fffffep+127"), f32), c(1e-45, f32), a * 4 + a, (b < 2).where(b, c(0)),
    b.cast(f32).bitcast(i32), UOp(Ops.REDUCE, idx, (r0 * 8 + r1, r1), ReduceArg(Ops.ADD)),
    UOp(Ops.REDUCE, f32, (x,), ReduceArg(Ops.MAX, (0, 1))), UOp(Ops.PERMUTE, f32, (x,), (1, 0)),
    UOp(Ops.VCONST, f32, arg=(1.0, -0.0, math.nan, math.inf)), UOp(Ops.VCONST, idx, arg=(3,)),
    UOp(Ops.BINARY, dtypes.uint8, arg=b"\x00\x01"), UOp(Ops.COPY, f32, (x,), ("CPU:0", "CPU:1")),
    UOp(Ops.SINK, dtypes.void, (x,), KernelInfo("k", (Opt.upcast(0, 4),), (Opt.thread(0, 2),))),
    UOp(Ops.CAST, f32.vec(4), (c(1.0, f32),)),
    UOp(Ops.FUNCTION, dtypes.void, (UOp(Ops.TUPLE, dtypes.void, (x,)), x), CallInfo("g")),
    UOp(Ops.PARAM, f32.ptr(AddrSpace.LOCAL, 16), (shape_uop(()),),
        ParamArg(3, f32, None, AddrSpace.LOCAL)),
    UOp(Ops.SINK, dtypes.void, (a,), tag=("t", 1.5)), UOp(Ops.SINK, dtypes.void, (a,), tag=1),
    UOp(Ops.SINK, dtypes.void, (a,), tag=True),
  ]


@pytest.mark.parametrize("i", range(len(graphs())))
def test_roundtrip_is_the_same_node(i: int) -> None:
  u = graphs()[i]
  assert loads(dumps(u)) is u


def test_schedule_roundtrips() -> None:
  x, w = Tensor.empty(8, 16), Tensor.empty(16, 16)
  linear = ((x @ w).softmax(-1) * 2.5).sum(0).schedule()
  assert len(linear.src) > 1 and loads(dumps(linear)) is linear


def test_equal_args_of_different_types_stay_apart() -> None:
  ones = [c(1), c(1.0, f32), c(True, dtypes.bool), UOp(Ops.SINK, dtypes.void, (), arg=1),
          UOp(Ops.SINK, dtypes.void, (), arg=1.0), UOp(Ops.SINK, dtypes.void, (), arg=True)]
  assert len({dumps(u) for u in ones}) == len(ones)
  assert len({content_digest(u) for u in ones}) == len(ones)
  assert content_digest(c(0.0, f32)) != content_digest(c(-0.0, f32))


DIGEST_CHILD = """
from unigrad import Tensor
from unigrad.uop.serialize import content_digest, dumps
import hashlib
x, w = Tensor.empty(8, 16), Tensor.empty(16, 16)
lin = ((x @ w).relu() + 1).sum(0).schedule()
print(content_digest(lin), hashlib.sha256(dumps(lin)).hexdigest())
"""


def test_digest_and_bytes_are_the_same_in_every_process() -> None:
  """String hashing differs between processes (PYTHONHASHSEED): keys must not depend on it."""
  outs = {subprocess.run([sys.executable, "-c", DIGEST_CHILD], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True).stdout
          for seed in (1, 2)}
  assert len(outs) == 1


def test_unserializable_arg_raises() -> None:
  fn = UOp(Ops.FUNCTION, dtypes.void, (UOp(Ops.TUPLE, dtypes.void, ()),), CallInfo("g", len))
  with pytest.raises(SerializeError, match="builtin_function_or_method"): dumps(fn)
  with pytest.raises(SerializeError): content_digest(fn)
  with pytest.raises(SerializeError, match="type"):
    dumps(UOp(Ops.SINK, dtypes.void, (), arg=(1, frozenset({2}))))


BAD = [b"", b"\x00\xff", b"[]", b"[1]", b"[99, [], [[]]]", b'[1, [["d", "float"]], []]',
       b'[1, [["d", "nope"]], [["CONST", 0, [], 1, null]]]',
       b'[1, [["d", "float"]], [["NOPE", 0, [], 1, null]]]',
       b'[1, [["d", "float"]], [["CONST", 5, [], 1, null]]]',
       b'[1, [["d", "float"]], [["ADD", 0, [0, 1], null, null]]]',
       b'[1, [["d", "float"]], [["CONST", 0, [], ["e", "os:path", "x"], null]]]',
       b'[1, [["d", "float"]], [["CONST", 0, [], ["c", "unigrad.uop.ops:ParamArg", [1]], null]]]',
       b'[1, [["d", "float"]], [["CONST", 0, [], ["f", "zz"], null]]]',
       b'[1, [["d", "float"]], [["CONST", 0, [], ["q"], null]]]',
       b'[1, [["d", "float"]], [["CONST", 0, [], 1.5, null]]]']


@pytest.mark.parametrize("data", BAD)
def test_malformed_bytes_raise_serialize_error(data: bytes) -> None:
  with pytest.raises(SerializeError): loads(data)


def test_truncated_and_random_bytes_raise_serialize_error() -> None:
  data = dumps(graphs()[-5])
  for bad in (data[:len(data) // 2], data[:-1], os.urandom(len(data))):
    with pytest.raises(SerializeError): loads(bad)
  assert json.loads(data)[0] == 1
