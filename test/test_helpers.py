"""helpers.py: the bounded-cache helper the in-process caches share."""
from unigrad.helpers import Timing, bounded_put, tqdm, trange


def test_bounded_put_drops_the_oldest_entry() -> None:
  cache: dict[str, int] = {}
  for i, k in enumerate("abcd"): assert bounded_put(cache, k, i, 3) == i
  assert list(cache) == ["b", "c", "d"]


def test_bounded_put_is_lru_when_hits_reinsert() -> None:
  cache = {"a": 0, "b": 1, "c": 2}
  bounded_put(cache, "a", cache.pop("a"), 3)  # a hit moves "a" to the newest end
  bounded_put(cache, "d", 3, 3)
  assert list(cache) == ["c", "a", "d"]


def test_bounded_put_trims_to_a_lowered_bound() -> None:
  cache = {k: 0 for k in "abcde"}
  bounded_put(cache, "f", 0, 2)
  assert list(cache) == ["e", "f"]


def test_tqdm_draws_on_stderr_when_not_a_terminal(capsys) -> None:
  seen = []
  for i in (t := trange(3, desc="start")):
    seen.append(i)
    t.set_description(f"loss {i}")
  assert seen == [0, 1, 2] and t.n == 3 and len(t) == 3
  out, err = capsys.readouterr()
  assert out == "" and err.endswith("\n") and "start: " in err
  last = err.rstrip("\n").split("\r")[-1]
  assert last.startswith("loss 2: 100%|") and " 3/3 [" in last
  with tqdm(total=2000, unit="B", unit_scale=True) as bar:
    bar.update(1500)
    bar.update(500)
  assert "2.00k/2.00k" in capsys.readouterr().err
  for _ in tqdm(iter([1, 2])): pass  # no length: a count
  assert "2it [" in capsys.readouterr().err
  for _ in tqdm([1], disable=True): pass
  assert capsys.readouterr().err == ""


def test_timing_takes_tinygrads_on_exit_and_enabled(capsys) -> None:
  """tinygrad's gpt2.py times each step with `Timing(prefix, on_exit=..., enabled=timing)`: it
  prints the ms and what on_exit (given the ns) returns, and nothing when not enabled."""
  with Timing("ran in ", on_exit=lambda ns: f", {'ns' if isinstance(ns, int) else '?'}") as t:
    pass
  out = capsys.readouterr().out
  assert out.startswith("ran in ") and out.endswith(" ms, ns\n") and t.elapsed >= 0
  with Timing("quiet ", enabled=False): pass

  @Timing("decorated ")
  def f() -> int: return 3
  assert f() == 3
  assert capsys.readouterr().out.startswith("decorated ")
