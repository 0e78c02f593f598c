"""NumericalFunction: properties, buffer categories, fixups, exact results and bad input."""
import math
import struct

import numpy as np
import pytest

from unigrad import Context, Tensor, dtypes, function
from unigrad.codegen.pipeline import full_rewrite
from unigrad.export import Category, ExportError, NumericalFunction, TensorSpec, svmap
from unigrad.export.csource import KernelSource
from unigrad.renderer.cstyle import PRELUDE, CRenderer
from unigrad.uop import Ops

from export.helpers import MLP, build_driver, compile_strict, needs_cc, run_driver, same_bits

pytestmark = needs_cc


@pytest.fixture(scope="module")
def mlp():
  Tensor.manual_seed(1)
  model = MLP()
  return model, NumericalFunction(model, ((3, 64), dtypes.float32), name="mlp")


def test_properties_follow_the_seed(mlp):
  _, nf = mlp
  assert nf.function_graph.op is Ops.FUNCTION
  assert nf.function_graph.src[0].op is Ops.TUPLE and len(nf.function_graph.src[0].src) == 2
  assert nf.schedule.op is Ops.LINEAR and all(c.op is Ops.CALL for c in nf.schedule.src)
  assert nf.name == "mlp"
  assert "void mlp(const float *in0, float *out0, float *out1);" in nf.header
  assert nf.header in nf.source and "static const union" in nf.source
  kernels = nf.rendered_kernels
  assert kernels and all(f"void {name}(" in src for name, src in kernels.items())
  assert all(f"static __attribute__((noinline)) void {name}(" in nf.source for name in kernels)
  with pytest.raises(AttributeError): nf.fn = None  # frozen


def test_buffer_categories(mlp):
  _, nf = mlp
  cats = {}
  for s in nf.buffers.values(): cats.setdefault(s.category, []).append(s)
  assert len(cats[Category.INPUT]) == 1 and cats[Category.INPUT][0].size == 3 * 64
  assert sorted(s.index for s in cats[Category.OUTPUT]) == [0, 1]
  assert len(cats[Category.CONSTANT]) == 4  # two weights, two biases
  assert cats[Category.INTERMEDIATE]


def test_mlp_matches_unigrad_bit_for_bit(mlp):
  model, nf = mlp
  x = Tensor.randn(3, 64).realize()
  logits, probs = nf(x)
  ref_logits, ref_probs = model(x)
  assert same_bits(logits, ref_logits.realize()) and same_bits(probs, ref_probs.realize())


def test_inputs_that_are_views_or_lazy_are_made_row_major(mlp):
  model, nf = mlp
  base = Tensor.randn(64, 3).realize()
  for x in (base.T, base.T * 1.0):
    assert same_bits(nf(x)[0], model(x.contiguous().realize())[0].realize())


def test_constants_keep_their_exact_bits():
  special = [math.nan, -0.0, math.inf, -math.inf, 1e-45, 3.4e38, -1.5]
  w = Tensor(special).realize()
  nf = NumericalFunction(lambda x: x + w, ((7,), dtypes.float32))
  out = nf(Tensor.zeros(7).contiguous().realize())
  ref = (Tensor.zeros(7) + w).realize()
  assert same_bits(out, ref)
  bits = struct.unpack("7I", struct.pack("7f", *special))
  assert all(f"0x{b:08x}u" in nf.source for b in bits)


def test_intermediates_share_scratch_by_lifetime():
  def chain(x):
    for _ in range(6): x = (x * 1.5 + 1).contiguous()
    return x.sum()
  nf = NumericalFunction(chain, ((64, 64), dtypes.float32))
  inter = [s for s in nf.buffers.values() if s.category is Category.INTERMEDIATE]
  assert len(inter) >= 5
  assert len({s.offset for s in inter}) < len(inter)  # the memory plan reuses the storage
  x = Tensor.randn(64, 64).realize()
  assert same_bits(nf(x), chain(x).realize())


@pytest.mark.parametrize("fn", [lambda x: x, lambda x: x[:2], lambda x: x.T, lambda x: x[::-1, 1:]],
                         ids=["identity", "slice", "transpose", "flip_slice"])
def test_outputs_aliasing_inputs_get_their_own_row_major_buffer(fn):
  nf = NumericalFunction(fn, ((3, 4), dtypes.float32))
  x = Tensor.arange(12, dtype=dtypes.float32).reshape(3, 4).contiguous().realize()
  out = nf(x)
  np.testing.assert_array_equal(out.numpy(), fn(x).numpy())
  assert same_bits(x, Tensor.arange(12, dtype=dtypes.float32).reshape(3, 4))  # input untouched


W3 = Tensor([5.0, -6.0, 7.5]).realize()
REPEATS = {
  "walrus": lambda x: ((y := x * 2), y),
  "equal_values": lambda x: (x * 2, x * 2),
  "input_twice": lambda x: (x, x),
  "input_between": lambda x: (x, x + 1, x),
  "weight_twice": lambda x: (W3, W3),
  "constant_twice": lambda x: ((c := Tensor.ones(3)), c),
  "nested": lambda x: [((y := x + 1), (y, x)), y],
  "views_of_one_value": lambda x: ((y := x * 2)[1:], y, y[:2], y[1:]),
}


@pytest.mark.parametrize("fn", REPEATS.values(), ids=REPEATS.keys())
def test_a_tensor_returned_twice_is_two_outputs_each_written(fn):
  nf = NumericalFunction(fn, ((3,), dtypes.float32), name="rep")
  x = Tensor([1.0, -2.0, 3.5]).realize()
  refs = [r.numpy() for r in _leaves(fn(x))]
  assert nf.header.count("float *out") == len(refs) == len(nf.output_specs)
  outs = nf(x)
  assert isinstance(outs, tuple) and len(outs) == len(refs)
  for got, ref in zip(outs, refs): np.testing.assert_array_equal(got.numpy(), ref)


def _leaves(tree):
  return [tree] if isinstance(tree, Tensor) else [t for x in tree for t in _leaves(x)]


@pytest.mark.parametrize("fn", [lambda x: x, lambda x: W3, lambda x: Tensor.full((2, 3), 4.0)],
                         ids=["input", "weight", "constant"])
def test_a_function_returning_an_input_or_a_constant_exports(fn):
  nf = NumericalFunction(fn, ((3,), dtypes.float32), name="one")
  x = Tensor([1.0, -2.0, 3.5]).realize()
  np.testing.assert_array_equal(nf(x).numpy(), fn(x).numpy())


def test_an_output_returned_twice_is_written_by_a_c_program(tmp_path):
  nf = NumericalFunction(lambda x: ((y := x * 2), y), ((3,), dtypes.float32), name="twice")
  assert "float *out0, float *out1" in nf.header
  exe = build_driver(tmp_path, "twice", nf.source, nf.header, [("float", 3)],
                     [("float", 3), ("float", 3)])
  x = Tensor([1.0, -2.0, 3.5]).realize()
  assert run_driver(exe, [x]) == bytes((x * 2).realize()._bytes()) * 2


def test_a_batched_output_returned_twice_is_written_for_every_example():
  nf = NumericalFunction(svmap(lambda x: ((y := x.sum()), y, x)), ((4, 3), dtypes.float32))
  x = Tensor.randn(5, 3).realize()
  s0, s1, same = nf(x)
  np.testing.assert_array_equal(s0.numpy(), s1.numpy())
  np.testing.assert_allclose(s0.numpy(), x.numpy().sum(1), rtol=1e-6)
  np.testing.assert_array_equal(same.numpy(), x.numpy())


def test_dtypes_int_bool_and_emulated_half():
  def f(i, h):
    return (i * 3) > 4, (h * 2).cast(dtypes.float32), h.cast(dtypes.bfloat16) + 1
  nf = NumericalFunction(f, ((5,), dtypes.int32), ((5,), dtypes.float16))
  assert "const int *in0, const uint16_t *in1, bool *out0, float *out1, uint16_t *out2" in (
    nf.header.replace("\n", " "))
  i = Tensor([0, 1, 2, 3, -4], dtype=dtypes.int32)
  h = Tensor([0.5, -1, 2.25, 1e4, 3], dtype=dtypes.float16)
  for got, ref in zip(nf(i, h), f(i, h)): assert same_bits(got, ref.realize())


def test_spec_pairs_and_tensors_give_the_same_export():
  f = lambda x: x * 2  # noqa: E731
  a = NumericalFunction(f, ((2, 3), dtypes.float32))
  b = NumericalFunction(f, Tensor.empty(2, 3))
  assert a.example_inputs == b.example_inputs == (TensorSpec((2, 3), dtypes.float32),)
  assert a.source == b.source and a.name == "fn"


def test_a_function_layer_function_exports():
  @function
  def f(x): return x.exp().sum(-1)
  nf = NumericalFunction(f, ((4, 5), dtypes.float32))
  x = Tensor.randn(4, 5).realize()
  assert same_bits(nf(x), f(x).realize())


# ---- bad input ----

@pytest.mark.parametrize("ret", [3, None, "x", (Tensor.ones(2), 1.0), ()],
                         ids=["int", "None", "str", "tuple_with_float", "empty"])
def test_returning_non_tensors_raises(ret):
  nf = NumericalFunction(lambda x: ret, ((2,), dtypes.float32))
  with pytest.raises(ExportError, match="must return a Tensor"): _ = nf.function_graph


def test_data_dependent_control_flow_raises_at_trace_time():
  def f(x): return x * 2 if x.sum() > 0 else x
  nf = NumericalFunction(f, ((2,), dtypes.float32))
  with pytest.raises(ExportError, match="data-dependent"): _ = nf.function_graph
  def g(x): return x + x.max().item()
  with pytest.raises(ExportError, match="data-dependent"):
    _ = NumericalFunction(g, ((2,), dtypes.float32)).source


@pytest.mark.parametrize("spec", [((-1, 3), dtypes.float32), ((2.5,), dtypes.float32),
                                  (("a",), dtypes.float32), ((True,), dtypes.float32)])
def test_invalid_input_shape_raises(spec):
  with pytest.raises(ValueError, match="invalid shape"): NumericalFunction(lambda x: x, spec)


def test_bad_specs_raise():
  with pytest.raises(TypeError, match="no C type"):
    NumericalFunction(lambda x: x, ((2,), dtypes.index))
  with pytest.raises(TypeError, match="not a dtype"): NumericalFunction(lambda x: x, ((2,), "f33"))
  with pytest.raises(TypeError, match="Tensor or a"): NumericalFunction(lambda x: x, [2, 3])
  with pytest.raises(TypeError, match="needs a function"):
    NumericalFunction(3, ((2,), dtypes.float32))


@pytest.mark.parametrize("name, why", [
  ("my-fn", "not a C identifier"), ("1x", "not a C identifier"), ("", "not a C identifier"),
  ("int", "keyword"), ("class", "keyword"), ("and", "keyword"), ("nullptr", "keyword"),
  ("__x", "reserved"), ("_X", "reserved"), ("_x", "reserved"), ("main", "entry point"),
  ("sin", "C library"), ("expf", "C library"), ("malloc", "C library"), ("printf", "C library"),
  ("memcpy", "C library"), ("isnan", "C library"), ("size_t", "C library"),
  ("uint32_t", "C library"), ("read", "C library"), ("float_v8", "kernels' code"),
  ("unigrad_oob", "kernels' code")])
def test_a_name_a_c_file_cannot_define_is_refused(name, why):
  with pytest.raises(ValueError, match=f"cannot name the exported C function: it .*{why}"):
    NumericalFunction(lambda x: x, ((2,), dtypes.float32), name=name)


def test_a_function_named_like_a_libc_function_exports_as_fn():
  def exp(x): return x.exp()
  def predict(x): return x * 2
  assert NumericalFunction(exp, ((2,), dtypes.float32)).name == "fn"
  assert NumericalFunction(predict, ((2,), dtypes.float32)).name == "predict"


@pytest.mark.parametrize("build", ["gcc", "clang"])
def test_a_public_name_equal_to_a_kernel_name_renames_the_kernel(build, tmp_path):
  kernel = next(iter(NumericalFunction(lambda x: x * 2, ((3,), dtypes.float32)).rendered_kernels))
  nf = NumericalFunction(lambda x: x * 2, ((3,), dtypes.float32), name=kernel)
  assert kernel not in nf.rendered_kernels and f"void {kernel}(const float *in0" in nf.source
  compile_strict(tmp_path, nf.source, build)
  np.testing.assert_array_equal(nf(Tensor([1.0, 2.0, 3.0])).numpy(), [2.0, 4.0, 6.0])


def test_calling_with_wrong_inputs_raises(mlp):
  _, nf = mlp
  with pytest.raises(ValueError, match=r"expected shape \(3, 64\)"): nf(Tensor.ones(2, 64))
  with pytest.raises(ValueError, match="dtype"): nf(Tensor.ones(3, 64, dtype=dtypes.float16))
  with pytest.raises(TypeError, match="1 input"): nf(Tensor.ones(3, 64), Tensor.ones(3, 64))
  with pytest.raises(TypeError, match="expected a Tensor"): nf([[0.0] * 64] * 3)


def test_single_thread_kernels_match_unigrad_with_one_thread():
  a, b = Tensor.randn(96, 80).realize(), Tensor.randn(80, 64).realize()
  nf = NumericalFunction(lambda x, y: (x @ y).relu(), a, b, threads=1)
  with Context(THREADS=1):
    ref = (a @ b).relu().realize()
    assert "r_t" not in "".join(nf.rendered_kernels)  # no THREAD chunks
  assert same_bits(nf(a, b), ref)
  with pytest.raises(ValueError, match="threads"): NumericalFunction(lambda x: x, a, threads=0)


W4 = Tensor([[1.5, -2.0, 0.25, 3.0]]).realize()


def test_kernels_reading_only_constants_are_folded_at_export_time():
  nf = NumericalFunction(lambda x: x + (W4.exp() * 2).contiguous(), ((3, 4), dtypes.float32))
  assert len(nf.schedule.src) == 1  # exp(W) * 2 was computed once, by the CPU device
  consts = [s for s in nf.buffers.values() if s.category is Category.CONSTANT]
  assert [s.size for s in consts] == [4]
  folded = (W4.exp() * 2).realize()
  assert all(f"0x{w:08x}u" in nf.source for w in struct.unpack("4I", bytes(folded._bytes())))
  x = Tensor.randn(3, 4).realize()
  assert same_bits(nf(x), (x + (W4.exp() * 2).contiguous()).realize())


def test_a_broadcast_of_constants_is_not_folded_into_a_bigger_array():
  nf = NumericalFunction(lambda x: x + W4.expand(256, 4).contiguous(), ((256, 4), dtypes.float32))
  assert len(nf.schedule.src) == 2
  assert [s.size for s in nf.buffers.values() if s.category is Category.CONSTANT] == [4]


def test_a_copy_between_devices_becomes_a_loop():
  nf = NumericalFunction(lambda x: x.to("PYTHON") * 2, ((3,), dtypes.float32))
  assert "for (size_t i = 0; i < 3u; i++)" in nf.source
  np.testing.assert_array_equal(nf(Tensor([1.0, -2.0, 3.0])).numpy(), [2.0, -4.0, 6.0])


def test_kernel_source_is_the_renderers_whole_output():
  ren = CRenderer("CPU", 32)
  t = Tensor.randn(8, 8).realize()
  kernel = (t.exp() + 1).schedule().src[-1].src[0]
  linear = full_rewrite(kernel, ren)
  helpers, text = ren.render_parts("k", linear)
  assert ren.render("k", linear) == KernelSource("k", helpers, text, 1).source
  assert text.startswith("void k(") and PRELUDE not in text


def test_writing_to_an_outside_tensor_raises():
  state = Tensor.zeros(2).contiguous().realize()
  def f(x):
    state.assign(x)
    return x * 2
  with pytest.raises(ExportError, match="pure"):
    _ = NumericalFunction(f, ((2,), dtypes.float32)).function_graph
  np.testing.assert_array_equal(state.numpy(), [0.0, 0.0])
