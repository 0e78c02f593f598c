"""nn/quantized.py: ggml's block formats kept packed. Each format's dequantization equals ggml's
(the `gguf` package's numpy port), a matmul over a packed weight equals dequantize-then-matmul on
every device, its schedule is one kernel that writes no float32 copy of the weight, and bad
blocks raise naming the tensor."""
import platform

import numpy as np
import pytest

from unigrad import Context, Device, Tensor, dtypes
from unigrad.nn.gguf import GGML_TYPES, gguf_load
from unigrad.nn.quantized import (DEQUANTIZE_ROWS, INT8_FORMATS, QUANT_FORMATS, ROW_LANES,
                                   PackedWeight, QuantizedLinear, dequantize_blocks, int8_linear,
                                   fuse_rows, interleave, is_packed, linear, pack, packed_nbytes,
                                   packed_weight)
from unigrad.nn.tensor_io import FormatError
from unigrad.uop import Ops

# the bytes of each format's float16 scale (and minimum) in a block
SCALE_BYTES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
TYPE_ID = {ty.name: i for i, ty in GGML_TYPES.items()}


def random_blocks(name: str, nb: int, seed: int = 0) -> np.ndarray:
  """nb random blocks (nb, block_bytes) of a format, their float16 scales of a sane size."""
  fmt, rng = QUANT_FORMATS[name], np.random.default_rng(seed)
  raw = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
  for at in SCALE_BYTES[name]:
    scale = (rng.standard_normal(nb) * 0.01).astype(np.float16)
    raw[:, at:at + 2] = scale.view(np.uint8).reshape(nb, 2)
  return raw


@pytest.mark.parametrize("name", QUANT_FORMATS)
def test_dequantization_equals_ggml(name):
  gq = pytest.importorskip("gguf.quants")
  from gguf import GGMLQuantizationType  # noqa: PLC0415
  fmt = QUANT_FORMATS[name]
  rows, cols = 3, 2 * fmt.block
  raw = random_blocks(name, rows * cols // fmt.block)
  want = gq.dequantize(raw.reshape(rows, -1), GGMLQuantizationType[name]).reshape(rows, cols)
  got = dequantize_blocks(Tensor(raw.reshape(-1)), fmt, (rows, cols)).numpy()
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", QUANT_FORMATS)
def test_packed_matmul_equals_dequantize_then_matmul(name, device):
  fmt = QUANT_FORMATS[name]
  rows, cols = (2, fmt.block) if device == "PYTHON" else (5, 2 * fmt.block)
  raw = random_blocks(name, rows * cols // fmt.block, seed=1).reshape(-1)
  x = np.random.default_rng(2).standard_normal((3, cols)).astype(np.float32)
  w = pack(Tensor(raw, device=device), name, (rows, cols))
  got = (Tensor(x, device=device) @ w.T).numpy()
  deq = dequantize_blocks(Tensor(raw), fmt, (rows, cols)).numpy()
  want = x @ deq.T
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_packed_linear_reads_the_blocks_in_one_kernel():
  """The schedule of a quantized Linear: one kernel, whose loads are the packed parts (uint8 and
  the per-block scales) and the input, and whose only store is the (batch, out) result."""
  rows, cols = 64, 256
  w = pack(Tensor(random_blocks("Q4_1", rows * cols // 32).reshape(-1)), "Q4_1", (rows, cols))
  assert is_packed(w) and not is_packed(w.contiguous().realize())
  x = Tensor.randn(2, cols).realize()
  calls = [u for u in (x @ w.T).schedule().src if u.op is Ops.CALL]
  assert len(calls) == 1
  kernel, buffers = calls[0].src[0], calls[0].src[1:]
  stores = [u for u in kernel.toposort() if u.op is Ops.STORE]
  assert len(stores) == 1
  assert all(b.dtype != dtypes.float32 or b.size < rows * cols for b in buffers)
  # the nibbles as bytes, or as the uint32 words of row-interleaved blocks (a CPU with byte dots)
  assert {b.dtype for b in buffers} in ({dtypes.float32, dtypes.uint8},
                                        {dtypes.float32, dtypes.uint32})


def write_tensors(tensors) -> bytes:
  from test_gguf import write_gguf  # noqa: PLC0415 (the GGUF writer of its tests)
  return write_gguf({}, tensors)


def test_gguf_load_keeps_blocks_packed_near_file_size(tmp_path, monkeypatch):
  """... in one realize for all the tensors: a realize walks the live lazy Tensors, and a
  model's 200 weights packed one realize each took seconds."""
  raws = {n: random_blocks(n, 8 * 512 // QUANT_FORMATS[n].block, seed=3) for n in QUANT_FORMATS}
  path = tmp_path / "q.gguf"
  path.write_bytes(write_tensors([(n, (8, 512), TYPE_ID[n], r.tobytes()) for n, r in raws.items()]))
  realizes, realize_all = [], Tensor.realize_all
  monkeypatch.setattr(Tensor, "realize_all",
                      staticmethod(lambda *ts: realizes.append(ts) or realize_all(*ts)))
  _, packed = gguf_load(path, dequantize=False)
  monkeypatch.undo()
  assert len(realizes) == 1 and len(realizes[0]) >= len(raws)
  _, floats = gguf_load(path)
  for n, r in raws.items():
    assert is_packed(packed[n]) and not is_packed(floats[n])
    assert packed_nbytes(packed[n]) <= 1.3 * r.nbytes, n
  for n in ("Q4_1", "Q4_K"):  # the values (every format's: the tests above)
    np.testing.assert_array_equal(packed[n].numpy(), floats[n].numpy())


def test_unsupported_type_names_type_and_tensor():
  raw = bytes(84)  # one Q2_K block
  with pytest.raises(FormatError, match=r"tensor 'w2'.*unsupported ggml type Q2_K \(10\)"):
    gguf_load(write_tensors([("w2", (256,), 10, raw)]), dequantize=False)
  with pytest.raises(ValueError, match=r"unsupported format 'Q9'.*'w'"):
    pack(Tensor(bytes(18)), "Q9", (32,), "w")


def test_block_count_mismatch_raises_format_error_naming_the_tensor():
  raw = Tensor(random_blocks("Q4_0", 3).reshape(-1))
  with pytest.raises(FormatError, match=r"tensor 'blk.0.w'.*Q4_0\[2, 32\] is 2 blocks"):
    pack(raw, "Q4_0", (2, 32), "blk.0.w")
  with pytest.raises(FormatError, match=r"tensor 'v'.*not whole Q8_0 blocks"):
    pack(raw, "Q8_0", (3, 18), "v")


def kernels_of(t: Tensor) -> list:
  return [u.src[0] for u in t.schedule().src if u.op is Ops.CALL]


def test_linear_dequantizes_once_for_many_rows_and_fuses_for_few():
  rows, cols = 64, 64
  raw = random_blocks("Q8_0", rows * cols // 32, seed=4).reshape(-1)
  with Context(INT8_MATVEC=0):  # row order, as without byte dot products (else the int8 matvec)
    w = pack(Tensor(raw), "Q8_0", (rows, cols))
  pw = packed_weight(w)
  assert pw is not None and pw.nbytes() == rows * cols + rows * cols // 32 * 4
  assert packed_weight(Tensor.ones(2)) is None
  layer, bias = QuantizedLinear(w, Tensor.ones(rows)), np.ones(rows, np.float32)
  assert layer.weight is pw
  deq = dequantize_blocks(Tensor(raw), QUANT_FORMATS["Q8_0"], (rows, cols)).numpy()
  for n, kernels in ((1, 1), (DEQUANTIZE_ROWS, 2)):  # decode: fused; a prompt: dequantized first
    x = Tensor.randn(n, cols).realize()
    assert len(kernels_of(linear(x, pw))) == kernels
    np.testing.assert_allclose(layer(x).numpy(), x.numpy() @ deq.T + bias, rtol=1e-5, atol=1e-5)


def test_linear_over_a_symbolic_row_count():
  """x with a bound Variable's rows (a prompt's length): linear counts the rows at their
  largest value (it raised TypeError converting the Variable to int)."""
  from unigrad.uop.variable import Variable  # noqa: PLC0415
  raw = random_blocks("Q4_1", 4, seed=3).reshape(-1)
  w = pack(Tensor(raw), "Q4_1", (2, 64))
  x = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)
  n = Variable("n", 1, 32).bind(5)
  got = linear(Tensor(x)[:n], w).numpy()
  want = x[:5] @ dequantize_blocks(Tensor(raw), QUANT_FORMATS["Q4_1"], (2, 64)).numpy().T
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- row-interleaved Q4_0/Q4_1 and the int8 matvec ----

def interleaved(name: str, rows: int, cols: int, seed: int, device: str = "CPU",
                raw: np.ndarray | None = None):
  """A packed weight with its rows interleaved (as pack lays it out on a CPU with byte dot
  products) and its raw blocks (random unless given)."""
  if raw is None: raw = random_blocks(name, rows * cols // 32, seed=seed).reshape(-1)
  pw = packed_weight(pack(Tensor(raw, device=device), name, (rows, cols)))
  if pw.lanes == 1:
    parts = interleave(pw.parts, (rows, cols), ROW_LANES)
    pw = PackedWeight(pw.fmt, tuple(p.contiguous().realize() for p in parts), (rows, cols),
                      ROW_LANES)
  return pw, raw


@pytest.mark.parametrize("name", INT8_FORMATS)
def test_interleaved_rows_dequantize_as_ggml(name):
  pw, raw = interleaved(name, 2 * ROW_LANES, 64, seed=5)
  want = dequantize_blocks(Tensor(raw), QUANT_FORMATS[name], (2 * ROW_LANES, 64)).numpy()
  np.testing.assert_array_equal(pw.tensor().numpy(), want)


def int8_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """x quantized to int8 per block of 32 (round half away from zero), dequantized, times w.T:
  what the int8 matvec computes, in float64."""
  xb = x.reshape(x.shape[0], -1, 32).astype(np.float64)
  amax = np.abs(xb).max(-1, keepdims=True)
  scale = np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0)
  q = np.trunc(xb * scale + np.where(xb >= 0, 0.5, -0.5))
  return (q * amax / 127).reshape(x.shape) @ w.T.astype(np.float64)


@pytest.mark.parametrize("name", INT8_FORMATS)
@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_int8_matvec_equals_quantize_then_multiply(name, device):
  """int8_linear (what linear runs for a few rows on a CPU with byte dot products) quantizes the
  rows to int8 per block and sums byte products: equal (up to float rounding) to multiplying
  the dequantized int8 rows, and within a few 1e-3 of float32. The PYTHON device runs the same
  program (its DOT4s evaluated by the interpreter)."""
  rows, cols = 2 * ROW_LANES, 96
  pw, _ = interleaved(name, rows, cols, seed=6, device=device)
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((3, cols)) * np.exp(rng.standard_normal((3, cols)))).astype(np.float32)
  x[1, 32:64] = 0  # an all-zero block: scale 0, no division by zero
  w = pw.tensor().numpy()
  got = int8_linear(Tensor(x, device=device), pw).numpy()
  want = int8_reference(x, w)
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
  assert np.abs(got - x @ w.T).max() <= 3e-2 * np.abs(x @ w.T).max()


@pytest.mark.parametrize("name", INT8_FORMATS)
@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_two_int8_passes_are_within_float_rounding_of_float32(name, device):
  """int8_linear(passes=2) quantizes x's int8 rounding error again (the LLM's logits): within a
  few 1e-5 of float32, where one pass is a few 1e-3 away."""
  rows, cols = 2 * ROW_LANES, 96
  pw, _ = interleaved(name, rows, cols, seed=11, device=device)
  rng = np.random.default_rng(12)
  x = (rng.standard_normal((2, cols)) * np.exp(rng.standard_normal((2, cols)))).astype(np.float32)
  w = pw.tensor().numpy()
  exact = x.astype(np.float64) @ w.T.astype(np.float64)
  one = int8_linear(Tensor(x, device=device), pw).numpy()
  two = int8_linear(Tensor(x, device=device), pw, passes=2).numpy()
  assert np.abs(two - exact).max() <= 1e-4 * np.abs(exact).max()
  assert np.abs(one - exact).max() >= 10 * np.abs(two - exact).max()
  with pytest.raises(ValueError, match="passes is 1 or 2"): int8_linear(Tensor(x), pw, passes=3)


@pytest.mark.parametrize("name", INT8_FORMATS)
def test_int8_matvec_runs_byte_dot_products_where_the_cpu_has_them(name):
  """On a CPU with AVX2 or VNNI the int8 matvec's kernel renders DOT4 (vpdpbusd or vpmaddubsw)
  and writes no float32 copy of the weight; without them (x86-64-v2) linear keeps float32. Q8_0's
  bytes are two nibbles each, their high half's factor 16 applied in float32 (on the int32 sum it
  was distributed over the byte products, and no DOT4 formed)."""
  from unigrad.codegen.pipeline import to_rendered  # noqa: PLC0415
  ren = Device["CPU"].renderer
  if not ren.byte_dot: pytest.skip("this CPU has no byte dot product")
  pw, _ = interleaved(name, 2 * ROW_LANES, 64, seed=8)
  x = Tensor.randn(1, 64).realize()
  with Context(INT8_MATVEC=1):
    y = linear(x, pw)
    calls = [u for u in y.schedule().src if u.op is Ops.CALL]
    assert all(b.dtype != dtypes.float32 or b.size < 2 * ROW_LANES * 64
               for c in calls for b in c.src[1:])
    srcs = [to_rendered(c.src[0], ren).src[1].arg for c in calls]
    assert any("__dot4" in s for s in srcs)
    # the nibbles' shifts are constants (an unrolled arange's sum folded: codegen/expand.py),
    # not one bounds-guarded scalar shift per lane
    assert not any("< 32 ?" in s for s in srcs)
    np.testing.assert_array_equal(y.numpy(), int8_linear(x, pw).numpy())
  with Context(MARCH="x86-64-v2"):
    assert not Device["CPU"].renderer.byte_dot


@pytest.mark.parametrize("name", INT8_FORMATS)
def test_avx2_sums_of_nibble_products_in_16_bits_are_exact(name):
  """On AVX2 (no VNNI) a chain of DOT4s over nibbles sums its byte products in 16 bits before
  one widening multiply (renderer/cstyle.py): with every nibble 15 and every activation -127,
  the largest sums it can meet, the matvec still equals quantize-then-multiply."""
  from unigrad.codegen.pipeline import to_rendered  # noqa: PLC0415
  if platform.machine() not in ("x86_64", "AMD64"): pytest.skip("x86 ISAs")
  rows, cols = 2 * ROW_LANES, 256
  raw = random_blocks(name, rows * cols // 32, seed=13)
  quants = np.ones(raw.shape[1], bool)
  for at in SCALE_BYTES[name]: quants[at:at + 2] = False
  raw[:, quants] = 0x7F if name == "Q8_0" else 0xFF  # Q8_0: 127, stored as 255 (two nibbles 15)
  x = -np.ones((1, cols), np.float32)
  with Context(MARCH="x86-64-v3", INT8_MATVEC=1):
    pw, _ = interleaved(name, rows, cols, seed=0, raw=raw.reshape(-1))
    y = int8_linear(Tensor(x), pw)
    assert any("__dot4x" in to_rendered(c.src[0], Device["CPU"].renderer).src[1].arg
               for c in y.schedule().src if c.op is Ops.CALL)
    got, want = y.numpy(), int8_reference(x, pw.tensor().numpy())
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_interleaved_weight_without_byte_dots_keeps_float32():
  """INT8_MATVEC=0 on a row-interleaved weight: the float32 matvec over the interleaved words,
  within 1e-5 of dequantize-then-multiply."""
  pw, raw = interleaved("Q4_0", 2 * ROW_LANES, 64, seed=9)
  x = np.random.default_rng(10).standard_normal((2, 64)).astype(np.float32)
  with Context(INT8_MATVEC=0):
    got = linear(Tensor(x), pw).numpy()
  want = x @ dequantize_blocks(Tensor(raw), QUANT_FORMATS["Q4_0"], (2 * ROW_LANES, 64)).numpy().T
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("lanes", [1, ROW_LANES])
def test_fused_rows_compute_each_weights_outputs_and_view_them_back(lanes):
  """fuse_rows stacks weights packed alike (a layer's q, k, v): one linear gives each one's
  outputs side by side, and `rows` views each weight back, equal to it; a group mixing formats
  or input sizes is not fused."""
  if lanes == 1: ws = [packed_weight(pack(Tensor(random_blocks("Q5_0", r * 2, seed=r).reshape(-1)),
                                          "Q5_0", (r, 64))) for r in (48, 16, 16)]
  else: ws = [interleaved("Q4_1", r, 64, seed=r)[0] for r in (48, 16, 16)]
  fused, mixed, other = fuse_rows([ws, [ws[0], interleaved("Q4_0", 16, 64, seed=1)[0]],
                                   [ws[0], interleaved("Q4_1", 16, 96, seed=2)[0]]])
  assert mixed is None and other is None and fused.shape == (80, 64) and fused.lanes == lanes
  x = Tensor(np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32))
  with Context(INT8_MATVEC=0):
    want = np.concatenate([linear(x, w).numpy() for w in ws], axis=1)
    np.testing.assert_allclose(linear(x, fused).numpy(), want, rtol=1e-6, atol=1e-6)
  for (a, b), w in zip(((0, 48), (48, 64), (64, 80)), ws):
    np.testing.assert_array_equal(fused.rows(a, b).tensor().numpy(), w.tensor().numpy())
  if lanes > 1:  # 16 rows interleaved: a view starts and ends on a group of 16
    with pytest.raises(ValueError, match="block boundaries"): fused.rows(0, 40)
  else: np.testing.assert_array_equal(fused.rows(0, 3).tensor().numpy(), ws[0].tensor().numpy()[:3])
