"""Elementwise ops of Tensor with PyTorch broadcasting and type promotion.

Binary ops promote with `result_type`, broadcast both operands to one shape with explicit
RESHAPE/EXPAND, and emit the spec's primitive ops; decomposed ops (SUB, DIV, CMPGE, ...) are
emitted in their primitive form. Float comparisons are built so NaN compares false like PyTorch.

exp is EXP2(x*log2(e)); codegen lowers that pair as a whole, so the rounded product costs no
accuracy (`codegen.transcendental.xexp`). cos has no op of its own: `compose_cos` builds it from SIN
of exact arguments (x and 2x), accurate for every argument, unlike sin(pi/2 - x), whose rounded
argument loses up to 2**-24*|x| (float32).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad.dtype import (FLOATS, LOW_FLOATS, SINTS, UINTS, DType, dtypes, least_upper_float,
                           to_dtype)
from unigrad.frontend.dtypes import check_int_operand, check_int_value, result_type, scalar_dtype
from unigrad.helpers import bounded_put
from unigrad.uop import Ops, UOp, shape_uop
from unigrad.uop.properties import broadcast_shapes

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

Operand = Any  # a Tensor or a Python number


# float // and % compute in a wider float, where floor(a/b)*b and a - q*b are exact, so they
# round once like PyTorch's fmod-based kernels
WIDER_FLOAT = {**{dt: dtypes.float32 for dt in LOW_FLOATS}, dtypes.float32: dtypes.float64}


def _is_float(t: Tensor) -> bool: return dtypes.is_float(t.dtype)


def _int_pow_const(a: Tensor, e: int) -> Tensor:
  """a**e for a Python int e >= 0 by repeated squaring: exact, wrapping in a's dtype."""
  out, base = a * 0 + 1, a
  while e:
    if e & 1: out = out * base
    e >>= 1
    if e: base = base * base
  return out


def _int_pow(a: Tensor, b: Tensor) -> Tensor:
  """a**b for integer tensors, one squaring per exponent bit; a negative b gives 1 for a == 1,
  +-1 for a == -1 and 0 otherwise (PyTorch's integer pow)."""
  e = (b < 0).where(0, b)
  out, base = a * 0 + 1, a
  for i in range(8 * b.dtype.itemsize - (0 if dtypes.is_unsigned(b.dtype) else 1)):
    out = ((e >> i) & 1).ne(0).where(out * base, out)
    base = base * base
  odd = (b & 1).ne(0)
  neg = a.eq(1).where(1, a.eq(-1).where(odd.where(-1, 1), 0)).cast(a.dtype)
  return (b < 0).where(neg, out)
def _is_inf(t: Tensor) -> Tensor: return t.eq(math.inf) | t.eq(-math.inf)


def _opposite_signs(a: Tensor, b: Tensor) -> Tensor:
  """a and b nonzero with different signs."""
  return a.ne(0) & (a < 0).ne(b < 0)


UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def _split_words(bits: Tensor, dt: DType) -> Tensor:
  """Unsigned words (..., n) -> (..., n*r) smaller words as `dt`, least significant first."""
  r, width = bits.dtype.itemsize // dt.itemsize, 8 * dt.itemsize
  small = UINT_OF_SIZE[dt.itemsize]
  parts = [(bits >> (width * k)).cast(small).unsqueeze(-1) for k in range(r)]
  pads = [[(0, 0)] * bits.ndim + [(k, r - 1 - k)] for k in range(r)]
  out = parts[0].pad(pads[0])
  for part, pad in zip(parts[1:], pads[1:]): out = out | part.pad(pad)
  return out.reshape(*bits.shape[:-1], bits.shape[-1] * r).bitcast(dt)


def _join_words(bits: Tensor, dt: DType) -> Tensor:
  """Unsigned words (..., n) -> (..., n/r) words r times bigger as `dt` (little endian)."""
  r, width = dt.itemsize // bits.dtype.itemsize, 8 * bits.dtype.itemsize
  big = UINT_OF_SIZE[dt.itemsize]
  x = bits.reshape(*bits.shape[:-1], bits.shape[-1] // r, r).cast(big)
  out = x[..., 0]
  for k in range(1, r): out = out | (x[..., k] << (width * k))
  return out.bitcast(dt)


def _operand_dtype(x: Operand) -> DType:
  return x.dtype if hasattr(x, "uop") else scalar_dtype(x)


# ---- exp and cos (tensor-graph UOps, so autograd differentiates them) ----

# float16/bfloat16 compute in float32 and round once at the end, as PyTorch does
COMPUTE_DTYPE = {**{dt: dtypes.float32 for dt in LOW_FLOATS}, dtypes.float32: dtypes.float32,
                 dtypes.float64: dtypes.float64}
LOG2E = 1 / math.log(2)


# |x| from which 2*x overflows (compose_cos switches to sin(x/2) there)
COS_HUGE = {dtypes.float32: 2.0 ** 127, dtypes.float64: 2.0 ** 1023}


def compose_cos(x: UOp) -> UOp:
  """cos(x) from s = sin(x) and d = sin(2x) = 2*s*cos(x), both of exact arguments: d/(2s) where
  |s| > 1/2, else +-sqrt(1 - s*s) (|cos| >= 0.86 there) with the sign of d/s. Where 2x would
  overflow, 1 - 2*sin(x/2)**2 (in [-1, 1], absolute error ~1 ulp of 1). Branches not taken see
  safe values, so their gradients stay finite."""
  dt = COMPUTE_DTYPE[x.dtype]
  if dt != x.dtype: return compose_cos(x.cast(dt)).cast(x.dtype)
  ax = (x < 0).where(x * -1, x)
  huge = (ax < COS_HUGE[dt]).logical_not()  # nan and inf too: sin gives nan for them
  s = x.sin()
  d = huge.where(x * 0.5, x * 2.0).sin()
  big = (s < -0.5) | (UOp.const(dt, 0.5) < s)
  s_small = big.where(UOp.const(dt, 0.0), s)
  root = (s_small * s_small * -1 + 1.0).sqrt()
  by_ratio = d * (big.where(s, UOp.const(dt, 1.0)) * 2.0).recip()
  c = big.where(by_ratio, (d < 0).ne(s < 0).where(root * -1, root))
  return huge.where(d * d * -2.0 + 1.0, c)


# Python number types whose promotion with a tensor of these dtypes keeps the tensor's dtype
_KEEPS_DTYPE: dict[type, frozenset[DType]] = {float: frozenset(FLOATS),
                                              int: frozenset((*FLOATS, *SINTS, *UINTS))}
NUMBERS = (int, float, bool)  # the Python number types an op takes (exactly these types)
_scalar_operands: dict[tuple, UOp] = {}
SCALAR_OPERAND_CACHE = 1024


def scalar_operand(dt: DType, v: int | float, shape: tuple) -> UOp:
  """CONST(v) as `dt` broadcast to `shape` (RESHAPE to ones, then EXPAND: what `expand` builds),
  cached: an eager loop asks for the same few constants at every step."""
  # a float keys by value but for zeros (0.0 == -0.0) and nans (never equal): by their bits
  key = (dt, v.hex() if type(v) is float and not (v and v == v) else v, shape)
  if (u := _scalar_operands.get(key)) is not None: return u
  check_int_operand(v, dt)  # where every Python number operand becomes a constant
  u = UOp.const(dt, v)
  if shape:
    u = UOp(Ops.RESHAPE, dt, (u, shape_uop((1,) * len(shape))))
    u = UOp(Ops.EXPAND, dt, (u, shape_uop(shape)))
  return bounded_put(_scalar_operands, key, u, SCALAR_OPERAND_CACHE)


def _scalar_uops(x: Operand, y: Operand) -> tuple[UOp, UOp] | None:
  """The operands' nodes, in order, when one is a tensor and the other a Python number that
  keeps the tensor's dtype (the eager hot path: the broadcast constant comes from
  `scalar_operand`'s cache instead of three new nodes); None otherwise."""
  tensor_first = hasattr(x, "uop")
  t, v = (x, y) if tensor_first else (y, x)
  if not hasattr(t, "uop") or (c := _scalar_beside(t.uop, v)) is None: return None
  return (t.uop, c) if tensor_first else (c, t.uop)


def _scalar_beside(u: UOp, v: Any) -> UOp | None:
  """The broadcast constant for a Python number `v` beside a tensor's node `u` when `v` keeps
  u's dtype (`scalar_operand`); None when promotion has a say (or `v` is no number)."""
  if (keeps := _KEEPS_DTYPE.get(type(v))) is None or u.dtype not in keeps: return None
  return scalar_operand(u.dtype, v, u.shape)


def expand_node(u: UOp, shape: tuple, node: Callable[[UOp], UOp]) -> UOp:
  """`u` broadcast to `shape` (as many or more dims, sizes equal or from 1: what
  `broadcast_shapes` gives) as `Tensor.expand` builds it; `node` is the tensor's `_node`, which
  each of the tensors it would make applies."""
  old = u.shape
  if shape == old: return node(u)
  if len(shape) != len(old):
    u = UOp(_RESHAPE, u.dtype, (u, shape_uop((1,) * (len(shape) - len(old)) + tuple(old))))
  return node(UOp(_EXPAND, u.dtype, (u, shape_uop(shape))))


_RESHAPE, _EXPAND = Ops.RESHAPE, Ops.EXPAND  # looked up once (`Ops.X` is slow on Python 3.11)
_COMPARES = frozenset((Ops.CMPLT, Ops.CMPNE))  # the binary ops with a bool result


class ElementwiseMixin:
  """Arithmetic, comparison, bitwise, transcendental and dtype ops."""
  uop: UOp
  _device: Any

  # ---- plumbing ----
  def _const(self, value: Any, dtype: DType) -> Tensor: raise NotImplementedError
  def _wrap(self, u: UOp) -> Tensor: raise NotImplementedError
  def _node(self, u: UOp) -> UOp: raise NotImplementedError

  def _to_tensor(self, x: Operand, dtype: DType) -> Tensor:
    if hasattr(x, "uop"): return x.cast(dtype)
    if isinstance(x, UOp) and x.dtype == dtypes.index and x.shape == ():  # a symbolic size
      return self._wrap(x.cast(dtype))
    if not isinstance(x, (int, float, bool)):
      raise TypeError(f"unsupported operand type {type(x).__name__} for a Tensor op")
    return self._const(x, dtype)

  def _to_node(self, x: Operand, dtype: DType) -> UOp:
    """The node of `_to_tensor(x, dtype)`, without making the tensor."""
    if hasattr(x, "uop"):
      u = x.uop
      return self._node(u if dtype is u.dtype or dtype == u.dtype else UOp(Ops.CAST, dtype, (u,)))
    if isinstance(x, UOp) and x.dtype == dtypes.index and x.shape == ():  # a symbolic size
      return self._node(x.cast(dtype))
    if not isinstance(x, (int, float, bool)):
      raise TypeError(f"unsupported operand type {type(x).__name__} for a Tensor op")
    check_int_operand(x, dtype)
    return UOp.const(dtype, x)

  def _broadcasted(self, x: Operand, y: Operand, dtype: DType | None = None,
                   reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Both operands as tensors of one dtype (promoted unless `dtype`) and one shape."""
    ux, uy = self._broadcast_nodes(x, y, dtype, reverse)
    return self._wrap(ux), self._wrap(uy)

  def _broadcast_nodes(self, x: Operand, y: Operand, dtype: DType | None = None,
                       reverse: bool = False) -> tuple[UOp, UOp]:
    """The nodes of `_broadcasted`'s two tensors, without making them (or the tensors that the
    casts and expands in between would make)."""
    if reverse: x, y = y, x
    if dtype is None and hasattr(x, "uop") and hasattr(y, "uop"):
      ux, uy = x.uop, y.uop  # two tensors of one dtype on one device: nothing to promote or check
      same_dtype = ux.dtype is uy.dtype or ux.dtype == uy.dtype
      if same_dtype and x._device == y._device == self._device:
        n = self._node
        if ux.shape == uy.shape: return n(ux), n(uy)
        shape = broadcast_shapes(ux.shape, uy.shape)  # a bias, a residual: broadcast only
        return expand_node(n(ux), shape, n), expand_node(n(uy), shape, n)
    elif dtype is None and (fast := _scalar_uops(x, y)) is not None:
      return self._node(fast[0]), self._node(fast[1])
    self._check_devices(x, y)
    if dtype is None:  # two tensors of one dtype keep it: result_type's answer, without its work
      same = hasattr(x, "uop") and hasattr(y, "uop") and x.uop.dtype == y.uop.dtype
      dtype = x.uop.dtype if same else result_type(x, y)
    # a Python number waits for the shape: its broadcast constant comes from scalar_operand
    ux = None if type(x) in NUMBERS else self._to_node(x, dtype)
    uy = None if type(y) in NUMBERS else self._to_node(y, dtype)
    shape = broadcast_shapes(() if ux is None else ux.shape, () if uy is None else uy.shape)
    return self._operand_node(ux, x, dtype, shape), self._operand_node(uy, y, dtype, shape)

  def _operand_node(self, u: UOp | None, v: Operand, dtype: DType, shape: tuple) -> UOp:
    """Node `u` broadcast to `shape`, or for a Python number `v` (u None) its constant."""
    if u is None: return self._node(scalar_operand(dtype, v, shape))
    return expand_node(u, shape, self._node)

  def _check_devices(self, *xs: Operand) -> None:
    for t in xs:
      if hasattr(t, "uop") and t.device != self.device:
        raise RuntimeError(f"expected all tensors on one device, got {self.device} and {t.device}")

  def _binary(self, op: Ops, other: Operand, reverse: bool = False,
              dtype: DType | None = None) -> Tensor:
    u = self.uop
    if dtype is None and (c := _scalar_beside(u, other)) is not None:  # the eager hot path
      u, c = self._node(u), self._node(c)
      out = dtypes.bool if op in _COMPARES else u.dtype
      return self._wrap(UOp(op, out, (c, u) if reverse else (u, c)))
    x, y = self._broadcast_nodes(self, other, dtype, reverse)
    out = dtypes.bool if op in _COMPARES else x.dtype
    return self._wrap(UOp(op, out, (x, y)))

  def _unary(self, op: Ops) -> Tensor: return self._wrap(UOp(op, self.uop.dtype, (self.uop,)))

  def _cast(self, dtype: DType) -> Tensor:
    """`cast` for an operand inside an op: self itself when the cast would change nothing (the
    same node), so no Tensor is made for it. Never return its result to the caller as is."""
    u = self.uop
    if (dtype is u.dtype or dtype == u.dtype) and self._node(u) is u:
      return self  # type: ignore[return-value]
    return self.cast(dtype)

  def _float(self) -> Tensor:
    """This tensor as a float (`_cast`: possibly self, for use as an operand)."""
    return self._cast(least_upper_float(self.dtype))

  # ---- arithmetic ----
  def add(self, x: Operand, reverse: bool = False) -> Tensor:
    """Elementwise sum with broadcasting. `a.add(b)` or `a + b`."""
    return self._binary(Ops.ADD, x, reverse)

  def mul(self, x: Operand, reverse: bool = False) -> Tensor:
    """Elementwise product with broadcasting."""
    return self._binary(Ops.MUL, x, reverse)

  def sub(self, x: Operand, reverse: bool = False) -> Tensor:
    """a - b, as the spec's ADD(a, NEG(b)). Like PyTorch, no operand may be bool."""
    if dtypes.bool in (self.dtype, _operand_dtype(x)):
      raise TypeError("subtraction with a bool operand is not supported: use logical_xor or ^")
    ua, ub = self._broadcast_nodes(self, x, reverse=reverse)
    # a.add(b.neg()) on the nodes its tensors would hold; neg is b * -1 (a constant tensor)
    n = self._node
    minus_one = expand_node(n(UOp.const(ub.dtype, -1)), ub.shape, n)
    return self._wrap(UOp(Ops.ADD, ua.dtype, (ua, n(UOp(Ops.MUL, ub.dtype, (ub, minus_one))))))

  def neg(self) -> Tensor:
    """-x, as the spec's MUL(x, -1)."""
    u, n = self.uop, self._node
    if u.dtype == dtypes.bool:
      raise TypeError("negation of a bool tensor is not supported: use logical_not or ~")
    # self.mul(self._const(-1, dtype)) on the nodes its tensors would hold
    return self._wrap(UOp(Ops.MUL, u.dtype, (n(u), expand_node(n(UOp.const(u.dtype, -1)),
                                                                u.shape, n))))

  def div(self, x: Operand, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    """True division (ints give a float), or rounded with rounding_mode 'trunc' / 'floor'.
    `Tensor([1, 2]) / 2` is `[0.5, 1.0]`."""
    if rounding_mode not in (None, "trunc", "floor"):
      raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor': {rounding_mode!r}")
    if rounding_mode == "floor": return self.floordiv(x, reverse)
    if rounding_mode == "trunc":
      a, b = self._broadcasted(self, x, reverse=reverse)
      if _is_float(a): return a.div(b).trunc()
      return a.floordiv(b)._trunc_fix(a, b)
    # operands go straight to the float type: a scalar never wraps in an integer type first (a
    # float tensor keeps its dtype beside a Python number: result_type's answer, without its work)
    keeps = type(x) in (int, float) and dtypes.is_float(self.uop.dtype)
    dt = self.uop.dtype if keeps else least_upper_float(result_type(self, x))
    ua, ub = self._broadcast_nodes(self, x, dt, reverse)
    # a.mul(b.reciprocal()) on the nodes its tensors would hold
    return self._wrap(UOp(Ops.MUL, dt, (ua, self._node(UOp(Ops.RECIP, dt, (ub,))))))

  def _trunc_fix(self, a: Tensor, b: Tensor) -> Tensor:
    """Floor division -> truncating division: add 1 where the signs differ and b does not
    divide a."""
    fix = (a.floormod(b).ne(0)) & ((a < 0) ^ (b < 0))
    return fix.where(self + 1, self)

  def floordiv(self, x: Operand, reverse: bool = False) -> Tensor:
    """Floor division (Python's `//`): IDIV on integers, floor(a/b) on floats with
    torch.floor_divide's infinities: +-inf // b is nan (b != 0), a // +-inf is -1 when a != 0 and
    the signs differ, else +-0."""
    a, b = self._broadcasted(self, x, reverse=reverse)
    if a.dtype in WIDER_FLOAT: return a.cast(WIDER_FLOAT[a.dtype]).floordiv(b).cast(a.dtype)
    if _is_float(a):
      q = a.mul(b.reciprocal()).floor()
      q = (_is_inf(b) & _opposite_signs(a, b)).where(-1.0, q)
      return (_is_inf(a) & b.ne(0)).where(math.nan, q)
    if a.dtype == dtypes.bool: raise TypeError("floor division of bool tensors is not supported")
    return a._wrap(UOp(Ops.IDIV, a.dtype, (a.uop, b.uop)))

  def floormod(self, x: Operand, reverse: bool = False) -> Tensor:
    """Python's `%` (the sign of the divisor): MOD on integers, a - floor(a/b)*b on floats with
    torch.remainder's edge cases: a finite a % +-inf is a (+-inf when the signs differ),
    +-inf % b and a % 0 are nan, and a zero result keeps the sign of a."""
    a, b = self._broadcasted(self, x, reverse=reverse)
    if a.dtype in WIDER_FLOAT: return a.cast(WIDER_FLOAT[a.dtype]).floormod(b).cast(a.dtype)
    if _is_float(a):
      r = a.sub(a.floordiv(b).mul(b))
      # fmod's zero takes the sign of a; r.detach() - r is +0.0 carrying r's gradient
      r = r.eq(0).where(a * 0.0 - (r.detach() - r), r)
      return (_is_inf(b) & (a - a).eq(0)).where(_opposite_signs(a, b).where(b, a), r)
    if a.dtype == dtypes.bool: raise TypeError("modulo of bool tensors is not supported")
    return a._wrap(UOp(Ops.MOD, a.dtype, (a.uop, b.uop)))

  def maximum(self, x: Operand) -> Tensor:
    """Elementwise max (NaN propagates)."""
    return self._binary(Ops.MAX, x)

  def minimum(self, x: Operand) -> Tensor:
    """Elementwise min (NaN propagates)."""
    a, b = self._broadcasted(self, x)
    if _is_float(a): return a.neg().maximum(b.neg()).neg()
    return (a < b).where(a, b)

  def pow(self, x: Operand, reverse: bool = False) -> Tensor:
    """a ** b. Integer powers of integers stay integers, exact and wrapping like PyTorch's
    (repeated squaring in the integer dtype). `Tensor([1, 2, 3]) ** 2` is `[1, 4, 9]`."""
    a, b = self._broadcasted(self, x, reverse=reverse)
    if a.dtype == dtypes.bool: raise TypeError("pow of bool tensors is not supported")
    exponent = self if reverse else x
    if not _is_float(a) and not hasattr(exponent, "uop") and exponent < 0:
      raise ValueError(f"integers to negative integer powers are not allowed (got {exponent})")
    if _is_float(a): return a._wrap(UOp(Ops.POW, a.dtype, (a.uop, b.uop)))
    if isinstance(exponent, int): return _int_pow_const(a, exponent)
    return _int_pow(a, b)

  def reciprocal(self) -> Tensor:
    """1/x (ints give a float)."""
    return self._float()._unary(Ops.RECIP)

  def trunc(self) -> Tensor:
    """Round toward zero."""
    return self._unary(Ops.TRUNC) if _is_float(self) else self._wrap(self.uop)

  def floor(self) -> Tensor:
    if not _is_float(self): return self._wrap(self.uop)
    t = self.trunc()
    return (self < t).where(t - 1, t)

  def ceil(self) -> Tensor:
    if not _is_float(self): return self._wrap(self.uop)
    t = self.trunc()
    return (self > t).where(t + 1, t)

  def round_half_even(self) -> Tensor:
    """Round to the nearest integer, ties to even (PyTorch's round)."""
    if not _is_float(self): return self._wrap(self.uop)
    f = self.floor()
    diff = self - f
    up = (diff > 0.5) | ((diff == 0.5) & (f.floormod(2) != 0))
    return up.where(f + 1, f)

  def sqrt(self) -> Tensor: return self._float()._unary(Ops.SQRT)
  def exp2(self) -> Tensor: return self._float()._unary(Ops.EXP2)
  def log2(self) -> Tensor: return self._float()._unary(Ops.LOG2)
  def sin(self) -> Tensor: return self._float()._unary(Ops.SIN)

  def log(self) -> Tensor: return self._float().log2().mul(math.log(2))

  def exp(self) -> Tensor:
    """e**x as EXP2(x*log2(e)), within 1 ulp for float32 and float64: codegen lowers that product
    as a whole (`codegen.transcendental.xexp`). `Tensor([0.0, 1.0]).exp()` is `[1.0, 2.7183]`."""
    x = self._float()
    dt = COMPUTE_DTYPE[x.dtype]
    return x._cast(dt).mul(LOG2E).exp2()._cast(x.dtype)

  def cos(self) -> Tensor:
    """Cosine, within 2 ulp wherever 2x is finite (see `compose_cos`; sin(pi/2 - x) rounded
    pi/2 - x). `Tensor([0.0, math.pi]).cos()` is `[1.0, -1.0]`."""
    x = self._float()
    return x._wrap(compose_cos(x.uop))

  def relu(self) -> Tensor:
    """max(x, 0), with NaN kept (PyTorch) and a zero gradient at 0."""
    return (self <= 0).where(self._const(0, self.dtype), self)
  def abs(self) -> Tensor:
    """|x|. As in PyTorch, abs(-0.0) is 0.0 and the gradient is sign(x): 0 at 0 (and at nan)."""
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool: return self._wrap(self.uop)
    if not _is_float(self): return (self < 0).where(self.neg(), self)
    zero_or_nan = self * 0.0 + 0.0  # +0.0 for +-0.0, nan for nan; its gradient is 0
    return (self < 0).where(self.neg(), (self > 0).where(self, zero_or_nan))
  def square(self) -> Tensor: return self * self

  # ---- comparison ----
  def __lt__(self, x: Operand) -> Tensor: return self._binary(Ops.CMPLT, x)
  def __gt__(self, x: Operand) -> Tensor: return self._binary(Ops.CMPLT, x, reverse=True)

  def __le__(self, x: Operand) -> Tensor:
    a, b = self._broadcasted(self, x)
    return (b < a).logical_not() if not _is_float(a) else (a < b) | a.eq(b)

  def __ge__(self, x: Operand) -> Tensor:
    a, b = self._broadcasted(self, x)
    return (a < b).logical_not() if not _is_float(a) else (a > b) | a.eq(b)

  def ne(self, x: Operand) -> Tensor:
    """Elementwise !=, as CMPNE."""
    return self._binary(Ops.CMPNE, x)

  def eq(self, x: Operand) -> Tensor:
    """Elementwise ==, as NOT(CMPNE)."""
    return self.ne(x).logical_not()

  def lt(self, x: Operand) -> Tensor:
    """Elementwise <, PyTorch's torch.lt. `Tensor([1, 3]).lt(2)` is `[True, False]`."""
    return self < x

  def le(self, x: Operand) -> Tensor:
    """Elementwise <=, PyTorch's torch.le."""
    return self <= x

  def gt(self, x: Operand) -> Tensor:
    """Elementwise >, PyTorch's torch.gt."""
    return self > x

  def ge(self, x: Operand) -> Tensor:
    """Elementwise >=, PyTorch's torch.ge."""
    return self >= x

  def __eq__(self, x: Operand) -> Tensor: return self.eq(x)  # type: ignore[override]
  def __ne__(self, x: Operand) -> Tensor: return self.ne(x)  # type: ignore[override]
  __hash__ = object.__hash__

  def logical_not(self) -> Tensor:
    """not x (x != 0 for non-bool tensors), as CMPNE(x, True)."""
    b = self if self.dtype == dtypes.bool else self.ne(0)
    return b._binary(Ops.CMPNE, True)

  # ---- bitwise ----
  def _bitwise(self, op: Ops, x: Operand, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(self, x, reverse=reverse)
    if _is_float(a):
      raise TypeError(f"bitwise {op.name.lower()} needs integer or bool tensors, got {a.dtype!r}")
    if op in (Ops.SHL, Ops.SHR) and a.dtype == dtypes.bool:
      raise TypeError(f"{op.name.lower()} of bool tensors is not supported: cast to an integer")
    return a._wrap(UOp(op, a.dtype, (a.uop, b.uop)))

  def bitwise_and(self, x: Operand) -> Tensor: return self._bitwise(Ops.AND, x)
  def bitwise_or(self, x: Operand) -> Tensor: return self._bitwise(Ops.OR, x)
  def bitwise_xor(self, x: Operand) -> Tensor: return self._bitwise(Ops.XOR, x)
  def lshift(self, x: Operand) -> Tensor: return self._bitwise(Ops.SHL, x)
  def rshift(self, x: Operand) -> Tensor: return self._bitwise(Ops.SHR, x)

  def bitwise_not(self) -> Tensor:
    if self.dtype == dtypes.bool: return self.logical_not()
    if _is_float(self):
      raise TypeError(f"bitwise not needs an integer or bool tensor, got {self.dtype!r}")
    return self._bitwise(Ops.XOR, -1)

  # ---- selection and dtype ----
  def where(self, x: Operand, y: Operand) -> Tensor:
    """x where self is true, else y (broadcast, promoted). `cond.where(a, b)`"""
    self._check_devices(x, y)
    dt = result_type(x, y)
    for v in (x, y): check_int_value(v, dt)  # a branch is a value of dt: no wrapping
    cond = (self if self.dtype == dtypes.bool else self.ne(0)).uop
    # a Python number waits for the shape: its broadcast constant comes from scalar_operand
    ux = None if type(x) in NUMBERS else self._to_node(x, dt)
    uy = None if type(y) in NUMBERS else self._to_node(y, dt)
    shape = broadcast_shapes(cond.shape, () if ux is None else ux.shape,
                             () if uy is None else uy.shape)
    c = expand_node(cond, shape, self._node)
    a, b = self._operand_node(ux, x, dt, shape), self._operand_node(uy, y, dt, shape)
    return self._wrap(UOp(Ops.WHERE, dt, (c, a, b)))

  def cast(self, dtype: Any) -> Tensor:
    """The values converted to `dtype` (float -> int truncates toward zero)."""
    dt = to_dtype(dtype)
    return self._wrap(self.uop) if dt == self.dtype else self._wrap(UOp(Ops.CAST, dt, (self.uop,)))

  def bitcast(self, dtype: Any) -> Tensor:
    """The same bytes read as `dtype` (little endian; the last axis rescales when the item sizes
    differ, like PyTorch's `view(dtype)`). `Tensor([1.0]).bitcast("int32")` is `[1065353216]`."""
    dt = to_dtype(dtype)
    if dt == self.dtype: return self._wrap(self.uop)
    if dt.itemsize == self.dtype.itemsize: return self._wrap(UOp(Ops.BITCAST, dt, (self.uop,)))
    if self.ndim == 0 or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize:
      raise ValueError(f"bitcast {self.dtype!r} -> {dt!r} needs a last axis whose bytes divide "
                       f"evenly, got shape {self.shape}")
    bits = self.bitcast(UINT_OF_SIZE[self.dtype.itemsize])
    if dt.itemsize < self.dtype.itemsize: return _split_words(bits, dt)
    return _join_words(bits, dt)

  def threefry(self, key: Operand) -> Tensor:
    """Threefry-2x32 of uint64 counters with a uint64 key (the spec's PRNG primitive)."""
    return self._binary(Ops.THREEFRY, key, dtype=dtypes.uint64)

  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)

  def type_as(self, other: Tensor) -> Tensor:
    """This tensor cast to `other`'s dtype (PyTorch's type_as)."""
    if not hasattr(other, "dtype") or not isinstance(other.dtype, DType):
      raise TypeError(f"type_as: expected a Tensor, got {type(other).__name__}")
    return self.cast(other.dtype)

  # ---- Python operators ----
  def __add__(self, x: Operand) -> Tensor: return self.add(x)
  def __radd__(self, x: Operand) -> Tensor: return self.add(x, True)
  def __sub__(self, x: Operand) -> Tensor: return self.sub(x)
  def __rsub__(self, x: Operand) -> Tensor: return self.sub(x, True)
  def __mul__(self, x: Operand) -> Tensor: return self.mul(x)
  def __rmul__(self, x: Operand) -> Tensor: return self.mul(x, True)
  def __truediv__(self, x: Operand) -> Tensor: return self.div(x)
  def __rtruediv__(self, x: Operand) -> Tensor: return self.div(x, True)
  def __floordiv__(self, x: Operand) -> Tensor: return self.floordiv(x)
  def __rfloordiv__(self, x: Operand) -> Tensor: return self.floordiv(x, True)
  def __mod__(self, x: Operand) -> Tensor: return self.floormod(x)
  def __rmod__(self, x: Operand) -> Tensor: return self.floormod(x, True)
  def __pow__(self, x: Operand) -> Tensor: return self.pow(x)
  def __rpow__(self, x: Operand) -> Tensor: return self.pow(x, True)
  def __neg__(self) -> Tensor: return self.neg()
  def __and__(self, x: Operand) -> Tensor: return self._bitwise(Ops.AND, x)
  def __rand__(self, x: Operand) -> Tensor: return self._bitwise(Ops.AND, x, True)
  def __or__(self, x: Operand) -> Tensor: return self._bitwise(Ops.OR, x)
  def __ror__(self, x: Operand) -> Tensor: return self._bitwise(Ops.OR, x, True)
  def __xor__(self, x: Operand) -> Tensor: return self._bitwise(Ops.XOR, x)
  def __rxor__(self, x: Operand) -> Tensor: return self._bitwise(Ops.XOR, x, True)
  def __lshift__(self, x: Operand) -> Tensor: return self.lshift(x)
  def __rshift__(self, x: Operand) -> Tensor: return self.rshift(x)
  def __invert__(self) -> Tensor: return self.bitwise_not()
