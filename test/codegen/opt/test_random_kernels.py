"""Random kernels: every legal sequence of opts computes what the unoptimized kernel computes.

Hypothesis draws small single-kernel Tensor expressions (elementwise trees over moved inputs, an
optional sum or max, matmuls; ragged sizes) as source text, and 1-3 legal opts. The optimized
kernel on the PYTHON interpreter and on vector C code must equal the unoptimized PYTHON run (the
oracle), with every stage's spec verifier on (SPEC=1). Without named opts, the axes merge first
(codegen/merge_axes.py) and the heuristics choose: that path is checked against the oracle too.
"""
import math

import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

from unigrad import Context, Tensor, dtypes
from unigrad.codegen.linearize import launch_size
from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.opt.kernel import OptKernel
from unigrad.codegen.pipeline import full_rewrite
from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.renderer import PythonRenderer
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.ops_cpu import find_c_compiler
from unigrad.runtime.ops_python import PythonProgram
from unigrad.uop import KernelInfo, UOp, graph_rewrite

from codegen.kernels import inputs_for, params_of

VEC = CRenderer("CPU", vector_bytes=64)
HAS_CC = find_c_compiler() is not None
MAX_NUMEL = 1024  # iterations of the unoptimized loop nest: the PYTHON interpreter is slow
RAGGED = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31]
AMOUNTS = [2, 3, 4, 8, 16]


# ---- running one kernel (as in test_vectorize.py) ----

def x(*shape: int, dtype=dtypes.float32) -> Tensor: return Tensor.empty(*shape, dtype=dtype)


def xi(*shape: int) -> Tensor: return Tensor.empty(*shape, dtype=dtypes.int32)


def run(kernel: UOp, opts, inputs: list[np.ndarray], ren) -> np.ndarray:
  """The output buffer (slot 0) after running `kernel` with `opts` on `ren`'s device (None: the
  heuristics' choice, after the axes merge: codegen/merge_axes.py)."""
  info = KernelInfo(opts_to_apply=None if opts is None else tuple(opts))
  with Context(SPEC=1):
    linear = full_rewrite(kernel.replace(arg=info), ren)
  dev = "PYTHON" if isinstance(ren, PythonRenderer) else "CPU"
  bufs = [Buffer(dev, len(a), p.dtype).copyin(a.tobytes())
          for a, p in zip(inputs, params_of(kernel))]
  if dev == "PYTHON":
    PythonProgram("k", ren.render("k", linear).encode())(*bufs, global_size=launch_size(linear))
  else:
    d = Device["CPU"]
    prog = d.runtime("k", d.compiler.compile_cached(ren.render("k", linear)))
    prog(*bufs, global_size=launch_size(linear), wait=True)
  return np.frombuffer(bufs[0].copyout(), dtype=inputs[0].dtype).copy()


def single_kernel(expr: str) -> UOp | None:
  """The kernel AST of `expr` (source text over x/xi/dtypes), or None if it needs more kernels."""
  t = eval(expr, {"x": x, "xi": xi, "dtypes": dtypes})  # noqa: S307 (our own generated text)
  with Context(SPEC=1):
    sched = t.schedule()
  return sched.src[0].src[0] if len(sched.src) == 1 else None


def assert_same(got: np.ndarray, want: np.ndarray, msg: str) -> None:
  if np.issubdtype(want.dtype, np.floating):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=msg)
  else: np.testing.assert_array_equal(got, want, err_msg=msg)


def check_opts(kernel: UOp, opts: list[Opt], msg: str = "") -> None:
  """`kernel` with `opts` on PYTHON and on vector C equals the unoptimized PYTHON run."""
  inputs = inputs_for(kernel)
  want = run(kernel, (), inputs, PythonRenderer())
  assert_same(run(kernel, opts, inputs, PythonRenderer()), want, f"PYTHON {opts} {msg}")
  if HAS_CC: assert_same(run(kernel, opts, inputs, VEC), want, f"CPU {opts} {msg}")


# ---- kernels as source text ----

def sizes(cap: int = 40) -> st.SearchStrategy[int]:
  """An axis size in 1..`cap`, often a ragged prime."""
  return st.one_of(st.sampled_from([s for s in RAGGED if s <= cap]), st.integers(1, cap))


@st.composite
def shapes(draw) -> tuple[int, ...]:
  """1-3 sizes in 1..40, at most MAX_NUMEL elements in all."""
  dims: list[int] = []
  for _ in range(draw(st.integers(1, 3))):
    dims.append(draw(sizes(min(40, MAX_NUMEL // math.prod(dims)))))
  return tuple(dims)


@st.composite
def leaves(draw, shape: tuple[int, ...], leaf: str) -> str:
  """A new input moved (or not) to `shape`: permute, pad (gated loads), shrink or strided
  slicing, expand (broadcast) or flip."""
  kind = draw(st.sampled_from(["plain", "permute", "pad", "shrink", "slice", "expand", "flip"]))
  n = len(shape)
  if kind == "permute" and n > 1:
    perm = draw(st.permutations(range(n)))
    src = [0] * n
    for i, p in enumerate(perm): src[p] = shape[i]
    return f"{leaf}{tuple(src)}.permute{tuple(perm)}"
  if kind == "pad":
    pads = [draw(st.tuples(st.integers(0, min(3, s - 1)), st.integers(0, min(3, s - 1))))
            for s in shape]
    pads = [(b, min(a, s - 1 - b)) for (b, a), s in zip(pads, shape)]
    src = tuple(s - b - a for (b, a), s in zip(pads, shape))
    value = draw(st.sampled_from(["", ", value=-1.5"]))
    return f"{leaf}{src}.pad({tuple(pads)}{value})"
  if kind == "shrink":
    pads = [draw(st.tuples(st.integers(0, 3), st.integers(0, 3))) for _ in shape]
    src = tuple(s + b + a for (b, a), s in zip(pads, shape))
    return f"{leaf}{src}.shrink({tuple((b, b + s) for (b, _), s in zip(pads, shape))})"
  if kind == "slice":
    steps = [draw(st.sampled_from([1, 2, 3])) for _ in shape]
    starts = [draw(st.integers(0, 2)) for _ in shape]
    src = tuple(b + s * k for b, s, k in zip(starts, shape, steps))
    idx = ", ".join(f"{b}:{b + s * k}:{k}" for b, s, k in zip(starts, shape, steps))
    return f"{leaf}{src}[{idx}]"
  if kind == "expand":
    ones = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    src = tuple(1 if o else s for o, s in zip(ones, shape))
    return f"{leaf}{src}.expand{shape}" if src != shape else f"{leaf}{shape}"
  if kind == "flip":
    return f"{leaf}{shape}.flip({draw(st.integers(0, n - 1))})"
  return f"{leaf}{shape}"


@st.composite
def trees(draw, shape: tuple[int, ...], leaf: str, depth: int) -> str:
  """An elementwise expression of `shape`: + * max where exp relu and casts to int32 and back."""
  if depth == 0 or draw(st.integers(0, 3)) == 0: return draw(leaves(shape, leaf))
  sub = lambda: draw(trees(shape, leaf, depth - 1))  # noqa: E731
  is_int = leaf == "xi"
  ops = ["add", "mul", "max", "where", "relu", "const"] + ([] if is_int else ["exp", "int"])
  op = draw(st.sampled_from(ops))
  if op == "add": return f"({sub()} + {sub()})"
  if op == "mul": return f"({sub()} * {sub()})"
  if op == "max": return f"{sub()}.maximum({sub()})"
  if op == "where": return f"({sub()} > {sub()}).where({sub()}, {sub()})"
  if op == "relu": return f"{sub()}.relu()"
  if op == "const": return f"({sub()} * 3 + 2)" if is_int else f"({sub()} * 0.5 - 0.25)"
  if op == "exp": return f"{sub()}.exp()"
  return f"({sub()} * 4).cast(dtypes.int32).cast(dtypes.float32)"


@st.composite
def elementwise_kernels(draw) -> str:
  """A tree, perhaps moved as a whole, then perhaps a sum or max over one axis or all."""
  shape = draw(shapes())
  leaf = draw(st.sampled_from(["x", "x", "x", "xi"]))
  expr = draw(trees(shape, leaf, 2))
  if len(shape) > 1 and draw(st.booleans()):
    perm = tuple(draw(st.permutations(range(len(shape)))))
    expr, shape = f"{expr}.permute{perm}", tuple(shape[p] for p in perm)
  reduce = draw(st.sampled_from(["", "sum", "max"]))
  if not reduce: return expr
  axis = draw(st.sampled_from([None, *range(len(shape))]))
  keepdim = draw(st.booleans())
  expr = f"{expr}.{reduce}({axis}, keepdim={keepdim})"
  kept = [1 if axis in (None, i) else s for i, s in enumerate(shape)]
  out = tuple(kept) if keepdim else tuple(s for i, s in enumerate(shape) if axis not in (None, i))
  post = draw(st.sampled_from(["", ".relu()", " * 2", f" + {leaf}{out}"]))
  return f"({expr}{post})" if post else expr


@st.composite
def matmul_kernels(draw) -> str:
  """A small `a @ b`, maybe batched, `a` maybe transposed, maybe with a bias or a ReLU after."""
  m, k, n = draw(sizes(16)), draw(sizes()), draw(sizes(16))
  batch = draw(st.sampled_from([(), (), (2,), (3,)]))
  leaf = draw(st.sampled_from(["x", "x", "xi"]))
  a = f"{leaf}{(*batch, m, k)}"
  if draw(st.booleans()): a = f"{leaf}{(*batch, k, m)}.transpose(-1, -2)"
  post = draw(st.sampled_from(["", ".relu()", f" + {leaf}{(n,)}"]))
  return f"({a} @ {leaf}{(k, n)}){post}"


# ---- opts ----

def amounts_for(kind: str, size: int) -> list[int]:
  """The AMOUNTS that could apply to an axis of `size` (apply still decides)."""
  if kind == "padto": return [m for m in AMOUNTS if size % m and -(-size // m) * m <= 4 * size]
  return [m for m in AMOUNTS if size % m == 0]


CPU_OPTS = ("upcast", "unroll", "group", "thread", "padto", "swap")


def draw_opts(data, kernel: UOp, kinds: tuple[str, ...] = CPU_OPTS) -> list[Opt]:
  """1-3 opts of `kinds` that apply, in order, to `kernel`; illegal draws are skipped, not
  failures. Opts number the axes of the kernel after the pipeline's first stage (simplify drops
  size-1 axes)."""
  k = OptKernel(graph_rewrite(kernel, pm_kernel_simplify, name="simplify"))
  want, opts = data.draw(st.integers(1, 3), label="number of opts"), []
  for _ in range(12):
    if len(opts) == want or not k.axes: break
    kind = data.draw(st.sampled_from(kinds))
    axis = data.draw(st.integers(0, len(k.axes) - 1))
    others = [a for a in range(len(k.axes)) if a != axis]
    amounts = others if kind == "swap" else amounts_for(kind, k.sizes[axis])
    if not amounts: continue
    opt = getattr(Opt, kind)(axis, data.draw(st.sampled_from(amounts)))
    try: k = k.apply(opt)
    except KernelOptError: continue
    opts.append(opt)
  return opts


def check_random(data, expr: str) -> None:
  """Draw opts for `expr`'s kernel (if it is one kernel) and check them against the oracle."""
  note(f"kernel: {expr}")
  kernel = single_kernel(expr)
  assume(kernel is not None)
  opts = draw_opts(data, kernel)
  assume(opts)
  note(f"opts: {opts}")
  check_opts(kernel, opts, expr)


@settings(max_examples=180, deadline=None, derandomize=True)
@given(st.data(), elementwise_kernels())
def test_random_elementwise_and_reduce_kernels(data, expr):
  check_random(data, expr)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data(), matmul_kernels())
def test_random_matmul_kernels(data, expr):
  check_random(data, expr)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(elementwise_kernels())
def test_random_kernels_with_merged_axes_and_the_heuristics_opts(expr):
  """No opts named: the axes merge and the heuristics choose, on PYTHON and on vector C."""
  kernel = single_kernel(expr)
  assume(kernel is not None)
  check_opts(kernel, None, expr)


# ---- regressions the random kernels found ----

@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("expr, opts", [
  ("x(4,).sum()", [Opt.unroll(0, 2), Opt.padto(0, 3), Opt.group(0, 3)]),
  ("x(2,).sum()", [Opt.unroll(0, 2), Opt.padto(0, 2), Opt.group(0, 2)]),
  ("x(2,).sum()", [Opt.group(0, 2), Opt.padto(1, 2), Opt.group(1, 2)]),
  ("x(6,).max()", [Opt.unroll(0, 2), Opt.padto(0, 4), Opt.group(0, 4)]),
  ("x(5, 6).sum(1)", [Opt.unroll(1, 2), Opt.padto(1, 4), Opt.group(1, 4)]),
  ("xi(6,).sum()", [Opt.unroll(0, 2), Opt.padto(0, 4), Opt.group(0, 4)]),
])
def test_fully_masked_group_of_a_padded_reduce_vectorizes(expr, opts):
  """Regression: with PADTO, a GROUP_REDUCE lane group can be all padding; its value folds to the
  reduce's identity (a scalar CONST), and vectorize left GEP(CONST, lanes), which C rendered as
  `0.0f[0]`. A GEP of a value that does not vary over the vector range is that value."""
  check_opts(single_kernel(expr), opts)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_padded_axis_read_as_a_vector_stays_in_its_buffer():
  """Regression: PADTO clamps a padded axis's reads into bounds (WHERE(i < 3, i, 2)); upcast
  into the vector, vectorize took the clamp for `base + lane` and loaded 2 lanes at index 2 of a
  3-element buffer (CHECK_OOB caught it; without it a read past the buffer). Each lane's clamp
  is now its own load."""
  check_opts(single_kernel("x(3,)"), [Opt.padto(0, 2), Opt.upcast(0, 2)])
