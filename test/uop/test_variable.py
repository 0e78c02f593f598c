"""Symbolic variables (uop/variable.py): Variable, bind/unbind, the size helpers, their errors."""
from dataclasses import replace

import pytest

from unigrad import UnboundVariableError, Variable
from unigrad.dtype import dtypes
from unigrad.uop import Ops, SpecError, UOp, spec_tensor
from unigrad.uop.variable import (VariableBindError, bound_values, concrete, concrete_shape,
                                  divide_sizes, resolve, simplify_size, sizes_equal, unbind_values)


def test_variable_is_a_bounded_index_param():
  n = Variable("n", 1, 64)
  assert n.op is Ops.PARAM and n.dtype == dtypes.index and n.shape == ()
  assert (n.vmin, n.vmax) == (1, 64) and n.arg.name == "n" and n.arg.value is None
  assert n.is_variable and n is UOp.variable("n", 1, 64)


def test_bind_keeps_the_range_and_records_the_value():
  n = Variable("n", 1, 64)
  b = n.bind(3)
  assert b is not n and b.arg.value == 3 and (b.vmin, b.vmax) == (1, 64)
  assert b is n.bind(3) and b is not n.bind(4)
  assert b.unbind() == (n, 3)


@pytest.mark.parametrize("value", [0, 65, -1])
def test_bind_outside_the_range_names_the_variable_and_range(value):
  with pytest.raises(ValueError, match=r"'n'.*outside its range \[1, 64\]"):
    Variable("n", 1, 64).bind(value)


def test_bad_variables_and_binds_raise_typed_errors():
  with pytest.raises(ValueError, match="min 5 > max 2"): Variable("n", 5, 2)
  with pytest.raises(ValueError, match="min >= 0"): Variable("n", -1, 2)
  with pytest.raises(TypeError, match="ints"): Variable("n", 0, 2.5)
  with pytest.raises(TypeError, match="needs an int"): Variable("n", 0, 4).bind(2.0)
  with pytest.raises(TypeError, match="needs a variable"): UOp.const(dtypes.index, 3).bind(3)
  with pytest.raises(TypeError, match="bound variable"): Variable("n", 0, 4).unbind()


def test_concrete_evaluates_bound_sizes():
  n, m = Variable("n", 1, 64).bind(3), Variable("m", 1, 8).bind(5)
  assert concrete(n * 4 + m) == 17
  assert concrete_shape((n, 4, m * n)) == (3, 4, 15)
  assert bound_values((n * m, 2)) == {"n": 3, "m": 5}


def test_concrete_of_an_unbound_size_names_the_variable():
  n = Variable("n", 1, 64)
  with pytest.raises(UnboundVariableError,
                     match=r"symbolic shape where a concrete one is needed.*'n' in \[1, 64\]"):
    concrete_shape((n, 4))


def test_two_values_of_one_variable_conflict():
  n = Variable("n", 1, 64)
  with pytest.raises(VariableBindError, match="bound to both 3 and 4"):
    bound_values((n.bind(3), n.bind(4)))


def test_resolve_uses_ranges_then_bound_values():
  n = Variable("n", 1, 64)
  assert resolve(n <= 64) and not resolve(n < 1)
  assert resolve(n.bind(3) <= 16) and not resolve(n.bind(20) <= 16)
  with pytest.raises(UnboundVariableError): resolve(n <= 16)


def test_size_algebra():
  n, m = Variable("n", 1, 64), Variable("m", 1, 8)
  assert simplify_size(n + 0) is n and simplify_size(n - n) == 0
  assert sizes_equal(n * 4, 4 * n) and not sizes_equal(n * 4, n * 3) and sizes_equal(6, 6)
  assert sizes_equal(divide_sizes((n, 4, m), (m, 2)), n * 2)
  assert divide_sizes((n, 4), (m,)) is None and divide_sizes((n, 4), (3,)) is None


def test_unbind_values_strips_every_bound_variable():
  n = Variable("n", 1, 64)
  u, vals = unbind_values(n.bind(7) * 4 + 1)
  assert vals == {"n": 7} and u is n * 4 + 1


def test_spec_rejects_a_bound_value_outside_the_range():
  n = Variable("n", 1, 4)
  spec_tensor.verify(n.bind(4))
  bad = UOp(Ops.PARAM, dtypes.index, n.src, replace(n.arg, value=9))
  with pytest.raises(SpecError, match=r"bound value 9 outside \[1, 4\]"): spec_tensor.verify(bad)
