"""Composite ops of Tensor: movement compositions, scans, statistics and small elementwise helpers.

Everything here composes the primitive Tensor methods (movement, elementwise, reduce, creation):
no new UOps. Sliding windows (cumsum and friends, pooling) are the spec's pad/reshape window
trick; gathers along an axis are the spec's one-hot gather. The compiler turns both into index
arithmetic (closed-form reductions, direct gated loads), so nothing here loops in Python over
elements. Semantics, dtypes and error types follow PyTorch.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unigrad.dtype import LOW_FLOATS, DType, dtypes, least_upper_float
from unigrad.frontend.dtypes import check_int_value, result_type
from unigrad.frontend.gradient import override_gradient
from unigrad.frontend.movement import normalize_pads, shape_arg, canonical_axis
from unigrad.frontend.nnops import is_nan, pool, take
from unigrad.frontend.reduce import Axis, RowNodes, Rows, canonical_axes, takes_dim

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor
  from unigrad.uop import UOp

PAD_MODES = ("constant", "reflect", "replicate", "circular")
# a cat of more pieces (counting the pieces of a lazy cat it extends: ONNX exports DenseNet's
# growing feature maps as nested two-input Concats) is made contiguous, one copy kernel: fused
# into its consumers, each piece is a gated read of its own, and a consumer reducing over the
# cat axis (a convolution over the concatenated features) became one reduce nest per piece, in
# every consumer of every layer again
CAT_FUSE_MAX = 4


def _tensors(first: Any, others: tuple) -> list[Tensor]:
  """Accept t.cat(a, b), Tensor.cat(t, a, b) and Tensor.cat([t, a, b])."""
  ts = [*first, *others] if isinstance(first, (list, tuple)) else [first, *others]
  if not ts: raise ValueError("expected a non-empty list of Tensors")
  for t in ts:
    if not hasattr(t, "uop"): raise TypeError(f"expected Tensors, got {type(t).__name__}")
  return ts


def _positional_dim(first: Any, others: tuple, dim: int) -> tuple[tuple, int]:
  """PyTorch's `Tensor.cat([a, b], 1)`: after a list of tensors, one int is the dim."""
  if isinstance(first, (list, tuple)) and len(others) == 1 and isinstance(others[0], int):
    if dim != 0: raise TypeError("cat() got the dim twice (positional and dim=)")
    return (), others[0]
  return others, dim


def axis_to_last(t: Tensor, axis: int) -> tuple[Tensor, list[int]]:
  """t with `axis` moved last, and the permutation that moves it back."""
  order = [i for i in range(t.ndim) if i != axis] + [axis]
  return t.permute(order), [order.index(i) for i in range(t.ndim)]


def _check_cat_shapes(ts: list[Tensor], d: int) -> None:
  ref = ts[0]
  for i, t in enumerate(ts):
    if t.ndim != ref.ndim:
      raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} and "
                         f"{t.ndim}")
    for a in range(ref.ndim):
      if a != d and t.shape[a] != ref.shape[a]:
        raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size "
                           f"{ref.shape[a]} but got size {t.shape[a]} for tensor number {i} in the "
                           f"list ({ref.shape} and {t.shape})")


def reversed_order(t: Tensor) -> Tensor:
  """A value that orders the other way round (min <-> max) exactly: -x, or ~x for ints/bools."""
  return t.neg() if dtypes.is_float(t.dtype) else t.bitwise_not()


def _pad_axis(x: Tensor, axis: int, b: int, a: int, mode: str) -> Tensor:
  """x padded by (b, a) along `axis` in a non-constant mode."""
  n = x.shape[axis]
  def part(lo: int, hi: int) -> Tensor:
    return x.shrink([(lo, hi) if i == axis else None for i in range(x.ndim)])
  where = f"padding ({b}, {a}) at dimension {axis} of input {list(x.shape)}"
  if mode == "reflect":
    if b >= n or a >= n:
      raise RuntimeError(f"Padding size should be less than the corresponding input dimension, but "
                         f"got: {where}")
    pieces = [part(1, b + 1).flip(axis), x, part(n - 1 - a, n - 1).flip(axis)]
  elif mode == "replicate":
    if n == 0: raise RuntimeError(f"replicate padding of an empty dimension: {where}")
    def edge(lo: int, k: int) -> Tensor:
      return part(lo, lo + 1).expand(*[k if i == axis else s for i, s in enumerate(x.shape)])
    pieces = [edge(0, b), x, edge(n - 1, a)]
  else:
    if b > n or a > n:
      raise RuntimeError(f"Padding value causes wrapping around more than once: {where}")
    pieces = [part(n - b, n), x, part(0, a)]
  pieces = [p for p in pieces if p.shape[axis]]
  return pieces[0].cat(*pieces[1:], dim=axis)


def _finite_or_zero(m: Tensor) -> Tensor:
  """A max used as a shift: infinite maxima shift by 0 so that exp(x - m) stays finite or 0."""
  return m.abs().eq(math.inf).where(0, m)


def _scan_index(x: Tensor, values: Tensor, axis: int) -> Tensor:
  """The last index j <= i with x[j] == values[i] (NaN matching NaN), as int64."""
  d = canonical_axis(axis, x.ndim)
  if x.ndim == 0 or x.shape[d] <= 1:
    return type(x).zeros(*x.shape, dtype=dtypes.int64, device=x.device)
  xl, back = axis_to_last(x, d)
  vl, _ = axis_to_last(values, d)
  n = xl.shape[-1]
  hit = xl.unsqueeze(-2).eq(vl.unsqueeze(-1))  # [..., i, j]: x[j] == values[i]
  if dtypes.is_float(x.dtype): hit = hit | (is_nan(xl).unsqueeze(-2) & is_nan(vl).unsqueeze(-1))
  j = type(x).arange(n, device=x.device)
  hit = hit & (j.reshape(1, n) <= j.reshape(n, 1))
  return hit.where(j, 0).max(-1).permute(back)


def _einsum_labels(term: str, x: Tensor, ell: int, i: int) -> list[str]:
  """One label per axis of operand i; the axes '...' covers get '...k', aligned to the right."""
  head, dots, tail = term.partition("...")
  e = x.ndim - len(head) - len(tail)
  labels = [*head, *[f"...{k}" for k in range(ell - e, ell)], *tail] if dots else list(term)
  if (dots and e < 0) or (not dots and len(term) != x.ndim):
    raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(head + tail)}) "
                       f"does not match the number of dimensions ({x.ndim}) for operand {i}"
                       + ("" if dots else " and no ellipsis was given"))
  for c in head + tail:
    if not (c.isascii() and c.isalpha()):
      raise RuntimeError(f"einsum(): invalid subscript {c!r} in the equation for operand {i}")
  return labels


def _einsum_parse(formula: str, xs: list[Tensor]) -> tuple[list[list[str]], list[str]]:
  lhs, arrow, rhs = formula.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(xs):
    raise RuntimeError(f"einsum(): the equation '{formula}' has {len(terms)} operands, "
                       f"got {len(xs)}")
  ell = max((x.ndim - len(t) + 3 for t, x in zip(terms, xs) if "..." in t), default=0)
  labels = [_einsum_labels(t, x, ell, i) for i, (t, x) in enumerate(zip(terms, xs))]
  used = [c for lab in labels for c in lab]
  dims = [f"...{k}" for k in range(ell)]
  if not arrow:  # implicit output: the ellipsis axes, then the labels used once, sorted
    once = [c for c in set(used) if used.count(c) == 1 and not c.startswith("...")]
    return labels, dims + sorted(once)
  head, dots, tail = rhs.partition("...")
  out = [*head, *(dims if dots else []), *tail]
  for c in head + tail:
    if c not in used:
      raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation for "
                         f"any input operand")
    if out.count(c) > 1:
      raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the output")
  return labels, out


def _einsum_diagonals(x: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
  """Repeated labels within one operand select its diagonal (moved last)."""
  while (dup := next((c for c in labels if labels.count(c) > 1), None)) is not None:
    i = labels.index(dup)
    j = labels.index(dup, i + 1)
    if x.shape[i] != x.shape[j]:
      raise RuntimeError(f"einsum(): subscript {dup} is repeated for operand but the sizes don't "
                         f"match, {x.shape[i]} != {x.shape[j]}")
    x, labels = x.diagonal(0, i, j), [c for k, c in enumerate(labels) if k not in (i, j)] + [dup]
  return x, labels


def _einsum_sizes(pairs: list[tuple[Tensor, list[str]]]) -> dict[str, int]:
  """The size of every label, broadcasting 1s."""
  sizes: dict[str, int] = {}
  for x, labels in pairs:
    for c, s in zip(labels, x.shape):
      if sizes.get(c, 1) == 1: sizes[c] = s
      elif s not in (1, sizes[c]):
        raise RuntimeError(f"einsum(): operands do not broadcast: subscript {c} has sizes "
                           f"{sizes[c]} and {s}")
  return sizes


# ---- softmax: one formula for Tensors and RowNodes ----

def shifted(x: Rows, axis: Any) -> Rows:
  """x - max(x) along `axis`, the max detached (the shift cancels: no gradient flows to it)."""
  return x - x.max(axis, keepdim=True).detach()


def softmax_of(x: Rows, axis: Any) -> Rows:
  """exp(x - max(x)) / sum(exp(x - max(x))) along `axis`: `Tensor.softmax`'s formula, on a
  Tensor in its compute dtype or on RowNodes (an attention layer calls it on every head)."""
  e = shifted(x, axis).exp()
  return e.div(e.sum(axis, keepdim=True))


# ---- movement compositions ----

def _zero_grad(g: UOp) -> UOp:
  """The gradient of a piecewise constant function (sign): zeros, as PyTorch gives."""
  return g.const_like(0.0)


def _copysign_grad(a: UOp, out: UOp, g: UOp) -> UOp:
  """d copysign(a, b)/da = out/a (1 or -1), 0 where a == 0, as PyTorch (b gets none: the bits
  of its sign carry no gradient)."""
  return g * a.ne(0.0).where(out * a.recip(), 0.0)


class CompositeMixin:
  """Movement compositions, padding modes, scans, statistics, einsum and elementwise helpers."""

  def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
    """Concatenate along `dim` (dtypes promote). `a.cat(b, dim=1)`, `Tensor.cat(a, b)` or
    PyTorch's `Tensor.cat([a, b], 1)`"""
    others, dim = _positional_dim(self, others, dim)
    ts = _tensors(self, others)
    dt = result_type(*ts)
    ts[0]._check_devices(*ts)
    kept = [t for t in ts if t.shape != (0,)] or ts[:1]  # PyTorch skips legacy (0,) tensors
    if kept[0].ndim == 0:
      raise RuntimeError("zero-dimensional tensor (at position 0) cannot be concatenated")
    d = canonical_axis(dim, kept[0].ndim)
    _check_cat_shapes(kept, d)
    total, off, out = sum(t.shape[d] for t in kept), 0, kept[0].cast(dt)
    for i, t in enumerate(kept):
      pads = [(off, total - off - t.shape[d]) if a == d else (0, 0) for a in range(t.ndim)]
      piece, off = t.cast(dt).pad(pads), off + t.shape[d]
      inside = type(t).full(t.shape, True, dtypes.bool, t.device).pad(pads)
      out = piece if i == 0 else inside.where(piece, out)
    if len(kept) == 1: return out
    pieces = sum(t.__dict__.get("_cat_pieces", 1) for t in kept)
    if pieces > CAT_FUSE_MAX: return out.contiguous()
    out.__dict__["_cat_pieces"] = pieces  # (a lazy cat: a cat extending it counts them)
    return out

  def stack(self, *others: Tensor, dim: int = 0) -> Tensor:
    """Join equal-shaped tensors along a new axis `dim`. `a.stack(b)` has shape (2, *a.shape);
    PyTorch's `Tensor.stack([a, b], 1)` works too."""
    others, dim = _positional_dim(self, others, dim)
    ts = _tensors(self, others)
    d = canonical_axis(dim, ts[0].ndim + 1)
    for i, t in enumerate(ts):
      if t.shape != ts[0].shape:
        raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                           f"{list(ts[0].shape)} at entry 0 and {list(t.shape)} at entry {i}")
    return ts[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in ts[1:]], dim=d)

  def repeat(self, *repeats: Any) -> Tensor:
    """Tile the tensor `repeats[i]` times along each axis (new leading axes allowed).
    `Tensor([1, 2]).repeat(2)` is `[1, 2, 1, 2]`."""
    reps = tuple(shape_arg(repeats))
    if len(reps) < self.ndim:
      raise RuntimeError(f"Number of dimensions of repeat dims {reps} can not be smaller than "
                         f"number of dimensions of tensor {self.shape}")
    if any(r < 0 for r in reps):
      raise RuntimeError(f"repeat: negative repeat count in {reps}")
    base = (1,) * (len(reps) - self.ndim) + tuple(self.shape)
    x = self.reshape(*[v for s in base for v in (1, s)])
    x = x.expand(*[v for r, s in zip(reps, base) for v in (r, s)])
    return x.reshape(*[r * s for r, s in zip(reps, base)])

  def repeat_interleave(self, repeats: int | Sequence[int] | Tensor,
                        dim: int | None = None) -> Tensor:
    """Repeat each element `repeats` times along `dim` (flattened when None); per-element counts
    (a list, or a Tensor: read back, which realizes it) size the output, as in PyTorch.
    `Tensor([1, 2]).repeat_interleave(2)` is `[1, 1, 2, 2]`."""
    x = self.flatten() if dim is None else self
    d = 0 if dim is None else canonical_axis(dim, x.ndim)
    if x.ndim == 0: x = x.reshape(1)
    if isinstance(repeats, int):
      if repeats < 0: raise RuntimeError(f"repeats can not be negative, got {repeats}")
      shape = list(x.shape)
      x = x.unsqueeze(d + 1).expand(*shape[:d + 1], repeats, *shape[d + 1:])
      return x.flatten(d, d + 1)
    counts = [int(c) for c in (repeats.flatten().tolist() if hasattr(repeats, "uop") else repeats)]
    if len(counts) == 1: counts = counts * x.shape[d]
    if len(counts) != x.shape[d]:
      raise RuntimeError(f"repeats must have the same size as input along dim, but got "
                         f"repeats.size(0) = {len(counts)} and input.size({d}) = {x.shape[d]}")
    if any(c < 0 for c in counts): raise RuntimeError("repeats can not be negative")
    idx = [i for i, c in enumerate(counts) for _ in range(c)]
    if not idx: return x.shrink([(0, 0) if a == d else None for a in range(x.ndim)])
    return take(x, d, type(x)(idx, device=x.device, dtype=dtypes.int64))

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of `sizes` (an int: equal pieces, the last may be smaller) along `dim`."""
    d = canonical_axis(dim, self.ndim)
    n = self.shape[d]
    if isinstance(sizes, int):
      if sizes < 0: raise RuntimeError(f"split expects split_size be non-negative, but got {sizes}")
      if sizes == 0 and n:
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension "
                           f"size of {n}")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
    sizes = list(sizes)
    if sum(sizes) != n or any(s < 0 for s in sizes):
      raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input "
                         f"tensor's size at dimension {d}), but got split_sizes={sizes}")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(self.shrink([(b, b + s) if a == d else None for a in range(self.ndim)])
                 for b, s in zip(starts, sizes))

  def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most `chunks` pieces of ceil(size / chunks) along `dim`."""
    if chunks <= 0:
      raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = canonical_axis(dim, self.ndim)
    n = self.shape[d]
    if n == 0: return self.split([0] * chunks, d)
    return self.split(math.ceil(n / chunks), d)

  def unfold(self, dimension: int, size: int, step: int) -> Tensor:
    """Windows of `size` every `step` along `dimension`; the window is a new last axis.
    `Tensor.arange(5).unfold(0, 2, 2)` is `[[0, 1], [2, 3]]`."""
    x = self.reshape(1) if self.ndim == 0 else self
    d = canonical_axis(dimension, x.ndim)
    n = x.shape[d]
    if step <= 0: raise RuntimeError(f"step is {step} but must be > 0")
    if not 0 <= size <= n:
      raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    o = (n - size) // step + 1
    if size == 0:  # empty windows, still a view of x: backward gives x zeros (as PyTorch)
      empty = x.unsqueeze(-1).shrink(tuple((0, s) for s in x.shape) + ((0, 0),))
      return empty.reshape(*x.shape[:d], o, *x.shape[d + 1:], 0)
    moved, back = axis_to_last(x, d)
    out = pool(moved, (size,), (step,), (1,)).permute(*back, x.ndim)
    return out.reshape(size) if self.ndim == 0 else out

  def meshgrid(self, *others: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids of 0-D/1-D tensors; indexing 'ij' (matrix) or 'xy' (Cartesian)."""
    if indexing not in ("ij", "xy"):
      raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: '
                         f"{indexing}")
    ts = _tensors(self, others)
    if any(t.ndim > 1 for t in ts):
      raise RuntimeError(f"meshgrid expects all tensors to have 0 or 1 dimensions, got "
                         f"{[t.shape for t in ts]}")
    ts = [t.reshape(-1) for t in ts]
    swap = indexing == "xy" and len(ts) > 1
    if swap: ts[0], ts[1] = ts[1], ts[0]
    shape = [t.shape[0] for t in ts]
    grids = [t.reshape(*[-1 if j == i else 1 for j in range(len(ts))]).expand(shape)
             for i, t in enumerate(ts)]
    if swap: grids = [grids[1], grids[0], *grids[2:]]
    return tuple(grids)

  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (dim1, dim2) planes as a new last axis."""
    a, b = canonical_axis(dim1, self.ndim), canonical_axis(dim2, self.ndim)
    if a == b: raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    order = [i for i in range(self.ndim) if i not in (a, b)] + [a, b]
    x = self.permute(order)
    n, m = x.shape[-2], x.shape[-1]
    k = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    rows = (0, k) if offset >= 0 else (-offset, -offset + k)
    cols = (offset, offset + k) if offset >= 0 else (0, k)
    if k == 0: return x.shrink([None] * (x.ndim - 2) + [(0, 0), (0, 0)]).reshape(*x.shape[:-2], 0)
    x = x.shrink([None] * (x.ndim - 2) + [rows, cols]).flatten(-2)
    # row i of the padded (k, k+1) layout starts at element (i, i)
    x = x.pad([(0, 0)] * (x.ndim - 1) + [(0, k)]).reshape(*x.shape[:-1], k, k + 1)
    return x[..., 0]

  def diag(self, diagonal: int = 0) -> Tensor:
    """1-D -> the square matrix with it on diagonal `diagonal`; 2-D -> that diagonal."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")
    n, o = self.shape[0] + abs(diagonal), abs(diagonal)
    # element (i, j) holds v[min(i, j)] where j - i == diagonal
    v = self.pad(((0, o),))
    v = v.reshape(n, 1) if diagonal >= 0 else v.reshape(1, n)
    i = type(self).arange(n, device=self.device)
    on = (i.reshape(1, n) - i.reshape(n, 1)).eq(diagonal)
    return on.where(v, type(self).full((), 0, self.dtype, self.device))

  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Rotate elements by `shifts` along `dims` (the flattened tensor when None)."""
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    sh = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    ds = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(sh) != len(ds):
      raise RuntimeError(f"shifts and dimensions must align. shifts: {len(sh)}, dims:{len(ds)}")
    x = self
    for s, d in zip(sh, ds):
      a = canonical_axis(d, x.ndim)
      n = x.shape[a]
      if n == 0 or s % n == 0: continue
      r = s % n
      x = x.repeat(*[2 if i == a else 1 for i in range(x.ndim)])
      x = x.shrink([(n - r, 2 * n - r) if i == a else None for i in range(x.ndim)])
    return x

  def pad(self, padding: Sequence[Any], mode: Any = "constant",
          value: float | None = None) -> Tensor:
    """Pad with mode 'constant' (with `value`), 'reflect', 'replicate' or 'circular'. `padding`
    is ((before, after), ...) per axis or PyTorch's flat (last_before, last_after, ...); negative
    amounts crop. `x.pad((1, 1), mode="reflect")`"""
    if not isinstance(mode, str): mode, value = "constant", mode  # the older pad(padding, value)
    if mode not in PAD_MODES:
      raise NotImplementedError(f"Unrecognised padding mode {mode}: use one of {PAD_MODES}")
    constant_pad = super().pad  # type: ignore[misc]  (MovementMixin.pad, next in the MRO)
    if mode == "constant": return constant_pad(padding, 0.0 if value is None else value)
    if value is not None and value != 0:
      raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    pads = normalize_pads(padding, self.ndim)
    # negative amounts crop first; the mode then pads what is left
    x = self.shrink([(max(0, -b), s - max(0, -a)) for (b, a), s in zip(pads, self.shape)])
    for axis, (b, a) in enumerate(pads):
      if b > 0 or a > 0: x = _pad_axis(x, axis, max(0, b), max(0, a), mode)
    return x

  def triu(self, diagonal: int = 0) -> Tensor:
    """Keep the upper triangle (j - i >= diagonal) of the last two axes, zero the rest."""
    return self._triangle(diagonal, upper=True)

  def tril(self, diagonal: int = 0) -> Tensor:
    """Keep the lower triangle (j - i <= diagonal) of the last two axes, zero the rest."""
    return self._triangle(diagonal, upper=False)

  def _triangle(self, diagonal: int, upper: bool) -> Tensor:
    if self.ndim < 2:
      raise RuntimeError(f"{'triu' if upper else 'tril'}: input tensor must have at least 2 "
                         f"dimensions, got shape {self.shape}")
    n, m = self.shape[-2], self.shape[-1]
    i = type(self).arange(n, device=self.device).reshape(n, 1)
    j = type(self).arange(m, device=self.device).reshape(1, m)
    keep = (j - i >= diagonal) if upper else (j - i <= diagonal)
    return keep.where(self, type(self).full((), 0, self.dtype, self.device))

  # ---- softmax family ----
  def _softmax_input(self, dtype: Any) -> Tensor:
    """x in the compute dtype of the softmax family (16-bit floats in float32, like PyTorch)."""
    x = self.cast(dtype) if dtype is not None else self._float()
    return x.float() if x.dtype in LOW_FLOATS else x

  def _out_float(self, dtype: Any) -> DType:
    return self.cast(dtype).dtype if dtype is not None else least_upper_float(self.dtype)

  @takes_dim
  def softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis`, max-shifted. `Tensor([0., 0.]).softmax()` is
    `[.5, .5]`."""
    if self.ndim and self.shape[canonical_axis(axis, self.ndim)] == 0:
      return self.cast(least_upper_float(self.dtype))
    if dtype is None and self.ndim:
      axes = (canonical_axis(axis, self.ndim),)
      if (r := RowNodes.of(self.uop, axes)) is not None: return self._wrap(softmax_of(r, axes).uop)
    return softmax_of(self._softmax_input(dtype), axis)._cast(self._out_float(dtype))

  @takes_dim
  def softmin(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """softmax(-x) along `axis` (PyTorch's F.softmin)."""
    return (-self).softmax(axis, dtype)

  @takes_dim
  def log_softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """x - logsumexp(x) along `axis`."""
    if self.ndim and self.shape[canonical_axis(axis, self.ndim)] == 0:
      return self.cast(least_upper_float(self.dtype))
    m = shifted(self._softmax_input(dtype), axis)
    return (m - m.exp().sum(axis, keepdim=True).log())._cast(self._out_float(dtype))

  @takes_dim
  def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over `axis`, shifted by the max (infinite maxima shift by 0)."""
    x = self._float()
    if self.ndim and any(self.shape[a] == 0 for a in canonical_axes(axis, self.ndim)):
      return x.exp().sum(axis, keepdim).log()
    m = _finite_or_zero(x.max(axis, keepdim=True).detach())
    s = (x - m).exp().sum(axis, keepdim=True).log() + m
    if keepdim: return s
    axes = canonical_axes(axis, self.ndim)
    return s.reshape(*[e for i, e in enumerate(self.shape) if i not in axes])

  # ---- scans: out[i] reduces x[0..i], over the spec's prefix windows ----
  def _scan(self, axis: int, reduce_last: Any, fill: Any) -> Tensor:
    d = canonical_axis(axis, self.ndim)
    if self.ndim == 0 or self.shape[d] <= 1: return reduce_last(self.unsqueeze(-1))
    x, back = axis_to_last(self, d)
    n = x.shape[-1]
    x = x.pad([(0, 0)] * (x.ndim - 1) + [(n - 1, 0)], value=fill)
    return reduce_last(pool(x, (n,), (1,), (1,))).permute(back)

  @takes_dim
  def cumsum(self, axis: int = 0, dtype: Any = None) -> Tensor:
    """Prefix sums along `axis` (bool/ints accumulate in int64). `Tensor([1, 2, 3]).cumsum()` is
    `[1, 3, 6]`."""
    return self._scan(axis, lambda w: w.sum(-1, dtype=dtype), 0)

  @takes_dim
  def cumprod(self, axis: int = 0, dtype: Any = None) -> Tensor:
    """Prefix products along `axis`."""
    return self._scan(axis, lambda w: w.prod(-1, dtype=dtype), 1)

  @takes_dim
  def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(values, indices) of the running maximum; an index is the last position of the value."""
    values = self._scan(axis, lambda w: w.max(-1), self.dtype.min)
    return values, _scan_index(self, values, axis)

  @takes_dim
  def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(values, indices) of the running minimum."""
    values, indices = reversed_order(self).cummax(axis)
    return reversed_order(values), indices

  @takes_dim
  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, each prefix shifted by its running max."""
    def lse(w: Tensor) -> Tensor:
      m = _finite_or_zero(w.max(-1, keepdim=True).detach())
      return ((w - m).exp().sum(-1, keepdim=True).log() + m).squeeze(-1)
    return self._float()._scan(axis, lse, -math.inf)

  # ---- statistics ----
  @takes_dim
  def var(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
    """Variance over `axis` with `correction` (1: unbiased), dividing by max(0, N - correction)."""
    if not dtypes.is_float(self.dtype):
      raise RuntimeError(f"std and var only support floating point and complex dtypes, got "
                         f"{self.dtype!r}")
    n = math.prod(self.shape[a] for a in canonical_axes(axis, self.ndim)) if self.ndim else 1
    squares = (self - self.mean(axis, keepdim=True)).square()
    return squares.sum(axis, keepdim).div(max(0, n - correction))

  @takes_dim
  def std(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
    """Standard deviation: sqrt(var)."""
    return self.var(axis, keepdim, correction).sqrt()

  @takes_dim
  def var_mean(self, axis: Axis = None, keepdim: bool = False,
               correction: float = 1) -> tuple[Tensor, Tensor]:
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  @takes_dim
  def std_mean(self, axis: Axis = None, keepdim: bool = False,
               correction: float = 1) -> tuple[Tensor, Tensor]:
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  @takes_dim
  def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index (int64) of the first maximum along `axis` (of the flattened tensor when None); NaN
    counts as the maximum. `Tensor([1, 3, 3]).argmax()` is 1."""
    if axis is None:
      out = self.flatten().argmax(0)
      return out.reshape(*[1] * self.ndim) if keepdim else out
    d = canonical_axis(axis, self.ndim)
    if self.ndim == 0: return type(self).full((), 0, dtypes.int64, self.device)
    n = self.shape[d]
    if n == 0:
      raise IndexError(f"argmax(): Expected reduction dim {d} to have non-zero size (shape "
                       f"{self.shape})")
    hit = self.eq(self.max(d, keepdim=True))
    if dtypes.is_float(self.dtype): hit = hit | is_nan(self)
    # the first hit has the largest reversed index n - i
    rev = type(self).arange(n, 0, -1, device=self.device).reshape(n, *[1] * (self.ndim - d - 1))
    return hit.where(rev, 0).max(d, keepdim).sub(n, reverse=True)

  @takes_dim
  def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index (int64) of the first minimum along `axis`."""
    return reversed_order(self).argmax(axis, keepdim)

  # ---- logic ----
  @takes_dim
  def any(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
    """Whether any element along `axis` is nonzero (False over no elements)."""
    b = self if self.dtype == dtypes.bool else self.ne(0)
    if self.ndim and any(self.shape[a] == 0 for a in canonical_axes(axis, self.ndim)):
      return b.sum(axis, keepdim).ne(0)
    return b.max(axis, keepdim)

  @takes_dim
  def all(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
    """Whether every element along `axis` is nonzero (True over no elements)."""
    return self.logical_not().any(axis, keepdim).logical_not()

  def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
              equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other| elementwise (equal infinities are close)."""
    a, b = self._broadcasted(self, other)
    close = a.eq(b)
    if a.dtype == dtypes.bool: return close
    if not dtypes.is_float(a.dtype): a, b = a.double(), b.double()
    if equal_nan: close = close | (is_nan(a) & is_nan(b))
    err = (a - b).abs()
    return close | ((err < math.inf) & (err <= b.abs() * rtol + atol))

  def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
               equal_nan: bool = False) -> bool:
    """Whether every element is close (a Python bool: this realizes)."""
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

  # ---- elementwise compositions ----
  def clamp(self, min_: Any = None, max_: Any = None, *, min: Any = None,
            max: Any = None) -> Tensor:
    """min(max(x, min_), max_) with promotion; NaN propagates. Bounds are positional (tinygrad)
    or the keywords min/max (PyTorch). `x.clamp(0, 1)`"""
    lo, hi = (min_ if min_ is not None else min), (max_ if max_ is not None else max)
    if lo is None and hi is None:
      raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
    x = self.cast(result_type(self, *[v for v in (lo, hi) if v is not None]))
    for v in (lo, hi): check_int_value(v, x.dtype)  # a bound is a value of x's dtype
    if lo is not None: x = x.maximum(lo)
    return x if hi is None else x.minimum(hi)

  def clip(self, min_: Any = None, max_: Any = None, *, min: Any = None,
           max: Any = None) -> Tensor:
    return self.clamp(min_, max_, min=min, max=max)

  def lerp(self, end: Any, weight: Any) -> Tensor:
    """self + weight * (end - self), in PyTorch's two-sided form for accuracy."""
    a, b = self._broadcasted(self, end)
    if not dtypes.is_float(a.dtype):
      raise RuntimeError(f"lerp needs floating point, got {a.dtype!r}")
    if not hasattr(weight, "uop"):
      return a + (b - a) * weight if abs(weight) < 0.5 else b - (b - a) * (1 - weight)
    return (weight.abs() < 0.5).where(a + (b - a) * weight, b - (b - a) * (1 - weight))

  def sign(self) -> Tensor:
    """-1, 0 or 1 with the tensor's dtype (NaN gives 0)."""
    if self.dtype == dtypes.bool: return self._wrap(self.uop)
    pos = (self > 0).cast(self.dtype)
    out = pos if dtypes.is_unsigned(self.dtype) else pos - (self < 0).cast(self.dtype)
    if dtypes.is_float(self.dtype): override_gradient(out.uop, self.uop, _zero_grad)
    return out

  def copysign(self, other: Any) -> Tensor:
    """|self| with the sign bit of `other` (a float result; -0.0 and NaN signs count)."""
    dt = least_upper_float(result_type(self, other))
    a, b = self._broadcasted(self, other, dt)
    it = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[dt.itemsize]
    sign_bit = -(2 ** (8 * dt.itemsize - 1))
    bits = (a.bitcast(it) & ~sign_bit) | (b.bitcast(it) & sign_bit)
    out = bits.bitcast(dt)
    override_gradient(out.uop, a.uop, functools.partial(_copysign_grad, a.uop, out.uop))
    if b.uop is not a.uop: override_gradient(out.uop, b.uop, _zero_grad)
    return out

  def logaddexp(self, other: Any) -> Tensor:
    """log(exp(self) + exp(other)), computed as max + log(1 + exp(-|self - other|))."""
    a, b = self._broadcasted(self, other, least_upper_float(result_type(self, other)))
    same_inf = a.eq(b) & a.abs().eq(math.inf)
    return same_inf.where(a, a.maximum(b) + (a - b).abs().neg().exp().add(1).log())

  # ---- einsum ----
  @staticmethod
  def einsum(formula: str, *operands: Any, dtype: Any = None) -> Tensor:
    """Einstein summation over labelled axes; '...' broadcasts, repeated labels take diagonals,
    and without '->' the output is the labels used once, sorted. `Tensor.einsum("ij,jk->ik", a, b)`
    """
    if not operands: raise RuntimeError("einsum(): must provide at least one operand")
    xs = _tensors(operands[0], operands[1:])
    labels, out = _einsum_parse(formula.replace(" ", ""), xs)
    pairs = [_einsum_diagonals(x, lab) for x, lab in zip(xs, labels)]
    sizes = _einsum_sizes(pairs)
    full = out + sorted(set(sizes) - set(out))
    dt = result_type(*xs) if dtype is None else xs[0].cast(dtype).dtype
    acc = dtypes.float32 if dt in LOW_FLOATS else dt
    prod = None
    for x, lab in pairs:  # each operand laid out on all labels: output ones, then contracted
      dims = dict(zip(lab, x.shape))
      x = x.permute(sorted(range(len(lab)), key=lambda i, lab=lab: full.index(lab[i])))
      x = x.reshape(*[dims.get(c, 1) for c in full]).cast(acc).expand(*[sizes[c] for c in full])
      prod = x if prod is None else prod * x
    assert prod is not None
    if len(full) > len(out): prod = prod.sum(tuple(range(len(out), len(full))), dtype=acc)
    return prod.cast(dt)
