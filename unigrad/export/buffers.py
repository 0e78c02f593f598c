"""Buffers: seed 003's four buffer categories and what an export plan records of each buffer."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unigrad.dtype import DType

__all__ = ["Category", "Slot"]


class Category(Enum):
  """Seed 003's buffer categories."""
  INPUT = "input"
  OUTPUT = "output"
  CONSTANT = "constant"
  INTERMEDIATE = "intermediate"


@dataclass(frozen=True)
class Slot:
  """One buffer of the schedule: its category, the index within it (input 0, constant 3...),
  element count and dtype; for an intermediate, its element offset in its dtype's scratch."""
  category: Category
  index: int
  size: int
  dtype: DType
  offset: int = 0
