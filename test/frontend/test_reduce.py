"""Reductions and matmul: the node-level matmul builds exactly the graph of the tensor-level
composition it stands for."""
import contextlib

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.frontend import reduce

SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
          ((2, 2, 3, 4), (2, 2, 4, 1)), ((1, 4), (4, 1)), ((2, 1, 4), (2, 4, 3))]


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_matmul_node_builds_the_general_graph(dt, grad, monkeypatch):
  for xs, ws in SHAPES:
    x = Tensor.ones(*xs, dtype=dt, requires_grad=grad)
    w = Tensor.ones(*ws, dtype=dt, requires_grad=grad)
    with Tensor.no_grad() if not grad else contextlib.nullcontext():
      assert reduce._matmul_node(x, w, None) is not None, (xs, ws)
      fast = x @ w
      with monkeypatch.context() as m:
        m.setattr(reduce, "_matmul_node", lambda *_: None)
        slow = x @ w
    assert fast.uop is slow.uop and fast.shape == slow.shape, (xs, ws)


def test_matmul_node_leaves_other_cases_to_the_general_path():
  a, b = Tensor.ones(2, 3), Tensor.ones(3, 4)
  assert reduce._matmul_node(a, b.half(), None) is None  # promotion
  assert reduce._matmul_node(a.half(), b.half(), None) is None  # accumulates in float32
  assert reduce._matmul_node(a, Tensor.ones(3), None) is None  # a vector
  assert reduce._matmul_node(a, Tensor.ones(2, 3, 4), None) is None  # broadcast batch dims
  assert reduce._matmul_node(a, Tensor.ones(4, 4), None) is None  # the error is the general path's
  with pytest.raises(RuntimeError, match="cannot be multiplied"): a @ Tensor.ones(4, 4)
  x, w = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
  np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w)
