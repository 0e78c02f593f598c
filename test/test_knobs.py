"""knobs.py: declaration, environment parsing, Context overrides, the listing."""
import io

import pytest

from unigrad import knobs
from unigrad.knobs import DEBUG, KNOBS, Context, Knob, getenv


def fresh(name: str, kind: type, default: object) -> Knob:
  """An undeclared knob (not in KNOBS), so tests never disturb the real ones."""
  return Knob(name, kind, default, "test knob")


def test_every_knob_declared_once_with_help() -> None:
  assert all(k.name == name and k.help for name, k in KNOBS.items())
  for name in ("DEBUG", "SPEC", "DEV", "CC", "BEAM", "NOOPT", "REWRITE_STACK_LIMIT"):
    assert name in KNOBS
  assert all(isinstance(k.default, k.kind) for k in KNOBS.values())


def test_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
  k = fresh("UNIGRAD_TEST_INT", int, 3)
  assert k.value == 3
  monkeypatch.setenv("UNIGRAD_TEST_INT", "7")
  assert k.value == 3  # read once, on first use
  k2 = fresh("UNIGRAD_TEST_INT", int, 3)
  assert k2.value == 7 and int(k2) == 7 and k2 == 7 and k2 > 6 and k2 >= 7 and k2 < 8 and k2 <= 7


@pytest.mark.parametrize("raw,want", [("1", True), ("0", False), ("", False), ("false", False),
                                      ("no", False), ("yes", True), (" FALSE ", False)])
def test_bool_parsing(monkeypatch: pytest.MonkeyPatch, raw: str, want: bool) -> None:
  monkeypatch.setenv("UNIGRAD_TEST_BOOL", raw)
  assert fresh("UNIGRAD_TEST_BOOL", bool, True).value is want


def test_bad_env_value(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("UNIGRAD_TEST_INT", "abc")
  k = fresh("UNIGRAD_TEST_INT", int, 0)
  with pytest.raises(ValueError, match="UNIGRAD_TEST_INT"): _ = k.value


def test_knob_compares_like_value() -> None:
  k = fresh("X", int, 2)
  assert bool(k) and str(k) == "2" and [10, 20, 30][k] == 30 and hash(k) == hash("X")
  assert not fresh("Y", int, 0)


def test_context_overrides_and_restores() -> None:
  before = DEBUG.value
  with Context(DEBUG=4) as ctx:
    assert DEBUG.value == 4 and DEBUG >= 4 and isinstance(ctx, Context)
    with Context(DEBUG="5"):  # converted with the knob's type
      assert DEBUG.value == 5
    assert DEBUG.value == 4
  assert DEBUG.value == before


def test_context_restores_after_exception() -> None:
  before = DEBUG.value
  with pytest.raises(RuntimeError), Context(DEBUG=3):
    raise RuntimeError("boom")
  assert DEBUG.value == before


def test_context_decorator() -> None:
  before = DEBUG.value

  @Context(DEBUG=2)
  def inner() -> int: return DEBUG.value
  assert inner() == 2 and inner() == 2 and DEBUG.value == before


def test_context_unknown_knob() -> None:
  with pytest.raises(ValueError, match="unknown knob"): Context(NOT_A_KNOB=1)


def test_getenv(monkeypatch: pytest.MonkeyPatch) -> None:
  assert getenv("DEBUG") == DEBUG.value
  assert getenv("UNIGRAD_UNDECLARED", 5) == 5
  monkeypatch.setenv("UNIGRAD_UNDECLARED", "9")
  assert getenv("UNIGRAD_UNDECLARED", 5) == 9
  assert getenv("UNIGRAD_UNDECLARED", "s") == "9"


def test_listing_names_every_knob() -> None:
  out = io.StringIO()
  knobs.main(out)
  text = out.getvalue()
  assert all(name in text for name in KNOBS) and len(text.splitlines()) == len(KNOBS)
