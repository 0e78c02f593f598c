"""gpudims: output axes become work-group / work-item indices on GPU targets (no device needed)."""
import pytest

from unigrad import Context, Tensor
from unigrad.codegen.gpudims import launch_dims
from unigrad.codegen.linearize import estimate
from unigrad.codegen.opt import KernelOptError, Opt
from unigrad.codegen.pipeline import full_rewrite
from unigrad.renderer.cstyle import CRenderer
from unigrad.renderer.gpu import CUDARenderer, OpenCLRenderer
from unigrad.uop import KernelInfo, Ops

CL = OpenCLRenderer()


def lower(t, ren=CL, opts=None, parallel=True):
  """The LINEAR of t's last kernel with `opts` (None: no opts, and no opts_to_apply marker)."""
  kernel = t.schedule().src[-1].src[0]
  if opts is not None or not parallel:
    kernel = kernel.replace(arg=KernelInfo(opts_to_apply=tuple(opts or ()), parallel=parallel))
  with Context(NOOPT=1): return full_rewrite(kernel, ren)


def specials(linear): return {u.arg: u.src[0].arg for u in linear.src if u.op is Ops.SPECIAL}


def test_output_axes_become_group_ids_innermost_first():
  linear = lower(Tensor.empty(3, 5, device="NULL").exp(), opts=(), parallel=False)
  assert specials(linear) == {}  # a kernel that runs in order keeps its loops: one work item
  linear = lower(Tensor.empty(3, 5, device="NULL").exp(), opts=())
  assert specials(linear) == {"gidx0": 5, "gidx1": 3}  # no opts: its output axes are still bound
  linear = lower(Tensor.empty(3, 5, device="NULL").exp(), opts=[Opt.local(1, 5)])
  assert specials(linear) == {"gidx0": 3, "lidx0": 5}  # the size-1 outer part is gone
  assert launch_dims(linear) == ((3, 1, 1), (5, 1, 1))
  assert not any(u.op is Ops.RANGE for u in linear.src)


def test_more_axes_than_dimensions_are_merged_into_the_last():
  # a reversed permute: no two adjacent axes merge before the opts (codegen/merge_axes.py)
  linear = lower(Tensor.empty(2, 3, 4, 5, device="NULL").permute(3, 2, 1, 0) + 1)
  assert specials(linear) == {"gidx0": 2, "gidx1": 3, "gidx2": 20}
  assert launch_dims(linear) == ((2, 3, 20), (1, 1, 1))


def test_a_dimension_above_the_limit_merges_everything_into_dimension_0():
  ren = CUDARenderer(global_max=(2 ** 31 - 1, 4, 4))
  linear = lower(Tensor.empty(7, 9, device="NULL").exp(), ren)
  assert specials(linear) == {"gidx0": 63}
  assert launch_dims(linear) == ((63, 1, 1), (1, 1, 1))


def test_cpu_targets_keep_loops_and_core_id():
  linear = lower(Tensor.empty(3, 5, device="NULL").exp(), CRenderer())
  assert specials(linear) == {} and launch_dims(linear) == ((1,), None)


def test_reductions_stay_loops_inside_a_work_item():
  linear = lower(Tensor.empty(6, 8, device="NULL").sum(1))
  assert specials(linear) == {"gidx0": 6}
  assert [u.src[0].arg for u in linear.src if u.op is Ops.RANGE] == [8]


def test_cuda_and_opencl_render_the_same_linear_in_their_dialects():
  linear = lower(Tensor.empty(4, 4, device="NULL").exp(), opts=[Opt.local(1, 4)])
  cl, cu = CL.render("k", linear), CUDARenderer().render("k", linear)
  assert "__kernel void k(" in cl and "get_group_id(0)" in cl and "get_local_id(0)" in cl
  assert 'extern "C" __global__ void k(' in cu and "blockIdx.x" in cu and "threadIdx.x" in cu


def test_group_reduce_goes_through_local_memory_with_a_barrier():
  linear = lower(Tensor.empty(6, 64, device="NULL").sum(1), opts=[Opt.group(1, 16)])
  assert specials(linear) == {"gidx0": 6, "lidx0": 16}
  ops = [u.op for u in linear.src]
  assert ops.count(Ops.BARRIER) == 1
  smem = [u for u in linear.src if u.op is Ops.BUFFER and u.addrspace.name == "LOCAL"]
  assert len(smem) == 1 and smem[0].shape == (16,)
  src = CL.render("k", linear)
  assert "__local float smem" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
  assert "__shared__ float smem" in CUDARenderer().render("k", linear)


def test_gpu_heuristics_pick_groups_for_reductions_and_work_groups_for_elementwise():
  with Context(NOOPT=0):
    kernel = Tensor.empty(8, 4096, device="NULL").sum(1).schedule().src[-1].src[0]
    reduce = full_rewrite(kernel, CL)
    kernel = Tensor.empty(64, 64, device="NULL").exp().schedule().src[-1].src[0]
    elementwise = full_rewrite(kernel, CL)
  assert launch_dims(reduce)[1][0] == 256 and any(u.op is Ops.BARRIER for u in reduce.src)
  glob, local = launch_dims(elementwise)
  assert local[0] == 64 and glob[0] * glob[1] * local[0] * local[1] == 64 * 64


def test_estimates_count_every_work_item():
  linear = lower(Tensor.empty(64, 64, device="NULL").exp(), opts=[Opt.local(1, 16)])
  assert estimate(linear).mem_bytes == 2 * 64 * 64 * 4  # one load and one store per element
  assert estimate(linear).flops >= 64 * 64


def test_a_thread_axis_on_a_gpu_target_is_a_clear_error():
  with pytest.raises(KernelOptError, match="THREAD"):
    lower(Tensor.empty(64, 64, device="NULL").exp(), opts=[Opt.thread(0, 4)])
