"""Collectives on Tensors: each is a COLLECTIVE node of the graph, scheduled into the command
buffer as a call of its own and run by MPI on the buffers' memory (distributed/mpi.py).

Every rank of the group must call the same collectives in the same order with the same shapes
and dtypes (a header check turns a disagreement into `CollectiveError` on every rank). The
results are lazy like any Tensor op, except `send` and `recv`, which run when called (as
PyTorch's do): a recv's data is there when it returns.
"""
from __future__ import annotations

from unigrad.distributed.mpi import CollectiveError, group
from unigrad.dtype import dtypes
from unigrad.frontend.gradient import override_gradient
from unigrad.frontend.tensor import Tensor
from unigrad.uop import Ops, UOp
from unigrad.uop.ops import CollectiveArg

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv",
           "reduce_in_backward", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "max", "min", "mean")


def _collective(x: Tensor, kind: str, reduce: str | None = None, peer: int = -1,
                tag: int = 0) -> Tensor:
  """COLLECTIVE(x) for this process's group."""
  g = group()
  if not isinstance(x, Tensor): raise TypeError(f"{kind} takes a Tensor, got {type(x).__name__}")
  if isinstance(x.device, tuple):
    raise CollectiveError(f"{kind} takes a tensor on one device, got one on {x.device}")
  if x.ndim == 0: x = x.reshape(1)
  arg = CollectiveArg(kind, g.size, g.rank, reduce, peer, tag)
  u = UOp(Ops.COLLECTIVE, x.dtype, (x.uop,), arg)
  return Tensor._from_uop(u, x.device, x.requires_grad)


def _check_peer(kind: str, peer: int, what: str) -> int:
  size = group().size
  if not isinstance(peer, int) or not 0 <= peer < size:
    raise ValueError(f"{kind}: {what} must be a rank in [0, {size}), got {peer!r}")
  return peer


def _along(x: Tensor, axis: int, kind: str) -> tuple[Tensor, int]:
  """x with `axis` moved to the front (collectives join and split axis 0)."""
  if x.ndim == 0: raise ValueError(f"{kind} needs a tensor with at least one axis")
  ax = axis + x.ndim if axis < 0 else axis
  if not 0 <= ax < x.ndim: raise ValueError(f"{kind}: axis {axis} is out of range for {x.ndim}-d")
  return (x if ax == 0 else x.transpose(0, ax)), ax


def all_reduce(x: Tensor, op: str = "sum") -> Tensor:
  """Every rank's `x` combined by `op` (sum, max, min or mean), on every rank.
  `all_reduce(Tensor([rank() + 1.0]))` is [3.0] on both of 2 ranks."""
  if op not in REDUCE_OPS:
    raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
  if op == "mean":
    if not dtypes.is_float(x.dtype):
      raise CollectiveError(f"all_reduce(mean) of {x.dtype.name}: a mean needs a float tensor")
    return _collective(x, "all_reduce", "sum").reshape(x.shape) / group().size
  return _collective(x, "all_reduce", op).reshape(x.shape)


def all_gather(x: Tensor, axis: int = 0) -> Tensor:
  """The ranks' `x` joined along `axis` in rank order (rank r's part at r*n .. (r+1)*n)."""
  y, ax = _along(x, axis, "all_gather")
  out = _collective(y.contiguous(), "all_gather")
  return out if ax == 0 else out.transpose(0, ax)


def reduce_scatter(x: Tensor, op: str = "sum", axis: int = 0) -> Tensor:
  """The ranks' `x` combined by `op`, then split along `axis` in world_size() parts: rank r keeps
  part r (the axis must divide evenly)."""
  if op not in REDUCE_OPS: raise ValueError(f"reduce_scatter: op must be one of {REDUCE_OPS}")
  y, ax = _along(x, axis, "reduce_scatter")
  n = group().size
  if y.shape[0] % n:
    raise ValueError(f"reduce_scatter: axis {axis} of size {y.shape[0]} does not split into {n}")
  out = _collective(y.contiguous(), "reduce_scatter", "sum" if op == "mean" else op)
  if op == "mean": out = out / n
  return out if ax == 0 else out.transpose(0, ax)


def broadcast(x: Tensor, root: int = 0) -> Tensor:
  """Rank `root`'s `x` on every rank (the others' `x` give only the shape and dtype)."""
  _check_peer("broadcast", root, "root")
  return _collective(x, "broadcast", peer=root).reshape(x.shape)


def send(x: Tensor, dst: int, tag: int = 0) -> None:
  """Send `x` to rank `dst` (returns once MPI holds or delivered the data)."""
  if _check_peer("send", dst, "dst") == group().rank: raise ValueError("send: dst is this rank")
  _collective(x, "send", peer=dst, tag=tag).realize()


def recv(like: Tensor, src: int, tag: int = 0) -> Tensor:
  """The tensor rank `src` sends, shaped and typed like `like` (whose values are not read)."""
  if _check_peer("recv", src, "src") == group().rank: raise ValueError("recv: src is this rank")
  return _collective(like.detach(), "recv", peer=src, tag=tag).reshape(like.shape).realize()


def reduce_in_backward(x: Tensor) -> Tensor:
  """`x` unchanged, but its gradient is summed over the ranks (Megatron's `f`): the input of a
  tensor-parallel block is the same on every rank, and each rank's part of the block
  contributes part of its gradient."""
  y = x.contiguous_backward()
  arg = CollectiveArg("all_reduce", group().size, group().rank, "sum")
  override_gradient(y.uop, x.uop, lambda g: UOp(Ops.COLLECTIVE, g.dtype, (g,), arg))
  return y
