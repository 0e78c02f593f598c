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

  def add(self, t: Tensor) -> None: self._refs[weakref.ref(t, self._drop)] = None

  def alive(self) -> list[Tensor]:
    """The live tensors, in a list of their own."""
    return [t for r in list(self._refs) if (t := r()) is not None]

  def __iter__(self) -> Iterator[Tensor]: return iter(self.alive())

  def __len__(self) -> int: return len(self._refs)


all_tensors = LiveTensors()
