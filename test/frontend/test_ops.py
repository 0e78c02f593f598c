"""Every elementwise op, reduction and matmul against numpy / PyTorch, on PYTHON and CPU.

Compiling a CPU kernel costs ~0.1 s, so the dtype x op matrix packs the results of many ops into
one kernel (`pack`: each result flattened and padded into its own slice of one 1-D tensor), and
the failing op is named from its slice. Ints and bools are checked against numpy (same wrapping,
floor division and shift semantics as PyTorch, and it has uint16..uint64 arithmetic), floats
against PyTorch (its float16/bfloat16 rounding). PYTHON cases stay small (it interprets).
"""
import math
import operator

import numpy as np
import pytest
import torch

from unigrad import Tensor
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import dtypes
from unigrad.engine.programs import renderer_for
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.uop import AxisType, Ops, ReduceArg, UOp

ALL = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
       dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
       dtypes.float64)
INTS = tuple(dt for dt in ALL if dtypes.is_int(dt))
NO_TORCH_OPS = (dtypes.uint16, dtypes.uint32, dtypes.uint64)  # torch has the dtypes, not the ops
FLOATS = tuple(dt for dt in ALL if dtypes.is_float(dt))
TORCH = {dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8,
         dtypes.int16: torch.int16, dtypes.uint16: torch.uint16, dtypes.int32: torch.int32,
         dtypes.uint32: torch.uint32, dtypes.int64: torch.int64, dtypes.uint64: torch.uint64,
         dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
         dtypes.float32: torch.float32, dtypes.float64: torch.float64}
TORCH_DT = {v: k for k, v in TORCH.items()}
# numpy holds bfloat16 values as float32
NP = {dt: np.dtype("float32" if dt == dtypes.bfloat16 else str(TORCH[dt]).split(".")[1])
      for dt in ALL}
RTOL = {dtypes.float16: 1e-3, dtypes.bfloat16: 8e-3, dtypes.float32: 1e-6, dtypes.float64: 1e-12}


# ---- helpers ----

def data(rng, dt, shape, lo=-20, hi=20, nonzero=False):
  """Random values of `dt` as a numpy array (bfloat16 values as float32); ints cover [lo, hi]
  clipped to the type, floats [lo/4, hi/4] rounded to the type."""
  if dt == dtypes.bool: return rng.integers(0, 2, shape).astype(bool)
  if dtypes.is_float(dt):
    x = rng.uniform(lo / 4, hi / 4, shape)
    if nonzero: x = np.where(np.abs(x) < 0.25, 0.75, x)
    return torch.from_numpy(x).to(TORCH[dt]).float().numpy().astype(NP[dt])
  info = np.iinfo(NP[dt])
  x = rng.integers(max(lo, info.min), min(hi, info.max) + 1, shape)
  if nonzero: x = np.where(x == 0, 3, x)
  return x.astype(NP[dt])


def tensor(x, dt, device, view="contiguous"):
  """`x` as a Tensor of `dt` on `device`, read through a non-contiguous view of another buffer
  when `view` is permuted/flipped/strided (x must be 2-D then)."""
  def mk(a: np.ndarray) -> Tensor:
    if dt == dtypes.bfloat16: return Tensor(a.tolist(), dtype=dt, device=device)
    return Tensor(np.ascontiguousarray(a), device=device)
  if view == "permuted": return mk(x.T).permute(1, 0)
  if view == "flipped": return mk(x[::-1, ::-1]).flip(0, 1)
  if view == "strided":
    big = np.zeros((2 * x.shape[0] + 1, x.shape[1]), dtype=x.dtype)
    big[-2::-2] = x
    return mk(big)[-2::-2]
  return mk(x)


def ref(x, dt):
  """A numpy array (ints, bool) or a torch tensor (floats) to compute the reference with."""
  return torch.from_numpy(np.ascontiguousarray(x)).to(TORCH[dt]) if dtypes.is_float(dt) else x


def as_numpy(r):
  if isinstance(r, torch.Tensor): return (r.float() if r.dtype == torch.bfloat16 else r).numpy()
  return np.asarray(r)


def assert_close(got, want, dt, rtol=None, atol=0.0, what=""):
  got, want = np.asarray(got), as_numpy(want)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if dtypes.is_float(dt):
    rtol = RTOL[dt] if rtol is None else rtol
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True, err_msg=what)
  else: np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)


def pack(results):
  """One 1-D tensor holding every result (all of one dtype) flattened, in order: one kernel."""
  flat = [r.reshape(-1) for r in results]
  total = sum(f.shape[0] for f in flat)
  out, start = None, 0
  for f in flat:
    part = f.pad(((start, total - start - f.shape[0]),))
    out = part if out is None else out + part
    start += f.shape[0]
  return out


def has_pad(t):
  return any(u.op is Ops.PAD for u in t.uop.toposort())


def check_packed(named, want, dt, **tol):
  """Realize `named` {name: Tensor} in one kernel and compare each to want[name]. Results that
  contain a PAD are realized alone, so that a nested-PAD bug cannot hide the op under test."""
  packed = [n for n in named if not has_pad(named[n])]
  got = {n: named[n].numpy() for n in named if n not in packed}
  flat, start = pack([named[n] for n in packed]).numpy() if packed else None, 0
  for n in packed:
    size = math.prod(named[n].shape)
    got[n] = flat[start:start + size].reshape(named[n].shape)
    start += size
  for n in named: assert_close(got[n], want[n], dt, what=n, **tol)


# ---- elementwise: every op for every dtype ----

def _same_dtype_ops(dt):
  """name -> (ours, reference) for ops whose result keeps the operands' dtype."""
  ops = {"add": (operator.add, operator.add), "maximum": (Tensor.maximum, _maximum),
         "minimum": (Tensor.minimum, _minimum),
         "where": (lambda a, b: (a < b).where(a, b), lambda a, b: _where(a < b, a, b))}
  if dt == dtypes.bool:
    ops["mul"] = (operator.mul, operator.and_)
  else:
    ops.update({"sub": (operator.sub, operator.sub), "mul": (operator.mul, operator.mul),
                "floordiv": (operator.floordiv, operator.floordiv),
                "mod": (operator.mod, operator.mod), "neg": (lambda a, b: -a, lambda a, b: -a),
                "abs": (lambda a, b: a.abs(), lambda a, b: abs(a))})
  if not dtypes.is_float(dt):
    ops.update({"and": (operator.and_, operator.and_), "or": (operator.or_, operator.or_),
                "xor": (operator.xor, operator.xor), "invert": (lambda a, b: ~a, lambda a, b: ~a)})
  else: ops["trunc"] = (lambda a, b: a.trunc(), lambda a, b: torch.trunc(a))
  return ops


def _lib(a): return torch if isinstance(a, torch.Tensor) else np
def _maximum(a, b): return _lib(a).maximum(a, b)
def _minimum(a, b): return _lib(a).minimum(a, b)
def _where(c, a, b): return _lib(a).where(c, a, b)


CMP_OPS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
           "eq": operator.eq, "ne": operator.ne}


def _inputs(dt, device, seed):
  rng = np.random.default_rng(seed)
  shape = (3, 4) if device == "CPU" else (2, 3)
  x, y = data(rng, dt, shape), data(rng, dt, shape, nonzero=True)
  if not dtypes.is_float(dt) and dt != dtypes.bool:  # the extremes wrap; no MIN // -1
    x.flat[0], x.flat[1] = np.iinfo(NP[dt]).max, np.iinfo(NP[dt]).min
    y.flat[1] = 3
  return x, y, tensor(x, dt, device, "permuted"), tensor(y, dt, device, "flipped")


def _unary_float_ops(dt, x, device):
  """name -> (ours, reference) for ops with a float result (float32 for ints and bool)."""
  ops = {"reciprocal": (Tensor.reciprocal, torch.reciprocal), "sqrt": (Tensor.sqrt, torch.sqrt),
         "exp2": (Tensor.exp2, torch.exp2), "log2": (Tensor.log2, torch.log2),
         "sin": (Tensor.sin, torch.sin)}
  return {n: (f(x[0]), r(x[1])) for n, (f, r) in ops.items()}


def _pow_case(dt, device):
  """Ints: small bases and exponents (an overflowing float -> int cast is UB in C)."""
  rng = np.random.default_rng(12)
  base, e = data(rng, dt, (2, 3), -6, 6), data(rng, dt, (2, 3), 0, 3)
  if dtypes.is_float(dt): base, e = data(rng, dt, (2, 3), 0, 12), data(rng, dt, (2, 3))
  want = base ** e if dt in NO_TORCH_OPS else ref(base, dt) ** ref(e, dt)
  return tensor(base, dt, device) ** tensor(e, dt, device), want


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_elementwise_every_op(device, dt):
  """Every elementwise op on non-contiguous inputs of `dt` (a permuted and a flipped view), with
  the result dtype PyTorch gives; all results of one dtype are checked in one kernel."""
  x, y, a, b = _inputs(dt, device, 1)
  y.flat[2] = x.flat[2]  # an equal pair for the comparisons
  b = tensor(y, dt, device, "flipped")
  rx, ry = ref(x, dt), ref(y, dt)
  with np.errstate(all="ignore"):
    same = {n: (f(a, b), r(rx, ry)) for n, (f, r) in _same_dtype_ops(dt).items()}
    cmp = {n: (f(a, b), f(rx, ry)) for n, f in CMP_OPS.items()}
    cmp["logical_not"] = (a.logical_not(), np.logical_not(x))
    if dtypes.is_int(dt): same.update(_shift_cases(dt, a, x, device))
    if dt != dtypes.bool: same["pow"] = _pow_case(dt, device)
  out = dt if dtypes.is_float(dt) else dtypes.float32
  tx, ty = torch.from_numpy(x).to(TORCH[dt]), torch.from_numpy(y).to(TORCH[dt])
  floats = {"truediv": (a / b, tx / ty)} | _unary_float_ops(dt, (a, tx), device)
  assert {n: t.dtype for n, (t, _) in same.items()} == dict.fromkeys(same, dt)
  assert {n: t.dtype for n, (t, _) in cmp.items()} == dict.fromkeys(cmp, dtypes.bool)
  assert {n: t.dtype for n, (t, _) in floats.items()} == dict.fromkeys(floats, out)
  # comparisons ride along cast to dt (one kernel fewer); float results share dt when dt is a float
  groups = [same | {n: (t.cast(dt), as_numpy(w).astype(NP[dt])) for n, (t, w) in cmp.items()}]
  groups += [floats] if out != dt else []
  if out == dt: groups[0] |= floats
  for group, gdt in zip(groups, (dt, out)):
    tol = {"rtol": 2e-5, "atol": 1e-6} if gdt == dtypes.float32 else {}
    check_packed({n: t for n, (t, _) in group.items()}, {n: w for n, (_, w) in group.items()}, gdt,
                 **tol)


def _shift_cases(dt, a, x, device):
  k = np.random.default_rng(2).integers(0, 8 * NP[dt].itemsize, x.shape).astype(NP[dt])
  s = tensor(k, dt, device)
  one, two = NP[dt].type(1), NP[dt].type(2)
  return {"shl": (a << s, x << k), "shr": (a >> s, x >> k), "shl1": (a << 1, x << one),
          "shr2": (a >> 2, x >> two)}


# ---- semantics in detail ----

def test_floordiv_mod_python_semantics(device):
  """// rounds toward -inf and % takes the divisor's sign, for every sign combination."""
  x = np.array([-7, -7, 7, 7, 0, -1, 5, 6, -6, 127, -128, -128])
  y = np.array([3, -3, 3, -3, 5, 4, -1, -4, 4, -1, 3, -1])
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64):
    a, b = Tensor(x.astype(NP[dt]), device=device), Tensor(y.astype(NP[dt]), device=device)
    with np.errstate(all="ignore"):
      want_q = (x // y).astype(NP[dt])
      want_r = (x % y).astype(NP[dt])
    check_packed({"floordiv": a // b, "mod": a % b, "mod_scalar": a % -3, "rmod": 7 % b,
                  "trunc_div": a.div(b, rounding_mode="trunc")},
                 {"floordiv": want_q, "mod": want_r, "mod_scalar": (x % -3).astype(NP[dt]),
                  "rmod": (7 % y).astype(NP[dt]),
                  "trunc_div": np.trunc(x / y).astype(np.int64).astype(NP[dt])}, dt)
  xf, yf = torch.tensor([-7.5, 7.5, -7.5, 7.5, 0.5]), torch.tensor([2.0, -2.0, -2.0, 2.0, -3.0])
  a, b = Tensor(xf.numpy(), device=device), Tensor(yf.numpy(), device=device)
  check_packed({"floordiv": a // b, "mod": a % b, "trunc": a.div(b, rounding_mode="trunc")},
               {"floordiv": xf // yf, "mod": xf % yf,
                "trunc": torch.div(xf, yf, rounding_mode="trunc")},
               dtypes.float32)


@pytest.mark.parametrize("dt", (dtypes.float16, dtypes.bfloat16, dtypes.float32), ids=str)
def test_float_floordiv_mod_round_once(device, dt):
  """Regression: float // and % rounded every step of a - floor(a/b)*b (float32 % was off by an
  ulp of a, 16-bit floats by more); they compute in a wider float and round once, like PyTorch."""
  rng = np.random.default_rng(13)
  tx = torch.from_numpy(rng.uniform(-5, 5, 24)).to(TORCH[dt])
  ty = torch.from_numpy(rng.uniform(0.1, 3, 24) * rng.choice([-1, 1], 24)).to(TORCH[dt])
  a = Tensor(tx.float().tolist(), dtype=dt, device=device)
  b = Tensor(ty.float().tolist(), dtype=dt, device=device)
  check_packed({"floordiv": a // b, "mod": a % b}, {"floordiv": tx // ty, "mod": tx % ty}, dt,
               rtol=0)


NAN_X = [math.nan, 1.0, math.nan, -math.inf, math.inf, 0.0, -0.0, 2.5]
NAN_Y = [1.0, math.nan, math.nan, -math.inf, 1.0, -0.0, 0.0, math.inf]


@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.bfloat16), ids=str)
def test_nan_and_inf_like_pytorch(device, dt):
  """NaN compares false (except !=), max/min propagate it, casts to bool make it true."""
  tx, ty = torch.tensor(NAN_X).to(TORCH[dt]), torch.tensor(NAN_Y).to(TORCH[dt])
  a, b = Tensor(NAN_X, device=device, dtype=dt), Tensor(NAN_Y, device=device, dtype=dt)
  ours = {n: f(a, b) for n, f in CMP_OPS.items()} | {"not": a.logical_not(), "b": a.bool()}
  want = {n: f(tx, ty) for n, f in CMP_OPS.items()} | {"not": tx.logical_not(), "b": tx.bool()}
  check_packed(ours, want, dtypes.bool)
  check_packed({"max": a.maximum(b), "min": a.minimum(b), "trunc": a.trunc(), "floor": a.floor(),
                "ceil": a.ceil(), "sqrt": a.sqrt(), "recip": a.reciprocal(), "add": a + b},
               {"max": torch.maximum(tx, ty), "min": torch.minimum(tx, ty), "trunc": tx.trunc(),
                "floor": tx.floor(), "ceil": tx.ceil(), "sqrt": tx.sqrt(), "recip": tx.reciprocal(),
                "add": tx + ty}, dt)


INF_X = [5.0, -5.0, 5.0, -5.0, 0.0, -0.0, 0.0, -0.0, math.inf, -math.inf, math.inf, 3.0, -4.0,
         4.0, -0.0, math.nan, 1.0, 2.5, -2.5, 1e30]
INF_Y = [math.inf, math.inf, -math.inf, -math.inf, math.inf, math.inf, -math.inf, -math.inf, 2.0,
         -2.0, math.inf, 0.0, 2.0, -2.0, 3.0, 1.0, math.nan, -0.0, 0.0, 3.0]


def signed(x):
  """Values with -0.0 told from 0.0 (as -1e-300 vs 1e-300): assert_allclose ignores the sign."""
  x = np.asarray(x, np.float64)
  return np.where(x == 0, np.copysign(1e-300, x), x)


@pytest.mark.parametrize("dt", (dtypes.float16, dtypes.float32, dtypes.float64), ids=str)
def test_floor_mod_and_floordiv_with_infinities_match_torch(device, dt):
  """Regression: a - floor(a/b)*b gave nan for a finite a % +-inf (torch.remainder: a, or b when
  the signs differ) and +-0.0 for zero results (torch keeps fmod's sign, the sign of a); a // +-inf
  was -0.0 where torch.floor_divide gives -1, and inf // 2 was inf (torch: nan)."""
  tx, ty = torch.tensor(INF_X).to(TORCH[dt]), torch.tensor(INF_Y).to(TORCH[dt])
  a = Tensor(tx.numpy(), device=device)
  b = Tensor(ty.numpy(), device=device)
  mod, div = (a % b).numpy(), (a // b).numpy()
  for got, want, what in ((mod, torch.remainder(tx, ty), "%"), (div, tx // ty, "//")):
    np.testing.assert_array_equal(signed(got), signed(want.numpy()), err_msg=what)


def test_abs_of_negative_zero_and_nan(device):
  """abs(-0.0) is +0.0 (it was -0.0), abs(nan) nan, like PyTorch."""
  x = [-0.0, 0.0, math.nan, -math.inf, -2.0, 3.0]
  got = Tensor(x, device=device).abs().numpy()
  np.testing.assert_array_equal(signed(got), signed(torch.tensor(x).abs().numpy()))


def ulps32(got, want):
  """Distance in float32 ulps (positions in the ordered list of floats; nan == nan)."""
  def order(v):
    i = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)
  d = np.abs(order(got) - order(want)).astype(np.float64)
  both = np.isnan(got) & np.isnan(want)
  d[both] = 0
  d[np.isnan(got) ^ np.isnan(want)] = np.inf
  return d


def float32_points(rng, n, lo, hi):
  """n float32 in +-[lo, hi), spread over the binades, plus the floats nearest k*pi/2."""
  mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n)) * rng.choice([-1, 1], n)
  ks = np.round(np.exp(rng.uniform(0, np.log(hi / 1.5), n // 8)))
  return np.concatenate([mag, ks * (np.pi / 2)]).astype(np.float32)


COS_RANGES = [(1e-3, 10.0), (10.0, 1e4), (1e4, 1e6), (1e6, 1e30)]


@pytest.mark.parametrize("lo,hi", COS_RANGES, ids=lambda v: f"{v:g}")
def test_cos_accurate_for_large_arguments(device, lo, hi):
  """Regression: cos(x) was sin(pi/2 - x): pi/2 - x rounds, so |x| > 1e4 gave garbage and the
  zeros of cos were off by ~1e5 ulp already below 10. Now within 2 ulp of the exact float64 cos
  (PyTorch: 1), and 3 of torch.cos, for every float32 with a finite 2x."""
  n = 40 if device == "PYTHON" else 20000
  x = float32_points(np.random.default_rng(int(lo)), n, lo, hi)
  got = Tensor(x, device=device).cos().numpy()
  exact = np.cos(x.astype(np.float64)).astype(np.float32)
  assert ulps32(got, exact).max() <= 2, x[ulps32(got, exact).argmax()]
  assert ulps32(got, torch.from_numpy(x).cos().numpy()).max() <= 3


def test_cos_edge_values(device):
  """cos of 0, -0, denormals, inf, nan, and where 2x overflows (|x| >= 2**127, computed as
  1 - 2 sin(x/2)**2: within 1e-6 absolute, never outside [-1, 1])."""
  x = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-38, math.inf, -math.inf, math.nan, 2.0 ** 127,
                  3.4e38, -3.4028235e38, 2.9e38])
  got = Tensor(x, device=device).cos().numpy()
  want = torch.from_numpy(x).cos().numpy()
  np.testing.assert_array_equal(got[:8], want[:8])
  assert np.all(np.abs(got[8:]) <= 1) and np.abs(got[8:] - want[8:]).max() < 1e-6


@pytest.mark.parametrize("dt", (dtypes.float16, dtypes.bfloat16, dtypes.float64), ids=str)
def test_cos_other_float_dtypes(device, dt):
  """float16/bfloat16 compute in float32 and round once (equal to torch); float64 within 2 ulp."""
  rng = np.random.default_rng(5)
  n = 40 if device == "PYTHON" else 4000
  hi = 6e4 if dt == dtypes.float16 else 1e9
  tx = torch.from_numpy(rng.uniform(-hi, hi, n) * rng.choice([1, 1e-4], n)).to(TORCH[dt])
  x = Tensor(tx.float().tolist(), dtype=dt, device=device) if dt == dtypes.bfloat16 else Tensor(
    tx.numpy(), device=device)
  got = torch.from_numpy(x.cos().float().numpy() if dt == dtypes.bfloat16 else x.cos().numpy())
  want = tx.cos().to(got.dtype)
  if dt != dtypes.float64:
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL[dt], atol=0)
    return
  spacing = np.spacing(np.abs(want.numpy()))
  assert (np.abs(got.numpy() - want.numpy()) / spacing).max() <= 2


EXP_RANGES = {dtypes.float32: (-103.98, 88.72), dtypes.float64: (-745.1, 709.78),
              dtypes.float16: (-17.3, 11.08), dtypes.bfloat16: (-92.0, 88.5)}


@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16),
                         ids=str)
def test_exp_accurate_over_the_whole_range(device, dt):
  """Regression: exp(x) was exp2(x*log2(e)); the rounded product cost up to ~60 ulp (float32) for
  large |x|. Now 1 ulp from the exact result over the range that neither overflows nor flushes to
  0 (denormals included), and equal to torch for float16/bfloat16."""
  rng = np.random.default_rng(11)
  n = 40 if device == "PYTHON" else 20000
  lo, hi = EXP_RANGES[dt]
  tx = torch.from_numpy(np.concatenate([rng.uniform(lo, hi, n), rng.uniform(-2, 2, n // 4)]))
  tx = tx.to(TORCH[dt])
  x = Tensor(tx.float().tolist(), dtype=dt, device=device) if dt == dtypes.bfloat16 else Tensor(
    tx.numpy(), device=device)
  got = torch.from_numpy(x.exp().float().numpy() if dt == dtypes.bfloat16 else x.exp().numpy())
  exact = tx.double().exp().to(TORCH[dt]).to(got.dtype)
  if dt in (dtypes.float16, dtypes.bfloat16):
    np.testing.assert_array_equal(got.numpy(), tx.exp().to(got.dtype).numpy())
    return
  spacing = np.spacing(exact.numpy())
  err = np.abs(got.numpy() - exact.numpy()) / spacing
  assert err.max() <= 1, tx[int(err.argmax())]


def test_exp_edge_values(device):
  """inf, -inf, nan, +-0, the overflow threshold, denormal results and flush to 0 like torch."""
  x = np.float32([math.inf, -math.inf, math.nan, 0.0, -0.0, 88.72283, 88.7228394, 89.0, 1e30,
                  -87.33654, -103.27893, -103.972084, -104.0, -1e30, 1e-45])
  np.testing.assert_array_equal(Tensor(x, device=device).exp().numpy(),
                                torch.from_numpy(x).exp().numpy())


def test_exp_gradient_is_exp_near_the_overflow_and_at_the_edges(device):
  """Regression: with exp composed from a polynomial in the tensor graph, autograd differentiated
  the polynomial and the 2**n scaling, giving nan near the overflow (88.5), at -inf, and a zero
  gradient through the rounding constant. The gradient is exp(x) like torch."""
  x = np.float32([-math.inf, -200.0, -103.5, -1.0, 0.0, 3.0, 88.5, 88.72, 89.0, math.inf])
  t = Tensor(x, device=device, requires_grad=True)
  t.exp().sum().backward()
  tx = torch.from_numpy(x).requires_grad_()
  tx.exp().sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=2e-7)


def test_cpu_mul_then_add_rounds_each_op():
  """x*x rounds to float32 before the add, as on the PYTHON device and in PyTorch."""
  if find_c_compiler() is None: pytest.skip("no C compiler")
  for device in ("PYTHON", "CPU"):
    x, z = Tensor([1 + 2 ** -20], device=device), Tensor([-(1 + 2 ** -19)], device=device)
    assert (x * x + z).tolist() == [0.0], device


def test_le_ge_on_integers(device):
  """Regression: integer a <= b computed a >= b."""
  a, b = Tensor([1, 2, 3], device=device), Tensor([2, 2, 2], device=device)
  assert (a <= b).tolist() == [True, True, False]
  assert (a >= b).tolist() == [False, True, True]
  assert (Tensor([True, False], device=device) <= True).tolist() == [True, True]


def test_narrow_int_arithmetic_wraps_before_use(device):
  """Regression (C renderer): uint8/int16 sums were compared and shifted at int width."""
  a = Tensor(np.array([200, 100, 255], np.uint8), device=device)
  b = Tensor(np.array([100, 10, 1], np.uint8), device=device)
  assert ((a + b) < 50).tolist() == [True, False, True]
  assert ((a << 1) >> 1).tolist() == [72, 100, 127]
  h = Tensor(np.array([30000, -30000], np.int16), device=device)
  assert ((h * 2) // 2).tolist() == [-2768, 2768]


def test_small_int_arithmetic_wraps_before_a_widening_cast(device):
  """Regression (kernel simplifier): cast(a+b) was distributed into cast(a)+cast(b) when a+b
  could wrap in its own dtype, so uint8 200+100 cast to int32 gave 300."""
  u8 = lambda v: Tensor(np.array(v, np.uint8), device=device)  # noqa: E731
  assert (u8([200]) + u8([100])).cast(dtypes.int32).tolist() == [44]
  want = (torch.tensor([200, 100], dtype=torch.uint8) + torch.tensor([100, 200], dtype=torch.uint8))
  assert (u8([200, 100]) + u8([100, 200])).sum().item() == want.sum().item() == 88
  i32 = Tensor(np.array([-2**31, 2**30], np.int32), device=device)
  assert (i32 * 3).cast(dtypes.int64).tolist() == [-2**31, -2**30]
  assert (u8([16]) * u8([20])).cast(dtypes.int64).tolist() == [64]


def test_shift_past_width_like_pytorch(device):
  """Regression (C renderer): a shift by >= the width was undefined behaviour in C."""
  a = Tensor(np.array([1, -1, 5, -128], np.int32), device=device)
  k = Tensor(np.array([40, 40, 32, 33], np.int32), device=device)
  want_l = (torch.tensor([1, -1, 5, -128], dtype=torch.int32) << torch.tensor([40, 40, 32, 33],
                                                                               dtype=torch.int32))
  assert (a << k).tolist() == want_l.tolist()
  assert (a >> k).tolist() == [0, -1, 0, -1]


@pytest.mark.parametrize("n", [3, 4, 16, 17])
def test_constant_shift_past_width_agrees_on_vector_and_scalar_paths(device, n):
  """Regression: `int32 << 32` gave -1s on CPU for 4 elements (vector path) and 0s for 3."""
  ones, neg = Tensor([1] * n, dtype=dtypes.int32, device=device), Tensor([-8] * n, device=device)
  t_ones, t_neg = torch.ones(n, dtype=torch.int32), torch.full((n,), -8, dtype=torch.int64)
  assert (ones << 32).tolist() == (t_ones << 32).tolist()
  assert (ones << 33).tolist() == (t_ones << 33).tolist()
  assert (neg >> 70).tolist() == (t_neg >> 70).tolist()
  assert (neg.cast(dtypes.uint8) << 9).tolist() == [0] * n


def test_int_floordiv_on_cpu_with_negative_operands(device):
  """Regression (C renderer): IDIV/MOD of possibly negative ints had no C rendering."""
  a = Tensor([-7, 7, -8], device=device, dtype=dtypes.int32)
  assert (a // 2).tolist() == [-4, 3, -4] and (a % 3).tolist() == [2, 1, 1]


def test_truediv_scalar_does_not_wrap_in_int_dtype(device):
  """Regression: uint8 / -3 cast -3 to uint8 (253) before dividing."""
  a = Tensor(np.array([3, 6], np.uint8), device=device)
  np.testing.assert_allclose((a / -3).numpy(), [-1.0, -2.0])
  np.testing.assert_allclose((-3 / a).numpy(), [-1.0, -0.5])


def test_bool_sub_and_neg_are_errors():
  t = Tensor([True, False], device="PYTHON")
  for f in (lambda: t - t, lambda: t - 1, lambda: Tensor([1, 2], device="PYTHON") - True,
            lambda: True - Tensor([1.0], device="PYTHON"), lambda: -t):
    with pytest.raises(TypeError): f()


def test_integer_pow_is_exact_and_wraps_like_pytorch(device):
  """Regression: int64 3**39 was computed in float64 (4052555153018969600, off by 6667)."""
  assert (Tensor([3], dtype=dtypes.int64, device=device) ** 39).tolist() == [3 ** 39]
  a, b = [3, -3, 1, -1, 0, 2, 7, 5], [39, 5, -2, -3, 0, -1, 21, 40]
  ta, tb = torch.tensor(a), torch.tensor(b)
  assert (Tensor(a, device=device) ** Tensor(b, device=device)).tolist() == (ta ** tb).tolist()
  u8 = Tensor(a, device=device).cast(dtypes.uint8)
  assert (u8 ** 13).tolist() == (ta.to(torch.uint8) ** 13).tolist()
  i32 = Tensor([3, 10, 40], dtype=dtypes.int32, device=device)
  assert (2 ** i32).tolist() == (2 ** torch.tensor([3, 10, 40], dtype=torch.int32)).tolist()


def test_float32_pow_is_accurate_on_cpu():
  """Regression: float32 pow on CPU was up to 96 ulp off; PyTorch is within 1 ulp."""
  if find_c_compiler() is None: pytest.skip("no C compiler")
  rng = np.random.default_rng(1)
  a = np.exp(rng.uniform(-8, 8, 4000)).astype(np.float32)
  b = rng.uniform(-12, 12, 4000).astype(np.float32)
  want = np.power(a.astype(np.float64), b.astype(np.float64))
  got = (Tensor(a, device="CPU") ** Tensor(b, device="CPU")).numpy().astype(np.float64)
  ok = (want > 1e-37) & (want < 3e38)
  ulp = np.spacing(want[ok].astype(np.float32)).astype(np.float64)
  assert (np.abs(got[ok] - want[ok]) <= ulp).all()


def test_float_sum_over_2_31_and_more_elements_is_right():
  """Regression: one float32 accumulator over 2**31+5 ones stopped at 2**24 (and 2**33 ones gave
  2**32); PyTorch gives 2**31 (2**31+5 rounded to float32) and 2**33."""
  if find_c_compiler() is None: pytest.skip("no C compiler")
  assert Tensor.ones(2 ** 33, device="CPU").sum().item() == 2.0 ** 33
  assert Tensor.ones(2 ** 31 + 5, device="CPU").sum().item() == 2.0 ** 31
  assert Tensor.ones(3, 2 ** 31 + 5, device="CPU").mean(1).tolist() == [1.0] * 3
  assert Tensor.full((2 ** 23 + 1, 2), 0.5, device="CPU").sum(0).tolist() == [4194304.5] * 2


def test_long_float_sum_has_no_long_accumulation_loop():
  """Long float sums are summed in chunks: no kernel loops over more than a chunk."""
  linear = Tensor.empty(2 ** 31 + 5, device="NULL").sum().schedule()
  loops = [u.src[0].arg for call in linear.src for u in call.src[0].toposort()
           if u.op is Ops.RANGE and u.arg.axis_type is AxisType.REDUCE]
  assert loops and max(loops) <= 2 ** 16


def test_index_arithmetic_over_2_31_elements_is_64_bit():
  """Loops and addresses into buffers of more than 2**31 elements use 64-bit integers in C."""
  kernel = (Tensor.empty(2 ** 31 + 5, device="NULL") + 1).schedule().src[-1].src[0]
  ren = renderer_for("CPU")
  src = ren.render("k", full_rewrite(kernel, ren))
  assert "long long ridx0" in src and "2147483653LL" in src and "int ridx0" not in src


def test_long_float_sum_of_data_matches_float64():
  a = np.random.default_rng(2).random((2 ** 22 + 7,), dtype=np.float32)
  got = Tensor(a, device="CPU" if find_c_compiler() else "PYTHON").sum().item()
  assert abs(got - a.astype(np.float64).sum()) <= 1e-6 * a.sum(dtype=np.float64)


def test_int_pow_negative_scalar_exponent_is_an_error():
  with pytest.raises(ValueError, match="negative"): Tensor([2, 3], device="PYTHON") ** -1
  assert (Tensor([2.0], device="PYTHON") ** -1).tolist() == [0.5]


def test_where_and_cast_to_from_bool(device):
  c = Tensor([True, False, True], device=device)
  x = Tensor(np.array([1, 2, 3], np.int8), device=device)
  out = c.where(x, 2.5)
  assert out.dtype == dtypes.float32 and out.tolist() == [1.0, 2.5, 3.0]
  assert c.where(x, Tensor(np.array([9, 9, 9], np.int16), device=device)).dtype == dtypes.int16
  assert Tensor([0.0, -0.5, 2.0], device=device).where(1, 0).tolist() == [0, 1, 1]


# ---- broadcasting, views and scalars ----

SHAPE_PAIRS = [((3, 1, 4), (2, 1)), ((1,), ()), ((2, 3), (3,)), ((1, 1), (4, 1, 5)),
               ((5,), (1,)), ((2, 1, 3), (2, 4, 1))]


def test_broadcasting(device):
  rng = np.random.default_rng(6)
  named, want = {}, {}
  for sa, sb in SHAPE_PAIRS:
    x, y = data(rng, dtypes.float32, sa), data(rng, dtypes.float32, sb, nonzero=True)
    a, b = Tensor(x, device=device), Tensor(y, device=device)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for n, f, r in (("add", operator.add, operator.add),
                    ("radd", lambda u, v: v + u, lambda u, v: v + u),
                    ("div", operator.truediv, operator.truediv),
                    ("where", lambda u, v: (u < v).where(u, v * 2),
                     lambda u, v: torch.where(u < v, u, v * 2))):
      named[f"{n}{sa}{sb}"], want[f"{n}{sa}{sb}"] = f(a, b), r(tx, ty)
  check_packed(named, want, dtypes.float32)


def test_noncontiguous_inputs(device):
  rng = np.random.default_rng(7)
  x, y = data(rng, dtypes.int32, (3, 4)), data(rng, dtypes.int32, (4,), nonzero=True)
  b = Tensor(y, device=device)
  named, want = {}, {}
  for view in ("permuted", "flipped", "strided", "expanded"):
    xv = np.broadcast_to(x[:1], (3, 4)).copy() if view == "expanded" else x
    if view == "expanded": a = Tensor(x[:1], device=device).expand(3, 4)
    else: a = tensor(x, dtypes.int32, device, view)
    for n, f in (("mul", lambda u, v: u * v), ("mod", lambda u, v: u % v), ("self", lambda u, v: u),
                 ("T", lambda u, v: u.T + 1)):
      named[f"{n}-{view}"], want[f"{n}-{view}"] = f(a, b), f(xv, y)
  check_packed(named, want, dtypes.int32)


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_python_scalars_and_0d_tensors(dt):
  """Result dtypes of tensor-scalar ops follow torch (no kernel runs)."""
  a, ta = Tensor([1, 1], dtype=dt, device="PYTHON"), torch.ones(2, dtype=TORCH[dt])
  for s in (True, 3, -2, 2.5):
    for name, f in (("add", operator.add), ("mul", operator.mul), ("lt", operator.lt),
                    ("truediv", operator.truediv), ("max", lambda u, v: u.maximum(v))):
      tf = (lambda u, v: torch.maximum(u, torch.tensor(v))) if name == "max" else f
      try: want = TORCH_DT[tf(ta, s).dtype]
      except (RuntimeError, NotImplementedError): continue
      assert f(a, s).dtype == want, (name, s)
      assert f(a, Tensor(s, device="PYTHON")).dtype == want, (name, "0-d", s)



def test_scalar_values(device):
  a = Tensor([1, 2, 3], device=device, dtype=dtypes.int8)
  check_packed({"add": a + 2.5, "rsub": 10 - a.float(), "rdiv": 3 / a,
                "mul0d": a * Tensor(2.0, device=device)},
               {"add": np.array([3.5, 4.5, 5.5]), "rsub": np.array([9, 8, 7]),
                "rdiv": np.array([3, 1.5, 1]), "mul0d": np.array([2, 4, 6])}, dtypes.float32)


# ---- reductions ----

AXES = [None, 0, -1, (0, 2), (1,), (), (-3, -1)]


def _reduce_ref(x, op, axis, keepdim, dt):
  dim = tuple(range(x.ndim)) if axis is None or axis == () else axis
  if not dtypes.is_float(dt):  # numpy; sums and products of ints and bools are int64
    kw = {"dtype": np.int64} if op in ("sum", "prod") else {}
    return getattr(np, op)(x, axis=dim, keepdims=keepdim, **kw)
  t = torch.from_numpy(np.ascontiguousarray(x)).to(TORCH[dt])
  if op in ("max", "min"): return getattr(torch, f"a{op}")(t, dim=dim, keepdim=keepdim)
  if op == "prod":  # torch's prod takes one dim
    dims = {d % x.ndim for d in ((dim,) if isinstance(dim, int) else dim)}
    for d in dims: t = t.prod(d, keepdim=True)
    return t if keepdim else t.reshape([s for i, s in enumerate(x.shape) if i not in dims])
  return getattr(t, op)(dim=dim, keepdim=keepdim)


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_reduce_every_dtype(device, dt):
  rng = np.random.default_rng(8)
  shape = (2, 3, 4) if device == "CPU" else (2, 2, 3)
  x = data(rng, dt, shape, -3, 3)
  a = tensor(x.reshape(shape[0], -1), dt, device, "flipped").reshape(shape)
  ops = ("sum", "prod", "max", "min") + (("mean",) if dtypes.is_float(dt) else ())
  named = {op: getattr(a, op)(1) for op in ops}
  acc = dt if dtypes.is_float(dt) else dtypes.int64
  assert [t.dtype for t in named.values()] == [acc, acc, dt, dt, acc][:len(ops)]
  wide = dtypes.float64 if dtypes.is_float(dt) else dtypes.int64  # one kernel for all: cast up
  want = {op: as_numpy(_reduce_ref(x, op, 1, False, dt)).astype(NP[wide]) for op in ops}
  check_packed({op: t.cast(wide) for op, t in named.items()}, want, wide, rtol=RTOL.get(dt, 0) * 4)


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_axes(device, axis, keepdim):
  x = data(np.random.default_rng(9), dtypes.float32, (2, 3, 2), -8, 8)
  a = Tensor(x, device=device)
  ops = ("sum", "max", "min", "prod", "mean")
  check_packed({op: getattr(a, op)(axis, keepdim=keepdim) for op in ops},
               {op: _reduce_ref(x, op, axis, keepdim, dtypes.float32) for op in ops},
               dtypes.float32,
               rtol=1e-5)


def test_reduce_0d_and_dtype_args(device):
  s = Tensor(3.0, device=device)
  assert s.sum().item() == 3.0 and s.sum(0).shape == () and s.max(-1, keepdim=True).shape == ()
  assert Tensor(3, dtype=dtypes.int8, device=device).sum().dtype == dtypes.int64
  x = Tensor([[1, 2], [3, 4]], device=device, dtype=dtypes.uint8)
  assert x.sum(dtype=dtypes.int16).dtype == dtypes.int16 and x.sum(dtype="int16").item() == 10
  assert Tensor([1, 2], device=device).mean(dtype=dtypes.float64).dtype == dtypes.float64
  assert Tensor([True, True, False], device=device).sum().item() == 2


def test_empty_reductions(device):
  """Regression: reducing a zero-size axis read out of bounds; it gives the identity (nan for
  mean) and max/min raise like PyTorch."""
  e = Tensor(np.zeros((2, 0, 3), np.float32), device=device)
  te = torch.zeros(2, 0, 3)
  check_packed({"sum": e.sum(1), "prod": e.prod(1), "mean": e.mean(1), "sumall": e.sum(),
                "k": e.sum((1, 2), keepdim=True)},
               {"sum": te.sum(1), "prod": te.prod(1), "mean": te.mean(1), "sumall": te.sum(),
                "k": te.sum((1, 2), keepdim=True)}, dtypes.float32)
  with pytest.raises(IndexError, match="non-zero size"): e.max(1)  # PyTorch's type with a dim
  with pytest.raises(RuntimeError, match="zero-size"): e.min()
  m = Tensor(np.zeros((3, 0), np.float32), device=device) @ Tensor(np.zeros((0, 2), np.float32),
                                                                   device=device)
  assert m.tolist() == [[0.0] * 2] * 3


def test_half_sum_accumulates_in_float32(device):
  """Regression: float16/bfloat16 sums accumulated (and overflowed) in 16 bits."""
  h = Tensor([60000.0, 10000.0, -20000.0], dtype=dtypes.float16, device=device)
  want = torch.tensor([60000.0, 10000.0, -20000.0], dtype=torch.float16).sum().item()
  assert h.sum().item() == want == 49984.0 and h.sum().dtype == dtypes.float16
  # in bfloat16 steps 256 + 1 rounds back to 256 (ties to even): float32 accumulation gives 258
  assert Tensor([256.0, 1.0, 1.0], dtype=dtypes.bfloat16, device=device).sum().item() == 258.0
  b = Tensor([1.0, 2.0, 2.0], dtype=dtypes.bfloat16, device=device)
  assert b.mean().item() == torch.tensor([1.0, 2.0, 2.0], dtype=torch.bfloat16).mean().item()


def test_reduce_empty_axis_tuple_means_all(device):
  """Regression: PyTorch reduces every axis for dim=()."""
  a = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
  assert a.sum(()).item() == 10.0 and a.max(()).item() == 4.0 and a.mean(()).item() == 2.5


def test_python_device_runs_optimized_reductions():
  """Regression: the PYTHON device could not eval back a LINEAR whose KernelInfo held opts."""
  assert Tensor.ones(128, device="PYTHON").sum().item() == 128.0


def test_raw_reduce_over_empty_axis_reads_nothing():
  x = Tensor(np.zeros((2, 0), np.float32), device="PYTHON")
  reduce = UOp(Ops.REDUCE, dtypes.float32, (x.uop,), ReduceArg(Ops.ADD, (1,)))
  r = Tensor._from_uop(reduce, "PYTHON")
  assert r.tolist() == [[0.0], [0.0]]


# ---- matmul ----

MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (2, 4, 2)), ((2, 3, 4), (4, 2)), ((3, 4), (2, 4, 2)),
                 ((2, 1, 2, 3), (3, 3, 1))]


def test_matmul_shapes(device):
  """2-D, batched (with broadcast batch dims), vector-matrix, matrix-vector and vector-vector."""
  rng = np.random.default_rng(10)
  named, want = {}, {}
  for sa, sb in MATMUL_SHAPES:
    x, y = data(rng, dtypes.float32, sa), data(rng, dtypes.float32, sb)
    named[f"{sa}@{sb}"] = Tensor(x, device=device) @ Tensor(y, device=device)
    want[f"{sa}@{sb}"] = torch.from_numpy(x) @ torch.from_numpy(y)
  check_packed(named, want, dtypes.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", (dtypes.int8, dtypes.int32, dtypes.float16, dtypes.bfloat16,
                                dtypes.float64), ids=str)
def test_matmul_dtypes(device, dt):
  rng = np.random.default_rng(11)
  x, y = data(rng, dt, (3, 5)), data(rng, dt, (5, 2))
  out = tensor(x, dt, device, "permuted") @ tensor(y, dt, device)
  want = torch.from_numpy(x).to(TORCH[dt]) @ torch.from_numpy(y).to(TORCH[dt])
  assert out.dtype == TORCH_DT[want.dtype]
  assert_close(out.numpy(), want, dt, rtol=RTOL.get(dt, 0) * 2)


# ---- realize / numpy / tolist / item ----

def test_realize_numpy_tolist_item(device):
  a = Tensor([[1, 2], [3, 4]], device=device, dtype=dtypes.int16)
  b = (a * 2).realize()
  assert b.tolist() == [[2, 4], [6, 8]] and b.numpy().dtype == np.int16
  assert (b + 1).tolist() == [[3, 5], [7, 9]]
  assert (a.sum()).item() == 10 and isinstance(a.sum().item(), int)
  assert Tensor([1.5], device=device, dtype=dtypes.bfloat16).item() == 1.5
  assert Tensor([True], device=device).item() is True
  assert Tensor(np.zeros((0, 2), np.float32), device=device).tolist() == []
  with pytest.raises(RuntimeError): a.item()


def test_vector_shift_by_the_lane_width_is_guarded_on_cpu():
  """Regression: a vector's shift amount was judged against the whole vector's bits (64 for two
  int32 lanes), so `x << 32` on an upcast kernel was C's undefined shift (garbage or x)."""
  x = Tensor([1, -1, 5, -128, 7, 9, 11, 13], dtype=dtypes.int32, device="CPU")
  assert (x << 32).tolist() == [0] * 8 and (x >> 40).tolist() == [0, -1, 0, -1, 0, 0, 0, 0]
