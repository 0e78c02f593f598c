"""The program cache: progress while a run's new kernels are generated."""
import re

import numpy as np

from unigrad import Tensor
from unigrad.engine import execute, programs


def test_a_long_compile_prints_one_progress_line_and_a_cached_run_prints_none(monkeypatch,
                                                                              capsys):
  monkeypatch.setattr(programs, "PROGRESS_AFTER_S", 0.0)
  execute.forget_programs()  # what a new process starts without
  x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6), device="CPU")
  np.testing.assert_allclose((x * 3 + 7).exp2().max(1).numpy(), np.exp2(x.numpy() * 3 + 7).max(1))
  err = capsys.readouterr().err
  assert re.search(r"compiled \d+ kernels for CPU in [\d.]+ s", err), err
  (x * 3 + 7).exp2().max(1).numpy()
  assert "compiled" not in capsys.readouterr().err, "nothing new to compile: no line"
