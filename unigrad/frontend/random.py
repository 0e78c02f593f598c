"""Random numbers for Tensor: counter-based streams of the spec's THREEFRY.

Element i of a random call draws the 64 bits `THREEFRY(counter + i, key=seed)`. Each device keeps
its own counter, advanced (in Python) by the number of 64-bit words a call draws, so successive
calls differ, and `manual_seed(s)` restarts every device's stream: one seed and one sequence of
shapes give bit-identical results on every device.

The (seed, counter) pair enters the graph as a 2-element uint64 buffer, not as constants, so two
calls of one shape build the same program and hit the schedule and program caches.

Conversions: floats take the top mantissa bits of a word (`bits >> 9 | 0x3F800000`, bitcast, -1.0
for float32; 52 bits for float64), randn is Box-Muller, randint is `bits % range` (bias below
range / 2**64), randperm sorts unique random keys with a bitonic network.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad.dtype import FLOAT_BITS, FP8S, DType, dtypes, to_bytes, to_dtype
from unigrad.helpers import bounded_put
from unigrad import engine
from unigrad.frontend.reduce import any_true
from unigrad.runtime.device import Device

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor
  from unigrad.uop import UOp

MASK32, MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
MANTISSA_BITS = {**{dt: FLOAT_BITS[dt][1] for dt in FP8S}, dtypes.float16: 10, dtypes.bfloat16: 7,
                 dtypes.float32: 23}


@dataclass
class RngState:
  """The seed (THREEFRY key) and, per device, the next unused counter."""
  seed: int = 0
  counters: dict[str, int] = field(default_factory=dict)

  def take(self, device: str, n: int) -> tuple[int, int]:
    """(key, first counter) for `n` words on `device`; advances the device's counter."""
    base = self.counters.get(device, 0)
    self.counters[device] = (base + n) & MASK64
    return self.seed, base


rng = RngState()


def _dims(shape: Any) -> tuple[int, ...]:
  """Accept f(2, 3), f((2, 3)) and f(5)."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  dims = tuple(shape)
  if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in dims):
    raise ValueError(f"a shape needs non-negative ints, got {dims}")
  return dims


def _is_torch_form(args: tuple, size: Any) -> bool:
  """PyTorch's calls give a size (a trailing sequence or size=) or float parameters; tinygrad's
  give only the shape positionally (ints, or one sequence)."""
  if size is not None or any(isinstance(a, float) for a in args): return True
  return len(args) >= 2 and isinstance(args[-1], (tuple, list))


def _call_form(args: tuple, kwargs: dict[str, Any], names: tuple[str, str],
               defaults: tuple[Any, Any], fn: str) -> tuple[tuple[int, ...], list[Any]]:
  """(shape, [a, b]) of a two-parameter distribution called PyTorch's way, (a, b, size), or
  tinygrad's, (*shape, a=..., b=...). randint's one-parameter (high, size) form leaves b None."""
  kw = dict(kwargs)
  size = kw.pop("size", None)
  if "shape" in kw: size = kw.pop("shape") if size is None else size
  torch_form = _is_torch_form(args, size)
  if torch_form and size is None and args and isinstance(args[-1], (tuple, list)):
    size, args = args[-1], args[:-1]
  positional = args if torch_form else ()
  if len(positional) > 2: raise TypeError(f"{fn}() takes at most 2 parameters, got {args}")
  vals = list(positional)
  for name, default in zip(names[len(vals):], defaults[len(vals):]):
    vals.append(kw.pop(name, None if fn == "randint" and len(positional) == 1 else default))
  if kw: raise TypeError(f"{fn}() got unexpected keyword argument(s) {sorted(kw)}")
  if not torch_form: return _dims(args), vals
  if size is None: return (), vals
  return _dims((size,) if isinstance(size, int) else (tuple(size),)), vals


def _device(device: str | None) -> str:
  return Device.canonicalize(device) if device is not None else Device.DEFAULT


def _float_dtype(dtype: Any) -> DType:
  dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
  if not dtypes.is_float(dt): raise TypeError(f"random floats need a float dtype, got {dt!r}")
  return dt


def _iota(cls: type[Tensor], n: int, device: str) -> Tensor:
  """[0, n) as uint64 without a reduction: the sum over bits b of 2**b where i mod 2**(b+1) >= 2**b.
  (arange is the spec's O(n^2) prefix sum; this is O(n log n) and fuses into its consumer.)
  The graph is built once per (n, device): a model's initializers ask for a few sizes many times,
  and building it (log2 n pads and expands) was most of the time a model's construction took."""
  u = _iota_graphs.get((n, device))
  if u is None:
    u = bounded_put(_iota_graphs, (n, device), _build_iota(cls, n, device).uop, IOTA_CACHE_SIZE)
  return cls._from_uop(u, device)


IOTA_CACHE_SIZE = 64
_iota_graphs: dict[tuple[int, str], UOp] = {}


def _build_iota(cls: type[Tensor], n: int, device: str) -> Tensor:
  k = max(1, (n - 1).bit_length())
  acc: Tensor | None = None
  for b in range(k):
    half = 1 << b
    # `half` zeros, then `half` copies of `half`
    bit = cls.full((half,), 0, dtypes.uint64, device).pad(((0, half),), value=half)
    bit = bit.reshape(1, 2 * half).expand(1 << (k - 1 - b), 2 * half).reshape(1 << k)
    acc = bit if acc is None else acc + bit
  assert acc is not None
  return acc.shrink(((0, n),))


def _random_bits(cls: type[Tensor], n: int, device: str) -> Tensor:
  """`n` words of 64 random bits (uint64, shape (n,)) from the device's stream."""
  key, base = rng.take(device, n)
  state = cls([key, base], dtype=dtypes.uint64, device=device)
  if engine.capturing:  # a TinyJit replay draws the next words of the stream, as this call did
    engine.capturing[-1].refills.append((engine.buffer_of(state.uop), _stream_refill(device, n)))
  return (_iota(cls, n, device) + state[1]).threefry(state[0])


def _stream_refill(device: str, n: int) -> Callable[[], bytes]:
  """The (key, counter) bytes for the next `n` words of `device`'s stream (advancing it)."""
  return lambda: to_bytes(dtypes.uint64, list(rng.take(device, n)))


def _unit32(word: Tensor, dtype: DType) -> Tensor:
  """A 32-bit word (held in uint64) -> [0, 1) with the mantissa bits of `dtype` (at most 23)."""
  m = MANTISSA_BITS[dtype]
  mant = (word >> (32 - m)) << (23 - m)
  one_to_two = (mant | 0x3F800000).cast(dtypes.uint32).bitcast(dtypes.float32)
  return (one_to_two - 1.0).cast(dtype)  # exact: a multiple of 2**-m below 1


def _unit64(bits: Tensor) -> Tensor:
  """64 random bits -> float64 in [0, 1) from the top 52 bits."""
  return ((bits >> 12) | 0x3FF0000000000000).bitcast(dtypes.float64) - 1.0


def _uniform01(cls: type[Tensor], dims: tuple[int, ...], dtype: DType, device: str) -> Tensor:
  n = math.prod(dims)
  if n == 0: return cls.empty(*dims, dtype=dtype, device=device)
  bits = _random_bits(cls, n, device)
  u = _unit64(bits) if dtype == dtypes.float64 else _unit32(bits >> 32, dtype)
  return u.reshape(*dims)


def _standard_normal(cls: type[Tensor], dims: tuple[int, ...], dtype: DType, device: str) -> Tensor:
  """Box-Muller: sqrt(-2 ln(1 - u1)) * cos(2 pi u2); one word per value below float64."""
  n = math.prod(dims)
  if n == 0: return cls.empty(*dims, dtype=dtype, device=device)
  if dtype == dtypes.float64:
    u = _unit64(_random_bits(cls, 2 * n, device))
    u1, u2 = u.shrink(((0, n),)), u.shrink(((n, 2 * n),))
  else:
    bits = _random_bits(cls, n, device)
    u1, u2 = _unit32(bits & MASK32, dtypes.float32), _unit32(bits >> 32, dtypes.float32)
  z = ((1.0 - u1).log() * -2.0).sqrt() * (u2 * (2 * math.pi)).cos()
  return z.cast(dtype).reshape(*dims)


def _compare_exchange(x: Tensor, half: int, mirror: bool) -> Tensor:
  """One bitonic pass over the last axis of (batch, n): blocks of 2*half elements put the min of
  each pair first; with `mirror`, element j pairs with the block's mirror image of j."""
  b, n = x.shape
  v = x.reshape(b, n // (2 * half), 2, half)
  lo, hi = v.shrink((None, None, (0, 1), None)), v.shrink((None, None, (1, 2), None))
  if mirror: hi = hi.flip(3)
  small, big = lo.minimum(hi), lo.maximum(hi)
  if mirror: big = big.flip(3)
  # interleave as min(small padded after, big padded before), padding with the largest key
  pad_small, pad_big = ((0, 0), (0, 0), (0, 1), (0, 0)), ((0, 0), (0, 0), (1, 0), (0, 0))
  out = small.pad(pad_small, value=MASK64).minimum(big.pad(pad_big, value=MASK64))
  return out.reshape(b, n).contiguous()


def _sort_unique(keys: Tensor) -> Tensor:
  """Sort the distinct uint64 keys of (batch, n) ascending along the last axis.
  A bitonic network: n padded to 2**k, k(k+1)/2 passes (one kernel each), O(n log^2 n) work."""
  b, n = keys.shape
  k = max(0, (n - 1).bit_length())
  # materialized first: computed once, not per read, and no pad nests inside the first pass's pads
  x = keys.contiguous()
  if (1 << k) != n: x = x.pad(((0, 0), (0, (1 << k) - n)), value=MASK64).contiguous()
  for p in range(k):
    x = _compare_exchange(x, 1 << p, mirror=True)
    for q in range(p - 1, -1, -1): x = _compare_exchange(x, 1 << q, mirror=False)
  return x.shrink((None, (0, n)))


def _with_index(cls: type[Tensor], high: Tensor, n: int, device: str) -> tuple[Tensor, int]:
  """Distinct sort keys: the top bits of `high` (uint64, (..., n)), the index in the low bits."""
  k = max(1, (n - 1).bit_length())
  return ((high >> k) << k) | _iota(cls, n, device), (1 << k) - 1


def _like(t: Tensor, ctor: Any, dtype: Any, device: str | None) -> Tensor:
  """`ctor` with t's shape, t's float dtype and t's device unless given."""
  dt = dtype or (t.dtype if dtypes.is_float(t.dtype) else None)
  return ctor(t.shape, dtype=dt, device=device or t.device)


class RandomMixin:
  """manual_seed, rand/randn/randint/randperm, distributions, initializers, multinomial, dropout."""

  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Seed every device's stream and restart its counter. `Tensor.manual_seed(42)`"""
    rng.seed, rng.counters = seed & MASK64, {}

  @classmethod
  def rand(cls, *shape: Any, dtype: Any = None, device: str | None = None,
           requires_grad: bool | None = None) -> Tensor:
    """Uniform floats in [0, 1). `Tensor.rand(2, 3)`"""
    t = _uniform01(cls, _dims(shape), _float_dtype(dtype), _device(device))
    t.requires_grad = requires_grad
    return t

  def rand_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform [0, 1) with this tensor's shape (and float dtype and device by default)."""
    return _like(self, type(self).rand, dtype, device)

  @classmethod
  def randn(cls, *shape: Any, dtype: Any = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
    """Standard normal floats (Box-Muller). `Tensor.randn(2, 3)`"""
    t = _standard_normal(cls, _dims(shape), _float_dtype(dtype), _device(device))
    t.requires_grad = requires_grad
    return t

  def randn_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """Standard normal with this tensor's shape (and float dtype and device by default)."""
    return _like(self, type(self).randn, dtype, device)

  @classmethod
  def randint(cls, *args: Any, dtype: Any = None, device: str | None = None,
              **kwargs: Any) -> Tensor:
    """Uniform integers in [low, high). PyTorch's forms `Tensor.randint(0, 10, (3,))` and
    `Tensor.randint(10, (3,))` (also `size=`/`shape=`), or tinygrad's
    `Tensor.randint(3, 4, low=0, high=10)` (shape first; low 0, high 10 by default)."""
    dims, (low, high) = _call_form(args, kwargs, ("low", "high"), (0, 10), "randint")
    if high is None: low, high = 0, low
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
      raise TypeError(f"randint: low and high must be ints, got {low!r} and {high!r}")
    if high <= low: raise ValueError(f"randint: need low < high, got [{low}, {high})")
    dev = _device(device)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
    n = math.prod(dims)
    if n == 0: return cls.empty(*dims, dtype=dt, device=dev)
    r = (_random_bits(cls, n, dev) % (high - low)).cast(dtypes.int64) + low
    return r.cast(dt).reshape(*dims)

  @classmethod
  def normal(cls, *args: Any, dtype: Any = None, device: str | None = None,
             requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    """Normal floats with `mean` and `std`: PyTorch's form `Tensor.normal(0, 2, (3, 3))` (also
    `size=`) or tinygrad's `Tensor.normal(3, 3, mean=0, std=2)` (shape first)."""
    dims, (mean, std) = _call_form(args, kwargs, ("mean", "std"), (0.0, 1.0), "normal")
    if std < 0: raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    t = cls.randn(dims, dtype=dtype, device=device).mul(std).add(mean)
    t.requires_grad = requires_grad
    return t

  @classmethod
  def uniform(cls, *args: Any, dtype: Any = None, device: str | None = None,
              requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
    """Uniform floats in [low, high): `Tensor.uniform(-1, 1, (3, 3))` (low, high, shape; also
    `size=`) or tinygrad's `Tensor.uniform(3, 3, low=-1, high=1)` (shape first)."""
    dims, (low, high) = _call_form(args, kwargs, ("low", "high"), (0.0, 1.0), "uniform")
    t = cls.rand(dims, dtype=dtype, device=device).mul(high - low).add(low)
    t.requires_grad = requires_grad
    return t

  @classmethod
  def scaled_uniform(cls, *shape: Any, dtype: Any = None, device: str | None = None,
                     requires_grad: bool | None = None) -> Tensor:
    """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
    dims = _dims(shape)
    bound = math.prod(dims) ** -0.5 if math.prod(dims) else 1.0
    return cls.uniform(-bound, bound, dims, dtype=dtype, device=device,
                       requires_grad=requires_grad)

  @classmethod
  def glorot_uniform(cls, *shape: Any, dtype: Any = None, device: str | None = None,
                     requires_grad: bool | None = None) -> Tensor:
    """Xavier/Glorot: uniform in +-sqrt(6 / (fan_out + fan_in)); fan_out = shape[0],
    fan_in = prod(shape[1:])."""
    dims = _dims(shape)
    bound = math.sqrt(6 / max(1, dims[0] + math.prod(dims[1:]))) if dims else 1.0
    return cls.uniform(-bound, bound, dims, dtype=dtype, device=device,
                       requires_grad=requires_grad)

  @classmethod
  def kaiming_uniform(cls, *shape: Any, a: float = math.sqrt(5), dtype: Any = None,
                      device: str | None = None, requires_grad: bool | None = None) -> Tensor:
    """He uniform: +-sqrt(3) * gain / sqrt(fan_in), gain = sqrt(2 / (1 + a^2)); the default a is
    PyTorch's Linear/Conv init."""
    dims = _dims(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(max(1, math.prod(dims[1:])))
    return cls.uniform(-bound, bound, dims, dtype=dtype, device=device,
                       requires_grad=requires_grad)

  @classmethod
  def kaiming_normal(cls, *shape: Any, a: float = 0.01, dtype: Any = None,
                     device: str | None = None, requires_grad: bool | None = None) -> Tensor:
    """He normal: std = sqrt(2 / (1 + a^2)) / sqrt(fan_in), fan_in = prod(shape[1:])."""
    dims = _dims(shape)
    std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(max(1, math.prod(dims[1:])))
    return cls.normal(0.0, std, dims, dtype=dtype, device=device, requires_grad=requires_grad)

  @classmethod
  def randperm(cls, n: int, dtype: Any = None, device: str | None = None) -> Tensor:
    """A random permutation of [0, n): unique random keys sorted by a bitonic network
    (about log2(n)^2 / 2 kernels). `Tensor.randperm(5)`"""
    if n < 0: raise ValueError(f"randperm: n must be non-negative, got {n}")
    dt, dev = to_dtype(dtype) if dtype is not None else dtypes.default_int, _device(device)
    if n <= 1: return cls.empty(0, dtype=dt, device=dev) if n == 0 else cls.full((1,), 0, dt, dev)
    keys, mask = _with_index(cls, _random_bits(cls, n, dev), n, dev)
    return (_sort_unique(keys.reshape(1, n)).reshape(n) & mask).cast(dt)

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Sample category indices with probability proportional to the (1-D or 2-D) weights.
    With replacement: inverse CDF (O(K^2) prefix sum over K categories); without: the exponential
    race (smallest E/w, E ~ Exp(1)) sorted bitonically. `Tensor([1, 3]).multinomial(4, True)`"""
    if self.ndim not in (1, 2):
      raise ValueError(f"multinomial needs 1-D or 2-D weights, got shape {self.shape}")
    if num_samples < 1:
      raise ValueError(f"multinomial: num_samples must be positive, got {num_samples}")
    w = self.float().reshape(-1, self.shape[-1])
    k = w.shape[1]
    if w.numel():
      invalid, empty = any_true((w < 0) | w.isnan() | w.isinf(), w.sum(-1) <= 0)
      if invalid:
        raise RuntimeError("multinomial: probability tensor contains either inf, nan or "
                           "element < 0")
      if empty: raise RuntimeError("multinomial: invalid distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > k:
      raise ValueError(f"multinomial: cannot draw {num_samples} samples from {k} categories "
                       "without replacement (pass replacement=True)")
    out = _sample_replacement(w, num_samples) if replacement else _sample_race(w, num_samples)
    return out.cast(dtypes.default_int).reshape(*self.shape[:-1], num_samples)

  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p), in training only
    (`Tensor.training`); otherwise the identity."""
    if not 0 <= p <= 1: raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not getattr(type(self), "training", False) or p == 0: return self
    if p == 1: return self.zeros_like()
    keep = type(self).rand(self.shape, dtype=dtypes.float32, device=self.device) >= p
    return keep.where(self * (1 / (1 - p)), 0).cast(self.dtype)


def _sample_replacement(w: Tensor, num_samples: int) -> Tensor:
  """(batch, K) weights -> (batch, S) indices: #{j : cdf_j <= u * total}."""
  cls, (b, k), dev = type(w), w.shape, w.device
  idx = _iota(cls, k, dev)
  tri = (idx.reshape(1, k) > idx.reshape(k, 1)).logical_not()  # tri[j, i] = i <= j
  cdf = tri.where(w.unsqueeze(-2), 0.0).sum(-1)
  u = cls.rand(b, num_samples, device=dev) * cdf[:, k - 1:]
  return (cdf.unsqueeze(-2) <= u.unsqueeze(-1)).sum(-1).minimum(k - 1)


def _sample_race(w: Tensor, num_samples: int) -> Tensor:
  """(batch, K) weights -> (batch, S) distinct indices: the S smallest E_i / w_i."""
  cls, (b, k), dev = type(w), w.shape, w.device
  race = (1.0 - cls.rand(b, k, device=dev)).log() / w.neg()
  # non-negative floats sort as their bits; clearing the sign bit turns -0.0 into 0.0
  high = (race.bitcast(dtypes.uint32) & 0x7FFFFFFF).cast(dtypes.uint64) << 32
  keys, mask = _with_index(cls, high, k, dev)
  return _sort_unique(keys).shrink((None, (0, num_samples))) & mask
