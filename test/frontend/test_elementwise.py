"""Elementwise plumbing: the scalar-operand fast path builds exactly the graph (and dtype) that
the general promotion and broadcasting path builds."""
import contextlib
import gc
import itertools
import math

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.uop import Ops
from unigrad.frontend import elementwise
from unigrad.frontend.dtypes import result_type
from unigrad.frontend import tensor as tensor_module

DTYPES = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32,
          dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.bool]
SCALARS = [1.5, -0.0, 0.0, math.inf, math.nan, 3, 0, -7, 300, True, False]
OPS = [lambda a, b: a + b, lambda a, b: b + a, lambda a, b: a * b, lambda a, b: b * a,
       lambda a, b: a - b, lambda a, b: b - a, lambda a, b: a < b, lambda a, b: b < a,
       lambda a, b: a.maximum(b), lambda a, b: a / b, lambda a, b: b / a]


def build(t: Tensor, s, op):
  try: return op(t, s)
  except (TypeError, ValueError, RuntimeError) as e: return type(e)


def general(x, y):
  return None


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("shape", [(), (4,), (2, 1, 3)])
def test_scalar_fast_path_builds_the_general_graph(shape, grad, monkeypatch):
  for dt, s, op in itertools.product(DTYPES, SCALARS, OPS):
    t = Tensor.ones(*shape, dtype=dt, requires_grad=grad and dtypes.is_float(dt))
    with Tensor.no_grad() if not grad else contextlib.nullcontext():
      fast = build(t, s, op)
      with monkeypatch.context() as m:
        m.setattr(elementwise, "_scalar_beside", general)
        slow = build(t, s, op)
    if isinstance(slow, type): assert fast is slow, (dt, s)
    else: assert fast.uop is slow.uop and fast.dtype == slow.dtype, (dt, s)


def test_scalar_fast_path_under_no_grad_and_with_grad():
  x = Tensor([1.0, 2.0], requires_grad=True)
  with Tensor.no_grad():
    y = x * 2.0 + 1
    assert not y.requires_grad
  (x * 3.0 + 0.5).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
  np.testing.assert_allclose(y.numpy(), [3.0, 5.0])


def test_scalar_operand_cache_is_bounded_and_keeps_signed_zero():
  a, b = (elementwise.scalar_operand(dtypes.float32, v, (3,)) for v in (0.0, -0.0))
  assert a is not b
  for i in range(elementwise.SCALAR_OPERAND_CACHE + 10):
    elementwise.scalar_operand(dtypes.float32, float(i), (2,))
  assert len(elementwise._scalar_operands) <= elementwise.SCALAR_OPERAND_CACHE


def test_scalar_operand_cache_keys_floats_by_value_but_zeros_and_nans_by_bits():
  """Floats key the constants' cache by value (0.5 and 0.5 are one entry), except zeros, whose
  sign == cannot see, and nans, which equal nothing: x * -0.0 after x * 0.0 keeps its sign."""
  f = elementwise.scalar_operand
  assert f(dtypes.float32, 0.5, (3,)) is f(dtypes.float32, 0.5, (3,))
  assert f(dtypes.float32, -0.0, (3,)) is f(dtypes.float32, -0.0, (3,))
  assert f(dtypes.float32, math.nan, (3,)) is f(dtypes.float32, -math.nan, (3,))
  x = Tensor([1.0, -2.0])
  assert [math.copysign(1, v) for v in (x * 0.0).tolist()] == [1, -1]
  assert [math.copysign(1, v) for v in (x * -0.0).tolist()] == [-1, 1]
  assert all(math.isnan(v) for v in (x + math.nan).tolist())


@pytest.mark.parametrize("grad", [True, False])
def test_casts_and_broadcasts_that_change_nothing_make_no_tensor(grad, monkeypatch):
  """An op makes one Tensor, its result: the operands' casts and broadcasts are built as nodes
  (none at all when they change nothing), not as tensors of their own."""
  a, b = Tensor.ones(2, 3), Tensor.ones(2, 3)
  row, ints = Tensor.ones(3), Tensor.ones(2, 3, dtype=dtypes.int32)
  made: list = []
  monkeypatch.setattr(tensor_module.all_tensors, "add", made.append)
  with Tensor.no_grad() if not grad else contextlib.nullcontext():
    cond = a < 0.5
    for op in (lambda: a + b, lambda: a * 2.0, lambda: a + row, lambda: a * ints,
               lambda: a < b, lambda: a.maximum(row), lambda: cond.where(a, row)):
      count = len(made)
      out = op()
      assert len(made) == count + 1 and made[-1] is out
    c = a + b
    if grad:  # no node between the operands and the ADD; a broadcast is a node, not a tensor
      assert c.uop.src == (a.uop, b.uop) and (a + row).uop.src[1].op is Ops.EXPAND


@pytest.mark.parametrize("grad", [True, False])
def test_broadcasting_two_tensors_builds_what_expand_builds(grad):
  x, b = Tensor.rand(2, 3, 4).realize(), Tensor.rand(4).realize()
  y = Tensor.rand(2, 3, 4) * 2  # not a buffer: detached under no_grad
  with Tensor.no_grad() if not grad else contextlib.nullcontext():
    for u in (x, y):
      assert (u + b).uop is (u + b.reshape(1, 1, 4).expand(2, 3, 4)).uop
      assert (b * u).uop is (b.reshape(1, 1, 4).expand(2, 3, 4) * u).uop


def test_dead_tensors_leave_the_live_set():
  gc.collect()
  before = len(tensor_module.all_tensors)
  t = Tensor.ones(2) * 2
  assert any(x is t for x in tensor_module.all_tensors)
  del t
  assert len(tensor_module.all_tensors) == before  # the weak reference's callback removed it


@pytest.mark.parametrize("grad", [True, False])
def test_sub_and_div_build_their_composition(grad):
  """sub and div build their nodes directly: the graph of a.add(b.neg()) and a.mul(b.recip())."""
  x = Tensor.ones(2, 3, requires_grad=grad)
  for y in (Tensor.ones(2, 3), Tensor.ones(3), Tensor.ones(()), 2, 1.5, Tensor.ones(2, 3).int()):
    with Tensor.no_grad() if not grad else contextlib.nullcontext():
      a, b = x._broadcasted(x, y)
      assert (x - y).uop is a.add(b.neg()).uop
      b, a = x._broadcasted(x, y, reverse=True)
      assert (y - x).uop is b.add(a.neg()).uop
      dt = dtypes.float32 if isinstance(y, (int, float)) else result_type(x, y)
      a, b = x._broadcasted(x, y, dt)
      assert (x / y).uop is a.mul(b.reciprocal()).uop
      assert (-x).uop is x.mul(x._const(-1, x.dtype)).uop
