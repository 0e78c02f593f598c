"""Exported models built by the system C compiler into a small program (inputs from a file,
outputs to a file), compared with unigrad; the digits example script; C++ and OpenMP builds."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from unigrad import Tensor, dtypes
from unigrad.export import NumericalFunction
from unigrad.nn.state import get_state_dict, safe_save

from export.helpers import (STRICT_BUILDS, MLP, DigitsCNN, build_driver, cc, compile_strict,
                            needs_cc, run_driver, same_bits)
import export_digits  # examples/, put on the path by export.helpers

pytestmark = needs_cc


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
  """examples/export_digits.py run on weights saved here (as train_digits.py saves them)."""
  folder = tmp_path_factory.mktemp("digits")
  Tensor.manual_seed(7)
  model = DigitsCNN()
  safe_save(get_state_dict(model), str(folder / "digits_cnn.safetensors"))
  nf = export_digits.main(["--weights", str(folder / "digits_cnn.safetensors"),
                           "--out-dir", str(folder), "--check", "0"])
  return folder, nf, model


def test_mlp_program_matches_unigrad_bit_for_bit(tmp_path):
  Tensor.manual_seed(2)
  model = MLP()
  nf = NumericalFunction(model, ((4, 64), dtypes.float32), name="mlp")
  exe = build_driver(tmp_path, "mlp", nf.source, nf.header, [("float", 256)],
                     [("float", 40), ("float", 40)])
  x = Tensor.randn(4, 64).realize()
  logits, probs = model(x)
  assert run_driver(exe, [x]) == bytes(logits.realize()._bytes()) + bytes(probs.realize()._bytes())


def test_digits_cnn_program_matches_unigrad(digits, capsys):
  folder, nf, model = digits
  src = (folder / "digits_cnn.c").read_text()
  assert src == nf.source and "void digits_cnn(int batch, const float *in0, float *out0)" in src
  exe = build_driver(folder, "digits_cnn", src, (folder / "digits_cnn.h").read_text(),
                     [("float", 5 * 64)], [("float", 5 * 10)], batch=5)
  x = Tensor.rand(5, 64).realize()
  out = np.frombuffer(run_driver(exe, [x]), dtype=np.float32).reshape(5, 10)
  for i in range(5):  # the per-example kernels of unigrad: bit for bit
    assert out[i].tobytes() == bytes(model(x[i].reshape(1, 64)).realize()._bytes())
  np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-6)  # the batched model


def test_example_prints_the_build_command(digits, capsys):
  folder, _, _ = digits
  export_digits.main(["--weights", str(folder / "digits_cnn.safetensors"), "--out-dir",
                      str(folder / "fixed"), "--batch", "3", "--check", "3"])
  out = capsys.readouterr().out
  assert "build: cc -std=c11 -O2" in out and "-Wall -Werror -c digits_cnn.c" in out
  assert "void digits_cnn(const float *in0, float *out0);" in out
  assert "max |difference| 0," in out  # a fixed batch runs unigrad's own kernels


def test_example_without_weights_says_how_to_make_them(tmp_path, capsys):
  with pytest.raises(SystemExit): export_digits.main(["--weights", str(tmp_path / "none")])
  assert "train_digits.py" in capsys.readouterr().err


@pytest.mark.parametrize("build", STRICT_BUILDS)
def test_source_compiles_warning_free(digits, build, tmp_path):
  folder, _, _ = digits
  compile_strict(tmp_path, (folder / "digits_cnn.c").read_text(), build)


def every_dtype(x, h, q):
  """float32, float16 and fp8e4m3 inputs; results of every dtype the C file stores, float64
  math (vector helpers on double lanes) and 8-bit float rounding included."""
  return (x.cast(dtypes.float16) * 2, x.cast(dtypes.bfloat16) + 1, x.cast(dtypes.fp8e4m3),
          (x * 3).cast(dtypes.fp8e5m2), (h + 1).cast(dtypes.float32), q.cast(dtypes.float32) * 2,
          x.cast(dtypes.int8) + 1, x.cast(dtypes.int32) // 3, x.cast(dtypes.int64) % 5, x > 0,
          x.cast(dtypes.float64).sin(), x.abs().cast(dtypes.uint8) << 1, (x * 2).max())


@pytest.fixture(scope="module")
def every_dtype_export():
  return NumericalFunction(every_dtype, ((64,), dtypes.float32), ((64,), dtypes.float16),
                           ((64,), dtypes.fp8e4m3), name="every_dtype")


@pytest.mark.parametrize("build", STRICT_BUILDS)
def test_every_dtype_compiles_warning_free_under_gcc_and_clang(every_dtype_export, build, tmp_path):
  compile_strict(tmp_path, every_dtype_export.source, build)


def test_every_dtype_export_matches_unigrad_bit_for_bit(every_dtype_export):
  x = (Tensor.randn(64) * 30).clip(-120, 120).realize()  # float -> int8 in range
  h, q = (x / 7).cast(dtypes.float16).realize(), x.cast(dtypes.fp8e4m3).realize()
  for got, ref in zip(every_dtype_export(x, h, q), every_dtype(x, h, q)):
    assert same_bits(got, ref.realize())


def test_openmp_build_gives_the_same_bits(tmp_path):
  probe = subprocess.run([cc(), "-fopenmp", "-x", "c", "-", "-o", str(tmp_path / "p")],
                         input="int main(void){return 0;}", capture_output=True, text=True)
  if probe.returncode != 0: pytest.skip("no OpenMP")
  nf = NumericalFunction(lambda a, b: (a @ b).relu(), ((64, 96), dtypes.float32),
                         ((96, 80), dtypes.float32), name="mm")
  assert "MM_PARALLEL_FOR" in nf.source.split("void mm(")[-1] or "core_id" in nf.source
  exe = build_driver(tmp_path, "mm", nf.source, nf.header, [("float", 64 * 96), ("float", 96 * 80)],
                     [("float", 64 * 80)])
  src = Path(tmp_path / "mm.c")
  omp = tmp_path / "mm_omp"
  proc = subprocess.run([cc(), "-std=c11", "-O2", "-fopenmp", "-Wall", "-Werror", "driver.c",
                         str(src), "-o", str(omp), "-lm"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  a, b = Tensor.randn(64, 96).realize(), Tensor.randn(96, 80).realize()
  ref = bytes((a @ b).relu().realize()._bytes())
  assert run_driver(exe, [a, b]) == ref and run_driver(omp, [a, b]) == ref


@pytest.mark.parametrize("cxx", [None, "c++"], ids=["c11", "c++"])
def test_bool_int_and_half_arrays_cross_the_interface(tmp_path, cxx):
  if cxx is not None and shutil.which(cxx) is None: pytest.skip("no C++ compiler")
  def f(x, i): return x > 0, (i * 3).cast(dtypes.int64), x.cast(dtypes.float16) * 2
  nf = NumericalFunction(f, ((6,), dtypes.float32), ((6,), dtypes.int32), name="mixed")
  exe = build_driver(tmp_path, "mixed", nf.source, nf.header, [("float", 6), ("int", 6)],
                     [("bool", 6), ("long long", 6), ("uint16_t", 6)], cxx=cxx)
  x = Tensor([-1.5, 0.0, 2.0, 1e-3, -0.0, 7.0])
  i = Tensor([1, -2, 3, 2**20, -(2**20), 0], dtype=dtypes.int32)  # no overflow: C's is undefined
  refs = [r.realize() for r in f(x, i)]
  assert run_driver(exe, [x, i]) == b"".join(bytes(r._bytes()) for r in refs)
