"""Data-dependent selection of Tensor: `masked_select` and `nonzero`.

Without `size` the result's length depends on the data: the mask is realized and counted on the
host, like PyTorch. With `size` (tinygrad's keyword; PyTorch's `torch.nonzero_static`) the shape
is fixed and nothing is realized: the j-th selected position is the number of positions whose
inclusive running count of selected elements is at most j (one comparison reduce over the
flattened input, O(N * size)), read with the direct gather; slots past the count hold
`fill_value`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unigrad.dtype import dtypes
from unigrad.frontend.indexing import take_rows, true_positions, unravel_positions
from unigrad.uop.properties import broadcast_shapes

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


def _check_size(size: Any, name: str) -> int:
  if isinstance(size, bool) or not isinstance(size, int) or size < 0:
    raise RuntimeError(f"{name}: 'size' must be an non-negative integer, got {size!r}")
  return size


def _static_positions(flat_mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
  """(positions, valid): the flat position of the j-th True of a 1-D bool mask for j < size
  (clamped into range past the count), and whether slot j holds one."""
  cls, n, dev = type(flat_mask), flat_mask.shape[0], flat_mask.device
  counts = flat_mask.cast(dtypes.int64).cumsum(0)
  slots = cls.arange(size, device=dev).reshape(size, 1)
  pos = (counts.reshape(1, n) <= slots).sum(-1, dtype=dtypes.int64)
  return pos.minimum(max(n - 1, 0)), pos < n


def _static_flat(flat_mask: Tensor, size: int, fill_value: int) -> Tensor:
  """The flat positions of the first `size` Trues, -1 past the count (coordinates then take
  fill_value there)."""
  if flat_mask.shape[0] == 0: return type(flat_mask).full((size,), -1, dtypes.int64,
                                                          flat_mask.device)
  pos, valid = _static_positions(flat_mask, size)
  return valid.where(pos, -1)


class SelectMixin:
  """masked_select, nonzero (with tinygrad's static `size`)."""

  def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """The elements where mask (broadcast with self) is True, as a 1-D tensor: realizes mask,
    or with `size` the first `size` of them padded with `fill_value` (lazy, fixed shape).
    `Tensor([1, 2, 3]).masked_select(Tensor([True, False, True]))` is `[1, 3]`."""
    x: Tensor = self  # type: ignore[assignment]
    if not hasattr(mask, "uop") or mask.dtype != dtypes.bool:
      raise RuntimeError(f"masked_select: expected BoolTensor for mask, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)!r}")
    shape = broadcast_shapes(x.shape, mask.shape)
    flat, flat_mask = x.expand(*shape).flatten(), mask.expand(*shape).flatten()
    if size is None: return take_rows(flat, true_positions(flat_mask))
    size = _check_size(size, "masked_select")
    if flat.shape[0] == 0: return type(x).full((size,), fill_value, x.dtype, x.device)
    pos, valid = _static_positions(flat_mask, size)
    return valid.where(take_rows(flat, pos), type(x).full((), fill_value, x.dtype, x.device))

  def nonzero(self, as_tuple: bool = False, size: int | None = None,
              fill_value: int = -1) -> Any:
    """The indices (int64) of the nonzero elements: (count, ndim), or one 1-D tensor per axis
    with as_tuple. Realizes self (the count depends on the data), unless `size` fixes the count
    (PyTorch's nonzero_static): the first `size` indices, rows past the count `fill_value`.
    `Tensor([0, 3, 4]).nonzero()` is `[[1], [2]]`."""
    x: Tensor = self  # type: ignore[assignment]
    flat_mask = x.flatten()
    flat_mask = flat_mask if flat_mask.dtype == dtypes.bool else flat_mask.ne(0)
    if size is None: pos = true_positions(flat_mask)
    else: pos = _static_flat(flat_mask, _check_size(size, "nonzero_static"), fill_value)
    coords = unravel_positions(pos, tuple(x.shape))
    if size is not None: coords = [(pos >= 0).where(c, fill_value) for c in coords]
    if as_tuple: return tuple(coords) if coords else (pos * 0,)
    if not coords: return type(x).full((pos.shape[0], 0), 0, dtypes.int64, x.device)
    return coords[0].stack(*coords[1:], dim=1)
