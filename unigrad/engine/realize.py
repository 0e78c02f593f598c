"""Realize: run the pipeline for a set of tensor-graph nodes and execute the command buffer.

`realize(uops, devices)` callifies the nodes, looks the function body up in the schedule cache
(keyed by the body node itself: hash-consing makes equal programs the same node), compiles each
kernel once per device (the program cache), allocates intermediates for the run, launches the
kernels in order (slots and lifetimes derived once per schedule: its launch plan) and returns the
map from each realized node to the buffer holding it. On a cache hit the work is one walk of the
graph (tuple-device check and callify share it), the body rebuilt over PARAMs, and the launches.
Python threads realize one at a time: `realize`, `schedule`, `copyout` and `buffer_with_data`
hold `realize_lock` (re-entrant), which guards the caches here and the devices' launch state.
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

from unigrad.codegen.linearize import Estimates, estimate, launch_size
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import DType, dtypes
from unigrad.helpers import GlobalCounters
from unigrad.knobs import BEAM, CHECK_OOB, DEBUG, NOOPT
from unigrad.renderer import PythonRenderer, Renderer
from unigrad.renderer.cstyle import CRenderer
from unigrad.runtime.device import Buffer, Device
from unigrad.runtime.ops_cpu import last_level_cache_bytes, native_vector_bytes
from unigrad.schedule import multi
from unigrad.schedule.callify import buffer_base, callify, is_plain_buffer
from unigrad.schedule.callify import new_buffer as new_single_buffer
from unigrad.schedule.schedule import create_schedule
from unigrad.uop import Ops, UOp

__all__ = ["realize", "schedule", "new_buffer", "buffer_of", "buffer_with_data", "copyout",
           "is_realized", "is_buffer_view", "schedule_cache", "renderer_for", "realize_lock"]

buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
# realized buffer view -> the graph that computed it (kept while the buffer node lives), so
# autograd can differentiate through a tensor that was realized before backward()
history: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def with_history(root: UOp) -> UOp:
  """`root` with each realized buffer it reads replaced by the graph that computed it, through
  any number of realizations (histories are older than what they explain: no cycles)."""
  while sub := {u: history[u] for u in root.toposort() if u in history}:
    root = root.substitute(sub)
  return root
schedule_cache: dict[UOp, UOp] = {}
SCHEDULE_CACHE_SIZE = 256
realize_lock = threading.RLock()


def renderer_for(device: str) -> Renderer:
  base = device.split(":")[0]
  if base == "PYTHON": return PythonRenderer()
  if base != "CPU": return CRenderer(base)
  return CRenderer(base, native_vector_bytes(), last_level_cache_bytes())


def buffer_of(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER node (created on first use)."""
  base = buffer_base(u)
  if base is None: raise RuntimeError(f"{u.op.name} node is not backed by a buffer")
  buf = buffers.get(base)
  if buf is None:
    size = base.src[0].arg[0] if base.src[0].op is Ops.VCONST else base.shape[0]  # shape is slower
    buf = buffers[base] = Buffer(base.arg.device, size, base.dtype)
  return buf


def new_buffer(device: str | tuple[str, ...], dtype: DType, shape: tuple[int, ...]) -> UOp:
  """A fresh buffer viewed with `shape`; on a tuple of devices, replicated (a copy on each)."""
  if isinstance(device, tuple): return multi.new_multi_buffer(device, dtype, shape, None)
  return new_single_buffer(device, dtype, shape)


def buffer_with_data(device: str, dtype: DType, data: bytes, shape: tuple[int, ...]) -> UOp:
  with realize_lock:
    u = new_buffer(device, dtype, shape)
    buffer_of(u).copyin(data)
  return u


def copyout(u: UOp) -> memoryview:
  with realize_lock: return _copyout(u)


def _copyout(u: UOp) -> memoryview:
  if isinstance(u.device, tuple):  # gathered onto the first device
    g = UOp(Ops.COPY, u.dtype, (u,), u.device[0])
    u = realize([g], [u.device[0]])[g]
  if not is_plain_buffer(u): raise RuntimeError("copyout needs a realized tensor")
  return buffer_of(u).copyout()


def is_realized(u: UOp) -> bool: return is_plain_buffer(u) or multi.is_multi_view(u)


def is_buffer_view(u: UOp) -> bool: return buffer_base(u) is not None or multi.is_multi_view(u)


def _schedule_for(body: UOp, nargs: int, device: str) -> UOp:
  linear = schedule_cache.get(body)
  if linear is None:
    t0 = time.perf_counter()
    linear = create_schedule(body, nargs, device)
    if len(schedule_cache) >= SCHEDULE_CACHE_SIZE: schedule_cache.pop(next(iter(schedule_cache)))
    schedule_cache[body] = linear
    if DEBUG >= 1:
      ms = (time.perf_counter() - t0) * 1e3
      print(f"scheduled {len(linear.src)} kernels in {ms:.2f} ms (cache miss)")
  elif DEBUG >= 1: print(f"scheduled {len(linear.src)} kernels (cache hit)")
  return linear


def schedule(uops: list[UOp], devices: list[str]) -> UOp:
  """The LINEAR of kernel CALLs that realizing `uops` would run, with the real buffers as args."""
  with realize_lock: return _schedule(uops, devices)


def _schedule(uops: list[UOp], devices: list[str]) -> UOp:
  if (plan := multi.lower_multi(uops, devices)) is not None:
    return _schedule(plan.uops, plan.devices)
  res = callify(uops, devices)
  linear = _schedule_for(res.body, len(res.bufs), devices[0])
  args = res.bufs
  sub = {p: args[p.arg.slot] for c in linear.src for p in c.src[1:] if p.arg.slot < len(args)}
  calls = tuple(c.replace(src=(c.src[0], *(sub.get(p, p) for p in c.src[1:])))
                for c in linear.src)
  return UOp(Ops.LINEAR, linear.dtype, calls)


def realize(uops: list[UOp], devices: list[str]) -> dict[UOp, UOp]:
  """Compute `uops` into buffers; returns node -> buffer view for every realized node. Graphs on
  tuple devices are first lowered to one graph per device (schedule/multi.py). The one toposort
  of the targets serves both the tuple-device check and callify."""
  with realize_lock: return _realize(uops, devices)


def _realize(uops: list[UOp], devices: list[str]) -> dict[UOp, UOp]:
  nodes = UOp(Ops.SINK, dtypes.void, tuple(uops)).toposort()
  if (plan := multi.lower_multi(uops, devices, nodes)) is not None:
    return plan.finish(_realize(plan.uops, plan.devices))
  res = callify(uops, devices, nodes)
  run_linear(_schedule_for(res.body, len(res.bufs), devices[0]), res.bufs)
  return res.becomes


@dataclass
class Runner:
  """A compiled kernel ready to launch on one device."""
  name: str
  program: object
  estimates: Estimates
  global_size: tuple[int, ...] = (1,)


_runners: dict[tuple[UOp, str, int, bool, bool], Runner] = {}


def get_runner(kernel: UOp, device: str) -> Runner:
  """The compiled program for a kernel AST on a device (compiled once per optimizer setting:
  BEAM, NOOPT and CHECK_OOB choose different code for the same kernel)."""
  key = (kernel, device, int(BEAM), bool(NOOPT), bool(CHECK_OOB))
  if (r := _runners.get(key)) is not None: return r
  t0 = time.perf_counter()
  dev = Device[device]
  ren = renderer_for(device)
  if DEBUG >= 3: print(f"kernel AST:\n{kernel!r}")
  linear = full_rewrite(kernel, ren)
  name = linear.arg.name if linear.arg is not None else "kernel"
  src = ren.render(name, linear)
  if DEBUG >= 4: print(src)
  t1 = time.perf_counter()
  lib = dev.compiler.compile_cached(src) if dev.compiler is not None else src.encode()
  r = _runners[key] = Runner(name, dev.runtime(name, lib), estimate(linear), launch_size(linear))
  if DEBUG >= 1:
    codegen_ms, compile_ms = (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3
    print(f"compiled {name} for {device}: codegen {codegen_ms:.2f} ms, compile {compile_ms:.2f} ms")
  return r


def _count(runner: Runner, device: str, t: float | None) -> None:
  est = runner.estimates
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += est.flops
  GlobalCounters.global_mem += est.mem_bytes
  if t is not None: GlobalCounters.time_sum_s += t
  if DEBUG >= 2 and t is not None:
    rate = ""
    if t > 0: rate = f"{est.flops / t * 1e-9:8.2f} GFLOPS {est.mem_bytes / t * 1e-9:8.2f} GB/s"
    print(f"*** {device:8s} {GlobalCounters.kernel_count:4d} {runner.name:30s} "
          f"{t * 1e6:10.2f} us {rate}")


@dataclass(frozen=True)
class Launch:
  """One CALL of a schedule: the kernel, its buffers' slots, its device (None: the first
  argument's) and the intermediate slots whose last use it is."""
  kernel: UOp
  slots: tuple[int, ...]
  device: str | None
  frees: tuple[int, ...]


@dataclass(frozen=True)
class LaunchPlan:
  """What running a schedule needs, derived once per (schedule, number of arguments)."""
  launches: tuple[Launch, ...]
  inter: dict[int, tuple[int, DType]]  # intermediate slot -> (size, dtype)


_plans: dict[tuple[UOp, int], LaunchPlan] = {}


def launch_plan(linear: UOp, nargs: int) -> LaunchPlan:
  """The launches of `linear` when slots below `nargs` are arguments (cached)."""
  if (plan := _plans.get((linear, nargs))) is not None: return plan
  last_use: dict[int, int] = {}
  inter: dict[int, tuple[int, DType]] = {}
  for i, call in enumerate(linear.src):
    for p in call.src[1:]:
      last_use[p.arg.slot] = i
      if p.arg.slot >= nargs: inter.setdefault(p.arg.slot, (p.shape[0], p.dtype))
  launches = []
  for i, call in enumerate(linear.src):
    params = call.src[1:]
    device = next((p.arg.device for p in params if p.arg.device is not None), None)
    frees = tuple(s for s, last in last_use.items() if last == i and s >= nargs)
    launches.append(Launch(call.src[0], tuple(p.arg.slot for p in params),
                           None if device is None else Device.canonicalize(device), frees))
  if len(_plans) >= 4 * SCHEDULE_CACHE_SIZE: _plans.pop(next(iter(_plans)))
  plan = _plans[(linear, nargs)] = LaunchPlan(tuple(launches), inter)
  return plan


def run_linear(linear: UOp, args: tuple[UOp, ...]) -> None:
  """Launch every CALL of a schedule; intermediates live from first to last use."""
  nargs = len(args)
  plan = launch_plan(linear, nargs)
  arg_bufs = [buffer_of(a) for a in args]
  inter: dict[int, Buffer] = {}
  fallback = args[0].arg.device if args else Device.DEFAULT
  wait = DEBUG >= 2
  for launch in plan.launches:
    device = launch.device or Device.canonicalize(fallback)
    bufs = []
    for slot in launch.slots:
      if slot < nargs: buf = arg_bufs[slot]
      elif (buf := inter.get(slot)) is None:
        buf = inter[slot] = Buffer(device, *plan.inter[slot])
      bufs.append(buf.ensure_allocated())
    if launch.kernel.op is Ops.COPY:
      bufs[0].copyin(bufs[1].copyout())
      if DEBUG >= 2: print(f"*** COPY {bufs[1].device} -> {bufs[0].device} {bufs[0].nbytes} bytes")
    else:
      runner = get_runner(launch.kernel, device)
      t = runner.program(*bufs, global_size=runner.global_size, wait=wait)
      _count(runner, device, t)
    for slot in launch.frees: inter.pop(slot, None)
