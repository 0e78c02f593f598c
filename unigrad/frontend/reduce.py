"""Reductions of Tensor (sum, prod, max, min, mean) and matmul as the spec's gemm composition."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from unigrad.dtype import LOW_FLOATS, DType, dtypes, sum_acc_dtype, to_dtype, to_numpy_name
from unigrad import engine
from unigrad.frontend.dtypes import result_type
from unigrad.frontend.elementwise import LOG2E, expand_node, scalar_operand
from unigrad.frontend.movement import canonical_axis
from unigrad.uop import Ops, ReduceArg, UOp, shape_uop

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

Axis = int | Sequence[int] | None
HALF_LIKE = frozenset(LOW_FLOATS)  # floats that accumulate in float32
PLAIN_FLOATS = frozenset((dtypes.float32, dtypes.float64))  # floats that accumulate in themselves
# A float sum over more than LONG_FLOAT_SUM elements is summed in chunks of FLOAT_SUM_CHUNK (then
# the chunk sums, again in chunks): one accumulator over 2**31 float32 ones stops at 2**24.
LONG_FLOAT_SUM = 2 ** 22
FLOAT_SUM_CHUNK = 2 ** 14


_Method = TypeVar("_Method", bound=Callable[..., Any])


def takes_dim(method: _Method) -> _Method:
  """`method` (whose first argument is tinygrad's `axis`) taking PyTorch's `dim=` keyword for
  it too: `x.sum(dim=1)` is `x.sum(axis=1)` (`x.sum(1)` is both)."""
  @functools.wraps(method)
  def with_dim(self: Any, *args: Any, **kwargs: Any) -> Any:
    if "dim" in kwargs:
      if args or "axis" in kwargs:
        raise TypeError(f"{method.__name__}() got the reduced axis twice (as 'dim' and 'axis')")
      kwargs["axis"] = kwargs.pop("dim")
    return method(self, *args, **kwargs)
  return with_dim  # type: ignore[return-value]


class ValuesIndices(NamedTuple):
  """PyTorch's result of `max(dim=...)`, `min(dim=...)` (torch.return_types.max)."""
  values: Tensor
  indices: Tensor


def canonical_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
  """The reduced axes, canonical. None and () mean every axis, as in PyTorch."""
  if axis is None: return tuple(range(ndim))
  if isinstance(axis, int) and not isinstance(axis, bool): items: tuple = (axis,)
  elif isinstance(axis, (tuple, list)): items = tuple(axis)
  else: raise TypeError(f"axis must be an int, a sequence of ints or None: {type(axis).__name__}")
  if not items: return tuple(range(ndim))
  axes = tuple(canonical_axis(a, ndim) for a in items)
  if len(set(axes)) != len(axes):
    raise ValueError(f"dim {axis} appears multiple times in the list of dims")
  return axes


def any_true(*conds: Tensor) -> list[bool]:
  """Whether each bool tensor has a True element, computed together in one realize. Checks of
  values (class indices in range, valid probabilities) run eagerly like PyTorch's CPU kernels,
  which raise at the call: a small reduction and one sync per checked call. Values that cannot
  be read now are not checked (all False): placeholders of a function being traced, and any value
  while a TinyJit capture runs (its eager first call checked them; replays run no Python)."""
  if engine.capturing or any(_is_traced(c.uop) for c in conds): return [False] * len(conds)
  flags = [c.any() for c in conds]
  if flags: type(flags[0]).realize_all(*flags)
  return [bool(f.item()) for f in flags]


def host_values(t: Tensor) -> Any:
  """The values of an int or bool tensor, flat, read to the host (realizes it): a numpy array
  when numpy is installed (fast), else a memoryview of the buffer."""
  x = t if engine.is_realized(t.uop) else t.contiguous().realize()
  raw = engine.copyout(x.uop)
  try: import numpy as np  # noqa: PLC0415 (numpy is optional: the fast path)
  except ImportError: return raw.cast(t.dtype.fmt or "B")
  return np.frombuffer(raw, dtype=to_numpy_name(t.dtype))


def _is_traced(u: UOp) -> bool:
  """Whether `u` depends on a FUNCTION placeholder (an unnamed PARAM): a value being traced."""
  return any(n.op is Ops.PARAM and n.arg.name is None for n in u.toposort())


def _acc_dtype(dt: DType) -> DType:
  """PyTorch accumulates 16-bit floats in float32 and rounds the result once."""
  return dtypes.float32 if dt in HALF_LIKE else dt


def _matmul_node(x: Tensor, y: Tensor, dtype: DType | None) -> UOp | None:
  """The node `matmul` builds for x (..., M, K) @ y (K, N) or (..., K, N) with the same batch
  dims, both of one float32/float64 dtype and static shapes, K not chunked (a model's linear
  layers and attention), made straight from nodes: the same graph, without its eight tensors and
  their checks. None for anything else (the general path)."""
  ux, uy, node = x.uop, y.uop, x._node
  xs, ys, dt = ux.shape, uy.shape, ux.dtype
  if uy.dtype is not dt or dt not in PLAIN_FLOATS: return None  # (an equal copy: the general path)
  if dtype is not None and dtype != dt: return None
  if len(xs) < 2 or len(ys) < 2 or (len(ys) > 2 and ys[:-2] != xs[:-2]): return None
  if x._device != y._device: return None
  for d in xs + ys:  # static shapes only
    if type(d) is not int: return None
  (m, k), (k2, n) = xs[-2:], ys[-2:]
  if k != k2 or k > LONG_FLOAT_SUM: return None
  # x.unsqueeze(-1) * y.unsqueeze(-3), each node as the tensor op wrapping it holds it
  xu = node(UOp(_RESHAPE, dt, (node(ux), shape_uop((*xs, 1)))))
  yu = node(UOp(_RESHAPE, dt, (node(uy), shape_uop((*ys[:-2], 1, k, n)))))
  shape = (*xs[:-2], m, k, n)
  prod = node(UOp(_MUL, dt, (expand_node(xu, shape, node), expand_node(yu, shape, node))))
  # .sum(-2): a REDUCE keeping the axis, then the reshape dropping it
  total = node(UOp(_REDUCE, dt, (prod,), ReduceArg(_ADD, (len(shape) - 2,))))
  return node(UOp(_RESHAPE, dt, (total, shape_uop((*xs[:-2], m, n)))))


# looked up once: `Ops.X` costs 70 ns on Python 3.11 (its enum metaclass's __getattr__)
_RESHAPE, _MUL, _REDUCE, _ADD = Ops.RESHAPE, Ops.MUL, Ops.REDUCE, Ops.ADD


Rows = TypeVar("Rows", "Tensor", "RowNodes")  # what a row formula runs on


class RowNodes:
  """A float32 or float64 node of static shape with the Tensor methods that the row formulas
  (composite.softmax_of, nnops.layernorm_of) call, each building the nodes the Tensor method
  builds (a number is `scalar_operand`'s constant, x - y is x + y*-1, an operand of another
  shape is expanded to this one), without a Tensor per step: an attention layer normalizes
  every head. The formula is written once and runs on a Tensor or on RowNodes. The shape is
  carried along (not derived from each new node), and the nodes are not detached step by step
  under no_grad (the Tensor that wraps the result is)."""
  __slots__ = ("uop", "shape")

  def __init__(self, uop: UOp, shape: tuple[int, ...]) -> None: self.uop, self.shape = uop, shape

  @staticmethod
  def of(u: UOp, axes: tuple[int, ...]) -> RowNodes | None:
    """`u` as RowNodes where the Tensor methods would build no more than they do (reductions
    over `axes` of a float32/float64 value of static shape, not summed in chunks); else None."""
    shape = u.shape
    if u.dtype not in PLAIN_FLOATS or not axes: return None
    if not all(type(s) is int for s in shape): return None
    return RowNodes(u, shape) if 0 < math.prod(shape[a] for a in axes) <= LONG_FLOAT_SUM else None

  def _operand(self, y: RowNodes | float) -> UOp:
    """`y` as the second source of an elementwise op on this node, broadcast to its shape."""
    if not isinstance(y, RowNodes): return scalar_operand(self.uop.dtype, y, self.shape)
    if y.shape == self.shape: return y.uop
    return UOp(Ops.EXPAND, y.uop.dtype, (y.uop, shape_uop(self.shape)))

  def _new(self, op: Ops, *src: UOp) -> RowNodes:
    return RowNodes(UOp(op, self.uop.dtype, src), self.shape)

  def _reduce(self, op: Ops, axis: tuple[int, ...], keepdim: bool) -> RowNodes:
    assert keepdim, "the row formulas keep the reduced axes"
    rows = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
    return RowNodes(UOp(_REDUCE, self.uop.dtype, (self.uop,), ReduceArg(op, axis)), rows)

  def add(self, y: RowNodes | float) -> RowNodes: return self._new(_ADD, self.uop, self._operand(y))
  def mul(self, y: RowNodes | float) -> RowNodes: return self._new(_MUL, self.uop, self._operand(y))

  def div(self, y: RowNodes | float) -> RowNodes:
    return self._new(_MUL, self.uop, UOp(Ops.RECIP, self.uop.dtype, (self._operand(y),)))

  def __sub__(self, y: RowNodes) -> RowNodes:
    minus_y = UOp(_MUL, self.uop.dtype, (self._operand(y), self._operand(-1)))
    return self._new(_ADD, self.uop, minus_y)

  def __mul__(self, y: RowNodes | float) -> RowNodes: return self.mul(y)
  def exp(self) -> RowNodes: return self._new(Ops.EXP2, self.mul(LOG2E).uop)
  def sqrt(self) -> RowNodes: return self._new(Ops.SQRT, self.uop)
  def reciprocal(self) -> RowNodes: return self._new(Ops.RECIP, self.uop)
  def detach(self) -> RowNodes: return self._new(Ops.DETACH, self.uop)
  def max(self, axis: tuple[int, ...], keepdim: bool) -> RowNodes:
    return self._reduce(Ops.MAX, axis, keepdim)
  def sum(self, axis: tuple[int, ...], keepdim: bool) -> RowNodes:
    return self._reduce(_ADD, axis, keepdim)

  def mean(self, axis: tuple[int, ...], keepdim: bool) -> RowNodes:
    return self.sum(axis, keepdim).div(math.prod(self.shape[a] for a in axis))


class ReduceMixin:
  """sum, prod, max, min, mean over any axes with keepdim; matmul."""
  uop: UOp

  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError
  def _const(self, value: Any, dtype: DType) -> Tensor: raise NotImplementedError
  def _cast(self, dtype: DType) -> Tensor: raise NotImplementedError
  def _reshape_to(self, new: Sequence[Any]) -> Tensor: raise NotImplementedError

  def _reduce(self, op: Ops, axis: Axis, keepdim: bool) -> Tensor:
    axes = canonical_axes(axis, self.ndim)
    if self.ndim == 0: return self._wrap(self.uop)
    # over a zero-size axis too: the loop runs no trips and gives the identity, and x stays in the
    # graph, so backward() gives x (and what made x) zero gradients like PyTorch
    ret = self._wrap(UOp(Ops.REDUCE, self.uop.dtype, (self.uop,), ReduceArg(op, axes)))
    if keepdim: return ret
    kept = [s for i, s in enumerate(self.shape) if i not in axes]
    return ret._reshape_to(kept) if all(type(s) is int for s in kept) else ret.reshape(*kept)

  def _accumulate(self, op: Ops, dtype: Any, axis: Axis, keepdim: bool) -> Tensor:
    dt = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    x = self._cast(_acc_dtype(dt))
    s = x._chunked_sum(axis, keepdim) if op is Ops.ADD and dtypes.is_float(x.dtype) else None
    return (s if s is not None else x._reduce(op, axis, keepdim))._cast(dt)

  def _chunked_sum(self, axis: Axis, keepdim: bool) -> Tensor | None:
    """A sum over more than LONG_FLOAT_SUM elements as sums of chunks (None for shorter ones):
    the reduced axes moved last and flattened, zero-padded to whole chunks."""
    axes = canonical_axes(axis, self.ndim) if self.ndim else ()
    shape = self.shape
    if not all(isinstance(d, int) for d in shape): return None
    n = math.prod(shape[a] for a in axes)
    if n <= LONG_FLOAT_SUM: return None
    keep = [i for i in range(self.ndim) if i not in axes]
    outer = [shape[i] for i in keep]
    y = self.permute(*keep, *axes).reshape(*outer, n)
    while n > FLOAT_SUM_CHUNK:
      m = -(-n // FLOAT_SUM_CHUNK)
      y = y.pad(((0, 0),) * len(outer) + ((0, m * FLOAT_SUM_CHUNK - n),))
      y = y.reshape(*outer, m, FLOAT_SUM_CHUNK)._reduce(Ops.ADD, -1, False)
      n = m
    y = y._reduce(Ops.ADD, -1, False)
    return y.reshape(*[1 if i in axes else d for i, d in enumerate(shape)]) if keepdim else y

  @takes_dim
  def sum(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Sum over `axis` (all by default); bool and integers accumulate in int64 like PyTorch.
    `Tensor([[1, 2], [3, 4]]).sum(0)` is `[4, 6]`."""
    return self._accumulate(Ops.ADD, dtype, axis, keepdim)

  @takes_dim
  def prod(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Product over `axis`; bool and integers accumulate in int64 like PyTorch."""
    return self._accumulate(Ops.MUL, dtype, axis, keepdim)

  def _check_nonempty(self, name: str, axis: Axis) -> None:
    """A reduction with no identity (max, min) of nothing raises, with PyTorch's types: an
    IndexError naming the zero-size axis, a RuntimeError for a whole-tensor reduction."""
    empty = [a for a in canonical_axes(axis, self.ndim) if self.ndim and self.shape[a] == 0]
    if not empty: return
    if axis is None:
      raise RuntimeError(f"{name}(): cannot reduce a zero-size tensor of shape {self.shape} "
                         "(there is no identity): give the reduction axis with 'axis'")
    raise IndexError(f"{name}(): expected reduction dim {empty[0]} to have non-zero size, got a "
                     f"tensor of shape {self.shape} (there is no identity)")

  def max(self, axis: Axis = None, keepdim: bool = False, *, dim: int | None = None) -> Any:
    """Maximum over `axis` (NaN propagates). `Tensor([1, 3, 2]).max()` is 3. With PyTorch's
    `dim=` keyword it is PyTorch's `(values, indices)` pair (`x.max(1)` is tinygrad's: the
    values)."""
    if dim is not None: return self._with_indices("max", axis, dim, keepdim)
    self._check_nonempty("max", axis)
    return self._reduce(Ops.MAX, axis, keepdim)

  def min(self, axis: Axis = None, keepdim: bool = False, *, dim: int | None = None) -> Any:
    """Minimum over `axis`: -max(-x) for floats, ~max(~x) for integers and bools. `dim=` gives
    PyTorch's `(values, indices)` pair, as for max."""
    if dim is not None: return self._with_indices("min", axis, dim, keepdim)
    self._check_nonempty("min", axis)
    if dtypes.is_float(self.dtype): return self.neg().max(axis, keepdim).neg()
    return self.bitwise_not().max(axis, keepdim).bitwise_not()

  def _with_indices(self, name: str, axis: Axis, dim: int, keepdim: bool) -> ValuesIndices:
    if axis is not None: raise TypeError(f"{name}() got the reduced axis twice (as 'dim' and "
                                         "'axis')")
    values = getattr(self, name)(dim, keepdim)
    return ValuesIndices(values, getattr(self, f"arg{name}")(dim, keepdim))

  @takes_dim
  def mean(self, axis: Axis = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Arithmetic mean over `axis` (needs a float tensor or dtype, like PyTorch; a bool tensor
    gives the fraction of True in the default float dtype, as in tinygrad: `(pred == y).mean()`);
    the mean of no elements is NaN. `Tensor([1., 2.]).mean()` is 1.5."""
    dt = to_dtype(dtype) if dtype is not None else \
        dtypes.default_float if self.dtype == dtypes.bool else self.dtype
    if not dtypes.is_float(dt):
      raise RuntimeError(f"mean(): input dtype should be floating point, got {dt!r}")
    n = math.prod(self.shape[a] for a in canonical_axes(axis, self.ndim)) if self.ndim else 1
    s = self._cast(_acc_dtype(dt)).sum(axis, keepdim)
    return (s.div(n) if n else s.mul(math.nan))._cast(dt)

  # ---- matmul ----
  def matmul(self, w: Tensor, dtype: DType | None = None) -> Tensor:
    """Matrix product with broadcasting batch dims, as the spec's gemm composition:
    (A.reshape(M,K,1) * B.reshape(1,K,N)).sum(K). `a @ b`"""
    x, y = self, w
    if not hasattr(y, "uop"):
      raise TypeError(f"matmul: the other operand must be a Tensor, got {type(w).__name__} {w!r}")
    xs, ys = x.uop.shape, y.uop.shape  # read once: every eager matmul passes these checks
    if not xs or not ys:
      raise RuntimeError(f"matmul needs two tensors of at least 1 dim, got {xs} and {ys}")
    if xs[-1] != ys[-min(len(ys), 2)]:
      sx, sy = "x".join(map(str, xs)), "x".join(map(str, ys))
      raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({sx} and {sy})")
    if (fast := _matmul_node(x, y, dtype)) is not None: return self._wrap(fast)
    dt = result_type(x, y) if dtype is None else dtype
    if dt == dtypes.bool: raise TypeError("matmul of bool tensors is not supported: cast first")
    x, y = x._cast(_acc_dtype(dt)), y._cast(_acc_dtype(dt))
    xv, yv = x.ndim == 1, y.ndim == 1
    if xv: x = x.reshape(1, x.shape[0])
    if yv: y = y.reshape(y.shape[0], 1)
    out = (x.unsqueeze(-1) * y.unsqueeze(-3)).sum(-2, dtype=_acc_dtype(dt))._cast(dt)
    if xv: out = out.squeeze(-2)
    if yv: out = out.squeeze(-1)
    return out

  def dot(self, w: Tensor) -> Tensor: return self.matmul(w)
  def __matmul__(self, w: Tensor) -> Tensor: return self.matmul(w)

  def __rmatmul__(self, w: Tensor) -> Tensor:
    if not hasattr(w, "uop"):
      raise TypeError(f"matmul: the other operand must be a Tensor, got {type(w).__name__} {w!r}")
    return w.matmul(self)

