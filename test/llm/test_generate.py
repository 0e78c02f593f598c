"""unigrad.llm.generate without a model: `draw`, the sampler that runs on the device."""
import numpy as np
import pytest

from unigrad import Tensor, TinyJit
from unigrad.llm.generate import DRAW_BLOCK, draw


def cdf(logits: np.ndarray, temperature: float) -> np.ndarray:
  p = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
  return np.cumsum(p / p.sum())


@pytest.mark.parametrize("vocab", [5, 2 * DRAW_BLOCK, 2 * DRAW_BLOCK + 88])
def test_draw_picks_the_id_whose_cdf_interval_holds_u(vocab):
  """Inverse CDF in id order: u in the middle of id i's interval of the softmax's cumulative
  sum gives i (several blocks, a padded last block, and fewer ids than a block)."""
  rng = np.random.default_rng(vocab)
  logits, t = rng.normal(0, 2, vocab).astype(np.float32), 0.7
  c = cdf(logits, t)
  picked = []
  for i in sorted({*rng.choice(vocab, 12).tolist(), 0, vocab - 1}):
    lo = c[i - 1] if i else 0.0
    if c[i] - lo < 1e-5: continue  # a middle too close to float32's rounding of the sums
    u = (lo + c[i]) / 2
    picked.append((draw(Tensor(logits), Tensor([1 / t]), Tensor([u])).item(), i))
  assert picked and all(got == want for got, want in picked)


def test_draw_never_picks_past_the_vocabulary_at_u_near_one():
  logits = np.zeros(DRAW_BLOCK + 3, np.float32)
  assert draw(Tensor(logits), Tensor([1.0]), Tensor([0.9999999])).item() == DRAW_BLOCK + 2


def test_a_captured_draw_serves_every_temperature_and_u():
  logits = Tensor(np.array([0.0, 1.0, 2.0, 3.0], np.float32)).realize()
  step = TinyJit(lambda lg, it, u: draw(lg, it, u).realize())
  for t, u in [(1.0, 0.5), (0.5, 0.1), (2.0, 0.99), (0.25, 0.01), (1.0, 0.0)]:
    want = int(np.searchsorted(cdf(logits.numpy(), t), u, side="right"))
    assert step(logits, Tensor([1 / t]), Tensor([u])).item() == want
