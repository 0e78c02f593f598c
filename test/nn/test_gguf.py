"""nn/gguf.py: GGUF files written here by hand after the spec, quantized with numpy versions of
ggml's reference quantizers, read back and dequantized exactly as ggml's `dequantize_row_*`
(numpy ports below) computes; truncated and lying files raise naming the file and the field."""
import struct

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.nn.state import FormatError, ggml_data_to_tensor, gguf_load, gguf_metadata

BLOCK = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 14: (256, 210)}


# ---- a GGUF writer ----

def gstr(s: str) -> bytes:
  b = s.encode()
  return struct.pack("<Q", len(b)) + b


def gvalue(v) -> bytes:
  if isinstance(v, bool): return struct.pack("<I?", 7, v)
  if isinstance(v, int): return struct.pack("<Iq", 11, v) if v < 0 else struct.pack("<IQ", 10, v)
  if isinstance(v, float): return struct.pack("<If", 6, v)
  if isinstance(v, str): return struct.pack("<I", 8) + gstr(v)
  if isinstance(v, list) and all(isinstance(x, str) for x in v):
    return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(gstr(x) for x in v)
  if isinstance(v, list): return struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v)
  raise TypeError(v)


def write_gguf(kv: dict, tensors: list[tuple[str, tuple, int, bytes]], align: int = 32,
               version: int = 3) -> bytes:
  """tensors: (name, numpy shape, ggml type, raw bytes)."""
  if align != 32: kv = {**kv, "general.alignment": align}
  head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
  for k, v in kv.items():
    head += gstr(k) + (struct.pack("<II", 4, v) if k == "general.alignment" else gvalue(v))
  data, offsets = b"", []
  for _, _, _, raw in tensors:
    data += b"\0" * (-len(data) % align)
    offsets.append(len(data))
    data += raw
  for (name, shape, ty, _), off in zip(tensors, offsets):
    head += gstr(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q",
                                                                      *reversed(shape))
    head += struct.pack("<IQ", ty, off)
  return head + b"\0" * (-len(head) % align) + data


# ---- numpy quantizers (ggml's quantize_row_*_ref) and dequantizers (dequantize_row_*) ----

def f16(x) -> np.ndarray: return np.asarray(x, np.float32).astype(np.float16)


def quantize_q8_0(x: np.ndarray) -> bytes:
  out = b""
  for blk in x.reshape(-1, 32):
    d = np.abs(blk).max() / 127
    q = np.round(blk / d if d else blk * 0).astype(np.int8)
    out += f16(d).tobytes() + q.tobytes()
  return out


def quantize_q4_0(x: np.ndarray) -> bytes:
  out = b""
  for blk in x.reshape(-1, 32):
    mx = blk[np.argmax(np.abs(blk))]
    d = mx / -8
    q = np.minimum(15, (blk * (1 / d if d else 0) + 8.5).astype(np.int8)).astype(np.uint8)
    out += f16(d).tobytes() + (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()
  return out


def random_blocks(ty: int, nb: int, rng) -> bytes:
  """Random block bytes with finite float16 scales (types without a quantizer here)."""
  size = BLOCK[ty][1]
  raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
  scales = {3: (0, 2), 6: (0,), 7: (0, 2), 14: (208,)}[ty]
  for s in scales: raw[:, s:s + 2] = f16(rng.uniform(-0.1, 0.1, nb)).view(np.uint8).reshape(nb, 2)
  return raw.tobytes()


def dequantize(ty: int, raw: bytes) -> np.ndarray:
  n_el, size = BLOCK[ty]
  b = np.frombuffer(raw, np.uint8).reshape(-1, size)
  out = np.zeros((b.shape[0], n_el), np.float32)
  for i, blk in enumerate(b):
    d = np.float32(blk[:2].view(np.float16)[0])
    if ty == 8: out[i] = blk[2:34].view(np.int8).astype(np.float32) * d
    elif ty in (2, 3):
      qs, m = (blk[2:18], np.float32(0)) if ty == 2 else (blk[4:20], np.float32(blk[2:4].view(
        np.float16)[0]))
      for j in range(16):
        x0, x1 = int(qs[j] & 0xF), int(qs[j] >> 4)
        if ty == 2: out[i, j], out[i, j + 16] = (x0 - 8) * d, (x1 - 8) * d
        else: out[i, j], out[i, j + 16] = x0 * d + m, x1 * d + m
    elif ty in (6, 7):
      m = np.float32(0) if ty == 6 else np.float32(blk[2:4].view(np.float16)[0])
      qh = int(blk[2:6].view(np.uint32)[0]) if ty == 6 else int(blk[4:8].view(np.uint32)[0])
      qs = blk[6:22] if ty == 6 else blk[8:24]
      for j in range(16):
        xh0, xh1 = ((qh >> j) << 4) & 0x10, (qh >> (j + 12)) & 0x10
        x0, x1 = (int(qs[j] & 0x0F) | xh0), (int(qs[j] >> 4) | xh1)
        if ty == 6: out[i, j], out[i, j + 16] = (x0 - 16) * d, (x1 - 16) * d
        else: out[i, j], out[i, j + 16] = x0 * d + m, x1 * d + m
    else: out[i] = dequantize_q6_k(blk)
  return out.reshape(-1)


def dequantize_q6_k(blk: np.ndarray) -> np.ndarray:
  y = np.zeros(256, np.float32)
  d = np.float32(blk[208:210].view(np.float16)[0])
  ql, qh, sc = blk[0:128], blk[128:192], blk[192:208].view(np.int8)
  for n in range(2):
    qln, qhn, scn, yo = ql[64 * n:], qh[32 * n:], sc[8 * n:], 128 * n
    for ll in range(32):
      s = ll // 16
      q1 = ((int(qln[ll]) & 0xF) | ((int(qhn[ll]) >> 0 & 3) << 4)) - 32
      q2 = ((int(qln[ll + 32]) & 0xF) | ((int(qhn[ll]) >> 2 & 3) << 4)) - 32
      q3 = ((int(qln[ll]) >> 4) | ((int(qhn[ll]) >> 4 & 3) << 4)) - 32
      q4 = ((int(qln[ll + 32]) >> 4) | ((int(qhn[ll]) >> 6 & 3) << 4)) - 32
      for k, q in enumerate((q1, q2, q3, q4)):
        y[yo + ll + 32 * k] = d * np.float32(scn[s + 2 * k]) * np.float32(q)
  return y


# ---- tests ----

def sample(rng) -> tuple[bytes, dict[str, np.ndarray]]:
  w = rng.standard_normal((4, 64)).astype(np.float32)
  tensors = [("f32", (3, 5), 0, (f32 := rng.standard_normal((3, 5)).astype(np.float32)).tobytes()),
             ("f16", (2, 4), 1, (h := f16(rng.standard_normal((2, 4)))).tobytes()),
             ("bf16", (6,), 30, (bf := np.arange(6, dtype=np.float32)).view(np.uint32).__rshift__(
               16).astype(np.uint16).tobytes()),
             ("q8_0", (4, 64), 8, quantize_q8_0(w)), ("q4_0", (4, 64), 2, quantize_q4_0(w))]
  tensors += [(f"t{ty}", (2, BLOCK[ty][0] * 2), ty, random_blocks(ty, 4, rng))
              for ty in (3, 6, 7, 14)]
  ref = {"f32": f32, "f16": h, "bf16": bf}
  for name, shape, ty, raw in tensors[3:]: ref[name] = dequantize(ty, raw).reshape(shape)
  kv = {"general.name": "tiny", "llama.block_count": 2, "general.alignment": 64,
        "tokenizer.ggml.tokens": ["a", "b"], "scores": [1, -2], "ok": True, "eps": 0.5}
  return write_gguf({k: v for k, v in kv.items() if k != "general.alignment"}, tensors,
                    align=64), ref


def test_gguf_float_and_quantized_tensors_match_ggml_reference(tmp_path):
  data, ref = sample(np.random.default_rng(0))
  (tmp_path / "m.gguf").write_bytes(data)
  kv, tensors = gguf_load(tmp_path / "m.gguf")
  assert kv == {"general.name": "tiny", "llama.block_count": 2, "tokenizer.ggml.tokens": ["a", "b"],
                "scores": [1, -2], "ok": True, "eps": 0.5, "general.alignment": 64}
  assert list(tensors) == list(ref)
  assert tensors["f16"].dtype == dtypes.float16 and tensors["bf16"].dtype == dtypes.bfloat16
  for name, r in ref.items():
    got = tensors[name].numpy()
    assert got.shape == r.shape, name
    np.testing.assert_array_equal(got, r.astype(np.float32), err_msg=name)


def test_gguf_quantization_error_is_small():
  rng = np.random.default_rng(1)
  w = rng.standard_normal(64 * 32).astype(np.float32)
  for ty, tol in ((8, 0.02), (2, 0.2)):
    raw = quantize_q8_0(w) if ty == 8 else quantize_q4_0(w)
    got = ggml_data_to_tensor(Tensor(raw, dtype=dtypes.uint8), w.size, ty).numpy()
    assert np.abs(got - w).max() < tol * np.abs(w).max()


def test_gguf_from_bytes_and_tensor_and_version_2():
  data, ref = sample(np.random.default_rng(2))
  data2 = data[:4] + struct.pack("<I", 2) + data[8:]
  for src in (data, Tensor(data, dtype=dtypes.uint8), data2):
    np.testing.assert_array_equal(gguf_load(src)[1]["q4_0"].numpy(), ref["q4_0"])


def corrupt_cases(data: bytes) -> dict[str, tuple[bytes, str]]:
  return {"magic": (b"GGUX" + data[4:], "field magic"),
          "version": (data[:4] + struct.pack("<I", 9) + data[8:], "field version"),
          "truncated": (data[:-10], r"offset.*truncated file"),
          "header_cut": (data[:40], "field"),
          "count": (data[:8] + struct.pack("<Q", 10 ** 12) + data[16:], "field tensor_count")}


@pytest.mark.parametrize("kind", ["magic", "version", "truncated", "header_cut", "count"])
def test_gguf_rejects_truncated_or_lying_files_naming_file_and_field(tmp_path, kind):
  data, _ = sample(np.random.default_rng(3))
  bad, field = corrupt_cases(data)[kind]
  path = tmp_path / f"bad_{kind}.gguf"
  path.write_bytes(bad)
  with pytest.raises(FormatError, match=rf"bad_{kind}\.gguf.*{field}"): gguf_load(path)


def test_gguf_metadata_alone_equals_gguf_loads_and_ignores_the_tensors(tmp_path):
  data, _ = sample(np.random.default_rng(6))
  path = tmp_path / "m.gguf"
  path.write_bytes(data)
  kv = gguf_load(data)[0]
  for src in (path, str(path), data, Tensor(data, dtype=dtypes.uint8)):
    assert gguf_metadata(src) == kv
  head = data[:data.index(b"f32")]  # cut inside the tensor infos: metadata still reads
  assert gguf_metadata(head) == kv
  vocab = write_gguf({"tokenizer.ggml.tokens": ["a", "b"]}, [])
  a, b = struct.pack("<Q", 1) + b"a", struct.pack("<Q", 1) + b"b"
  with pytest.raises(FormatError, match=r"'tokenizer.ggml.tokens'\[1\]: needs 1 bytes.*truncated"):
    gguf_metadata(vocab[:vocab.index(a + b) + 17])
  with pytest.raises(FormatError, match=r"'tokenizer.ggml.tokens'\[0\]: not UTF-8"):
    gguf_metadata(vocab.replace(a + b, a[:8] + b"\xff" + b))
  (tmp_path / "empty.gguf").write_bytes(b"")
  with pytest.raises(FormatError, match=r"gguf_metadata: .*empty\.gguf.*field magic"):
    gguf_metadata(tmp_path / "empty.gguf")
  for kind in ("magic", "version", "count"):
    bad, field = corrupt_cases(data)[kind]
    (tmp_path / f"bad_{kind}.gguf").write_bytes(bad)
    with pytest.raises(FormatError, match=rf"bad_{kind}\.gguf.*{field}"):
      gguf_metadata(tmp_path / f"bad_{kind}.gguf")


def test_gguf_rejects_lying_tensor_infos():
  raw = quantize_q8_0(np.ones(32, np.float32))
  cases = {"type": ([("w", (32,), 99, raw)], "unsupported ggml type 99"),
           "block": ([("w", (16,), 8, raw)], "not a multiple of the Q8_0 block size"),
           "dims": ([("w", (1, 1, 1, 1, 32), 8, raw)], "n_dims"),
           "size": ([("w", (2, 32), 8, raw)], r"needs 68 bytes, the data section has 34")}
  for tensors, msg in cases.values():
    with pytest.raises(FormatError, match=msg): gguf_load(write_gguf({}, tensors))
  unaligned = bytearray(write_gguf({}, [("w", (32,), 8, raw)]))
  off = unaligned.index(b"w") + 1 + 4 + 8 + 4  # name, n_dims, dim, type -> offset
  unaligned[off:off + 8] = struct.pack("<Q", 3)
  with pytest.raises(FormatError, match="not aligned"): gguf_load(bytes(unaligned))


def test_gguf_random_corruption_raises_only_format_error():
  data, _ = sample(np.random.default_rng(4))
  rng = np.random.default_rng(5)
  for _ in range(100):
    bad = bytearray(data)
    for pos in rng.integers(0, 600, size=2): bad[pos] = rng.integers(0, 256)
    try: gguf_load(bytes(bad))
    except FormatError: pass


def test_ggml_data_to_tensor_rejects_bad_arguments():
  t = Tensor(bytes(34), dtype=dtypes.uint8)
  with pytest.raises(ValueError, match="unsupported ggml type"): ggml_data_to_tensor(t, 32, 99)
  with pytest.raises(ValueError, match="whole blocks"): ggml_data_to_tensor(t, 31, 8)
  with pytest.raises(ValueError, match="at least 68 bytes"): ggml_data_to_tensor(t, 64, 8)


def test_gguf_duplicated_metadata_key_raises_format_error():
  """Regression: a key given twice kept its last value silently (llama.cpp's gguf refuses it)."""
  data = write_gguf({"general.name": "a", "general.nama": "b"}, [])
  dup = data.replace(b"general.nama", b"general.name")
  with pytest.raises(FormatError, match=r"metadata\[1\]\.key: duplicate key 'general.name'"):
    gguf_load(dup)
  assert gguf_load(data)[0] == {"general.name": "a", "general.nama": "b"}
