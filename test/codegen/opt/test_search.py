"""BEAM search logic with a deterministic timer: it searches from the unoptimized kernel as well as
from the heuristic's, finds better kernels, never returns one slower than the heuristic's,
honours the budget and caches its choice on disk; on the CPU the chosen kernel computes the same
as numpy."""
import math
import time

import numpy as np
import pytest

from unigrad import Context, Tensor
from unigrad.codegen.opt import Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.opt.search import (FunctionTimer, actions, beam_search, extend,
                                         tile_floor, tiles)
from unigrad.codegen import pipeline
from unigrad.codegen.pipeline import CODEGEN_STAGES, make_timer
from unigrad.engine.programs import renderer_for
from unigrad.runtime.ops_cpu import find_c_compiler

needs_cc = pytest.mark.skipif(find_c_compiler() is None, reason="no C compiler")


def matmul_kernel(n: int = 16) -> OptKernel:
  return OptKernel((Tensor.empty(n, n) @ Tensor.empty(n, n)).schedule().src[0].src[0])


def tile_timer(k: OptKernel) -> float:
  """Pretend time: bigger register tiles are faster, threads halve the time."""
  tile = math.prod(s for t, s in zip(k.axis_types(), k.sizes) if t.letter in "urG")
  threads = 2 if any(t.letter == "t" for t in k.axis_types()) else 1
  return 100.0 / (min(tile, 64) * threads) + 0.01 * len(k.applied)


def fails(k: OptKernel) -> float: raise AssertionError("timed again")


def test_actions_only_name_axes_that_exist():
  k = matmul_kernel()
  assert all(a.axis is not None and a.axis < len(k.axes) for a in actions(k, 2))


def acc_lanes(k: OptKernel) -> int:
  return math.prod(s for t, s in zip(k.axis_types(), k.sizes) if t.letter in "uG")


def test_tile_floor_asks_matmuls_for_a_register_tile():
  assert tile_floor(matmul_kernel(64), 0) == 4 * 4  # 4 registers of 4 float lanes
  assert tile_floor(matmul_kernel(64), 64) == 4 * 16
  odd = OptKernel((Tensor.empty(12, 32) @ Tensor.empty(32, 12)).schedule().src[0].src[0])
  assert tile_floor(odd, 64) == 4 * 4  # as much as 12 = 4 * 3 allows
  assert tile_floor(matmul_kernel(12), 64) == 1  # too short a reduce
  assert tile_floor(OptKernel(Tensor.empty(64, 64).sum(1).schedule().src[0].src[0]), 64) == 1


def test_tiles_are_built_from_scratch_on_a_matmul():
  k = matmul_kernel(256)
  built = tiles(k, 2, 0, tile_floor(k, 0))
  assert built, "a 256x256 matmul has register tiles"
  for t in built:
    letters = [a.letter for a in t.axis_types()]
    assert letters.count("u") == 2 and letters.count("t") == 1, t.name()
    assert 16 <= acc_lanes(t) <= 32 * 4
  assert tiles(built[0], 2, 0, 16) == [], "a kernel with a tile gets no second one"


def test_extend_prunes_untiled_candidates_of_a_matmul():
  k = matmul_kernel(64)
  out = extend(k, 2, 0, tile_floor(k, 0))
  assert out and min(acc_lanes(c) for c in out) >= 4 * 4
  assert min(acc_lanes(c) for c in extend(k, 2, 0)) < 4 * 4, "a floor of 1 prunes no small tile"


def test_beam_finds_a_faster_kernel_than_the_heuristic(tmp_path):
  k = matmul_kernel()
  with Context(CACHEDIR=str(tmp_path), BEAM_BUDGET=30):
    best = beam_search(k, k, 2, FunctionTimer(tile_timer), threads=2, key="t1")
  assert tile_timer(best) < tile_timer(k) / 8


def test_beam_starts_from_the_unoptimized_kernel_too(tmp_path):
  k = matmul_kernel()
  heuristic = k.apply(Opt.upcast(1, 2))
  timed = []
  with Context(CACHEDIR=str(tmp_path)):
    beam_search(k, heuristic, 2, FunctionTimer(lambda c: timed.append(c) or tile_timer(c)),
                threads=2, key="t5")
  assert timed[0] is heuristic, "the heuristic's kernel is timed first"
  n = len(heuristic.applied)
  assert any(c.applied[:n] != heuristic.applied for c in timed), "no candidate from scratch"


def test_beam_never_returns_a_kernel_slower_than_the_heuristic(tmp_path):
  k = matmul_kernel()
  heuristic = k.apply(Opt.upcast(1, 4))
  slower_than_heuristic = lambda c: 1.0 if c.applied == heuristic.applied else 2.0  # noqa: E731
  with Context(CACHEDIR=str(tmp_path)):
    chosen = beam_search(k, heuristic, 2, FunctionTimer(slower_than_heuristic), threads=2, key="t2")
  assert chosen is heuristic


def test_a_candidate_fast_only_once_loses_the_final_retiming(tmp_path):
  k = matmul_kernel()
  heuristic = k.apply(Opt.upcast(1, 4))
  seen: set = set()

  def noisy(c: OptKernel) -> float:
    if c.applied == heuristic.applied: return 1.0
    first = c.ast not in seen
    seen.add(c.ast)
    return 0.5 if first else 3.0  # fast on its first run only: noise

  with Context(CACHEDIR=str(tmp_path)):
    assert beam_search(k, heuristic, 2, FunctionTimer(noisy), threads=2, key="t6") is heuristic


def test_beam_honours_the_time_budget(tmp_path):
  k = matmul_kernel()
  calls = []

  def slow(c: OptKernel) -> float:
    calls.append(c)
    time.sleep(0.01)
    return tile_timer(c)

  start = time.perf_counter()
  with Context(CACHEDIR=str(tmp_path), BEAM_BUDGET=0.3):
    beam_search(k, k, 4, FunctionTimer(slow), threads=2, key="t3")
  assert time.perf_counter() - start < 0.3 + 0.2
  assert len(calls) > 1, "the search timed candidates within the budget"


def test_beam_with_no_budget_returns_the_heuristic_untimed(tmp_path):
  k = matmul_kernel()
  heuristic = k.apply(Opt.upcast(1, 4))
  with Context(CACHEDIR=str(tmp_path), BEAM_BUDGET=0):
    assert beam_search(k, heuristic, 2, FunctionTimer(fails), threads=2, key="t7") is heuristic


def test_beam_choice_is_cached_on_disk(tmp_path):
  k = matmul_kernel()
  with Context(CACHEDIR=str(tmp_path)):
    first = beam_search(k, k, 2, FunctionTimer(tile_timer), threads=2, key="t4")
    second = beam_search(k, k, 2, FunctionTimer(fails), threads=2, key="t4")
  assert second.applied == first.applied and second.ast is first.ast


def test_cachelevel_0_searches_again(tmp_path):
  k = matmul_kernel()
  with Context(CACHEDIR=str(tmp_path), CACHELEVEL=0):
    beam_search(k, k, 2, FunctionTimer(tile_timer), threads=2, key="t8")
    with pytest.raises(AssertionError, match="timed again"):
      beam_search(k, k, 2, FunctionTimer(fails), threads=2, key="t8")


@needs_cc
def test_beam_choice_on_cpu_equals_numpy(tmp_path):
  """The real timer: compiles candidates in parallel, times them; the winner computes a @ b."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((24, 40), np.float32), rng.standard_normal((40, 56), np.float32)
  ren = renderer_for("CPU")
  sched = (Tensor.empty(24, 40, device="CPU") @ Tensor.empty(40, 56, device="CPU")).schedule()
  k = OptKernel(CODEGEN_STAGES[0].run(sched.src[0].src[0], ren))
  timer = make_timer(k.ast, ren)
  timer.bufs[1].copyin(a.tobytes())
  timer.bufs[2].copyin(b.tobytes())
  with Context(CACHEDIR=str(tmp_path), CACHELEVEL=0, BEAM_BUDGET=3):
    best = beam_search(k, k, 2, timer, threads=2, vector_bytes=ren.vector_bytes)
  assert best.applied, "some opts beat the unoptimized kernel"
  assert timer.time(best, 1, math.inf) < math.inf
  out = np.frombuffer(timer.bufs[0].copyout(), np.float32).reshape(24, 56)
  np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@needs_cc
def test_beam_through_realize_equals_numpy(tmp_path):
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((20, 36), np.float32), rng.standard_normal((36, 44), np.float32)
  with Context(CACHEDIR=str(tmp_path), BEAM=2, BEAM_BUDGET=2):
    out = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
  np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@needs_cc
def test_beam_searches_a_kernel_already_compiled_with_the_heuristics(tmp_path, monkeypatch):
  """Regression: compiled programs were cached per (kernel, device), so BEAM=2 on a kernel that
  had run before reused the heuristics' program and never searched."""
  searched = []
  real = pipeline.beam_search

  def spy(*args, **kwargs):
    searched.append(args)
    return real(*args, **kwargs)
  monkeypatch.setattr(pipeline, "beam_search", spy)
  rng = np.random.default_rng(2)
  a, b = rng.standard_normal((12, 28), np.float32), rng.standard_normal((28, 20), np.float32)
  ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
  np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  assert not searched
  with Context(CACHEDIR=str(tmp_path), BEAM=2, BEAM_BUDGET=2):
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  assert searched
