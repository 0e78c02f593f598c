"""Neural-network ops of Tensor: convolution and pooling, normalization, attention, one-hot and
losses (interpolation: resample.py).

Compositions of the primitive Tensor methods only. A convolution or pooling is the sliding-window
view of `pool` (pad, repeat, shrink, reshape, permute: no copies) followed by ONE fused reduce (a
convolution first copies its padded input and its weights, output channels innermost, so that the
reduce reads both without bounds checks and along contiguous vectors); the gradient of an
overlapping window view is a sum of shifted pads (gradient.override_gradient), not the rules'
reduction over the repeated copies;
gathers (losses) are the spec's one-hot gathers (`take`), which compile to direct gated loads.
`pool` and `take` also serve composite.py (scans, unfold, repeat_interleave) and resample.py.
Signatures are tinygrad's, semantics PyTorch's (torch.nn.functional).
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from unigrad.dtype import LOW_FLOATS, dtypes, least_upper_dtype
from unigrad import engine
from unigrad.frontend.dtypes import result_type
from unigrad.frontend.gradient import override_gradient
from unigrad.frontend.movement import canonical_axis
from unigrad.frontend.strided import is_contiguous_layout, strided_view_of
from unigrad.frontend.reduce import RowNodes, Rows, canonical_axes, any_true, host_values
from unigrad.frontend.traced import traced
from unigrad.uop import UOp

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

Pads = list[tuple[int, int]]
REDUCTIONS = ("none", "mean", "sum")


# ---- views shared with composite: sliding windows and the one-hot gather ----

def int_tuple(x: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
  """`x` as n ints: an int repeats, a 1-sequence repeats (like PyTorch)."""
  if isinstance(x, int): return (x,) * n
  t = tuple(int(v) for v in x)
  if len(t) == 1: return t * n
  if len(t) != n: raise ValueError(f"{name} must be an int or a sequence of {n} ints, got {x}")
  return t


def is_nan(t: Tensor) -> Tensor: return t.ne(t)


def take(t: Tensor, axis: int, idx: Tensor) -> Tensor:
  """t with `axis` replaced by the 1-D index tensor `idx` (t[..., idx, ...]), as the spec's one-hot
  gather: `(arange(K).reshape(K,1) == idx).where(t, 0).sum(K)` compiles to a direct gated load."""
  d, k, m = canonical_axis(axis, t.ndim), t.shape[axis], idx.shape[0]
  rest = (1,) * (t.ndim - d - 1)
  hot = type(t).arange(k, device=t.device).reshape(1, k).eq(idx.reshape(m, 1)).reshape(m, k, *rest)
  return hot.where(t.unsqueeze(d), 0).sum(d + 1, dtype=t.dtype)


def pool(t: Tensor, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int]) -> Tensor:
  """Sliding windows over the trailing len(k_) axes: (..., *i_) -> (..., *o_, *k_), with
  o = (i - d*(k-1) - 1) // s + 1 >= 1 (the caller checks). Views only: repeat, shrink, reshape."""
  n = len(k_)
  i_ = t.shape[t.ndim - n:]
  o_ = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(i_, k_, s_, d_)]
  if all(k <= s and d == 1 and o * s <= i for k, s, d, o, i in zip(k_, s_, d_, o_, i_)):
    x, windows_first = _pool_disjoint(t, k_, s_, o_), True
  else: x, windows_first = _pool_overlapping(t, k_, s_, d_, o_), False
  lead = t.ndim - n
  # the view is (..., [o0, k0] or [k0, o0], ...): bring every o before every k
  pairs = [(lead + 2 * j, lead + 2 * j + 1) for j in range(n)]
  outs = [a if windows_first else b for a, b in pairs]
  wins = [b if windows_first else a for a, b in pairs]
  view = x.permute(*range(lead), *outs, *wins)
  if (not windows_first and math.prod(k_) <= MAX_SHIFTED_WINDOWS
      and all(isinstance(i, int) for i in i_)):  # symbolic sizes keep the rules' gradient
    unpool = functools.partial(_unpool, type(t), t.device, tuple(i_), tuple(k_), tuple(s_),
                               tuple(d_))
    override_gradient(view.uop, t.uop, unpool)
  return view


# the overlapping windows whose gradient is a sum of shifted pads: each adds a gated load per
# input element (the repeat view's own gradient reduces over ~(k+1)^n copies with div/mod indexing)
MAX_SHIFTED_WINDOWS = 64


def _unpool(cls: type, device: Any, i_: tuple[int, ...], k_: tuple[int, ...],
            s_: tuple[int, ...], d_: tuple[int, ...], g: UOp) -> UOp:
  """The gradient of `pool`'s overlapping view (..., *o_, *k_) for its input (..., *i_): each
  window position's slice g[..., a] dilated by the stride and padded to its offset a*d, summed
  (col2im as Prod(k_) shifted pads)."""
  grad = cls._from_uop(g, device)
  n, lead = len(k_), grad.ndim - 2 * len(k_)
  o_ = grad.shape[lead:lead + n]
  total: Tensor | None = None
  for a_ in itertools.product(*[range(k) for k in k_]):
    piece = grad.shrink([None] * (lead + n) + [(a, a + 1) for a in a_])
    piece = piece.reshape(grad.shape[:lead + n])
    if any(s > 1 for s in s_): piece = _dilate(piece, s_)
    span = [(o - 1) * s + 1 for o, s in zip(o_, s_)]
    piece = piece.pad([(0, 0)] * lead + [(a * d, i - a * d - w)
                                         for a, d, i, w in zip(a_, d_, i_, span)])
    total = piece if total is None else total + piece
  assert total is not None
  return total.uop


def _pool_disjoint(t: Tensor, k_: Sequence[int], s_: Sequence[int], o_: Sequence[int]) -> Tensor:
  """Windows that do not overlap (k <= s, o*s <= i): cut to o*s, reshape (o, s), keep k."""
  keep = [(0, e) for e in t.shape[:t.ndim - len(k_)]]
  x = t.shrink(keep + [(0, o * s) for o, s in zip(o_, s_)])
  x = x.reshape(*t.shape[:len(keep)], *[v for o, s in zip(o_, s_) for v in (o, s)])
  return x.shrink(keep + [p for o, k in zip(o_, k_) for p in ((0, o), (0, k))])


def _pool_overlapping(t: Tensor, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int],
                      o_: Sequence[int]) -> Tensor:
  """Any windows, as (..., k, o) per axis: repeat the axis and read k rows of length i*f + d, so
  row r starts at r*d (mod i); then take every s-th element of the first o*s."""
  lead = t.shape[:t.ndim - len(k_)]
  keep, i_ = [(0, e) for e in lead], t.shape[len(lead):]
  f_ = [max(1, math.ceil((o * s - d) / i)) for i, o, s, d in zip(i_, o_, s_, d_)]
  row = [i * f + d for i, f, d in zip(i_, f_, d_)]
  x = t.repeat(*[1] * len(lead), *[math.ceil(k * r / i) for k, r, i in zip(k_, row, i_)])
  x = x.shrink(keep + [(0, k * r) for k, r in zip(k_, row)])
  x = x.reshape(*lead, *[v for k, r in zip(k_, row) for v in (k, r)])
  x = x.shrink(keep + [p for k, o, s in zip(k_, o_, s_) for p in ((0, k), (0, o * s))])
  x = x.reshape(*lead, *[v for k, o, s in zip(k_, o_, s_) for v in (k, o, s)])
  x = x.shrink(keep + [p for k, o in zip(k_, o_) for p in ((0, k), (0, o), (0, 1))])
  return x.reshape(*lead, *[v for k, o in zip(k_, o_) for v in (k, o)])


# ---- argument resolution ----

def _pads(padding: int | Sequence[int], n: int) -> Pads:
  """(before, after) per spatial axis from an int, one int per axis, or PyTorch's flat
  (last_before, last_after, ...) form."""
  if isinstance(padding, int): return [(padding, padding)] * n
  p = tuple(padding)
  if len(p) == n: return [(v, v) for v in p]
  if len(p) == 2 * n: return [(p[i], p[i + 1]) for i in range(0, 2 * n, 2)][::-1]
  raise ValueError(f"padding must be an int or a sequence of {n} or {2 * n} ints, got {padding}")


def _conv_pads(padding: Any, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int]) -> Pads:
  if not isinstance(padding, str):
    pads = _pads(padding, len(k_))
    if any(b < 0 or a < 0 for b, a in pads): raise RuntimeError("negative padding is not supported")
    return pads
  if padding == "valid": return [(0, 0)] * len(k_)
  if padding != "same":
    raise RuntimeError(f"Invalid padding string '{padding}', should be one of ['valid', 'same']")
  if any(s != 1 for s in s_):
    raise RuntimeError("padding='same' is not supported for strided convolutions")
  return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(k_, d_)]


def _batched(x: Tensor, n: int, name: str) -> Tensor:
  """x as (N, C, *spatial): an unbatched (C, *spatial) input gets N = 1."""
  if x.ndim == n + 1: return x.unsqueeze(0)
  if x.ndim != n + 2:
    raise RuntimeError(f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to {name}, but "
                       f"got input of size: {list(x.shape)}")
  return x


def _pool_geometry(x: Tensor, k_: tuple[int, ...], s_: tuple[int, ...], d_: tuple[int, ...],
                   pads: Pads, ceil_mode: bool) -> Pads:
  """Per axis (before, after + extra): the extra right padding gives ceil_mode's last window,
  which must start inside the input or the left padding (PyTorch's rule)."""
  out = []
  for i, k, s, d, (b, a) in zip(x.shape[-len(k_):], k_, s_, d_, pads):
    if b > k // 2 or a > k // 2:
      raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={b}, "
                         f"kernel_size={k} and dilation={d}")
    span = i + b + a - d * (k - 1) - 1
    o = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= i + b: o -= 1
    if o <= 0:
      raise RuntimeError(f"Given input size {x.shape}, the calculated output size {o} is too "
                         f"small (kernel {k_}, stride {s_}, padding {pads}, dilation {d_})")
    out.append((b, a + max(0, (o - 1) * s - span)))
  return out


def _pool_args(x: Tensor, kernel_size: Any, stride: Any, dilation: Any,
               padding: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Pads]:
  k_ = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
  n = len(k_)
  if x.ndim < n: raise RuntimeError(f"pooling {k_} needs at least {n} dims, got shape {x.shape}")
  s_ = int_tuple(k_ if stride is None or stride == [] else stride, n, "stride")
  if any(s <= 0 for s in s_): raise RuntimeError(f"stride should be greater than zero, got {s_}")
  return k_, s_, int_tuple(dilation, n, "dilation"), _pads(padding, n)


def _lead(x: Tensor, n: int) -> Pads: return [(0, 0)] * (x.ndim - n)


def _window_index(x: Tensor, k_: Sequence[int], s_: Sequence[int], d_: Sequence[int], geo: Pads,
                  o_: Sequence[int]) -> Tensor:
  """The flat spatial index into x of each pooling-window element, shape (*o_, *k_); the size of
  the spatial axes (an index no window element has) where the element lies in the padding."""
  n, ins = len(k_), x.shape[-len(k_):]
  flat: Tensor | None = None
  inside: Tensor | None = None
  for j, (i, k, s, d, (b, _), o) in enumerate(zip(ins, k_, s_, d_, geo, o_)):
    ar_o = type(x).arange(o, device=x.device).reshape(*[o if a == j else 1 for a in range(2 * n)])
    ar_k = type(x).arange(k, device=x.device)
    ar_k = ar_k.reshape(*[k if a == n + j else 1 for a in range(2 * n)])
    c = ar_o * s + ar_k * d - b  # the input coordinate along axis j
    ok, term = (c >= 0) & (c < i), c * math.prod(ins[j + 1:])
    flat, inside = (term, ok) if flat is None else (flat + term, inside & ok)
  assert flat is not None and inside is not None
  return inside.where(flat, math.prod(ins))


def _check_reduction(reduction: str) -> None:
  if reduction not in REDUCTIONS:
    raise ValueError(f"{reduction} is not a valid value for reduction")


@traced
def _class_cross_entropy(x: Tensor, y: Tensor, weight: Tensor | None, cdim: int, ignore_index: int,
                         label_smoothing: float, reduction: str) -> Tensor:
  """cross_entropy of logits `x` against class indices `y` (checked), classes along `cdim`
  (traced: a training step's loss is about forty ops)."""
  c = x.shape[cdim]
  nll, smooth, wy = _nll_terms(x.log_softmax(cdim), y, cdim, weight, ignore_index)
  if reduction == "none": return nll * (1 - label_smoothing) + smooth * (label_smoothing / c)
  nll, smooth = nll.sum(), smooth.sum()
  if reduction == "mean": nll, smooth = nll / wy.sum(), smooth / wy.sum()
  return nll * (1 - label_smoothing) + smooth * (label_smoothing / c)


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
  _check_reduction(reduction)
  if reduction == "none": return loss
  return loss.sum() if reduction == "sum" else loss.mean()


def _conv(x: Tensor, weight: Tensor, groups: int, s_: Sequence[int], d_: Sequence[int],
          pads: Pads, dtype: Any) -> Tensor:
  """(bs, groups*cin, *i_) conv (cout, cin, *k_): window view, broadcast multiply, one reduce."""
  n = weight.ndim - 2
  (bs, _), (cout, cin), k_ = x.shape[:2], weight.shape[:2], weight.shape[2:]
  span = [i + b + a for i, (b, a) in zip(x.shape[2:], pads)]
  if any(p < d * (k - 1) + 1 for p, k, d in zip(span, k_, d_)):
    raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, span))}). "
                       f"Kernel size: ({' x '.join(map(str, k_))}). Kernel size can't be greater "
                       f"than actual input size")
  dt = result_type(x, weight) if dtype is None else x.cast(dtype).dtype
  acc = dtypes.float32 if dt in LOW_FLOATS else dt
  x = x.cast(acc)
  # the padded input gets its own buffer: the reduce then reads it without bounds checks (a gated
  # load per multiply-add would keep the compiler from vectorizing the window reads)
  if any(b or a for b, a in pads): x = x.pad([(0, 0), (0, 0), *pads]).contiguous()
  win = pool(x, k_, s_, d_)  # (bs, g*cin, *o_, *k_)
  o_, rc = win.shape[2:2 + n], cout // groups
  win = win.reshape(bs, groups, cin, 1, *o_, *k_).expand(bs, groups, cin, rc, *o_, *k_)
  win = win.permute(0, 1, 3, *range(4, 4 + n), 2, *range(4 + n, 4 + 2 * n))
  # weights stored (cin, *k_, cout): a vector of output channels is one contiguous load, each
  # input value is broadcast across it (the register tile the CPU heuristics pick). With one
  # output channel per group (a depthwise convolution) a weight is one scalar per window
  # position whatever its layout: no copy (it cost a kernel per layer and call)
  wt = weight.cast(acc)
  if rc > 1:
    kernel = wt.permute(*range(1, n + 2), 0)
    if not _is_stored(kernel): kernel = kernel.contiguous()  # a weight stored so already is read
    wt = kernel.permute(n + 1, *range(n + 1))                # in place (unigrad.onnx stores its
                                                             # initializers so at load)
  w = wt.reshape(1, groups, rc, *[1] * n, cin, *k_)
  out = (win * w).sum(tuple(range(3 + n, 4 + 2 * n)), dtype=acc)  # over (cin, *k_)
  return out.reshape(bs, cout, *o_).cast(dt)


def _is_stored(t: Tensor) -> bool:
  """Whether `t` reads a whole buffer in row-major order (reading it needs no copy)."""
  sv = strided_view_of(t.uop)
  return sv is not None and sv.offset == 0 and is_contiguous_layout(t.shape, sv.strides) and \
    math.prod(sv.buffer.shape) == t.numel()


def _dilate(x: Tensor, s_: Sequence[int]) -> Tensor:
  """x with s-1 zeros between neighbours along each of its trailing len(s_) axes: (i-1)*s + 1."""
  lead, ins = x.shape[:x.ndim - len(s_)], x.shape[x.ndim - len(s_):]
  keep: Pads = [(0, 0)] * len(lead)
  x = x.reshape(*lead, *[v for i in ins for v in (i, 1)])
  x = x.pad([*keep, *[p for s in s_ for p in ((0, 0), (0, s - 1))]])
  x = x.reshape(*lead, *[i * s for i, s in zip(ins, s_)])
  return x.shrink([*[None] * len(lead), *[(0, (i - 1) * s + 1) for i, s in zip(ins, s_)]])


def _gqa_expand(q: Tensor, kv: Tensor) -> Tensor:
  """key or value with each of its heads (axis -3) repeated for the query heads it serves."""
  if q.ndim < 3 or kv.ndim < 3:
    raise RuntimeError("enable_gqa needs query, key and value with a heads axis (-3)")
  hq, hkv = q.shape[-3], kv.shape[-3]
  if hkv == 0 or hq % hkv:
    raise RuntimeError(f"Number of heads in key and value must divide the number of heads in "
                       f"query, got {hkv} and {hq}")
  return kv if hq == hkv else kv.repeat_interleave(hq // hkv, -3)


def _attention_weights(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool,
                       scale: float | None) -> Tensor:
  """softmax(q @ k^T * scale + mask) over the keys."""
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  qk = q.matmul(k.transpose(-2, -1)) * scale
  if is_causal: mask = type(q).full(qk.shape[-2:], True, dtypes.bool, q.device).tril()
  if mask is not None:
    qk = mask.where(qk, -math.inf) if mask.dtype == dtypes.bool else qk + mask
  return qk.softmax(-1)


@traced
def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               scale: float | None, enable_gqa: bool) -> Tensor:
  """scaled_dot_product_attention without dropout (traced: an attention layer's 30 nodes are one
  call)."""
  if enable_gqa: k, v = _gqa_expand(q, k), _gqa_expand(q, v)
  weights = _attention_weights(q, k, mask, is_causal, scale)
  return weights._cast(least_upper_dtype(q.dtype, v.dtype)).matmul(v)


def _attention_dropout(weights: Tensor, p: float) -> Tensor:
  if p == 1: return weights.zeros_like()
  keep = type(weights).rand(weights.shape, dtype=dtypes.float32, device=weights.device) >= p
  return keep.where(weights * (1 / (1 - p)), 0).cast(weights.dtype)


def _class_targets(x: Tensor, y: Tensor, cdim: int) -> None:
  """PyTorch's checks of class-index targets against (N, C, ...) or (C,) scores."""
  if dtypes.is_float(y.dtype) or y.dtype == dtypes.bool:
    raise RuntimeError(f"expected class indices of an integer dtype, got {y.dtype!r}")
  want = tuple(s for i, s in enumerate(x.shape) if i != cdim)
  if x.ndim > 1 and y.ndim and y.shape[0] != x.shape[0]:
    raise ValueError(f"Expected input batch_size ({x.shape[0]}) to match target batch_size "
                     f"({y.shape[0]}).")
  if y.shape != want:
    raise RuntimeError(f"expected target of shape {want} for input of shape {x.shape}, got "
                       f"{y.shape}")


def _check_class_range(y: Tensor, c: int, ignore_index: int) -> None:
  """IndexError for a class index outside [0, c) that is not ignore_index (checked eagerly). A
  realized target (a batch of labels) is read on the host: a training step's loss then needs no
  realize and sync of its own (which also kept the step's graph from matching the last step's)."""
  if y.numel() == 0: return
  if engine.is_realized(y.uop) and not engine.capturing:
    v = host_values(y)
    if hasattr(v, "min") and (int(v.min()) >= 0 and int(v.max()) < c): return
  elif not any_true(((y < 0) | (y >= c)) & y.ne(ignore_index))[0]: return
  bad = [v for v in y.flatten().tolist() if not 0 <= v < c and v != ignore_index]
  if bad: raise IndexError(f"Target {bad[0]} is out of bounds (classes are 0..{c - 1}).")


def _nll_terms(logp: Tensor, y: Tensor, cdim: int, weight: Tensor | None,
               ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
  """(weighted nll per sample, weighted -sum(logp) per sample, weight of each sample's class);
  ignored samples are 0 in all three."""
  c = logp.shape[cdim]
  classes = type(logp).arange(c, device=logp.device).reshape(c, *[1] * (logp.ndim - cdim - 1))
  valid = y.ne(ignore_index)
  hot = y.unsqueeze(cdim).eq(classes) & valid.unsqueeze(cdim)  # the one-hot gather of the target
  wc = logp.ones_like() if weight is None else weight.cast(logp.dtype).reshape(classes.shape)
  wlogp = logp * wc
  nll = -hot.where(wlogp, 0).sum(cdim)
  smooth = valid.where(-wlogp.sum(cdim), 0)
  return nll, smooth, hot.where(wc, 0).sum(cdim)


def layernorm_of(x: Rows, axis: Any, eps: float) -> Rows:
  """(x - mean) / sqrt(var + eps) over `axis`: `Tensor.layernorm`'s formula, on a Tensor or on
  RowNodes (a transformer calls it twice a layer)."""
  y = x - x.mean(axis, keepdim=True)
  return y.mul((y * y).mean(axis, keepdim=True).add(eps).sqrt().reciprocal())


class NNOpsMixin:
  """conv2d, conv_transpose2d, pools, interpolate, linear, norms, attention, one_hot, losses."""

  # ---- convolution ----
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
             dilation: Any = 1, padding: Any = 0, dtype: Any = None) -> Tensor:
    """Convolution over weight.ndim - 2 spatial axes (1-D, 2-D, 3-D ...), PyTorch's conv{n}d with
    padding an int, per axis, flat (last_before, last_after, ...), 'valid' or 'same'.
    `x.conv2d(w)` for x (N, Cin, H, W) and w (Cout, Cin/groups, kh, kw)."""
    n = weight.ndim - 2
    if n < 1:
      raise RuntimeError(f"weight should have at least three dimensions, got {weight.shape}")
    x = _batched(self, n, f"conv{n}d")
    cout, cin = weight.shape[:2]
    if groups <= 0: raise RuntimeError(f"non-positive groups is not supported, got {groups}")
    if cout % groups:
      raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at "
                         f"dimension 0, but got weight of size {list(weight.shape)} instead")
    if cin * groups != x.shape[1]:
      raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected "
                         f"input{list(x.shape)} to have {cin * groups} channels, but got "
                         f"{x.shape[1]} channels instead")
    s_, d_ = int_tuple(stride, n, "stride"), int_tuple(dilation, n, "dilation")
    out = _conv(x, weight, groups, s_, d_, _conv_pads(padding, weight.shape[2:], s_, d_), dtype)
    if bias is not None: out = out + bias.reshape(1, cout, *[1] * n)
    return out[0] if self.ndim == n + 1 else out

  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                       stride: Any = 1, dilation: Any = 1, padding: Any = 0,
                       output_padding: Any = 0) -> Tensor:
    """Transposed convolution (the gradient of conv2d) over weight.ndim - 2 spatial axes;
    weight is (Cin, Cout/groups, *k). The input is dilated by the stride, then convolved with
    the flipped, transposed kernel."""
    n = weight.ndim - 2
    x = _batched(self, n, f"conv_transpose{n}d")
    cin, rc, *k_ = weight.shape
    if x.shape[1] != cin or cin % groups:
      raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected "
                         f"input{list(x.shape)} to have {cin} channels, but got {x.shape[1]} "
                         f"channels instead")
    s_, d_ = int_tuple(stride, n, "stride"), int_tuple(dilation, n, "dilation")
    op_, p_ = int_tuple(output_padding, n, "output_padding"), int_tuple(padding, n, "padding")
    if any(op >= s and op >= d for op, s, d in zip(op_, s_, d_)):
      raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                         f"output_padding={op_}, stride={s_}, dilation={d_}")
    w = weight.reshape(groups, cin // groups, rc, *k_).transpose(1, 2).flip(*range(3, 3 + n))
    w = w.reshape(groups * rc, cin // groups, *k_)
    if any(s > 1 for s in s_): x = _dilate(x, s_)
    pads = [((k - 1) * d - p, (k - 1) * d - p + op) for k, d, p, op in zip(k_, d_, p_, op_)]
    x = x.shrink([None, None, *[(max(0, -b), e - max(0, -a))
                                for (b, a), e in zip(pads, x.shape[2:])]])
    out = _conv(x, w, groups, (1,) * n, d_, [(max(0, b), max(0, a)) for b, a in pads], None)
    if bias is not None: out = out + bias.reshape(1, -1, *[1] * n)
    return out[0] if self.ndim == n + 1 else out

  # ---- pooling ----
  def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                 padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> Tensor:
    """Average over windows of the trailing len(kernel_size) axes (2 for an int)."""
    k_, s_, d_, pads = _pool_args(self, kernel_size, stride, dilation, padding)
    n, axes = len(k_), tuple(range(-len(k_), 0))
    geo = _pool_geometry(self, k_, s_, d_, pads, ceil_mode)
    x = self if dtypes.is_float(self.dtype) else self.float()
    sums = pool(x.pad(_lead(x, n) + geo), k_, s_, d_).sum(axes)
    if divisor_override is not None: return sums.div(divisor_override)
    if count_include_pad and geo == pads: return sums.div(math.prod(k_))
    # the divisor counts window positions inside the input (and its padding if counted)
    ins = tuple(self.shape[-n:])
    if count_include_pad:
      ins = tuple(i + b + a for i, (b, a) in zip(ins, pads))
      geo = [(0, ga - a) for (_, a), (_, ga) in zip(pads, geo)]
    ones = type(self).ones(*ins, dtype=x.dtype, device=self.device)
    return sums.div(pool(ones.pad(geo), k_, s_, d_).sum(axes))

  def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                 padding: Any = 0, ceil_mode: bool = False,
                 return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Maximum over windows of the trailing len(kernel_size) axes; with return_indices also the
    flat index (int64) of the first maximum within the input's spatial axes."""
    k_, s_, d_, pads = _pool_args(self, kernel_size, stride, dilation, padding)
    n, axes = len(k_), tuple(range(-len(k_), 0))
    geo = _pool_geometry(self, k_, s_, d_, pads, ceil_mode)
    win = pool(self.pad(_lead(self, n) + geo, value=self.dtype.min), k_, s_, d_)
    values = win.max(axes)
    if not return_indices: return values
    size = math.prod(self.shape[-n:])
    hit = win.eq(values.reshape(*values.shape, *[1] * n))
    if dtypes.is_float(self.dtype): hit = hit | is_nan(win)
    # the first hit has the largest reversed index size - flat
    flat = _window_index(self, k_, s_, d_, geo, values.shape[-n:])
    return values, hit.where(flat.sub(size, reverse=True), 0).max(axes).sub(size, reverse=True)

  def max_unpool2d(self, indices: Tensor, kernel_size: Any = (2, 2), stride: Any = None,
                   dilation: Any = 1, padding: Any = 0,
                   output_size: Sequence[int] | None = None) -> Tensor:
    """The inverse of max_pool2d: each value goes to its flat spatial index, zeros elsewhere."""
    k_, s_, d_, pads = _pool_args(self, kernel_size, stride, dilation, padding)
    n = len(k_)
    if indices.shape != self.shape:
      raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor "
                         f"({self.shape}) but got indices tensor with shape: {indices.shape}")
    lead, ins = self.shape[:-n], self.shape[-n:]
    if output_size is None:
      outs = tuple((i - 1) * s - b - a + d * (k - 1) + 1
                   for i, k, s, d, (b, a) in zip(ins, k_, s_, d_, pads))
    else: outs = tuple(output_size)[-n:]
    p, q = math.prod(outs), math.prod(ins)
    hit = indices.reshape(*lead, 1, q).eq(type(self).arange(p, device=self.device).reshape(p, 1))
    vals = hit.where(self.reshape(*lead, 1, q), self.dtype.min).max(-1)
    return hit.any(-1).where(vals, 0).cast(self.dtype).reshape(*lead, *outs)

  # ---- layers ----
  @traced
  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight + bias, with weight (in_features, out_features) as in tinygrad (PyTorch's
    F.linear(x, w, b) is x.linear(w.T, b)); a 1-D weight scales elementwise."""
    x = self.mul(weight) if weight.ndim == 1 else self.matmul(weight)
    return x if bias is None else x.add(bias)

  def sequential(self, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
    """Apply `layers` in order. `x.sequential([l1, Tensor.relu, l2])`"""
    return functools.reduce(lambda x, f: f(x), layers, self)

  @traced
  def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (biased variance, no affine)."""
    if (r := RowNodes.of(self.uop, axes := canonical_axes(axis, self.ndim))) is not None:
      return self._wrap(layernorm_of(r, axes, eps).uop)
    return layernorm_of(self, axis, eps)

  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                axis: int | Sequence[int] = 1) -> Tensor:
    """(x - mean) * invstd * weight + bias, the statistics laid along `axis`."""
    axes = {a % self.ndim for a in ((axis,) if isinstance(axis, int) else axis)}
    shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
    x = self - mean.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
    return x if bias is None else x + bias.reshape(shape)

  def one_hot(self, num_classes: int = -1) -> Tensor:
    """int64 one-hot vectors along a new last axis (num_classes=-1 reads max + 1: realizes)."""
    if not dtypes.is_int(self.dtype):
      raise RuntimeError(f"one_hot is only applicable to index tensors, got {self.dtype!r}")
    if num_classes == -1:
      if self.numel() == 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
      num_classes = int(self.max().item()) + 1
    if self.numel():
      neg, big = any_true(self < 0, self >= num_classes)
      if neg: raise RuntimeError("one_hot: class values must be non-negative.")
      if big: raise RuntimeError(f"one_hot: class values must be smaller than num_classes "
                                 f"({num_classes}).")
    classes = type(self).arange(num_classes, device=self.device)
    return self.unsqueeze(-1).eq(classes).cast(dtypes.int64)

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor,
                                   attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                   is_causal: bool = False, scale: float | None = None,
                                   enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v; a bool mask keeps True, is_causal keeps j <= i.
    Like PyTorch's F.scaled_dot_product_attention, dropout_p > 0 drops attention weights
    whenever it is given (training or not), and enable_gqa lets key/value have fewer heads
    (axis -3) than the query, each serving Hq / Hkv query heads."""
    if not 0.0 <= dropout_p <= 1.0:
      raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if is_causal and attn_mask is not None:
      raise RuntimeError("cannot set attn_mask when is_causal=True")
    if dropout_p == 0: return _attention(self, key, value, attn_mask, is_causal, scale, enable_gqa)
    if enable_gqa: key, value = _gqa_expand(self, key), _gqa_expand(self, value)
    weights = _attention_dropout(_attention_weights(self, key, attn_mask, is_causal, scale),
                                 dropout_p)
    return weights._cast(least_upper_dtype(self.dtype, value.dtype)).matmul(value)

  # ---- losses ----
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean",  # noqa: N803
                          weight: Tensor | None = None) -> Tensor:
    """BCE of probabilities `self` against targets Y; logs clamp at -100 like PyTorch."""
    _check_reduction(reduction)
    if Y.shape != self.shape:
      raise ValueError(f"Using a target size ({Y.shape}) that is different to the input size "
                       f"({self.shape}) is deprecated. Please ensure they have the same size.")
    loss = -(Y * self.log().maximum(-100) + (1 - Y) * (1 - self).log().maximum(-100))
    return _reduce_loss(loss if weight is None else loss * weight, reduction)

  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean",  # noqa: N803
                                 pos_weight: Tensor | None = None,
                                 weight: Tensor | None = None) -> Tensor:
    """BCE of sigmoid(self) against Y, stably: (1-Y)x + (1 + (pw-1)Y) softplus(-x)."""
    _check_reduction(reduction)
    if Y.shape != self.shape:
      raise ValueError(f"Target size ({Y.shape}) must be the same as input size ({self.shape})")
    softplus_neg = self.abs().neg().exp().add(1).log() + self.neg().relu()  # -logsigmoid(x)
    scale = 1 if pos_weight is None else (pos_weight - 1) * Y + 1
    loss = (1 - Y) * self + scale * softplus_neg
    return _reduce_loss(loss if weight is None else loss * weight, reduction)

  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1,  # noqa: N803
                                      label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """Cross entropy of logits with classes on the LAST axis against class indices Y (tinygrad's
    form of F.cross_entropy); the mean is over the samples not equal to ignore_index."""
    moved = self.permute(0, self.ndim - 1, *range(1, self.ndim - 1)) if self.ndim > 2 else self
    return moved.cross_entropy(Y, reduction, label_smoothing, ignore_index=ignore_index)

  def cross_entropy(self, Y: Tensor, reduction: str = "mean",  # noqa: N803
                    label_smoothing: float = 0.0, weight: Tensor | None = None,
                    ignore_index: int = -100) -> Tensor:
    """F.cross_entropy: logits (N, C, ...) or (C,) against class indices or class probabilities
    (a float Y of the logits' shape), with class weights, ignore_index and label smoothing."""
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
      raise ValueError(f"label_smoothing must be in [0.0, 1.0], got {label_smoothing}")
    cdim = 0 if self.ndim == 1 else 1
    if dtypes.is_float(Y.dtype):
      c, logp = self.shape[cdim], self.log_softmax(cdim)
      if Y.shape != self.shape:
        raise RuntimeError(f"class-probability targets {Y.shape} must match the input {self.shape}")
      wc = 1 if weight is None else weight.reshape(c, *[1] * (self.ndim - cdim - 1))
      target = Y * (1 - label_smoothing) + label_smoothing / c
      return _reduce_loss(-(logp * target * wc).sum(cdim), reduction)
    _class_targets(self, Y, cdim)
    _check_class_range(Y, self.shape[cdim], ignore_index)
    return _class_cross_entropy(self, Y, weight, cdim, ignore_index, label_smoothing, reduction)

  def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: N803
               reduction: str = "mean") -> Tensor:
    """F.nll_loss: -self[n, Y[n]] * weight[Y[n]] for log-probabilities (N, C, ...) or (C,); the
    mean divides by the summed weights of the samples not ignored."""
    _check_reduction(reduction)
    cdim = 0 if self.ndim == 1 else 1
    _class_targets(self, Y, cdim)
    _check_class_range(Y, self.shape[cdim], ignore_index)
    nll, _, wy = _nll_terms(self, Y, cdim, weight, ignore_index)
    if reduction == "none": return nll
    return nll.sum() / wy.sum() if reduction == "mean" else nll.sum()
