"""The inputs bench/onnx.py feeds each model (imported by its first-call child processes)."""
from __future__ import annotations

import numpy as np


def feeds(name: str, batch: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  if name == "magika": return {"bytes": rng.integers(0, 257, (batch, 2048)).astype(np.int32)}
  if name == "nudenet": return {"images": rng.random((batch, 3, 320, 320), dtype=np.float32)}
  return {"input": rng.standard_normal((batch, 512)).astype(np.float32) * 0.1,
          "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)}
