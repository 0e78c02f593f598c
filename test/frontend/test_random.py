"""Random numbers: THREEFRY streams (reference bits, reproducibility, devices, caches) and the
statistics of every distribution. Statistical checks run on the default device with fixed seeds
(deterministic), at about 5 sigma or a KS level near 0.001."""
import math

import numpy as np
import pytest

from unigrad.dtype import dtypes
from unigrad.engine import entry
from unigrad.frontend import random
from unigrad.frontend.tensor import Tensor
from unigrad.runtime.device import Device
from unigrad.uop.alu import threefry2x32

DEV = Device.DEFAULT
N = 2000 if DEV.startswith("PYTHON") else 100_000  # the PYTHON interpreter is slow


def has_cpu() -> bool:
  try: Device["CPU"]
  except Exception: return False
  return True


def ks_statistic(x: np.ndarray, cdf) -> float:
  """Kolmogorov-Smirnov distance between the sample and a CDF."""
  x = np.sort(x.astype(np.float64))
  f = cdf(x)
  n = len(x)
  return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


def ks_limit(n: int) -> float: return 1.95 / math.sqrt(n)  # alpha ~ 0.001


def normal_cdf(x: np.ndarray) -> np.ndarray:
  """Abramowitz-Stegun 7.1.26 (error below 2e-7), vectorized."""
  z = np.abs(x) / math.sqrt(2)
  t = 1 / (1 + 0.3275911 * z)
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                + t * 1.061405429))))
  erf = 1 - poly * np.exp(-z * z)
  return 0.5 * (1 + np.sign(x) * erf)


# ---- the stream: reference bits, counters, seeds ----

def test_rand_matches_threefry_reference():
  Tensor.manual_seed(7)
  a, b = Tensor.rand(3, 4, device="PYTHON").numpy(), Tensor.rand(5, device="PYTHON").numpy()
  words = [threefry2x32(i, 7) >> 32 for i in range(17)]  # counters 0..11, then 12..16
  ref = np.array([(w >> 9) | 0x3F800000 for w in words], np.uint32).view(np.float32) - 1
  np.testing.assert_array_equal(a, ref[:12].reshape(3, 4))
  np.testing.assert_array_equal(b, ref[12:])


def test_rand_float64_reference():
  Tensor.manual_seed(3)
  a = Tensor.rand(4, dtype=dtypes.float64, device="PYTHON").numpy()
  bits = np.array([(threefry2x32(i, 3) >> 12) | 0x3FF0000000000000 for i in range(4)], np.uint64)
  np.testing.assert_array_equal(a, bits.view(np.float64) - 1)


def test_same_seed_reproduces_and_calls_differ():
  Tensor.manual_seed(123)
  a1, a2 = Tensor.rand(64, device=DEV).numpy(), Tensor.randn(64, device=DEV).numpy()
  Tensor.manual_seed(123)
  b1, b2 = Tensor.rand(64, device=DEV).numpy(), Tensor.randn(64, device=DEV).numpy()
  np.testing.assert_array_equal(a1, b1)
  np.testing.assert_array_equal(a2, b2)
  assert not np.array_equal(a1, Tensor.rand(64, device=DEV).numpy())


def test_different_seeds_differ():
  outs = []
  for seed in (0, 1, 2**40 + 5):
    Tensor.manual_seed(seed)
    outs.append(Tensor.rand(32, device=DEV).numpy())
  assert all(not np.array_equal(outs[i], outs[j]) for i in range(3) for j in range(i))


def test_counters_are_per_device():
  Tensor.manual_seed(9)
  a = Tensor.rand(6, device="PYTHON").numpy()
  Tensor.manual_seed(9)
  Tensor.rand(100, device="NULL")  # another device's stream: the PYTHON counter does not move
  np.testing.assert_array_equal(Tensor.rand(6, device="PYTHON").numpy(), a)


@pytest.mark.skipif(not has_cpu(), reason="no C compiler for the CPU device")
def test_cpu_and_python_agree():
  def draw(dev: str) -> list[np.ndarray]:
    Tensor.manual_seed(2024)
    outs = [Tensor.rand(3, 5, device=dev), Tensor.randint(-5, 9, (7,), device=dev),
            Tensor.randperm(9, device=dev), Tensor.rand(4, dtype=dtypes.float64, device=dev),
            Tensor.randn(6, device=dev)]
    return [t.numpy() for t in outs]
  cpu, py = draw("CPU"), draw("PYTHON")
  for c, p in zip(cpu[:4], py[:4]): np.testing.assert_array_equal(c, p)
  np.testing.assert_allclose(cpu[4], py[4], rtol=1e-5, atol=1e-6)  # log/cos may differ by an ulp


def test_repeated_calls_hit_the_schedule_cache():
  Tensor.rand(4, 4, device="PYTHON").realize()
  before = len(entry.schedule_cache)
  x, y = Tensor.rand(4, 4, device="PYTHON"), Tensor.rand(4, 4, device="PYTHON")
  assert x.schedule().src[0].src[0] is y.schedule().src[0].src[0]  # one kernel AST
  x.realize(), y.realize()
  assert len(entry.schedule_cache) == before
  assert not np.array_equal(x.numpy(), y.numpy())


# ---- shapes, dtypes, arguments ----

def test_shapes_and_dtypes():
  assert Tensor.rand(2, 3, device="PYTHON").shape == (2, 3)
  assert Tensor.rand((2, 3), device="PYTHON").dtype == dtypes.float32
  assert Tensor.rand(device="PYTHON").shape == ()
  assert Tensor.rand(0, 3, device="PYTHON").numpy().shape == (0, 3)
  assert Tensor.randn(5, dtype=dtypes.float64, device="PYTHON").dtype == dtypes.float64
  assert Tensor.randint(10, shape=3, device="PYTHON").dtype == dtypes.default_int
  assert Tensor.rand(2, requires_grad=True, device="PYTHON").requires_grad
  t = Tensor.zeros(2, 3, dtype=dtypes.float16, device="PYTHON")
  assert t.rand_like().dtype == dtypes.float16 and t.rand_like().shape == (2, 3)
  assert t.randn_like(dtype=dtypes.float32).dtype == dtypes.float32
  assert Tensor.zeros(4, dtype=dtypes.int32, device="PYTHON").rand_like().dtype == dtypes.float32


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64])
def test_rand_low_and_high_precision_in_range(dt):
  Tensor.manual_seed(5)
  x = Tensor.rand(256, dtype=dt, device=DEV).numpy().astype(np.float64)
  assert x.min() >= 0 and x.max() < 1 and len(np.unique(x)) > 50


def test_argument_errors():
  with pytest.raises(TypeError): Tensor.rand(3, dtype=dtypes.int32)
  with pytest.raises(ValueError): Tensor.randint(5, 5, (2,))
  with pytest.raises(ValueError): Tensor.rand(-1)
  with pytest.raises(ValueError): Tensor.randperm(-1)
  with pytest.raises(ValueError): Tensor([1.0, 2.0]).multinomial(3, replacement=False)
  with pytest.raises(ValueError): Tensor.ones(2, 2, 2).multinomial(1)
  with pytest.raises(ValueError): Tensor.ones(3).dropout(1.5)


# ---- statistics ----

def test_uniform_statistics():
  Tensor.manual_seed(11)
  x = Tensor.rand(N, device=DEV).numpy()
  assert x.min() >= 0 and x.max() < 1
  sd = math.sqrt(1 / 12 / N)
  assert abs(x.mean() - 0.5) < 5 * sd
  assert abs(x.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / N)
  assert ks_statistic(x, lambda v: np.clip(v, 0, 1)) < ks_limit(N)


def test_uniform_low_high():
  Tensor.manual_seed(12)
  x = Tensor.uniform(-3.0, 5.0, (N,), device=DEV).numpy()
  assert x.min() >= -3 and x.max() < 5
  assert abs(x.mean() - 1.0) < 5 * 8 * math.sqrt(1 / 12 / N)


def test_normal_statistics():
  Tensor.manual_seed(13)
  x = Tensor.randn(N, device=DEV).numpy()
  assert np.isfinite(x).all()
  assert abs(x.mean()) < 5 / math.sqrt(N)
  assert abs(x.var() - 1) < 5 * math.sqrt(2 / N)
  assert ks_statistic(x, normal_cdf) < ks_limit(N)
  y = Tensor.normal(2.0, 0.5, (N,), device=DEV).numpy()
  assert abs(y.mean() - 2) < 5 * 0.5 / math.sqrt(N) and abs(y.std() - 0.5) < 0.05


def test_randn_float64_statistics():
  Tensor.manual_seed(14)
  n = min(N, 20_000)
  x = Tensor.randn(n, dtype=dtypes.float64, device=DEV).numpy()
  assert ks_statistic(x, normal_cdf) < ks_limit(n)


def test_randint_range_and_counts():
  Tensor.manual_seed(15)
  x = Tensor.randint(-3, 7, (N,), device=DEV).numpy()
  assert x.min() == -3 and x.max() == 6
  counts = np.bincount(x + 3, minlength=10)
  expected = N / 10
  chi2 = ((counts - expected) ** 2 / expected).sum()
  assert chi2 < 33.7  # chi-square, 9 degrees of freedom, p = 0.0001


def test_randperm_is_a_permutation():
  Tensor.manual_seed(16)
  for n in (0, 1, 2, 5, 16, 17):
    p = Tensor.randperm(n, device="PYTHON").numpy()
    assert sorted(p.tolist()) == list(range(n))
  big = Tensor.randperm(1000, device=DEV).numpy()
  assert sorted(big.tolist()) == list(range(1000)) and not np.array_equal(big, np.arange(1000))
  assert not np.array_equal(big, Tensor.randperm(1000, device=DEV).numpy())


def test_randperm_looks_random():
  Tensor.manual_seed(17)
  n = 64 if DEV.startswith("PYTHON") else 1024  # the passes of randperm(1000): compiled once
  p = Tensor.randperm(n, device=DEV).numpy().astype(np.float64)
  assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 5 / math.sqrt(n - 1)  # no trend
  ascents = (np.diff(p) > 0).sum()  # Eulerian: mean (n-1)/2, variance (n+1)/12
  assert abs(ascents - (n - 1) / 2) < 5 * math.sqrt((n + 1) / 12)


def test_multinomial_with_replacement_frequencies():
  Tensor.manual_seed(18)
  w = np.array([1.0, 0.0, 3.0, 0.5, 5.5])
  x = Tensor(w, device=DEV).multinomial(min(N, 20_000), replacement=True).numpy()
  assert x.shape == (min(N, 20_000),) and 1 not in x
  freq = np.bincount(x, minlength=5) / len(x)
  assert np.abs(freq - w / w.sum()).max() < 5 * math.sqrt(0.25 / len(x))


def test_multinomial_batched_shapes():
  Tensor.manual_seed(19)
  x = Tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], device="PYTHON").multinomial(4, True).numpy()
  np.testing.assert_array_equal(x, [[1] * 4, [0] * 4])
  y = Tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 0.0, 1.0, 2.0]], device="PYTHON").multinomial(3).numpy()
  assert y.shape == (2, 3) and 1 not in y[1]
  assert all(len(set(row)) == 3 for row in y.tolist())


def test_multinomial_without_replacement_frequencies():
  Tensor.manual_seed(20)
  rows = 200 if DEV.startswith("PYTHON") else 4000
  w = np.array([1.0, 2.0, 0.0, 5.0])
  x = Tensor(np.tile(w, (rows, 1)), device=DEV).multinomial(3).numpy()
  assert all(sorted(r) == [0, 1, 3] for r in x.tolist())  # the zero weight is never drawn
  first = np.bincount(x[:, 0], minlength=4) / rows
  assert np.abs(first - w / w.sum()).max() < 5 * math.sqrt(0.25 / rows)


def test_dropout(monkeypatch):
  x = Tensor.ones(N, device=DEV)
  assert x.dropout(0.5) is x  # not training: the identity
  monkeypatch.setattr(Tensor, "training", True, raising=False)
  Tensor.manual_seed(21)
  y = x.dropout(0.25).numpy()
  assert set(np.unique(y).tolist()) <= {0.0, float(np.float32(1 / 0.75))}
  keep = (y != 0).mean()
  assert abs(keep - 0.75) < 5 * math.sqrt(0.75 * 0.25 / N)
  assert abs(y.mean() - 1) < 5 * math.sqrt(1 / 3 / N) * 1.1
  assert x.dropout(0.0) is x
  assert (x.dropout(1.0).numpy() == 0).all()


def test_initializer_bounds():
  Tensor.manual_seed(22)
  shape = (64, 32, 3, 3)
  fan_in = 32 * 9
  b = math.sqrt(3) * math.sqrt(2 / (1 + 5)) / math.sqrt(fan_in)  # a = sqrt(5)
  ku = Tensor.kaiming_uniform(*shape, device=DEV).numpy()
  assert np.abs(ku).max() <= b and np.abs(ku).max() > 0.99 * b
  assert abs(ku.std() - b / math.sqrt(3)) < 0.02 * b
  g = math.sqrt(6 / (64 + fan_in))
  gu = Tensor.glorot_uniform(*shape, device=DEV).numpy()
  assert np.abs(gu).max() <= g and np.abs(gu).max() > 0.99 * g
  su = Tensor.scaled_uniform(100, 50, device=DEV).numpy()
  assert np.abs(su).max() <= 1 / math.sqrt(5000) and abs(su.mean()) < 0.01 / math.sqrt(5000) * 100
  kn = Tensor.kaiming_normal(*shape, device=DEV).numpy()
  std = math.sqrt(2 / (1 + 0.01**2)) / math.sqrt(fan_in)
  assert abs(kn.std() - std) < 0.02 * std and abs(kn.mean()) < 0.02 * std


def test_iota_graph_is_built_once_per_size_and_the_cache_is_bounded():
  random._iota_graphs.clear()
  a, b = random._iota(Tensor, 10, "CPU"), random._iota(Tensor, 10, "CPU")
  assert a is not b and a.uop is b.uop  # one graph, two handles
  np.testing.assert_array_equal(a.numpy(), np.arange(10))
  for n in range(1, random.IOTA_CACHE_SIZE + 10): random._iota(Tensor, n, "CPU")
  assert len(random._iota_graphs) <= random.IOTA_CACHE_SIZE
  np.testing.assert_array_equal(b.numpy(), np.arange(10))  # realizing a handle spoils no graph
  np.testing.assert_array_equal(random._iota(Tensor, 10, "CPU").numpy(), np.arange(10))
