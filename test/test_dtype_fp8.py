"""8-bit floats: conversions bit-exact with PyTorch's float8 types (all 256 codes, random and
edge-case floats) in dtype.py and on every device, arithmetic through float32, promotion, finfo,
safetensors F8_E4M3/F8_E5M2."""
import math
import re

import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import (FP8S, FInfo, dtypes, float_to_fp8, fp8_to_float, from_bytes,
                           least_upper_dtype, to_bytes, truncate)
from unigrad.nn.state import safe_load, safe_save
from unigrad.renderer.gpu import CUDARenderer
from unigrad.runtime import ops_cuda
from unigrad.uop import Ops

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TORCH = {dtypes.fp8e4m3: torch.float8_e4m3fn, dtypes.fp8e5m2: torch.float8_e5m2,
         dtypes.fp8e4m3fnuz: torch.float8_e4m3fnuz, dtypes.fp8e5m2fnuz: torch.float8_e5m2fnuz}
IDS = [dt.name for dt in FP8S]


def f32_bits(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x, np.float32).view(np.uint32)


def probe_floats(dt, n: int = 20000, seed: int = 0) -> np.ndarray:
  """Random float32 bit patterns, values spread over the fp8 range, every fp8 value, the midpoints
  between neighbours (ties) and their float32 neighbours, infinities, NaNs and signed zeros."""
  rng = np.random.default_rng(seed)
  grid = np.array([fp8_to_float(b, dt) for b in range(256)], np.float64)
  grid = np.unique(grid[np.isfinite(grid)])
  mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
  top = grid[-1] + (grid[-1] - grid[-2]) / 2
  return np.concatenate([
    rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32),
    (rng.standard_normal(n) * np.exp(rng.uniform(-25, 12, n))).astype(np.float32),
    grid.astype(np.float32), -grid.astype(np.float32), mids, -mids,
    np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
    np.float32([top, -top, np.nextafter(np.float32(top), np.float32(0)), 1e30, -1e30,
                np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-40, -1e-40])])


def torch_encode(x: np.ndarray, dt) -> np.ndarray:
  return torch.from_numpy(x).to(TORCH[dt]).view(torch.uint8).numpy()


def torch_decode(dt) -> np.ndarray:
  return torch.arange(256, dtype=torch.uint8).view(TORCH[dt]).float().numpy()


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
  """Bit-equal, except that any NaN equals any NaN."""
  nan = np.isnan(a)
  return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(f32_bits(a)[~nan],
                                                                   f32_bits(b)[~nan]))


# ---- dtype.py ----

@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_fp8_to_float_matches_torch_on_all_256_codes(dt):
  ours = np.array([fp8_to_float(b, dt) for b in range(256)], np.float32)
  assert same_floats(ours, torch_decode(dt))


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_float_to_fp8_matches_torch_bit_for_bit(dt):
  x = probe_floats(dt)
  ours = np.array([float_to_fp8(float(v), dt) for v in x], np.uint8)
  ref = torch_encode(x, dt)
  bad = np.nonzero(ours != ref)[0]
  assert bad.size == 0, [(x[i], ours[i], ref[i]) for i in bad[:5]]


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_float64_reaches_fp8_through_float32_like_torch(dt):
  rng = np.random.default_rng(1)
  x = rng.standard_normal(5000) * np.exp(rng.uniform(-25, 12, 5000))
  ours = np.array([float_to_fp8(float(v), dt) for v in x], np.uint8)
  assert np.array_equal(ours, torch.from_numpy(x).to(TORCH[dt]).view(torch.uint8).numpy())


def test_fp8_formats_saturation_nan_and_zero():
  assert float_to_fp8(1.0, dtypes.fp8e4m3) == 0x38 and fp8_to_float(0x38, dtypes.fp8e4m3) == 1.0
  assert float_to_fp8(math.inf, dtypes.fp8e4m3) == 0x7E  # e4m3fn saturates: +-448
  assert float_to_fp8(-1e9, dtypes.fp8e4m3) == 0xFE
  assert float_to_fp8(math.inf, dtypes.fp8e5m2) == 0x7C  # e5m2 has infinities
  assert float_to_fp8(61440.0, dtypes.fp8e5m2) == 0x7C  # the tie above the max rounds to inf
  assert float_to_fp8(-0.0, dtypes.fp8e4m3fnuz) == 0  # no -0: 0x80 is the NaN
  assert float_to_fp8(1e9, dtypes.fp8e5m2fnuz) == 0x80
  assert math.isnan(fp8_to_float(0x80, dtypes.fp8e4m3fnuz))
  assert math.isnan(fp8_to_float(0x7F, dtypes.fp8e4m3)) and math.isnan(fp8_to_float(0xFF,
                                                                               dtypes.fp8e4m3))


def test_fp8_conversion_rejects_bad_arguments():
  with pytest.raises(TypeError, match="not an 8-bit float"): float_to_fp8(1.0, dtypes.float16)
  with pytest.raises(ValueError, match="0..255"): fp8_to_float(256, dtypes.fp8e4m3)
  with pytest.raises(TypeError): fp8_to_float(1, dtypes.int8)


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_fp8_bytes_roundtrip_and_truncate(dt):
  vals = [fp8_to_float(b, dt) for b in range(256)]
  data = to_bytes(dt, vals)
  back = from_bytes(dt, data)
  assert same_floats(np.array(back, np.float32), np.array(vals, np.float32))
  assert truncate(dt, 1.0001) == 1.0 and dt.itemsize == 1 and dtypes.is_float(dt)


@pytest.mark.parametrize("dt", [*FP8S, dtypes.float16, dtypes.bfloat16, dtypes.float32,
                                dtypes.float64], ids=lambda d: d.name)
def test_finfo_matches_torch(dt):
  th = {**TORCH, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
        dtypes.float32: torch.float32, dtypes.float64: torch.float64}[dt]
  ours, ref = dtypes.finfo(dt), torch.finfo(th)
  for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
    assert getattr(ours, field) == getattr(ref, field), field
  assert ours.dtype == ref.dtype
  exp, man = dtypes.finfo(dt)  # tinygrad's spelling: (exponent bits, mantissa bits)
  assert isinstance(ours, FInfo) and exp + man + 1 == 8 * dt.itemsize


def test_finfo_rejects_non_floats():
  for bad in (dtypes.int32, dtypes.bool, dtypes.float32.vec(4), "float32"):
    with pytest.raises(TypeError, match="float dtype"): dtypes.finfo(bad)


def test_fp8_promotion_raises_like_torch():
  assert least_upper_dtype(dtypes.fp8e4m3, dtypes.fp8e4m3) == dtypes.fp8e4m3
  for other in (dtypes.float32, dtypes.float16, dtypes.fp8e5m2, dtypes.int32, dtypes.bool):
    with pytest.raises(TypeError, match="8-bit floats"): least_upper_dtype(dtypes.fp8e4m3, other)
    with pytest.raises(RuntimeError):
      torch.promote_types(torch.float8_e4m3fn, {dtypes.float32: torch.float32,
                                                dtypes.float16: torch.float16,
                                                dtypes.fp8e5m2: torch.float8_e5m2,
                                                dtypes.int32: torch.int32,
                                                dtypes.bool: torch.bool}[other])
  assert dtypes.float8_e4m3fn is dtypes.fp8e4m3 and dtypes.is_fp8(dtypes.fp8e5m2fnuz)


# ---- devices ----

@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_cast_to_fp8_on_device_matches_torch(device, dt):
  x = probe_floats(dt, n=300 if device == "PYTHON" else 20000)
  got = Tensor(x, device=device).cast(dt).bitcast(dtypes.uint8).numpy()
  ref = torch_encode(x, dt)
  bad = np.nonzero(got != ref)[0]
  assert bad.size == 0, [(x[i], got[i], ref[i]) for i in bad[:5]]


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_fused_cast_of_inf_to_fp8_saturates_like_torch(device, dt):
  """Regression: on PYTHON a cast to fp8 fused with a later read kept +-inf, where e4m3fn
  saturates to +-448 and the fnuz formats give NaN (e5m2 keeps inf), as PyTorch and CPU do."""
  x = np.float32([math.inf, -math.inf, 1e9, -1e9, math.nan, 1.0])
  want = torch.from_numpy(x).to(TORCH[dt]).float().numpy()
  t = Tensor(x, device=device)
  stored = t.cast(dt).realize()
  cases = {"unfused": stored.cast(dtypes.float32), "fused": (t * 1).cast(dt).cast(dtypes.float32),
           "fused arithmetic": (t * 1).cast(dt).cast(dtypes.float32) * 1,
           "constant": Tensor.full((1,), math.inf, device=device).cast(dt).cast(dtypes.float32)}
  for name, got in cases.items():
    assert same_floats(got.numpy(), want[:got.shape[0]]), name


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_cast_from_fp8_on_device_matches_torch(device, dt):
  codes = Tensor(np.arange(256, dtype=np.uint8), device=device).bitcast(dt)
  assert same_floats(codes.cast(dtypes.float32).numpy(), torch_decode(dt))
  assert same_floats(codes.numpy(), torch_decode(dt))  # numpy() gives float32
  h = codes.cast(dtypes.float16).numpy()  # every fp8 value is a float16 value
  ref = torch.arange(256, dtype=torch.uint8).view(TORCH[dt]).to(torch.float16).numpy()
  assert np.array_equal(np.isnan(h), np.isnan(ref)) and np.array_equal(h[~np.isnan(h)],
                                                                        ref[~np.isnan(ref)])


@pytest.mark.parametrize("dt", FP8S, ids=IDS)
def test_fp8_arithmetic_goes_through_float32_and_rounds_per_op(device, dt):
  if device != "PYTHON" and dt in (dtypes.fp8e5m2, dtypes.fp8e4m3fnuz):
    pytest.skip("the compiled devices' conversions of every format are tested by the casts")
  rng = np.random.default_rng(2)
  n = 64 if device == "PYTHON" else 4096
  a32, b32 = (rng.standard_normal(n) * 8).astype(np.float32), rng.standard_normal(n).astype(
    np.float32)
  ta, tb = (torch.from_numpy(v).to(TORCH[dt]) for v in (a32, b32))
  a, b = (Tensor(v, device=device).cast(dt) for v in (a32, b32))
  cases = {"add": (a + b, ta.float() + tb.float()), "mul": (a * b, ta.float() * tb.float()),
           "div": (a / b, ta.float() / tb.float()), "scalar": (a * 0.5 + 1.0,
                                                                (ta.float() * 0.5).to(TORCH[dt])
                                                                .float() + 1.0),
           "exp": (b.exp(), tb.float().exp())}
  for name, (ours, ref) in cases.items():
    assert ours.dtype == dt, name
    expect = ref.to(TORCH[dt]).view(torch.uint8).numpy()
    got = ours.bitcast(dtypes.uint8).numpy()
    nan = np.isnan(ref.to(TORCH[dt]).float().numpy())
    assert np.array_equal(got[~nan], expect[~nan]), name
  s = b.sum()  # accumulates in float32, one rounding at the end
  assert s.dtype == dt and s.item() == fp8_to_float(float_to_fp8(float(tb.float().sum()), dt), dt)


def test_fp8_ops_with_another_dtype_raise_like_torch():
  a = Tensor([1.0, 2.0]).cast(dtypes.fp8e4m3)
  with pytest.raises(TypeError, match="8-bit floats"): a + Tensor([1.0, 2.0])
  with pytest.raises(TypeError, match="8-bit floats"): a + a.cast(dtypes.fp8e5m2)
  assert (a.float() + Tensor([1.0, 2.0])).tolist() == [2.0, 4.0]


# ---- safetensors ----

@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2], ids=["F8_E4M3", "F8_E5M2"])
def test_safetensors_fp8_roundtrip_with_the_library(tmp_path, dt):
  x = torch.from_numpy(probe_floats(dt, n=500)).to(TORCH[dt]).reshape(-1)
  safetensors_torch.save_file({"w": x, "b": torch.ones(3)}, tmp_path / "t.safetensors")
  got = safe_load(tmp_path / "t.safetensors")
  assert got["w"].dtype == dt
  assert got["w"].bitcast(dtypes.uint8).numpy().tobytes() == x.view(torch.uint8).numpy().tobytes()
  safe_save(got, tmp_path / "u.safetensors")
  assert (tmp_path / "u.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()
  back = safetensors_torch.load_file(tmp_path / "u.safetensors")
  assert back["w"].dtype == TORCH[dt] and torch.equal(back["w"].view(torch.uint8),
                                                      x.view(torch.uint8))



@pytest.mark.skipif(ops_cuda.find_cuda_compiler() is None, reason="no CUDA compiler")
def test_fp8_kernels_compile_for_cuda_sm90():
  ren, srcs = CUDARenderer(), []
  for dt in FP8S:
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="NULL").cast(dt)
    for t in (a + a, a * a, a / (a + 1), a.exp(), a.sum(1), a.cast(dtypes.float16),
              a.bitcast(dtypes.uint8), a.cast(dtypes.fp8e5m2 if dt != dtypes.fp8e5m2 else
                                              dtypes.fp8e4m3)):
      for call in t.schedule().src:
        if call.src[0].op is Ops.SINK:
          linear = full_rewrite(call.src[0], ren)
          srcs.append(ren.render(linear.arg.name, linear))
  assert all("__f_to_fp8" in s or "_to_f(" in s for s in srcs)
  includes = sorted({x for src in srcs for x in src.splitlines() if x.startswith("#include")})
  bodies = [f"namespace k{i} {{\n" + re.sub(r'void (\w+)\(', rf'void \1_{i}(', src) + "}"
            for i, src in enumerate(srcs)]
  unit = "\n".join([*includes, *(b.replace("#include", "// #include") for b in bodies)])
  assert ops_cuda.CUDACompiler("sm_90").compile(unit)
