"""Activations and the remaining elementwise functions of Tensor, with PyTorch semantics.

Everything here composes existing Tensor methods (where, exp, log, sin, sqrt, arithmetic): no new
UOps, so the gradients come from the primitive rules. Conventions that keep values and gradients
equal to PyTorch's:
- float functions give integer and bool inputs the default float (where PyTorch raises "not
  implemented for 'Long'", we promote); float16/bfloat16 compute in float32 and round once at the
  end, like PyTorch's CPU kernels (`_float_op`).
- a piecewise formula gives each piece an input chosen with `where` first ("double where"): the
  piece not selected still receives a zero gradient, and 0 * inf = NaN from it would otherwise
  poison the sum (e.g. exp(x) overflowing in elu's unused branch for large x).
- all pieces of one kink use one condition (`_split_sign`), so one-sided derivatives agree.
- stable forms: sigmoid and softplus from exp(-|x|), tanh/sinh/cosh from expm1, asinh/acosh/atanh
  from log1p, so large magnitudes neither overflow nor cancel.
Series (coefficients below, each cut per dtype where its terms fall under the dtype's precision):
expm1 and atan by Taylor, log1p by the atanh series, erf by Taylor below 1 and above by a
Chebyshev fit of erfc(x)*exp(x*x) on [1, 6] (computed with mpmath at 60 digits). A series is
built on the tensor's node directly (the MUL and ADD nodes its Tensor operators would make, one
Tensor for the result): graph building is per-call work of every model that uses it.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from unigrad.dtype import LOW_FLOATS, DType, dtypes, finite_max, least_upper_float
from unigrad.frontend.dtypes import dtype_category
from unigrad.frontend.elementwise import LOG2E, WIDER_FLOAT, scalar_operand
from unigrad.frontend.gradient import in_autograd_graph, is_grad_enabled
from unigrad.frontend.traced import traced
from unigrad.uop import Ops, UOp

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor

F = TypeVar("F", bound=Callable[..., Any])
COMPUTE_DTYPE = {dt: dtypes.float32 for dt in LOW_FLOATS}
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
GELU_TANH_SCALE = math.sqrt(2 / math.pi)
GELU_TANH_CUBIC = 0.044715
GELU_CLAMP = 1e10
QUICK_GELU_SCALE = 1.702
TAN_PI_8 = math.sqrt(2) - 1
LOG10_2 = math.log10(2)
ERF_CLAMP = 6.0  # erf(x) rounds to 1 beyond 3.92 (float32) and 5.93 (float64)


@dataclass(frozen=True)
class Series:
  """Coefficients of a power or Chebyshev series, and how many of them float32 needs (float64
  takes all)."""
  coeffs: tuple[float, ...]
  terms32: int

  def cut(self, dt: DType) -> tuple[float, ...]:
    return self.coeffs if dt == dtypes.float64 else self.coeffs[:self.terms32]


# expm1(x)/x = sum x**k/(k+1)! on |x| < 1/2
EXPM1_SERIES = Series(tuple(1 / math.factorial(k + 1) for k in range(14)), 8)
# log1p(x)/s = sum 2*z**k/(2k+1) with s = x/(2+x), z = s*s <= (3-2*sqrt(2))**2
LOG1P_SERIES = Series(tuple(2 / (2 * k + 1) for k in range(10)), 5)
# atan(t)/t = sum (-1)**k * z**k/(2k+1) with z = t*t <= tan(pi/8)**2
ATAN_SERIES = Series(tuple((-1) ** k / (2 * k + 1) for k in range(20)), 9)
# erf(x)/x = 2/sqrt(pi) * sum (-1)**n * z**n/(n!(2n+1)) with z = x*x < 1
ERF_SERIES = Series(tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1))
                          for n in range(18)), 11)
# erfc(x)*exp(x*x) on [1, 6] as a Chebyshev series in u = (2x - 7)/5 (relative error 4e-16)
ERFCX_SERIES = Series((
  0.20196598791223083, -0.147884835533987, 0.05188222158351389, -0.017525709964867527,
  0.005721802417478219, -0.0018109803028142997, 0.0005570714353927344, -0.00016689473052528832,
  4.878565911493746e-05, -1.3935932859822488e-05, 3.895514595190115e-06, -1.0668392337070025e-06,
  2.865502572057316e-07, -7.555861081756622e-08, 1.957586342968354e-08, -4.987110132992565e-09,
  1.2501871239431183e-09, -3.0858852312872416e-10, 7.504484747602075e-11, -1.7990193064432053e-11,
  4.25347830122088e-12, -9.92315607537652e-13, 2.285294689027943e-13, -5.197545128838963e-14,
  1.1678402647273797e-14, -2.593300539647079e-15, 5.693144752523706e-16, -1.2360008955300707e-16,
  2.65449529106721e-17, -5.641103352342304e-18), 17)
# float32 erf (ERF32): minimax fits (Lawson's iteration) of erf(x)/x in x*x on [0, 0.8] and of
# erfc(x)*exp(x*x) in x - 2.36 on [0.8, 3.92] (relative error 3e-9 and 7e-8)
ERF32_SPLIT, ERF32_CLAMP, ERFCX32_CENTER = 0.8, 3.92, 2.36
ERF32_NEAR = (1.1283791640180225, -0.3761260381812068, 0.1128314279625914, -0.026822106632859864,
              0.005087435968457782, -0.000654956929772446)
ERFCX32_FAR = (
  0.22172670761827884, -0.081829056404626, 0.02861064942753725, -0.00953923219275315,
  0.003046497788819039, -0.000937671909899855, 0.00028239417918205504, -8.061651411408927e-05,
  1.938752636942748e-05, -5.529557463765887e-06, 2.6169675514516585e-06, -6.339556143148088e-07)


# ---- building blocks (on tensors already in their compute dtype) ----

def _float_op(fn: F) -> F:
  """Run `fn` on the input as a float: ints and bools become the default float, float16 and
  bfloat16 are computed in float32 and rounded once at the end."""
  @functools.wraps(fn)
  def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    out = least_upper_float(self.dtype)
    return fn(self.cast(COMPUTE_DTYPE.get(out, out)), *args, **kwargs).cast(out)
  return wrapper  # type: ignore[return-value]


def _split_sign(x: Tensor) -> tuple[Tensor, Tensor]:
  """(x < 0, |x|), with |x| built from the same condition: at 0 its derivative is +1 (the side
  every caller's formula for x >= 0 uses). NaN counts as non-negative."""
  neg = x < 0
  return neg, neg.where(-x, x)


def _odd(neg: Tensor, r: Tensor) -> Tensor: return neg.where(-r, r)


class _NodeOps:
  """Elementwise nodes of one float dtype and shape, as the Tensor operators build them (numbers
  become `scalar_operand`'s cached broadcast constants, x - c is x + (-c), exp is EXP2(x*log2 e))
  but without a Tensor per step: an eager GELU built 20 tensors, a series of 20 terms through
  Tensor operators made erf cost 3.7 ms per call."""

  def __init__(self, like: UOp) -> None: self.dt, self.shape = like.dtype, tuple(like.shape)

  def c(self, v: float) -> UOp: return scalar_operand(self.dt, v, self.shape)
  def mul(self, a: UOp, b: UOp) -> UOp: return UOp(Ops.MUL, self.dt, (a, b))
  def add(self, a: UOp, b: UOp) -> UOp: return UOp(Ops.ADD, self.dt, (a, b))
  def neg(self, a: UOp) -> UOp: return self.mul(a, self.c(-1))
  def less(self, a: UOp, b: UOp) -> UOp: return UOp(Ops.CMPLT, dtypes.bool, (a, b))
  def where(self, c: UOp, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, self.dt, (c, a, b))
  def exp(self, a: UOp) -> UOp: return UOp(Ops.EXP2, self.dt, (self.mul(a, self.c(LOG2E)),))

  def poly(self, x: UOp, coeffs: tuple[float, ...]) -> UOp:
    """sum(coeffs[k] * x**k) by Horner's rule."""
    p = self.add(self.mul(x, self.c(coeffs[-1])), self.c(coeffs[-2]))
    for c in reversed(coeffs[:-2]): p = self.add(self.mul(p, x), self.c(c))
    return p

  def chebyshev(self, x: UOp, coeffs: tuple[float, ...]) -> UOp:
    """sum(coeffs[k] * T_k(x)) for x in [-1, 1] by Clenshaw's recurrence (b1' = 2x*b1 - b2 + c,
    the subtraction an addition of -b2, as Tensor.sub builds it)."""
    minus, x2 = self.c(-1.0), self.mul(x, self.c(2.0))
    b1, b2 = self.c(coeffs[-1]), self.c(0.0)
    for c in reversed(coeffs[1:-1]):
      b1, b2 = self.add(self.add(self.mul(x2, b1), self.mul(b2, minus)), self.c(c)), b1
    return self.add(self.add(self.mul(x, b1), self.mul(b2, minus)), self.c(coeffs[0]))


def _poly(z: Tensor, coeffs: tuple[float, ...]) -> Tensor:
  """sum(coeffs[k] * z**k) by Horner's rule."""
  return z._wrap(_NodeOps(z.uop).poly(z.uop, coeffs))


def _expm1(x: Tensor) -> Tensor:
  """exp(x) - 1 without cancellation near 0: a Taylor series on |x| < 1/2."""
  small = (x > -0.5) & (x < 0.5)
  xs = small.where(x, 0.0)
  return small.where(xs * _poly(xs, EXPM1_SERIES.cut(x.dtype)), x.exp() - 1)


def _log1p(x: Tensor) -> Tensor:
  """log(1 + x) without cancellation near 0: 2*atanh(x/(2+x)) as a series near 0."""
  small = (x > math.sqrt(0.5) - 1) & (x < math.sqrt(2) - 1)
  xs = small.where(x, 0.0)
  s = xs / (xs + 2)
  return small.where(s * _poly(s * s, LOG1P_SERIES.cut(x.dtype)), (x + 1).log())


def _atan(x: Tensor) -> Tensor:
  """atan by reduction to |t| <= tan(pi/8) (1/|x| above 1, then (t-1)/(t+1) with pi/4)."""
  neg, a = _split_sign(x)
  inv = a > 1
  t = inv.where(inv.where(a, 1.0).reciprocal(), a)
  mid = t > TAN_PI_8
  u = mid.where((t - 1) / (t + 1), t)
  r = u * _poly(u * u, ATAN_SERIES.cut(x.dtype))
  r = mid.where(r + math.pi / 4, r)
  return _odd(neg, inv.where(math.pi / 2 - r, r))


@dataclass(frozen=True)
class ErfFit:
  """erf in one dtype: x*P(x*x) with P's `near` coefficients below `split`, 1 - exp(-x*x)*E(x)
  from there to `clamp` (where erf rounds to 1), E approximating erfc(x)*exp(x*x)."""
  split: float
  clamp: float
  near: tuple[float, ...]
  far: Callable[[_NodeOps, UOp], UOp]  # E(xb) for xb in [split, clamp]


def _erfcx32(n: _NodeOps, xb: UOp) -> UOp:
  """The minimax polynomial in x - 2.36."""
  return n.poly(n.add(xb, n.c(-ERFCX32_CENTER)), ERFCX32_FAR)


def _erfcx64(n: _NodeOps, xb: UOp) -> UOp:
  """The Chebyshev series in u = (2x - 7)/5, u built as `(xb * 2 - 7) / 5` on tensors builds it."""
  u = n.mul(n.add(n.mul(xb, n.c(2)), n.neg(n.c(7))), UOp(Ops.RECIP, n.dt, (n.c(5),)))
  return n.chebyshev(u, ERFCX_SERIES.coeffs)


# float64 takes the Taylor and Chebyshev series; the other floats (computed in float32) take
# minimax polynomials, a third of the operations: GELU's erf was a third of the time of the
# matmul it follows in a transformer
ERF64 = ErfFit(1.0, ERF_CLAMP, ERF_SERIES.coeffs, _erfcx64)
ERF32 = ErfFit(ERF32_SPLIT, ERF32_CLAMP, ERF32_NEAR, _erfcx32)


def _erf(x: Tensor) -> Tensor:
  """erf: x*P(x*x) near 0, 1 - exp(-x*x)*erfcx(x) further out, +-1 beyond, with the dtype's fit
  (max absolute error 1.2e-7 in float32). Built on nodes (`_NodeOps`): a GELU calls it in every
  layer of a transformer."""
  fit = ERF64 if x.dtype == dtypes.float64 else ERF32
  n, u = _NodeOps(x.uop), x.uop
  neg = n.less(u, n.c(0))  # (x < 0, |x|) as _split_sign makes them, the sign put back at the end
  a = n.where(neg, n.neg(u), u)
  small = n.less(a, n.c(fit.split))
  xs = n.where(small, a, n.c(0.0))
  xb = n.where(small, n.c(fit.split), n.where(n.less(n.c(fit.clamp), a), n.c(fit.clamp), a))
  near = n.mul(xs, n.poly(n.mul(xs, xs), fit.near))
  far = n.add(n.c(1), n.neg(n.mul(n.exp(n.mul(n.neg(xb), xb)), fit.far(n, xb))))  # 1 - exp*E
  r = n.where(small, near, far)
  return x._wrap(n.where(neg, n.neg(r), r))


def _sinh_small(a: Tensor) -> Tensor:
  """sinh(a) = (E + E/(E+1))/2 with E = expm1(a): accurate near 0."""
  e = _expm1(a)
  return (e + e / (e + 1)) * 0.5


def _exp_pair(a: Tensor) -> tuple[Tensor, Tensor]:
  """(exp(a)/2, exp(-a)/2) for a >= 1 from h = exp(a/2), so exp(a)/2 overflows only when it
  must."""
  h = (a * 0.5).exp()
  return (h * 0.5) * h, (h.reciprocal() * 0.5) / h


def _softplus(y: Tensor) -> Tensor:
  """log(1 + exp(y)) = max(y, 0) + log1p(exp(-|y|)), with one condition for both kinks."""
  pos = y > 0
  return pos.where(y, 0.0) + _log1p(pos.where(-y, y).exp())


# PyTorch's names of the dtypes (its ScalarType), for errors worded as PyTorch words them
TORCH_NAMES = {dtypes.bool: "Bool", dtypes.uint8: "Byte", dtypes.int8: "Char",
               dtypes.int16: "Short", dtypes.int32: "Int", dtypes.int64: "Long",
               dtypes.uint16: "UInt16", dtypes.uint32: "UInt32", dtypes.uint64: "UInt64",
               dtypes.float16: "Half", dtypes.bfloat16: "BFloat16", dtypes.float32: "Float",
               dtypes.float64: "Double", dtypes.fp8e4m3: "Float8_e4m3fn",
               dtypes.fp8e5m2: "Float8_e5m2"}


def _torch_name(dt: DType) -> str: return TORCH_NAMES.get(dt, dt.name)


# ---- the mixin ----

class ActivationsMixin:
  """Activations, inverse trigonometric and hyperbolic functions, erf, float predicates, C-style
  remainders and the in-place / reflected operator forms."""

  # ---- roots and trigonometry ----
  def rsqrt(self) -> Tensor:
    """1/sqrt(x) (ints give a float). `Tensor([4.0]).rsqrt()` is `[0.5]`."""
    return self.sqrt().reciprocal()

  @_float_op
  def tan(self) -> Tensor:
    """sin(x)/cos(x) from two exact-argument sines, s = sin(x) and d = sin(2x) = 2 s cos(x):
    cos(x) is d/(2s) where |s| > 1/2 (accurate near the poles) and +-sqrt(1 - s*s) with the sign
    of d/s elsewhere (cos(x) = sin(pi/2 - x) would round pi/2 - x). Where 2x overflows, h = sin(x/2)
    (x/2 is exact) gives the sign: cos(x) = 1 - 2 h*h."""
    huge = self.abs() > finite_max(self.dtype) / 2
    s, d = self.sin(), huge.where(self * 0.5, self * 2).sin()
    big = (s > 0.5) | (s < -0.5)
    flip = huge.where(d * d > 0.5, (d < 0) ^ (s < 0))
    root = (1 - s * s).sqrt()
    c = (big & huge.logical_not()).where(d / (big.where(s, 1.0) * 2), flip.where(-root, root))
    return s / c

  @_float_op
  def atan(self) -> Tensor:
    """Inverse tangent in (-pi/2, pi/2). `Tensor([1.0]).atan()` is `[0.7854]`."""
    return _atan(self)

  @_float_op
  def asin(self) -> Tensor:
    """Inverse sine, 2*atan(x / (1 + sqrt(1-x) sqrt(1+x))); NaN outside [-1, 1]."""
    return _atan(self / ((1 - self).sqrt() * (1 + self).sqrt() + 1)) * 2

  @_float_op
  def acos(self) -> Tensor:
    """Inverse cosine, 2*atan(sqrt(1-x)/sqrt(1+x)) (pi minus the mirror image below 0, so small
    results keep their relative accuracy); NaN outside [-1, 1]."""
    neg = self < 0
    xp, xn = neg.where(0.0, self), neg.where(self, 0.0)
    above = _atan((1 - xp).sqrt() / (1 + xp).sqrt()) * 2
    below = math.pi - _atan((1 + xn).sqrt() / (1 - xn).sqrt()) * 2
    return neg.where(below, above)

  # ---- hyperbolic ----
  @_float_op
  def tanh(self) -> Tensor:
    """Hyperbolic tangent, -E/(E+2) with E = expm1(-2|x|): no overflow, no cancellation."""
    neg, a = _split_sign(self)
    e = _expm1(a * -2)
    return _odd(neg, -e / (e + 2))

  @_float_op
  def sinh(self) -> Tensor:
    """Hyperbolic sine: from expm1 below 1, (exp(|x|) - exp(-|x|))/2 above."""
    neg, a = _split_sign(self)
    small = a < 1
    big_pos, big_neg = _exp_pair(small.where(1.0, a))
    return _odd(neg, small.where(_sinh_small(small.where(a, 0.0)), big_pos - big_neg))

  @_float_op
  def cosh(self) -> Tensor:
    """Hyperbolic cosine: 1 + E*E/(2(E+1)) with E = expm1(|x|) below 1, so its gradient sinh(x)
    stays accurate near 0; (exp(|x|) + exp(-|x|))/2 above."""
    _, a = _split_sign(self)
    small = a < 1
    e = _expm1(small.where(a, 0.0))
    big_pos, big_neg = _exp_pair(small.where(1.0, a))
    return small.where(e * e / ((e + 1) * 2) + 1, big_pos + big_neg)

  @_float_op
  def asinh(self) -> Tensor:
    """Inverse hyperbolic sine: log1p(a + a*a/(1 + sqrt(1 + a*a))) below 2, and
    log(a) + log(1 + sqrt(1 + 1/a**2)) above (no overflow of a*a)."""
    neg, a = _split_sign(self)
    small = a < 2
    s = small.where(a, 0.0)
    near = _log1p(s + s * s / ((s * s + 1).sqrt() + 1))
    b = small.where(2.0, a)
    far = b.log() + (b.reciprocal().square() + 1).sqrt().add(1).log()
    return _odd(neg, small.where(near, far))

  @_float_op
  def acosh(self) -> Tensor:
    """Inverse hyperbolic cosine: log1p(t + sqrt(t) sqrt(t+2)) with t = x-1 below 2, and
    log(x) + log(1 + sqrt(1 - 1/x**2)) above; NaN below 1."""
    small = self < 2
    t = small.where(self - 1, 0.5)
    near = _log1p(t + t.sqrt() * (t + 2).sqrt())
    b = small.where(2.0, self)
    far = b.log() + (1 - b.reciprocal().square()).sqrt().add(1).log()
    return small.where(near, far)

  @_float_op
  def atanh(self) -> Tensor:
    """Inverse hyperbolic tangent (log1p(a) - log1p(-a))/2: +-inf at +-1, NaN beyond."""
    neg, a = _split_sign(self)
    return _odd(neg, (_log1p(a) - _log1p(-a)) * 0.5)

  @_float_op
  def log10(self) -> Tensor:
    """The base-10 logarithm, log2(x) * log10(2). `Tensor([100.0]).log10()` is `[2.0]`."""
    return self.log2() * LOG10_2

  # ---- erf and the gelus ----
  @traced
  @_float_op
  def erf(self) -> Tensor:
    """The error function (absolute error about 1e-7 in float32, 1e-16 in float64).
    `Tensor([0.5]).erf()` is `[0.5205]`."""
    return _erf(self)

  @traced
  @_float_op
  def gelu(self, approximate: str = "none") -> Tensor:
    """x * Phi(x). The default is PyTorch's exact x/2 * (1 + erf(x/sqrt(2))); approximate='tanh'
    is the tanh approximation (tinygrad's gelu), x/2 * (1 + tanh(u)) computed as x * sigmoid(2u)
    (no cancellation for negative x). `Tensor([1.0]).gelu()` is `[0.8413]`."""
    if approximate == "tanh":
      # beyond 1e10 the sigmoid is exactly 0 or 1: clamping keeps x**3 finite for the gradient
      xc = (self > GELU_CLAMP).where(GELU_CLAMP, (self < -GELU_CLAMP).where(-GELU_CLAMP, self))
      u = (xc + xc * xc * xc * GELU_TANH_CUBIC) * GELU_TANH_SCALE
      return self * (u * 2).sigmoid()
    if approximate == "none": return self * 0.5 * (_erf(self * math.sqrt(0.5)) + 1)
    raise RuntimeError(f"gelu: approximate argument must be either none or tanh, got "
                       f"{approximate!r}")

  @_float_op
  def quick_gelu(self) -> Tensor:
    """x * sigmoid(1.702 x), the GELU approximation of CLIP."""
    return self * (self * QUICK_GELU_SCALE).sigmoid()

  # ---- sigmoid family ----
  @_float_op
  def sigmoid(self) -> Tensor:
    """1/(1 + exp(-x)) from e = exp(-|x|): 1/(1+e) for x >= 0, e/(1+e) below (no overflow)."""
    neg, a = _split_sign(self)
    e = (-a).exp()
    s = (e + 1).reciprocal()
    return neg.where(e * s, s)

  @_float_op
  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))."""
    neg, a = _split_sign(self)
    return neg.where(self, 0.0) - _log1p((-a).exp())

  @_float_op
  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
    """clamp(alpha*x + beta, 0, 1); the gradient is alpha strictly inside, 0 at the corners.
    The corners are tested on the rounded alpha*x (a fused multiply-add could move them)."""
    ax = self * alpha
    return (ax <= -beta).where(0.0, (ax >= 1 - beta).where(1.0, ax + beta))

  @_float_op
  def silu(self) -> Tensor:
    """x * sigmoid(x). `Tensor([1.0]).silu()` is `[0.7311]`."""
    return self * self.sigmoid()

  def swish(self) -> Tensor:
    """x * sigmoid(x) (silu)."""
    return self.silu()

  @_float_op
  def hardswish(self) -> Tensor:
    """x * clamp(x + 3, 0, 6) / 6, with PyTorch's gradient: 0 up to -3, x/3 + 1/2 strictly
    between, 1 from 3 on (-inf gives NaN, as x * 0)."""
    low, high = self <= -3, self >= 3
    xs = (low | high).where(0.0, self)
    return low.where(self * 0, high.where(self, xs * (xs + 3) / 6))

  @_float_op
  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta*x))/beta, and x itself where beta*x > threshold (like PyTorch)."""
    y = self * beta
    return (y > threshold).where(self, _softplus(y) / beta)

  @_float_op
  def mish(self) -> Tensor:
    """x * tanh(softplus(x))."""
    return self * _softplus(self).tanh()

  @_float_op
  def softsign(self) -> Tensor:
    """x / (1 + |x|) (NaN at +-inf, as PyTorch's formula gives)."""
    return self / (self.abs() + 1)

  # ---- relu family ----
  @_float_op
  def elu(self, alpha: float = 1.0) -> Tensor:
    """x above 0, alpha * expm1(x) at or below."""
    pos = self > 0
    return pos.where(self, _expm1(pos.where(0.0, self)) * alpha)

  @_float_op
  def celu(self, alpha: float = 1.0) -> Tensor:
    """x above 0, alpha * expm1(x/alpha) at or below."""
    pos = self > 0
    return pos.where(self, _expm1(pos.where(0.0, self) / alpha) * alpha)

  @_float_op
  def selu(self) -> Tensor:
    """scale * elu(x, alpha) with the self-normalizing constants."""
    return self.elu(SELU_ALPHA) * SELU_SCALE

  @_float_op
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
    """x above 0, neg_slope * x at or below."""
    return (self > 0).where(self, self * neg_slope)

  def relu6(self) -> Tensor:
    """min(max(x, 0), 6) (hardtanh(x, 0, 6), as PyTorch). `Tensor([-1., 3., 9.]).relu6()` is
    `[0., 3., 6.]`."""
    return self.hardtanh(0, 6)

  def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
    """clamp(x, min_val, max_val) with gradient 1 strictly inside, 0 at and beyond the limits;
    integer tensors stay integers (like PyTorch)."""
    r = (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
    return r if dtypes.is_float(self.dtype) else r.cast(self.dtype)

  # ---- rounding and float predicates ----
  def round(self, decimals: int = 0) -> Tensor:
    """Round to nearest, ties to even (at `decimals` decimal places, like PyTorch)."""
    if decimals == 0: return self.round_half_even()
    if not dtypes.is_float(self.dtype):
      raise TypeError(f"round with decimals needs a float tensor, got {self.dtype!r}")
    if decimals > 0: return (self * 10.0 ** decimals).round_half_even() / 10.0 ** decimals
    return (self / 10.0 ** -decimals).round_half_even() * 10.0 ** -decimals

  def isnan(self) -> Tensor:
    """Whether each element is NaN (always false for integers)."""
    return self.ne(self)

  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """Whether each element is +inf (with detect_positive) or -inf (with detect_negative);
    tinygrad's keywords, PyTorch's isinf by default. `Tensor([-math.inf]).isinf(True, False)`
    is `[False]`."""
    if not dtypes.is_float(self.dtype) or not (detect_positive or detect_negative):
      return self.full_like(False, dtypes.bool)
    if detect_positive and detect_negative: return self.abs().eq(math.inf)
    return self.eq(math.inf if detect_positive else -math.inf)

  def isfinite(self) -> Tensor:
    """Whether each element is neither inf nor NaN."""
    if not dtypes.is_float(self.dtype): return self.eq(self)
    return self.abs() < math.inf

  # ---- integer-style division ----
  def idiv(self, x: Any, reverse: bool = False) -> Tensor:
    """Division rounded toward zero (C's integer division): `div(x, rounding_mode='trunc')`."""
    return self.div(x, reverse, rounding_mode="trunc")

  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's % (the sign of the divisor, torch.remainder)."""
    return self.floormod(x, reverse)

  def fmod(self, x: Any) -> Tensor:
    """C's fmod: a - trunc(a/b)*b, with the sign of the dividend; fmod(a, +-inf) is a.
    `Tensor([-5, 5]).fmod(3)` is `[-2, 2]`."""
    a, b = self._broadcasted(self, x)
    if not dtypes.is_float(a.dtype):
      r = a.floormod(b)
      return (r.ne(0) & ((r < 0) ^ (a < 0))).where(r - b, r)
    if a.dtype in WIDER_FLOAT: return a.cast(WIDER_FLOAT[a.dtype]).fmod(b).cast(a.dtype)
    r = a - (a / b).trunc() * b
    return (b.isinf() & a.isfinite()).where(a, r)

  # ---- dtype casts ----
  def bfloat(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def short(self) -> Tensor: return self.cast(dtypes.int16)

  # ---- in-place and remaining Python operators ----
  def _inplace(self, r: Tensor) -> Tensor:
    """Write the result `r` of an augmented assignment (`t += x`) into this tensor's storage,
    now, as PyTorch does: numpy arrays and DLPack consumers sharing the storage, and views of
    it, see the new values. PyTorch's rules: the result may not be of a higher kind (bool <
    integer < float) than the tensor, and a leaf that requires grad may not be written outside
    no_grad. A tensor computed from one (a non-leaf of an autograd graph) is not written: the
    statement rebinds the name to the result, whose gradient is exact; other references to the
    old tensor keep its value (writes through assign are not differentiated yet)."""
    if dtype_category(r.dtype) > dtype_category(self.dtype):
      raise RuntimeError(f"result type {_torch_name(r.dtype)} can't be cast to the desired "
                         f"output type {_torch_name(self.dtype)}")
    if self.requires_grad and is_grad_enabled():
      raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                         "operation.")
    value = r.cast(self.dtype)
    if in_autograd_graph(self.uop): return value
    return self.assign(value).realize()

  def __iadd__(self, x: Any) -> Tensor: return self._inplace(self.add(x))
  def __isub__(self, x: Any) -> Tensor: return self._inplace(self.sub(x))
  def __imul__(self, x: Any) -> Tensor: return self._inplace(self.mul(x))
  def __itruediv__(self, x: Any) -> Tensor: return self._inplace(self.div(x))
  def __ifloordiv__(self, x: Any) -> Tensor: return self._inplace(self.floordiv(x))
  def __imod__(self, x: Any) -> Tensor: return self._inplace(self.floormod(x))
  def __ipow__(self, x: Any) -> Tensor: return self._inplace(self.pow(x))
  def __iand__(self, x: Any) -> Tensor: return self._inplace(self.bitwise_and(x))
  def __ior__(self, x: Any) -> Tensor: return self._inplace(self.bitwise_or(x))
  def __ixor__(self, x: Any) -> Tensor: return self._inplace(self.bitwise_xor(x))
  def __ilshift__(self, x: Any) -> Tensor: return self._inplace(self.lshift(x))
  def __irshift__(self, x: Any) -> Tensor: return self._inplace(self.rshift(x))
  def __rlshift__(self, x: Any) -> Tensor: return self._bitwise(Ops.SHL, x, True)
  def __rrshift__(self, x: Any) -> Tensor: return self._bitwise(Ops.SHR, x, True)
  def __pos__(self) -> Tensor: return self
  def __abs__(self) -> Tensor: return self.abs()
