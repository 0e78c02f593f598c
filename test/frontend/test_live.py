"""frontend/live.py: the registry of live tensors, and its mark (what a TinyJit replay looks at)."""
import gc

from unigrad import Tensor
from unigrad.frontend.live import LiveTensors


def test_since_mark_gives_the_tensors_added_since_the_last_call_and_alive_skips_the_mark():
  reg = LiveTensors()
  a, b = Tensor([1.0]), Tensor([2.0])
  reg.add(a)
  assert reg.since_mark() is None  # no mark before the first call
  reg.add(b)
  c = Tensor([3.0])
  reg.add(c)
  del c
  gc.collect()
  assert [id(t) for t in reg.since_mark()] == [id(b)]  # c died: the live ones, in order
  assert reg.since_mark() == []
  assert [id(t) for t in reg.alive()] == [id(a), id(b)] and len(reg) == 2
