"""The codegen driver (pipeline.py): what it does around the stages."""
import gc
from dataclasses import replace

import pytest

from unigrad import Tensor
from unigrad.codegen import pipeline
from unigrad.codegen.pipeline import full_rewrite, gc_paused
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import Ops


def test_gc_is_paused_while_a_kernel_is_lowered_and_restored_after(
    monkeypatch: pytest.MonkeyPatch) -> None:
  seen: list[bool] = []
  first = pipeline.CODEGEN_STAGES[0]
  probe = replace(first, run=lambda ast, ren: seen.append(gc.isenabled()) or first.run(ast, ren))
  monkeypatch.setattr(pipeline, "CODEGEN_STAGES", (probe, *pipeline.CODEGEN_STAGES[1:]))
  kernel = (Tensor.empty(4, 4, device="NULL") + 1).schedule().src[-1].src[0]
  assert gc.isenabled()
  assert full_rewrite(kernel, CRenderer()).op is Ops.LINEAR
  assert seen == [False] and gc.isenabled()


def test_gc_paused_nests_and_leaves_a_disabled_collector_disabled() -> None:
  with gc_paused():
    with gc_paused(): assert not gc.isenabled()
    assert not gc.isenabled()
  assert gc.isenabled()
  gc.disable()
  try:
    with gc_paused(): pass
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_gc_paused_restores_the_collector_when_a_stage_raises() -> None:
  with pytest.raises(ValueError), gc_paused(): raise ValueError("stage failed")
  assert gc.isenabled()
