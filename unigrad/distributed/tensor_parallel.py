"""Tensor parallelism: one layer's weights split over the ranks, each rank computing its part.

A tensor sharded over ranks is the multi-process form of one sharded over devices
(`Tensor.shard(devices, axis)`, frontend/multi.py): split along `axis` into world_size() equal
chunks, rank r holding chunk r. `shard(t, axis)` takes this rank's chunk of a whole tensor.

- `ColumnParallelLinear`: the weight (out, in) sharded along its output features (axis 0): each
  rank computes its slice of the output's last axis; `gather_output` all-gathers it.
- `RowParallelLinear`: the weight sharded along its input features (axis 1): each rank
  multiplies its slice of the input (the output of a column-parallel layer needs no exchange)
  and the partial products are all-reduced; the bias is added once, after.
- `ParallelAttention`: the heads split over the ranks (q, k, v projections column-parallel,
  the output projection row-parallel): one all-reduce per attention block.

Gradients follow Megatron-LM's pairing: the input of a column-parallel layer is the same on
every rank, and its gradient is the sum of the ranks' parts (`reduce_in_backward`); the
all-reduce after a row-parallel layer passes the gradient through unchanged (a value equal on
every rank is one value). Built from a whole layer, a parallel layer computes what the whole
layer computes, and a training step takes the same step.
"""
from __future__ import annotations

from unigrad.distributed.collectives import all_gather, all_reduce, reduce_in_backward
from unigrad.distributed.mpi import group
from unigrad.frontend.tensor import Tensor
from unigrad.nn.layers import Linear

__all__ = ["shard", "ColumnParallelLinear", "RowParallelLinear", "ParallelAttention"]


def shard(t: Tensor, axis: int = 0) -> Tensor:
  """This rank's chunk of `t` split along `axis` into world_size() equal chunks (lazy)."""
  g = group()
  if t.ndim == 0: raise ValueError("cannot shard a 0-d tensor: it has no axis to split")
  ax = axis + t.ndim if axis < 0 else axis
  if not 0 <= ax < t.ndim: raise ValueError(f"shard: axis {axis} is out of range for {t.ndim}-d")
  if t.shape[ax] % g.size:
    raise ValueError(f"shard: axis {ax} of shape {t.shape} has size {t.shape[ax]}, which does not "
                     f"split evenly across {g.size} ranks")
  n = t.shape[ax] // g.size
  return t[(slice(None),) * ax + (slice(g.rank * n, (g.rank + 1) * n),)]


def _param(t: Tensor) -> Tensor:
  """A trainable tensor of its own holding `t`'s values."""
  p = t.detach().contiguous().realize()
  p.requires_grad = True
  return p


class ColumnParallelLinear:
  """y = x @ weight.T + bias with weight (out_features, in_features) sharded along axis 0: this
  rank's output features only (all of them with `gather_output`)."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True,
               gather_output: bool = False) -> None:
    self._take(Linear(in_features, out_features, bias), gather_output)

  @classmethod
  def from_linear(cls, layer: Linear, gather_output: bool = False) -> ColumnParallelLinear:
    """This rank's part of the whole `layer` (the same layer on every rank)."""
    self = cls.__new__(cls)
    self._take(layer, gather_output)
    return self

  def _take(self, layer: Linear, gather_output: bool) -> None:
    self.weight = _param(shard(layer.weight, 0))
    self.bias = None if layer.bias is None else _param(shard(layer.bias, 0))
    self.gather_output = gather_output

  def __call__(self, x: Tensor) -> Tensor:
    y = reduce_in_backward(x).linear(self.weight.T, self.bias)
    return all_gather(y, axis=-1) if self.gather_output else y


class RowParallelLinear:
  """y = x @ weight.T + bias with weight (out_features, in_features) sharded along axis 1: takes
  this rank's part of the input's last axis (the whole input with `input_is_parallel=False`),
  all-reduces the partial products, then adds the bias."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True,
               input_is_parallel: bool = True) -> None:
    self._take(Linear(in_features, out_features, bias), input_is_parallel)

  @classmethod
  def from_linear(cls, layer: Linear, input_is_parallel: bool = True) -> RowParallelLinear:
    """This rank's part of the whole `layer` (the same layer on every rank)."""
    self = cls.__new__(cls)
    self._take(layer, input_is_parallel)
    return self

  def _take(self, layer: Linear, input_is_parallel: bool) -> None:
    self.weight = _param(shard(layer.weight, 1))
    self.bias = None if layer.bias is None else _param(layer.bias)
    self.input_is_parallel = input_is_parallel

  def __call__(self, x: Tensor) -> Tensor:
    if not self.input_is_parallel: x = shard(reduce_in_backward(x), -1)
    y = all_reduce(x.linear(self.weight.T))
    return y if self.bias is None else y + self.bias


class ParallelAttention:
  """Multi-head self-attention with the heads split over the ranks: rank r runs heads
  r*h/n .. (r+1)*h/n (n_heads must divide by world_size())."""

  def __init__(self, dim: int, n_heads: int, bias: bool = True) -> None:
    wq, wk, wv, wo = (Linear(dim, dim, bias) for _ in range(4))
    self._take(wq, wk, wv, wo, n_heads)

  @classmethod
  def from_linears(cls, wq: Linear, wk: Linear, wv: Linear, wo: Linear,
                   n_heads: int) -> ParallelAttention:
    """This rank's heads of the attention whose projections are the whole layers given."""
    self = cls.__new__(cls)
    self._take(wq, wk, wv, wo, n_heads)
    return self

  def _take(self, wq: Linear, wk: Linear, wv: Linear, wo: Linear, n_heads: int) -> None:
    size = group().size
    if n_heads % size:
      raise ValueError(f"ParallelAttention: {n_heads} heads do not split across {size} ranks")
    self.n_heads, self.local_heads = n_heads, n_heads // size
    self.head_dim = wq.weight.shape[0] // n_heads
    self.wq, self.wk, self.wv = (ColumnParallelLinear.from_linear(w) for w in (wq, wk, wv))
    self.wo = RowParallelLinear.from_linear(wo)

  def __call__(self, x: Tensor, is_causal: bool = False) -> Tensor:
    """x (batch, time, dim) -> (batch, time, dim), the same on every rank."""
    b, t = x.shape[0], x.shape[1]
    q, k, v = (w(x).reshape(b, t, self.local_heads, self.head_dim).transpose(1, 2)
               for w in (self.wq, self.wk, self.wv))
    o = q.scaled_dot_product_attention(k, v, is_causal=is_causal)
    return self.wo(o.transpose(1, 2).reshape(b, t, self.local_heads * self.head_dim))

