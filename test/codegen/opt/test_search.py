"""BEAM search logic with a deterministic timer: it finds better kernels, never returns one
slower than the heuristic's, honours the budget and caches its choice on disk."""
import math

from unigrad import Context, Tensor
from unigrad.codegen.opt import Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.opt.search import beam_search


def matmul_kernel() -> OptKernel:
  return OptKernel((Tensor.empty(16, 16) @ Tensor.empty(16, 16)).schedule().src[0].src[0])


def tile_timer(k: OptKernel) -> float:
  """Pretend time: bigger register tiles are faster, threads halve the time."""
  tile = math.prod(s for t, s in zip(k.axis_types(), k.sizes) if t.letter in "urG")
  threads = 2 if any(t.letter == "t" for t in k.axis_types()) else 1
  return 100.0 / (min(tile, 64) * threads) + 0.01 * len(k.applied)


def test_beam_finds_a_faster_kernel_than_the_heuristic(tmp_path):
  k = matmul_kernel()
  with Context(CACHEDIR=str(tmp_path), BEAM_BUDGET=30):
    best = beam_search(k, k, 2, tile_timer, threads=2, key="t1")
  assert tile_timer(best) < tile_timer(k) / 8


def test_beam_never_returns_a_kernel_slower_than_the_heuristic(tmp_path):
  k = matmul_kernel()
  heuristic = k.apply(Opt.upcast(1, 4))
  slower_than_heuristic = lambda c: 1.0 if c.applied == heuristic.applied else 2.0  # noqa: E731
  with Context(CACHEDIR=str(tmp_path)):
    assert beam_search(k, heuristic, 2, slower_than_heuristic, threads=2, key="t2") is heuristic


def test_beam_honours_the_time_budget(tmp_path):
  k = matmul_kernel()
  calls = []
  with Context(CACHEDIR=str(tmp_path), BEAM_BUDGET=0):
    beam_search(k, k, 4, lambda c: calls.append(c) or tile_timer(c), threads=2, key="t3")
  assert len(calls) <= 1 + 40  # the heuristic, then at most one round already in flight


def test_beam_choice_is_cached_on_disk(tmp_path):
  k = matmul_kernel()
  with Context(CACHEDIR=str(tmp_path)):
    first = beam_search(k, k, 2, tile_timer, threads=2, key="t4")
    second = beam_search(k, k, 2, lambda c: (_ for _ in ()).throw(AssertionError("timed again")),
                         threads=2, key="t4")
  assert second.applied == first.applied
