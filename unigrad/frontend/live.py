"""The registry of every live Tensor (realizing, functions, TinyJit and backward read it)."""
from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


class LiveTensors:
  """Every live Tensor, held weakly (realizing points them at the buffers now holding their
  values). A dict of weak references whose callback is the dict's own `__delitem__`: adding a
  tensor and dropping a dead one run no Python code (a WeakSet's did, for each of the thousands
  of tensors an eager forward makes). Dict operations are atomic, so threads need no lock."""

  def __init__(self) -> None:
    self._refs: dict[weakref.ref, None] = {}
    self._drop = self._refs.__delitem__
    # how many times a registered tensor got a new node (Tensor.__setattr__), realizes aside
    # (they only point values at the buffers holding them): see since_mark
    self.rebinds = 0
    self._mark: weakref.ref | None = None

  def add(self, t: Tensor) -> None: self._refs[weakref.ref(t, self._drop)] = None

  def alive(self) -> list[Tensor]:
    """The live tensors, in a list of their own."""
    return [t for r in list(self._refs) if (t := r()) is not None]

  def since_mark(self) -> list[Tensor] | None:
    """The live tensors added since the last call (None on the first: no mark yet), and a new
    mark. The mark is a dead weak reference among the registry's keys (alive() skips it); the
    new one goes in before the keys are read, so a tensor another thread adds meanwhile is
    after it, and in the next call's answer."""
    old, self._mark = self._mark, _dead_ref()
    self._refs[self._mark] = None
    keys = list(self._refs)
    if old is not None: self._refs.pop(old, None)
    if old is None: return None
    new = []  # the keys between the two marks, walked back from the end (where they are)
    for r in reversed(keys):
      if r is old: break
      if (t := r()) is not None: new.append(t)
    return new[::-1]

  def __iter__(self) -> Iterator[Tensor]: return iter(self.alive())

  def __len__(self) -> int: return len(self._refs) - (self._mark is not None)  # (the mark)


class _Gone:
  """An object only ever referenced weakly: the registry's mark (see LiveTensors.since_mark)."""


def _dead_ref() -> weakref.ref:
  """A weak reference to an object that is gone, hashed while it lived (a dead reference can
  only be hashed if it was): a dict key equal to nothing but itself."""
  obj = _Gone()
  ref = weakref.ref(obj)
  hash(ref)
  return ref


all_tensors = LiveTensors()
