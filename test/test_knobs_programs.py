"""The knobs tinygrad and PyTorch programs set: TRAINING, DEFAULT_FLOAT/DEFAULT_INT,
EMULATED_DTYPES, IGNORE_BEAM_CACHE, CHECK_OOB, JIT (issue 15)."""
import numpy as np
import pytest

from unigrad import Context, Tensor, dtypes
from unigrad.codegen.opt import search
from unigrad.knobs import KNOBS


def test_program_knobs_are_declared() -> None:
  for name in ("TRAINING", "DEFAULT_FLOAT", "DEFAULT_INT", "EMULATED_DTYPES", "CHECK_OOB",
               "IGNORE_BEAM_CACHE", "JIT"):
    assert name in KNOBS


def test_unknown_knob_raises_naming_known_ones() -> None:
  with pytest.raises(ValueError, match="TRAINING"): Context(NOT_A_KNOB=1)


def test_training_knob_is_tensor_training() -> None:
  assert not Tensor.training
  with Context(TRAINING=1):
    assert Tensor.training and Tensor([1.0]).training
    x = Tensor.ones(1000)
    assert (x.dropout(0.5).numpy() == 0).any()  # dropout is on
  assert not Tensor.training
  with Tensor.train():
    assert KNOBS["TRAINING"].value is True
    with Tensor.train(False): assert not KNOBS["TRAINING"].value
  assert not KNOBS["TRAINING"].value
  assert Tensor.ones(10).dropout(0.5).numpy().tolist() == [1.0] * 10  # eval: identity


def test_default_float_knob_like_set_default_dtype() -> None:
  with Context(DEFAULT_FLOAT="HALF"):
    assert dtypes.default_float == dtypes.float16
    assert Tensor([1.5]).dtype == dtypes.float16 and Tensor.rand(2).dtype == dtypes.float16
    assert (Tensor([1, 2]) / 2).dtype == dtypes.float16
  with Context(DEFAULT_FLOAT=dtypes.float64): assert Tensor.zeros(2).dtype == dtypes.float64
  assert Tensor([1.5]).dtype == dtypes.float32


def test_assigning_default_float_sets_the_knob() -> None:
  old = dtypes.default_float
  try:
    dtypes.default_float = dtypes.float64
    assert KNOBS["DEFAULT_FLOAT"].value == "double" and Tensor([0.1]).dtype == dtypes.float64
    np.testing.assert_equal(Tensor([0.1]).numpy(), np.array([0.1]))
  finally:
    dtypes.default_float = old


def test_default_int_knob() -> None:
  with Context(DEFAULT_INT="int32"):
    assert Tensor([1, 2]).dtype == dtypes.int32 and Tensor.arange(3).dtype == dtypes.int32
  assert Tensor([1, 2]).dtype == dtypes.int64


def test_default_dtype_rejects_wrong_kinds() -> None:
  with pytest.raises(TypeError, match="floating-point"): dtypes.default_float = dtypes.int32
  with pytest.raises(TypeError, match="integer"): dtypes.default_int = dtypes.float32
  with Context(DEFAULT_FLOAT="int8"), pytest.raises(ValueError, match="DEFAULT_FLOAT"):
    Tensor([1.0])
  with Context(DEFAULT_INT="float"), pytest.raises(ValueError, match="DEFAULT_INT"):
    Tensor([1])


def test_emulated_dtypes_knob() -> None:
  with Context(EMULATED_DTYPES="bfloat16,half"):
    assert (Tensor([1.5, 2.0]).half() * 3).tolist() == [4.5, 6.0]
  with Context(EMULATED_DTYPES="int32"), pytest.raises(ValueError, match="EMULATED_DTYPES"):
    (Tensor([1.5, 2.0]).half() * 7).realize()


def test_ignore_beam_cache_skips_the_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
  calls: list[str] = []
  monkeypatch.setattr(search, "diskcache_get", lambda table, key: calls.append(table))
  search._cached(None, "somekey")  # type: ignore[arg-type]
  assert calls == ["beam"]
  with Context(IGNORE_BEAM_CACHE=1): assert search._cached(None, "somekey") is None  # type: ignore
  assert calls == ["beam"]
