"""nn.state: state dicts, safetensors (against the `safetensors` library), torch_load (vs torch)."""
import io
import json
import pickle
import struct
import time
import zipfile
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from unigrad import Tensor, dtypes, nn
from unigrad import engine
from unigrad.helpers import GlobalCounters
from unigrad.nn.state import (
  SafetensorsError, StateDictError, get_parameters, get_state_dict, load_state_dict, safe_load,
  safe_load_metadata, safe_save, torch_load)
from unigrad.nn.state import _raw_bytes as raw_bytes

TORCH_DTYPES = {dtypes.bool: torch.bool, dtypes.uint8: torch.uint8, dtypes.int8: torch.int8,
                dtypes.int16: torch.int16, dtypes.uint16: torch.uint16, dtypes.int32: torch.int32,
                dtypes.uint32: torch.uint32, dtypes.int64: torch.int64, dtypes.uint64: torch.uint64,
                dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
                dtypes.float32: torch.float32, dtypes.float64: torch.float64}


def torch_bytes(t: torch.Tensor) -> bytes:
  return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def random_torch(dt: torch.dtype, shape: tuple, seed: int = 0) -> torch.Tensor:
  g = torch.Generator().manual_seed(seed)
  if dt == torch.bool: return torch.rand(shape, generator=g) > 0.5
  if dt.is_floating_point: return (torch.randn(shape, generator=g) * 100).to(dt)
  return torch.randint(0, 100, shape, generator=g).to(dt)


def assert_same(u: Tensor, t: torch.Tensor) -> None:
  assert tuple(u.shape) == tuple(t.shape)
  assert u.dtype == {v: k for k, v in TORCH_DTYPES.items()}[t.dtype]
  assert bytes(raw_bytes(u)) == torch_bytes(t)


# ---- get_state_dict / get_parameters ----

class Block:
  def __init__(self, n: int) -> None:
    self.weight = Tensor(np.ones((n, n), np.float32))
    self.bias = Tensor(np.zeros(n, np.float32))


class Model:
  def __init__(self) -> None:
    self.l1 = Block(2)
    self.layers = [Block(3), Block(4)]
    self.heads = {"a": Tensor([1.0]), "b": (Tensor([2.0]),)}
    self.act = Tensor.relu
    self.name = "model"
    self.scale = 2.0


def test_state_dict_names_and_order():
  m = Model()
  sd = get_state_dict(m)
  assert list(sd) == ["l1.weight", "l1.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight",
                      "layers.1.bias", "heads.a", "heads.b.0"]
  assert sd["layers.1.weight"] is m.layers[1].weight
  assert list(get_state_dict(m, prefix="model.")) [0] == "model.l1.weight"
  assert get_state_dict(m.l1.weight) == {"": m.l1.weight}


def test_state_dict_namedtuple_ordereddict_and_cycles():
  Pair = namedtuple("Pair", ["left", "right"])
  m = Model()
  m.pair = Pair(Tensor([1.0]), Tensor([2.0]))
  m.od = OrderedDict(z=Tensor([3.0]))
  m.parent = m  # a cycle
  m.l1.owner = m
  sd = get_state_dict(m)
  assert "pair.left" in sd and "pair.right" in sd and "od.z" in sd
  assert len(sd) == 11


def test_get_parameters_dedups_shared_tensors():
  m = Model()
  m.tied = m.l1.weight
  sd, params = get_state_dict(m), get_parameters(m)
  assert "tied" in sd and len(sd) == 9
  assert len(params) == 8 and params[0] is m.l1.weight
  assert len({id(p) for p in params}) == len(params)


# ---- load_state_dict ----

def test_load_state_dict_assigns_in_place_and_converts_dtype():
  m = Model()
  w = m.l1.weight
  sd = {k: Tensor(np.full(tuple(v.shape), i, np.float64))
        for i, (k, v) in enumerate(get_state_dict(m).items())}
  assert load_state_dict(m, sd) == ([], [])
  assert m.l1.weight is w and w.dtype == dtypes.float32
  for i, v in enumerate(get_state_dict(m).values()): np.testing.assert_array_equal(v.numpy(), i)


def test_load_state_dict_roundtrip_between_models_and_from_numpy():
  a, b = Model(), Model()
  load_state_dict(a, {k: np.random.rand(*v.shape).astype(np.float32)
                      for k, v in get_state_dict(a).items()})
  load_state_dict(b, get_state_dict(a))
  for (ka, va), (kb, vb) in zip(get_state_dict(a).items(), get_state_dict(b).items()):
    assert ka == kb
    np.testing.assert_array_equal(va.numpy(), vb.numpy())
  load_state_dict(a, get_state_dict(a))  # loading a model's own tensors is a no-op


def test_load_state_dict_errors_name_keys_and_shapes():
  m = Model()
  sd = dict(get_state_dict(m))
  del sd["l1.bias"]
  sd["extra.weight"] = Tensor([1.0])
  sd["layers.0.weight"] = Tensor.zeros(2, 3)
  with pytest.raises(StateDictError) as e: load_state_dict(m, sd)
  msg = str(e.value)
  assert 'Missing key(s) in state_dict: "l1.bias".' in msg
  assert 'Unexpected key(s) in state_dict: "extra.weight".' in msg
  assert "size mismatch for layers.0.weight: copying a param with shape (2, 3) from checkpoint, " \
         "the shape in current model is (3, 3)." in msg
  assert isinstance(e.value, RuntimeError)


def test_load_state_dict_non_strict():
  m = Model()
  sd = {"l1.bias": Tensor([5.0, 6.0]), "nope": Tensor([1.0])}
  res = load_state_dict(m, sd, strict=False, consume=True)
  assert res.unexpected_keys == ["nope"] and "l1.weight" in res.missing_keys
  assert list(sd) == ["nope"]
  np.testing.assert_array_equal(m.l1.bias.numpy(), [5.0, 6.0])
  with pytest.raises(StateDictError, match="size mismatch for l1.bias"):
    load_state_dict(m, {"l1.bias": Tensor([1.0])}, strict=False)


def test_load_state_dict_into_fresh_model_computes_no_initializer():
  lin = nn.Linear(4, 3)
  w, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(3, np.float32)
  sd = {"weight": Tensor(w).realize(), "bias": Tensor(b).realize()}
  before = GlobalCounters.kernel_count
  load_state_dict(lin, sd)
  assert GlobalCounters.kernel_count == before  # no random init, no copy kernel
  assert lin.weight.requires_grad and lin.bias.requires_grad
  sd["weight"].assign(Tensor.zeros(3, 4)).realize()  # the model holds a copy, not the source
  np.testing.assert_array_equal(lin.weight.numpy(), w)
  lin(Tensor(np.ones((2, 4), np.float32))).sum().backward()  # still a trainable leaf
  np.testing.assert_array_equal(lin.weight.grad.numpy(), np.full((3, 4), 2.0))


def test_load_state_dict_consume_takes_over_buffers_without_copying():
  lin = nn.Linear(2, 2)
  w = Tensor(np.eye(2, dtype=np.float32))
  sd = {"weight": w, "bias": Tensor(np.zeros(2, np.float32))}
  before = GlobalCounters.kernel_count
  load_state_dict(lin, sd, consume=True)
  assert sd == {} and GlobalCounters.kernel_count == before
  assert engine.buffer_of(lin.weight.uop) is engine.buffer_of(w.uop)
  np.testing.assert_array_equal(lin.weight.numpy(), np.eye(2))


def test_load_state_dict_consume_never_lets_two_tensors_share_a_buffer():
  model = {"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)}
  one = Tensor(np.ones(2, np.float32))
  load_state_dict(model, {"a.bias": one, "b.bias": one}, strict=False, consume=True)
  a, b = model["a"].bias, model["b"].bias
  assert engine.buffer_of(a.uop) is engine.buffer_of(one.uop)  # the first takes it over
  assert engine.buffer_of(b.uop) is not engine.buffer_of(one.uop)  # the second copies
  a.assign(Tensor([5.0, 5.0])).realize()
  np.testing.assert_array_equal(b.numpy(), [1.0, 1.0])


def test_load_state_dict_converts_lazy_values_into_fresh_model():
  lin = nn.Linear(2, 2)
  sd = {"weight": Tensor(np.eye(2)) * 3, "bias": np.array([1.0, 2.0])}  # float64, one lazy
  load_state_dict(lin, sd)
  assert lin.weight.dtype == dtypes.float32
  np.testing.assert_array_equal(lin.weight.numpy(), np.eye(2) * 3)
  np.testing.assert_array_equal(lin.bias.numpy(), [1.0, 2.0])


def test_load_state_dict_writes_realized_tensors_in_place():
  lin = nn.Linear(2, 2)
  lin.weight.realize()
  flat = lin.weight.reshape(4)  # a view of the realized buffer sees the loaded values
  load_state_dict(lin, {"weight": Tensor([[1.0, 2.0], [3.0, 4.0]]), "bias": Tensor([0.0, 0.0])})
  np.testing.assert_array_equal(flat.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_load_state_dict_error_lists_every_bad_key():
  m = Model()
  sd = {k: v for k, v in get_state_dict(m).items() if k not in ("l1.bias", "heads.a")}
  sd.update({"x": Tensor([1.0]), "y": Tensor([1.0]), "l1.weight": Tensor.zeros(3, 2),
             "layers.1.bias": Tensor.zeros(5)})
  with pytest.raises(StateDictError) as e: load_state_dict(m, sd)
  msg = str(e.value)
  for part in ('"l1.bias", "heads.a"', '"x", "y"', "size mismatch for l1.weight",
               "size mismatch for layers.1.bias"):
    assert part in msg
  fitting = {k: v for k, v in sd.items() if k not in ("l1.weight", "layers.1.bias")}
  res = load_state_dict(m, fitting, strict=False)  # extra and missing keys are fine here
  assert res.missing_keys == ["l1.weight", "l1.bias", "layers.1.bias", "heads.a"]
  assert res.unexpected_keys == ["x", "y"]


# ---- safetensors ----

ALL_DTYPES = list(TORCH_DTYPES)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_safe_load_reads_library_files(tmp_path, dt):
  tdt = TORCH_DTYPES[dt]
  tensors = {"x": random_torch(tdt, (3, 5)), "empty": random_torch(tdt, (0, 4)),
             "scalar": random_torch(tdt, ())}
  safetensors.torch.save_file(tensors, tmp_path / "a.safetensors")
  loaded = safe_load(tmp_path / "a.safetensors")
  assert set(loaded) == set(tensors)
  for k, t in tensors.items(): assert_same(loaded[k], t)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_safe_save_is_byte_identical_to_library(tmp_path, dt):
  tdt = TORCH_DTYPES[dt]
  src = {"w": random_torch(tdt, (2, 3), 1), "e": random_torch(tdt, (0,), 2),
         "s": random_torch(tdt, (), 3)}
  ours = {k: Tensor(torch_bytes(t), dtype=dt).reshape(t.shape) for k, t in src.items()}
  safe_save(ours, tmp_path / "u.safetensors")
  safetensors.torch.save_file(src, tmp_path / "t.safetensors")
  assert (tmp_path / "u.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()
  back = safetensors.torch.load_file(tmp_path / "u.safetensors")
  for k, t in src.items(): assert torch.equal(back[k], t)


def test_safe_save_mixed_dtypes_order_and_metadata(tmp_path):
  arrays = {"b": np.arange(3, dtype=np.float32), "a": np.arange(4, dtype=np.int8),
            "c": np.ones((2, 2), np.float16), "é": np.arange(2, dtype=np.int64),
            "z": np.array(True)}
  meta = {"format": "pt"}
  safe_save({k: Tensor(v) for k, v in arrays.items()}, tmp_path / "u.st", metadata=meta)
  safetensors.numpy.save_file(arrays, tmp_path / "t.st", metadata=meta)
  assert (tmp_path / "u.st").read_bytes() == (tmp_path / "t.st").read_bytes()
  assert safe_load_metadata(tmp_path / "u.st") == meta
  assert safe_load_metadata(tmp_path / "t.st") == meta


def test_safe_metadata_many_keys_and_empty(tmp_path):
  meta = {"k2": "v", "k1": "w\n\"", "ü": "ß"}
  safetensors.numpy.save_file({"x": np.zeros(1, np.float32)}, tmp_path / "t.st", metadata=meta)
  assert safe_load_metadata(tmp_path / "t.st") == meta
  safe_save({"x": Tensor([0.0])}, tmp_path / "u.st", metadata=meta)
  with safetensors.safe_open(tmp_path / "u.st", "np") as f: assert f.metadata() == meta
  safe_save({}, tmp_path / "e.st")
  safetensors.numpy.save_file({}, tmp_path / "f.st")
  assert (tmp_path / "e.st").read_bytes() == (tmp_path / "f.st").read_bytes()
  assert safe_load(tmp_path / "e.st") == {} and safe_load_metadata(tmp_path / "e.st") == {}
  safe_save({"x": Tensor([0.0])}, tmp_path / "m.st", metadata={})
  safetensors.numpy.save_file({"x": np.zeros(1, np.float32)}, tmp_path / "n.st", metadata={})
  assert (tmp_path / "m.st").read_bytes() == (tmp_path / "n.st").read_bytes()


def test_safe_roundtrip_lazy_and_views(tmp_path):
  x = Tensor(np.arange(12, dtype=np.float32)).reshape(3, 4)
  sd = {"t": x.T, "sum": x.sum(0), "slice": x[1:, ::2]}
  safe_save(sd, tmp_path / "v.st")
  back = safetensors.numpy.load_file(tmp_path / "v.st")
  for k, v in sd.items(): np.testing.assert_array_equal(back[k], v.numpy())
  loaded = safe_load((tmp_path / "v.st").read_bytes())  # bytes are accepted too
  np.testing.assert_array_equal(loaded["t"].numpy(), sd["t"].numpy())


def test_safe_save_rejects_bad_input(tmp_path):
  with pytest.raises(ValueError, match="invalid tensor name"):
    safe_save({"__metadata__": Tensor([1.0])}, tmp_path / "x")
  with pytest.raises(TypeError, match="metadata"):
    safe_save({"a": Tensor([1.0])}, tmp_path / "x", {"a": 1})


def test_safe_save_of_a_non_tensor_value_raises_type_error(tmp_path):
  """Regression: a non-Tensor value raised AttributeError ('int' object has no attribute
  'dtype') and a non-dict one something else; nothing is written."""
  for value in (3, [1.0, 2.0], np.ones(2, np.float32)):
    with pytest.raises(TypeError, match=f"'b' is not a Tensor \\(got {type(value).__name__}\\)"):
      safe_save({"a": Tensor([1.0]), "b": value}, tmp_path / "x.st")
  with pytest.raises(TypeError, match="expected a dict of name -> Tensor, got list"):
    safe_save([Tensor([1.0])], tmp_path / "x.st")
  assert not (tmp_path / "x.st").exists()


def valid_file() -> bytes:
  buf = io.BytesIO()
  arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(3, dtype=np.int16)}
  buf.write(safetensors.numpy.save(arrays, metadata={"m": "x"}))
  return buf.getvalue()


def with_header(header: dict, data: bytes = b"\0" * 16, pad: bool = True) -> bytes:
  text = json.dumps(header).encode()
  if pad: text += b" " * (-len(text) % 8)
  return struct.pack("<Q", len(text)) + text + data


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
CORRUPT = {
  "empty": b"",
  "short": b"\x08\x00\x00",
  "header_too_long": struct.pack("<Q", 1000) + b"{}",
  "header_huge": struct.pack("<Q", 2 ** 63) + b"{}",
  "not_json": struct.pack("<Q", 4) + b"{abc",
  "not_utf8": struct.pack("<Q", 2) + b"\xff\xfe",
  "not_object": with_header([1, 2]),  # type: ignore[arg-type]
  "unknown_dtype": with_header({"x": {**F32_4, "dtype": "F8_E4M3"}}),
  "shape_not_list": with_header({"x": {**F32_4, "shape": 4}}),
  "negative_dim": with_header({"x": {**F32_4, "shape": [-4]}}),
  "bool_dim": with_header({"x": {**F32_4, "shape": [True]}}),
  "float_offset": with_header({"x": {**F32_4, "data_offsets": [0.0, 16]}}),
  "three_offsets": with_header({"x": {**F32_4, "data_offsets": [0, 8, 16]}}),
  "offsets_vs_shape": with_header({"x": {**F32_4, "shape": [5]}}),
  "reversed_offsets": with_header({"x": {**F32_4, "data_offsets": [16, 0]}}),
  "negative_offsets": with_header({"x": {**F32_4, "data_offsets": [-16, 0]}}),
  "past_end": with_header({"x": {**F32_4, "shape": [8], "data_offsets": [0, 32]}}),
  "overlap": with_header({"x": F32_4, "y": {**F32_4, "shape": [2], "data_offsets": [8, 16]}}),
  "hole": with_header({"x": {**F32_4, "shape": [2], "data_offsets": [8, 16]}}),
  "trailing_data": with_header({"x": F32_4}, b"\0" * 20),
  "extra_field": with_header({"x": {**F32_4, "extra": 1}}),
  "missing_field": with_header({"x": {"dtype": "F32", "shape": [4]}}),
  "metadata_not_str": with_header({"__metadata__": {"a": 1}, "x": F32_4}),
  "entry_not_object": with_header({"x": [1, 2]}),
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_corrupted_files_raise_value_error(tmp_path, kind):
  (tmp_path / "c.st").write_bytes(CORRUPT[kind])
  with pytest.raises(ValueError, match="safetensors"): safe_load(tmp_path / "c.st")
  with pytest.raises(SafetensorsError): safe_load_metadata(CORRUPT[kind])


@pytest.mark.parametrize("shape", [[2 ** 40, 2 ** 40, 0], [2 ** 32, 2 ** 32, 1], [0, 2 ** 70]])
def test_safetensors_header_whose_shape_product_overflows_raises_before_allocating(shape):
  """Regression: a zero after sizes whose product overflows 64 bits was accepted (an empty tensor
  of shape (2**40, 2**40, 0)), and [0, 2**70] failed later in numpy; the library refuses both."""
  data = with_header({"x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}, b"")
  with pytest.raises(Exception, match="overflow|expected usize"): safetensors.numpy.load(data)
  before = GlobalCounters.mem_used
  with pytest.raises(SafetensorsError, match=r"'x'.*overflow a 64-bit size"): safe_load(data)
  assert GlobalCounters.mem_used == before


@pytest.mark.parametrize("kind", ["header_too_long", "not_json", "past_end", "unknown_dtype"])
def test_corrupted_file_error_names_the_file(tmp_path, kind):
  path = tmp_path / f"broken_{kind}.safetensors"
  path.write_bytes(CORRUPT[kind])
  with pytest.raises(SafetensorsError, match=f"broken_{kind}.safetensors"): safe_load(path)
  with pytest.raises(SafetensorsError, match=f"broken_{kind}.safetensors"):
    safe_load_metadata(str(path))


def test_truncated_file_error_names_the_file(tmp_path):
  path = tmp_path / "cut.safetensors"
  path.write_bytes(valid_file()[:-4])
  with pytest.raises(SafetensorsError, match=r"truncated file\?\).*cut\.safetensors"):
    safe_load(path)


@pytest.mark.parametrize("bad", [12345, 3.5, None, ["a.safetensors"]])
def test_non_path_file_argument_raises_type_error(tmp_path, bad):
  with pytest.raises(TypeError, match="safe_load: expected a path"): safe_load(bad)
  with pytest.raises(TypeError, match="safe_load_metadata: expected a path"):
    safe_load_metadata(bad)
  with pytest.raises(TypeError, match="torch_load: expected a path"): torch_load(bad)
  with pytest.raises(TypeError, match="safe_save: expected a path"):
    safe_save({"a": Tensor([1.0])}, bad)


def test_safe_load_onto_unknown_device_raises_before_reading():
  with pytest.raises(RuntimeError, match="unknown device .NOPE."):
    safe_load(valid_file(), device="NOPE")


def test_every_truncation_raises_value_error():
  data = valid_file()
  assert set(safe_load(data)) == {"a", "b"}
  for n in range(len(data)):
    with pytest.raises(ValueError): safe_load(data[:n])


def test_random_byte_flips_never_escape_as_other_errors():
  data, rng = valid_file(), np.random.default_rng(0)
  for _ in range(300):
    corrupt = bytearray(data)
    for pos in rng.integers(0, len(data), size=rng.integers(1, 4)):
      corrupt[pos] = rng.integers(0, 256)
    try: out = safe_load(bytes(corrupt))
    except ValueError: continue
    for t in out.values(): assert len(raw_bytes(t)) == t.nbytes()


# ---- torch_load ----

class TorchNet(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.conv = torch.nn.Conv2d(3, 4, 3)
    self.bn = torch.nn.BatchNorm2d(4)
    self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.fixture(scope="module")
def torch_net() -> TorchNet:
  torch.manual_seed(0)
  net = TorchNet()
  net.bn.running_mean.uniform_()
  net.bn.num_batches_tracked += 7
  return net


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_torch_load_model_state_dict(tmp_path, torch_net, zipped):
  torch.save(torch_net.state_dict(), tmp_path / "m.pth", _use_new_zipfile_serialization=zipped)
  sd = torch_load(tmp_path / "m.pth")
  ref = torch_net.state_dict()
  assert list(sd) == list(ref) and isinstance(sd, OrderedDict)
  for k, t in ref.items(): assert_same(sd[k], t)
  assert sd["bn.num_batches_tracked"].item() == 7


def views() -> dict[str, torch.Tensor]:
  base = torch.arange(60, dtype=torch.float32)
  m = base.reshape(6, 10)
  return {
    "transposed": m.t(), "rows": m[2:4], "cols": m[:, 3:7], "step": m[1::2, ::3],
    "offset_flat": base[7:19], "permuted": base.reshape(3, 4, 5).permute(2, 0, 1),
    "expanded": torch.ones(4)[None].expand(3, 4), "size1": m[:, 5:6],
    "overlap": torch.as_strided(base, (4, 4), (3, 1), 2),
    "irregular": torch.as_strided(base, (3, 4), (7, 3), 1),
    "zero_stride": torch.as_strided(base, (3, 2), (0, 5), 4),
    "scalar_view": base[13], "empty_view": m[:, 4:4],
    "channels_last": torch.arange(48.).reshape(2, 3, 2, 4).to(memory_format=torch.channels_last),
    "half_t": torch.arange(12, dtype=torch.float16).reshape(3, 4).t(),
    "bf16_step": torch.arange(20, dtype=torch.bfloat16)[::3],
    "i8_off": torch.arange(-20, 20, dtype=torch.int8)[5:25].reshape(4, 5)[:, 1:],
    "u16_t": torch.arange(12).to(torch.uint16).reshape(3, 4).t(),
    "u64": torch.arange(5).to(torch.uint64), "u32": torch.arange(5).to(torch.uint32)[1:],
    "bool_t": (torch.arange(12) % 3 == 0).reshape(3, 4).t(),
    "f64": torch.arange(5, dtype=torch.float64), "i16": torch.arange(5, dtype=torch.int16),
    "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3)[:, ::2],
  }


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_torch_load_views_offsets_and_dtypes(tmp_path, zipped):
  ref = views()
  if not zipped: ref = {k: v for k, v in ref.items() if not k.startswith(("u16", "u32", "u64"))}
  torch.save(ref, tmp_path / "v.pth", _use_new_zipfile_serialization=zipped)
  got = torch_load(tmp_path / "v.pth")
  for k, t in ref.items(): assert_same(got[k], t)


def test_torch_load_shares_one_buffer_per_storage(tmp_path):
  base = torch.arange(10.0)
  torch.save({"a": base[:5], "b": base[5:], "c": base}, tmp_path / "s.pth")
  got = torch_load((tmp_path / "s.pth").read_bytes())
  bufs = {u for t in got.values() for u in t.uop.toposort() if u.op.name == "BUFFER"}
  assert len(bufs) == 1
  np.testing.assert_array_equal(got["b"].numpy(), [5, 6, 7, 8, 9])


def test_torch_load_containers_and_parameters(tmp_path):
  obj = {"list": [torch.ones(2), 3, "s"], "tuple": (torch.zeros(1), None), "nested": {"x": 1.5},
         "param": torch.nn.Parameter(torch.full((2,), 2.0)), "bytes": b"\x00\xff", "set": {1, 2},
         "size": torch.Size([2, 3])}
  torch.save(obj, tmp_path / "c.pth")
  got = torch_load(tmp_path / "c.pth")
  assert got["list"][1:] == [3, "s"] and got["nested"] == {"x": 1.5} and got["bytes"] == b"\x00\xff"
  assert got["tuple"][1] is None and got["set"] == {1, 2} and tuple(got["size"]) == (2, 3)
  np.testing.assert_array_equal(got["param"].numpy(), [2.0, 2.0])
  assert got["param"].requires_grad is True


class Evil:
  def __reduce__(self): return (print, ("pwned",))


def test_torch_load_refuses_arbitrary_globals(tmp_path, capsys):
  torch.save({"w": torch.ones(1), "evil": Evil()}, tmp_path / "e.pth")
  with pytest.raises(ValueError, match="refusing to unpickle builtins.print"):
    torch_load(tmp_path / "e.pth")
  torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pth")
  with pytest.raises(ValueError, match="refusing to unpickle torch.nn"):
    torch_load(tmp_path / "module.pth")
  assert "pwned" not in capsys.readouterr().out


def test_torch_load_rejects_garbage_and_corruption(tmp_path):
  with pytest.raises(ValueError, match="not a PyTorch file"): torch_load(b"hello world")
  with pytest.raises(ValueError): torch_load(pickle.dumps(1234))
  torch.save({"w": torch.arange(8.0)}, tmp_path / "ok.pth")
  bad = tmp_path / "bad.pth"
  with zipfile.ZipFile(tmp_path / "ok.pth") as src, zipfile.ZipFile(bad, "w") as dst:
    for name in src.namelist():  # shrink the storage: the view now reads past its end
      dst.writestr(name, src.read(name)[:12] if "/data/" in name else src.read(name))
  with pytest.raises(ValueError, match="reads past its storage"): torch_load(tmp_path / "bad.pth")
  with zipfile.ZipFile(tmp_path / "ok.pth") as src, zipfile.ZipFile(bad, "w") as dst:
    for name in src.namelist():  # cut the pickle short
      dst.writestr(name, src.read(name)[:40] if name.endswith("data.pkl") else src.read(name))
  with pytest.raises(ValueError, match="corrupted"): torch_load(bad)
  torch.save({"w": torch.arange(8.0)}, tmp_path / "l.pth", _use_new_zipfile_serialization=False)
  with pytest.raises(ValueError, match="truncated"):
    torch_load((tmp_path / "l.pth").read_bytes()[:-5])


def test_torch_load_into_model_with_load_state_dict(tmp_path, torch_net):
  class Linear:
    def __init__(self, i: int, o: int) -> None:
      self.weight, self.bias = Tensor.empty(o, i), Tensor.empty(o)

  class Net:
    def __init__(self) -> None: self.layers = [Linear(4, 8), None, Linear(8, 2)]

  torch.save(torch_net.layers.state_dict(), tmp_path / "l.pth")
  net = Net()
  net.layers[1] = "relu"
  load_state_dict(net, {f"layers.{k}": v for k, v in torch_load(tmp_path / "l.pth").items()})
  x = np.random.rand(3, 4).astype(np.float32)
  w1, b1, w2, b2 = (t.numpy() for t in get_state_dict(net).values())
  ours = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
  ref = torch_net.layers(torch.from_numpy(x)).detach().numpy()
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_torch_load_random_corruption_raises_only_value_error(zipped):
  buf = io.BytesIO()
  obj = {"a": torch.arange(6.0).reshape(2, 3).t(), "b": torch.ones(3, dtype=torch.int16),
         "c": [1, "x"]}
  torch.save(obj, buf, _use_new_zipfile_serialization=zipped)
  data, rng = buf.getvalue(), np.random.default_rng(1)
  for _ in range(150):
    corrupt = bytearray(data)
    for pos in rng.integers(0, len(data), size=rng.integers(1, 3)):
      corrupt[pos] = rng.integers(0, 256)
    try: torch_load(bytes(corrupt))
    except ValueError: pass


def test_torch_load_big_endian_archive(tmp_path):
  ref = {"f": torch.arange(6.0).reshape(2, 3), "h": torch.arange(4, dtype=torch.int16) - 2}
  torch.save(ref, tmp_path / "le.pth")
  big = tmp_path / "be.pth"
  with zipfile.ZipFile(tmp_path / "le.pth") as src, zipfile.ZipFile(big, "w") as dst:
    for name in src.namelist():
      data = src.read(name)
      if name.endswith("byteorder"): data = b"big"
      if "/data/" in name and not name.endswith("serialization_id"):
        size = 4 if data == torch_bytes(ref["f"]) else 2
        data = b"".join(data[i:i + size][::-1] for i in range(0, len(data), size))
      dst.writestr(name, data)
  got = torch_load(big)
  for k, t in ref.items(): assert_same(got[k], t)


def test_torch_load_of_a_big_overlapping_view_is_fast_and_right(tmp_path):
  """Regression: a 2000x2000 view with strides (1, 1) over 4000 elements took 14.5 s (a Python
  loop over 4M indices); it is one indexed read on the device now."""
  base = torch.arange(4000, dtype=torch.float32)
  views = {"big": base.as_strided((2000, 2000), (1, 1)),
           "odd": base.as_strided((3, 4, 5), (7, 2, 3), 11)}
  torch.save(views, tmp_path / "v.pt")
  t0 = time.perf_counter()
  got = torch_load(tmp_path / "v.pt", device="CPU")
  np.testing.assert_array_equal(got["big"].numpy(), views["big"].numpy())
  np.testing.assert_array_equal(got["odd"].numpy(), views["odd"].numpy())
  assert time.perf_counter() - t0 < 5.0
