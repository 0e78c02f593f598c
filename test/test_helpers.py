"""helpers.py: the bounded-cache helper the in-process caches share."""
from unigrad.helpers import bounded_put


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
