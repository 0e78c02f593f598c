"""Linearize's work estimates: whole-launch FLOPs and bytes, all threads included."""
import pytest

from unigrad import Tensor
from unigrad.codegen.linearize import estimate, launch_size
from unigrad.codegen.opt import Opt
from unigrad.codegen.pipeline import full_rewrite
from unigrad.helpers import GlobalCounters
from unigrad.renderer import PythonRenderer
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import KernelInfo, UOp

N = 16
MATMUL_OPTS = [(), (Opt.thread(0, 2),), (Opt.thread(0, 4), Opt.upcast(1, 4)), (Opt.upcast(0, 4),),
               (Opt.upcast(1, 4), Opt.unroll(2, 4)), (Opt.thread(0, 2), Opt.unroll(3, 4)), None]
ADD_OPTS = [(), (Opt.thread(0, 2),), (Opt.thread(0, 8), Opt.upcast(2, 4)), (Opt.upcast(1, 4),),
            None]


def kernel_of(t: Tensor) -> UOp: return t.schedule().src[-1].src[0]


def lower(kernel: UOp, opts: tuple | None, ren=None) -> UOp:
  """The kernel's LINEAR with exactly `opts` applied (None: the heuristics' choice)."""
  ast = kernel if opts is None else kernel.replace(arg=KernelInfo(opts_to_apply=opts))
  return full_rewrite(ast, ren or CRenderer("CPU", 32, 1 << 25))


@pytest.mark.parametrize("opts", MATMUL_OPTS, ids=str)
def test_matmul_counts_2n3_flops_whatever_the_opts(opts):
  linear = lower(kernel_of(Tensor.empty(N, N) @ Tensor.empty(N, N)), opts)
  assert estimate(linear).flops == 2 * N ** 3


@pytest.mark.parametrize("opts", ADD_OPTS, ids=str)
def test_elementwise_add_counts_n_ops_and_3n_words(opts):
  linear = lower(kernel_of(Tensor.empty(N, N) + Tensor.empty(N, N)), opts)
  est = estimate(linear)
  assert est.flops == N * N
  assert est.mem_bytes == 3 * N * N * 4


def test_threaded_kernel_counts_every_chunk():
  linear = lower(kernel_of(Tensor.empty(N, N) + Tensor.empty(N, N)), (Opt.thread(0, 4),),
                 PythonRenderer())
  assert launch_size(linear) == (4,) and estimate(linear).flops == N * N


def test_global_counters_count_the_whole_matmul(device):
  a, b = Tensor.rand(N, N, device=device).realize(), Tensor.rand(N, N, device=device).realize()
  GlobalCounters.reset()
  (a @ b).realize()
  assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_ops == 2 * N ** 3
  GlobalCounters.reset()
  (a + b).realize()
  assert GlobalCounters.global_ops == N * N and GlobalCounters.global_mem == 3 * N * N * 4
