"""spec_kernel and spec_linear: real kernels pass; each broken rule raises SpecError."""
import pytest

from unigrad import Tensor
from unigrad.codegen.pipeline import CODEGEN_STAGES
from unigrad.dtype import dtypes
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import AxisType, Ops, SpecError, UOp
from unigrad.uop.spec_kernel import spec_kernel, spec_linear


def kernel_of(t: Tensor) -> UOp: return t.schedule().src[0].src[0]


def test_real_kernels_pass_both_specs():
  x = Tensor.empty(4, 8)
  for t in (x + 1, (x * 2).sum(1), x.T.contiguous(), x.pad(((1, 1), (0, 2)))):
    ast = kernel_of(t)
    spec_kernel.verify(ast)
    for stage in CODEGEN_STAGES: ast = stage.run(ast, CRenderer())
    spec_linear.verify(ast)


def test_open_range_is_rejected():
  r = UOp.range(4, 0)
  st = UOp(Ops.STORE, dtypes.void, (UOp.const(dtypes.float, 0.0), UOp.const(dtypes.float, 1.0)))
  bad = UOp(Ops.SINK, dtypes.void, (st, r + 1))
  with pytest.raises(SpecError, match="never closed"):
    spec_kernel.verify(bad)


def test_end_must_close_a_range():
  st = UOp(Ops.STORE, dtypes.void, (UOp.const(dtypes.float, 0.0), UOp.const(dtypes.float, 1.0)))
  with pytest.raises(SpecError, match="closes a RANGE"):
    spec_kernel.verify(UOp(Ops.END, dtypes.void, (st, UOp.const(dtypes.index, 3))))


def test_shaped_value_rejected_in_kernel():
  v = UOp(Ops.VCONST, dtypes.float, arg=(1.0, 2.0))
  with pytest.raises(SpecError, match="scalar"):
    spec_kernel.verify(v + v)


def test_linear_rejects_use_before_definition():
  r = UOp.range(UOp.const(dtypes.int32, 4), 0, AxisType.LOOP)
  x = r + 1
  end = UOp(Ops.END, dtypes.void, (x, r))
  with pytest.raises(SpecError, match="before it is computed"):
    spec_linear.verify(UOp(Ops.LINEAR, dtypes.void, (x, r, end)))


def test_linear_rejects_unclosed_loop_and_index_dtype():
  r = UOp.range(UOp.const(dtypes.int32, 4), 0, AxisType.LOOP)
  with pytest.raises(SpecError, match="never closed"):
    spec_linear.verify(UOp(Ops.LINEAR, dtypes.void, (r,)))
  ri = UOp.range(4, 1)
  with pytest.raises(SpecError, match="index dtype"):
    spec_linear.verify(UOp(Ops.LINEAR, dtypes.void, (ri, UOp(Ops.END, dtypes.void, (ri, ri)))))
