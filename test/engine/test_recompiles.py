"""Recompiles a user can see: DEBUG=1 says what changed; the 8th schedule of one graph warns."""
import warnings

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.engine import recompiles
from unigrad.knobs import Context


def test_the_eighth_schedule_of_one_graph_for_new_shapes_warns_once(monkeypatch, capsys):
  monkeypatch.setattr(recompiles, "_forms", {})
  def run(n: int) -> float: return (Tensor(np.ones(n, np.float32), device="CPU") * 2.5).sum().item()
  assert run(3) == 7.5
  with Context(DEBUG=1): assert run(4) == 10.0
  assert "scheduled 2 times; a shape changed" in capsys.readouterr().out
  for n in range(5, 10):
    assert run(n) == 2.5 * n
  with pytest.warns(recompiles.RecompileWarning, match="8 times.*bound Variable"): run(10)
  with warnings.catch_warnings(record=True) as later:
    warnings.simplefilter("always")
    run(11)
  assert not [w for w in later if issubclass(w.category, recompiles.RecompileWarning)], \
    "one warning per graph"


def test_what_changed_names_a_constant():
  a = (Tensor.ones(4) * 2).uop
  b = (Tensor.ones(4) * 3).uop
  assert "constant" in recompiles.what_changed(a, b)
