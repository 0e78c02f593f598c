"""Data parallelism: every rank holds the whole model and a part of the batch; the gradients are
averaged over the ranks before each optimizer step, so every rank takes the same step (the one a
single process would take on the whole batch, up to rounding).

The gradients are all-reduced in buckets of about `bucket_bytes`, filled from the last
parameter to the first (the order backward produces them): a bucket is one COLLECTIVE on the
concatenated gradients of its parameters, and depends only on them, so the scheduler may start
it as soon as they exist, before the gradients of earlier layers are computed. The optimizer's
updates read the reduced values straight from the buckets.
"""
from __future__ import annotations

from collections.abc import Iterable

from unigrad.distributed.collectives import all_reduce, broadcast
from unigrad.frontend.tensor import Tensor
from unigrad.nn.optim import Optimizer

__all__ = ["allreduce_gradients", "broadcast_parameters", "DistributedOptimizer",
           "BUCKET_BYTES"]

BUCKET_BYTES = 4 << 20


def _numel(t: Tensor) -> int:
  n = t.numel()
  if not isinstance(n, int): raise ValueError(f"data parallel needs concrete shapes, got {t.shape}")
  return n


def _buckets(params: list[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
  """The parameters that have gradients, last first, grouped by dtype into buckets of at most
  `bucket_bytes` (a larger gradient gets a bucket of its own)."""
  out: list[list[Tensor]] = []
  open_: dict[object, tuple[list[Tensor], list[int]]] = {}  # dtype -> (bucket, [bytes])
  for p in reversed(params):
    if p.grad is None: continue
    nbytes = _numel(p.grad) * p.grad.dtype.itemsize
    bucket, size = open_.get(p.grad.dtype, (None, [0]))
    if bucket is None or size[0] + nbytes > bucket_bytes:
      bucket, size = [], [0]
      out.append(bucket)
      open_[p.grad.dtype] = (bucket, size)
    bucket.append(p)
    size[0] += nbytes
  return out


def allreduce_gradients(params: Iterable[Tensor], op: str = "mean",
                        bucket_bytes: int = BUCKET_BYTES) -> None:
  """Replace each parameter's `grad` by its all-reduce over the ranks (`mean` by default: the
  gradient of the mean loss over the whole batch when each rank's loss is the mean over its
  part). Lazy: the collectives run with whatever realizes the gradients (the optimizer step)."""
  if bucket_bytes < 1: raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
  with Tensor.no_grad():
    for bucket in _buckets(list(params), bucket_bytes):
      # each gradient its own kernel: fused into the concatenation, every element of a bucket
      # recomputed its reductions (58 ms instead of 2 for the digits CNN's one-bucket step)
      grads = [p.grad.detach().contiguous().reshape(-1) for p in bucket if p.grad is not None]
      flat = grads[0].cat(*grads[1:]) if len(grads) > 1 else grads[0]
      reduced = all_reduce(flat, op)
      start = 0
      for p in bucket:
        n = _numel(p)
        p.grad = reduced[start:start + n].reshape(p.shape)
        start += n


def broadcast_parameters(params: Iterable[Tensor], root: int = 0) -> None:
  """Make every rank's parameters (and buffers) equal to rank `root`'s, in place."""
  ps = list(params)
  with Tensor.no_grad():
    for p in ps: p.assign(broadcast(p.detach(), root))
  Tensor.realize_all(*ps)


class DistributedOptimizer:
  """An optimizer whose step first averages the gradients over the ranks (data parallelism):
  `opt = DistributedOptimizer(nn.optim.Adam(params))`, then `loss.backward(); opt.step()` (or
  `Tensor.realize_all(loss, *opt.schedule_step())` inside a TinyJit step) as with the wrapped
  one. `bucket_bytes` sizes the all-reduce buckets."""

  def __init__(self, optimizer: Optimizer, bucket_bytes: int = BUCKET_BYTES,
               op: str = "mean") -> None:
    if not isinstance(optimizer, Optimizer):
      raise TypeError(f"DistributedOptimizer wraps an Optimizer, got {type(optimizer).__name__}")
    self.optimizer, self.bucket_bytes, self.op = optimizer, bucket_bytes, op

  @property
  def params(self) -> list[Tensor]: return self.optimizer.params

  def zero_grad(self) -> None: self.optimizer.zero_grad()

  def schedule_step(self) -> list[Tensor]:
    """All-reduce the gradients, then the wrapped optimizer's lazy step."""
    allreduce_gradients(self.optimizer.params, self.op, self.bucket_bytes)
    return self.optimizer.schedule_step()

  def step(self) -> None: Tensor.realize_all(*self.schedule_step())
