"""Layers: small callable objects holding parameters, with PyTorch's shapes and initialization.

Parameters are created with `requires_grad=True` (each its own buffer, never merged with an equal
one) and laid out like PyTorch (Linear.weight is (out, in), Conv2d.weight is (out, in/groups, *k)),
so `load_state_dict` reads PyTorch checkpoints directly. Running statistics are their own buffers.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from unigrad.dtype import dtypes
from unigrad.frontend.indexing import checked_index
from unigrad.frontend.tensor import Tensor
from unigrad.frontend.traced import traced
from unigrad.helpers import make_tuple, prod


def _uniform(bound: float, *shape: int) -> Tensor:
  return Tensor.uniform(-bound, bound, shape, requires_grad=True)


def _param(t: Tensor) -> Tensor: return t.contiguous().requires_grad_()


class Linear:
  """y = x @ weight.T + bias, weight (out_features, in_features)."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
    bound = 1 / math.sqrt(in_features) if in_features else 0.0
    self.weight = Tensor.kaiming_uniform(out_features, in_features, a=math.sqrt(5),
                                         requires_grad=True)
    self.bias = _uniform(bound, out_features) if bias else None

  def __call__(self, x: Tensor) -> Tensor: return _dense(x, self.weight, self.bias)


@traced
def _dense(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
  """x @ weight.T + bias (traced with the transpose: a transformer calls it six times a layer)."""
  return x.linear(weight.T, bias)


def _check_padding_string(padding: Any, stride: tuple[int, ...]) -> None:
  """PyTorch's checks at construction: 'valid' or 'same', and 'same' only with stride 1."""
  if not isinstance(padding, str): return
  if padding not in ("valid", "same"):
    raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
  if padding == "same" and any(s != 1 for s in stride):
    raise ValueError(f"padding='same' is not supported for strided convolutions (stride {stride})")


class Conv2d:
  """Convolution over len(kernel_size) spatial axes (Conv2d for 2, Conv1d for 1)."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
               stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
               dilation: int | Sequence[int] = 1, groups: int = 1, bias: bool = True,
               dims: int = 2) -> None:
    self.kernel_size = make_tuple(kernel_size, dims)
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    _check_padding_string(padding, make_tuple(stride, dims))
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} "
                       f"must be divisible by groups {groups}")
    shape = (out_channels, in_channels // groups, *self.kernel_size)
    self.weight = Tensor.kaiming_uniform(*shape, a=math.sqrt(5), requires_grad=True)
    self.bias = _uniform(1 / math.sqrt(prod(shape[1:])), out_channels) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,  # noqa: N802
           padding: int | str = 0, dilation: int = 1, groups: int = 1, bias: bool = True) -> Conv2d:
  """A 1-D convolution (a Conv2d with one spatial axis)."""
  return Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                dims=1)


class ConvTranspose2d:
  """Transposed convolution; weight (in_channels, out_channels/groups, *k) like PyTorch."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
               stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
               output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
               groups: int = 1, bias: bool = True, dims: int = 2) -> None:
    self.kernel_size = make_tuple(kernel_size, dims)
    self.stride, self.padding, self.output_padding = stride, padding, output_padding
    self.dilation, self.groups = dilation, groups
    shape = (in_channels, out_channels // groups, *self.kernel_size)
    self.weight = Tensor.kaiming_uniform(*shape, a=math.sqrt(5), requires_grad=True)
    self.bias = _uniform(1 / math.sqrt(prod(shape[1:])), out_channels) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation,
                              self.padding, self.output_padding)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,  # noqa: N802
                    padding: int = 0, output_padding: int = 0, dilation: int = 1, groups: int = 1,
                    bias: bool = True) -> ConvTranspose2d:
  return ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding, output_padding,
                         dilation, groups, bias, dims=1)


class BatchNorm:
  """Batch normalization over axis 1 (N, C, ...): batch statistics when training (updating the
  running estimates), the running estimates otherwise. The estimates are exponential moving
  averages with weight `momentum` for the new batch, or with momentum=None cumulative averages
  (weight 1/num_batches_tracked), as in PyTorch."""

  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True,
               track_running_stats: bool = True, momentum: float | None = 0.1) -> None:
    self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
    self.weight = _param(Tensor.ones(sz)) if affine else None
    self.bias = _param(Tensor.zeros(sz)) if affine else None
    # without running statistics there are none (None, as in PyTorch: not in the state dict)
    self.running_mean: Tensor | None = None
    self.running_var: Tensor | None = None
    self.num_batches_tracked: Tensor | None = None
    if not track_running_stats: return
    # buffers, never trained (an optimizer given get_parameters(model) leaves them alone)
    self.running_mean = Tensor.zeros(sz).contiguous().requires_grad_(False)
    self.running_var = Tensor.ones(sz).contiguous().requires_grad_(False)
    # 0-d like PyTorch's, so its checkpoints load (a shape (1,) counter loads too: load_state_dict)
    self.num_batches_tracked = Tensor.zeros((), dtype=dtypes.int64).contiguous() \
      .requires_grad_(False)

  def __call__(self, x: Tensor) -> Tensor:
    axes = tuple(i for i in range(x.ndim) if i != 1)
    if Tensor.training or not self.track_running_stats:
      mean = x.mean(axes)
      var = ((x - mean.reshape(1, -1, *[1] * (x.ndim - 2))) ** 2).mean(axes)
      if Tensor.training and self.track_running_stats:
        self._update(mean, var, prod(x.shape) // x.shape[1])
    else:
      assert self.running_mean is not None and self.running_var is not None
      mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

  def _update(self, mean: Tensor, var: Tensor, n: int) -> None:
    assert self.running_mean is not None and self.running_var is not None
    assert self.num_batches_tracked is not None
    unbiased = var.detach() * (n / max(n - 1, 1))
    tracked = self.num_batches_tracked + 1
    # momentum None: the cumulative average, weight 1/tracked (lazy: no read of the counter)
    m: Tensor | float = (tracked.cast(self.running_mean.dtype).reciprocal()
                         if self.momentum is None else self.momentum)
    self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
    self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
    self.num_batches_tracked.assign(tracked)


BatchNorm2d = BatchNorm


class GroupNorm:
  """Normalize over groups of channels (and the spatial axes), then a per-channel affine."""

  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
               affine: bool = True) -> None:
    if num_channels % num_groups:
      raise ValueError(f"num_channels {num_channels} must be divisible by num_groups {num_groups}")
    self.num_groups, self.eps = num_groups, eps
    self.weight = _param(Tensor.ones(num_channels)) if affine else None
    self.bias = _param(Tensor.zeros(num_channels)) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    return _channel_affine(y, self.weight, self.bias)


class InstanceNorm:
  """Normalize each channel of each sample over its spatial axes."""

  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
    self.eps = eps
    self.weight = _param(Tensor.ones(num_features)) if affine else None
    self.bias = _param(Tensor.zeros(num_features)) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    y = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
    return _channel_affine(y, self.weight, self.bias)


def _channel_affine(y: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
  shape = (1, -1, *[1] * (y.ndim - 2))
  if w is not None: y = y * w.reshape(shape)
  return y if b is None else y + b.reshape(shape)


class LayerNorm:
  """Normalize over the last len(normalized_shape) axes, then an elementwise affine."""

  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
               elementwise_affine: bool = True) -> None:
    self.normalized_shape = make_tuple(normalized_shape, 1)
    self.eps = eps
    self.weight = _param(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
    self.bias = _param(Tensor.zeros(*self.normalized_shape)) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if tuple(x.shape[-n:]) != self.normalized_shape:
      raise ValueError(f"LayerNorm over {self.normalized_shape} got input of shape {x.shape}")
    return _layer_norm(x, self.weight, self.bias, tuple(range(-n, 0)), self.eps)


@traced
def _layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, axes: tuple[int, ...],
                eps: float) -> Tensor:
  """x.layernorm(axes, eps) * weight + bias (traced: a transformer calls it twice a layer)."""
  y = x.layernorm(axes, eps)
  if weight is not None: y = y * weight
  return y if bias is None else y + bias


class LayerNorm2d(LayerNorm):
  """LayerNorm over the channel axis of (N, C, H, W)."""

  def __call__(self, x: Tensor) -> Tensor:
    return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
  """x / sqrt(mean(x^2) + eps) * weight over the last axis."""

  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
    self.eps = eps
    self.weight = _param(Tensor.ones(dim)) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    y = x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()
    return y if self.weight is None else y * self.weight


class Embedding:
  """Rows of `weight` (vocab_size, embed_size) picked by integer indices. Compiles to direct
  indexed loads: the one-hot reduction over the vocabulary is collapsed by the compiler."""

  def __init__(self, vocab_size: int, embed_size: int) -> None:
    self.vocab_size, self.embed_size = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size, requires_grad=True)

  def __call__(self, idx: Tensor) -> Tensor:
    """The rows of `weight` at `idx` (any shape): output shape (*idx.shape, embed_size).
    A realized index tensor (e.g. made from a list or numpy) is range-checked here, by the
    indexing checks of Tensor, and an index outside [0, vocab_size) raises IndexError as in
    PyTorch; a lazy (unrealized) index is not checked, as in Tensor indexing: its
    out-of-range indices read zero rows."""
    if dtypes.is_float(idx.dtype): raise IndexError("Embedding indices must be an integer tensor")
    try:
      checked_index(idx, self.vocab_size, 0, wrap=False, err=IndexError)
    except IndexError as e:
      raise IndexError(f"Embedding({self.vocab_size}, {self.embed_size}): index out of range in "
                       f"self: {e}") from None
    return embedding(idx, self.weight)


@traced
def embedding(idx: Tensor, weight: Tensor) -> Tensor:
  """The rows of `weight` at `idx` as a one-hot reduction that the compiler turns into direct
  indexed loads (traced: about ten nodes a call). Indices are not checked: one outside
  [0, rows) reads a zero row (`Embedding` checks realized indices first)."""
  vocab = Tensor.arange(weight.shape[0], device=idx.device).reshape(weight.shape[0], 1)
  return vocab.eq(idx.reshape(*idx.shape, 1, 1)).where(weight, 0).sum(-2)


class LSTMCell:
  """One LSTM step: (h, c) = cell(x, (h, c)); gates i, f, g, o as in PyTorch."""

  def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
    bound = 1 / math.sqrt(hidden_size)
    self.hidden_size = hidden_size
    self.weight_ih = _uniform(bound, 4 * hidden_size, input_size)
    self.weight_hh = _uniform(bound, 4 * hidden_size, hidden_size)
    self.bias_ih = _uniform(bound, 4 * hidden_size) if bias else None
    self.bias_hh = _uniform(bound, 4 * hidden_size) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    if hc is None:
      zeros = Tensor.zeros(*x.shape[:-1], self.hidden_size, dtype=x.dtype, device=x.device)
      hc = (zeros, zeros)
    h, c = hc
    gates = x.linear(self.weight_ih.T, self.bias_ih) + h.linear(self.weight_hh.T, self.bias_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c
