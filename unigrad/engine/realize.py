"""Realize: run the pipeline for a set of tensor-graph nodes and execute the command buffer.

`realize(uops, devices)` callifies the nodes, looks the function body up in the schedule cache
(keyed by the body node itself: hash-consing makes equal programs the same node), compiles each
kernel once per device (the program cache), allocates intermediates for the run, launches the
kernels in order (slots and lifetimes derived once per schedule: its launch plan) and returns the
map from each realized node to the buffer holding it. On a cache hit the work is one walk of the
graph (tuple-device check and callify share it), the body rebuilt over PARAMs, and the launches;
realizing the very same graph again (hash-consing rebuilds it while the previous result's history
holds it, and realize holds the graph realized last) does not walk it: callify's result is
reused (`recallify`) with new output buffers. On a device with native command buffers (the CPU) a
schedule's launches run as one (`BatchedRun`), kept per schedule and re-pointed at each run's
buffers.
Symbolic variables: callify returns the bound values (`var_vals`, name -> int) beside the body,
which holds only the variables; each launch passes its kernel's variables' values as arguments.
Python threads realize one at a time: `realize`, `schedule`, `copyout` and `buffer_with_data`
hold `realize_lock` (re-entrant), which guards the caches here and the devices' launch state.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from unigrad.codegen.gpudims import launch_dims
from unigrad.codegen.linearize import Estimates, estimate
from unigrad.codegen.pipeline import full_rewrite
from unigrad.dtype import DType, dtypes
from unigrad.engine import compcache, profile
from unigrad.helpers import GlobalCounters, bounded_put
from unigrad import knobs
from unigrad.knobs import BEAM, CHECK_OOB, DEBUG, IGNORE_BEAM_CACHE, MARCH, NOOPT, PROFILE
from unigrad.renderer import Renderer
from unigrad.runtime.collective import collective_program
from unigrad.runtime.device import Batch, Buffer, Compiled, Device, Program
from unigrad.runtime.ops_cpu import cpu_threads
from unigrad.schedule import multi
from unigrad.schedule.function import graph_nodes, has_function, inline_functions
from unigrad.schedule.function import resolvable_calls
from unigrad.schedule.callify import buffer_base, callify, is_plain_buffer, recallify
from unigrad.schedule.callify import recallify_alike, remember
from unigrad.schedule.callify import new_buffer as new_single_buffer
from unigrad.schedule.memory import Lifetime, plan_memory
from unigrad.schedule.schedule import create_schedule
from unigrad.uop import NodeMap, Ops, UOp
from unigrad.uop.upat import traced_call
from unigrad.uop.variable import UnboundVariableError, concrete_shape

__all__ = ["realize", "schedule", "new_buffer", "buffer_of", "buffer_from", "buffer_with_data",
           "copyout", "is_realized", "is_buffer_view", "schedule_cache", "renderer_for",
           "realize_lock"]

buffers: NodeMap[Buffer] = NodeMap("buffer")  # BUFFER node -> its device Buffer
# realized buffer view -> the graph that computed it and the write epoch it was computed in
# (kept while the buffer node lives), so autograd can differentiate through a tensor that was
# realized before backward()
history: NodeMap[tuple[UOp, int]] = NodeMap("history")
# BUFFER node -> the epoch of the last write to it: a history that reads a buffer written after
# it was computed no longer explains its value (the buffer holds other values now)
written_at: NodeMap[int] = NodeMap("written_at")
write_epoch = 0


def mark_written(bases: dict[UOp, None] | list[UOp]) -> None:
  """The buffers `bases` were just overwritten: histories computed before now are stale."""
  global write_epoch
  write_epoch += 1
  for b in bases: written_at[b] = write_epoch


def _current(entry: tuple[UOp, int]) -> UOp | None:
  """A history's graph, or None when a buffer it reads was written after it was computed."""
  graph, epoch = entry
  for u in graph.toposort():
    if u.op is Ops.BUFFER and written_at.get(u, 0) > epoch: return None
  return graph


def with_history(root: UOp, leaves: dict[UOp, None] | None = None) -> UOp:
  """`root` with each realized buffer it reads replaced by the graph that computed it, through
  any number of realizations (histories are older than what they explain: no cycles). A history
  made stale by a later write to a buffer it reads is not used: that value is a constant. The
  graphs of `leaves` (autograd's targets, which may be pending writes) are kept as they are."""
  keep = leaves or {}
  while sub := {u: g for u in root.toposort(gate=lambda n: n not in keep)
                if (h := history.get(u)) is not None and (g := _current(h)) is not None}:
    root = root.substitute({**sub, **{k: k for k in keep}})
  return root
schedule_cache: dict[UOp, UOp] = {}
SCHEDULE_CACHE_SIZE = 256
realize_lock = threading.RLock()


def renderer_for(device: str) -> Renderer:
  """The renderer of `device`'s kernels: the device owns it."""
  return Device[device].renderer


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


def buffer_from(buf: Buffer) -> UOp:
  """A fresh BUFFER node of shape (buf.size,) backed by the existing Buffer `buf` (memory
  wrapped without a copy: from_blob, DLPack)."""
  with realize_lock:
    u = new_single_buffer(buf.device, buf.dtype, (buf.size,))
    buffers[u] = buf
  return u


def buffer_with_data(device: str, dtype: DType, data: bytes, shape: tuple[int, ...]) -> UOp:
  with realize_lock:
    u = new_buffer(device, dtype, shape)
    st = time.perf_counter()
    buffer_of(u).copyin(data)
    if PROFILE: profile.record("copyin", "copy", device, st, mem_bytes=len(data))
  return u


def copyout(u: UOp) -> memoryview:
  if capturing:
    raise CaptureError("a TinyJit function read tensor values (item, tolist, numpy) while it was "
                       "being captured: a replay runs no Python code, so nothing may depend on "
                       "them; return the tensor from the function and read it outside")
  with realize_lock: return _copyout(u)


def _copyout(u: UOp) -> memoryview:
  if isinstance(u.device, tuple):  # gathered onto the first device
    g = UOp(Ops.COPY, u.dtype, (u,), u.device[0])
    u = realize([g], [u.device[0]])[g]
  if not is_plain_buffer(u): raise RuntimeError("copyout needs a realized tensor")
  st = time.perf_counter()
  buf = buffer_of(u)
  out = buf.copyout()
  if PROFILE: profile.record("copyout", "copy", buf.device, st, mem_bytes=len(out))
  if all(isinstance(s, int) for s in u.shape): return out
  numel = math.prod(concrete_shape(u.shape))  # a symbolic shape: its row-major prefix
  return out[:numel * u.dtype.itemsize]


def is_realized(u: UOp) -> bool: return is_plain_buffer(u) or multi.is_multi_view(u)


def is_buffer_view(u: UOp) -> bool: return buffer_base(u) is not None or multi.is_multi_view(u)


def _schedule_for(body: UOp, nargs: int, device: str) -> UOp:
  """The LINEAR for a function body: from this process's cache, else the disk cache (another
  process scheduled it: engine/compcache.py), else the scheduler."""
  linear = schedule_cache.get(body)
  if linear is None:
    t0 = time.perf_counter()
    hits = compcache.stats.schedule_hits
    linear = compcache.cached_schedule(body, nargs, device, lambda: _traced_schedule(body, nargs,
                                                                                     device))
    bounded_put(schedule_cache, body, linear, SCHEDULE_CACHE_SIZE)
    if DEBUG >= 1:
      ms = (time.perf_counter() - t0) * 1e3
      where = "disk cache hit" if compcache.stats.schedule_hits > hits else "cache miss"
      print(f"scheduled {len(linear.src)} kernels in {ms:.2f} ms ({where})")
  elif DEBUG >= 1: print(f"scheduled {len(linear.src)} kernels (cache hit)")
  return linear


def _traced_schedule(body: UOp, nargs: int, device: str) -> UOp:
  """create_schedule, recorded for the viewer when VIZ is on (a no-op wrapper otherwise)."""
  linear, trace = traced_call("schedule", create_schedule, body, nargs, device)
  if trace is not None:
    trace.name = f"schedule {len(linear.src)} kernels"
    trace.info.update(graph=linear, device=device)
  return linear


def schedule(uops: list[UOp], devices: list[str]) -> UOp:
  """The LINEAR of kernel CALLs that realizing `uops` would run, with the real buffers as args."""
  return schedule_with_vars(uops, devices)[0]


def schedule_with_vars(uops: list[UOp], devices: list[str]) -> tuple[UOp, dict[str, int]]:
  """`schedule`, and the values of the bound variables its kernels read (name -> int)."""
  with realize_lock: return _schedule(uops, devices)


def _schedule(uops: list[UOp], devices: list[str]) -> tuple[UOp, dict[str, int]]:
  if has_function(UOp(Ops.SINK, dtypes.void, tuple(uops)).toposort()):
    uops = inline_functions(uops)
  if (plan := multi.lower_multi(uops, devices)) is not None:
    return _schedule(plan.uops, plan.devices)
  res = callify(uops, devices)
  linear = _schedule_for(res.body, len(res.bufs), devices[0])
  args = res.bufs
  sub = {p: args[p.arg.slot] for c in linear.src for p in c.src[1:] if p.arg.slot < len(args)}
  calls = tuple(c.replace(src=(c.src[0], *(sub.get(p, p) for p in c.src[1:])))
                for c in linear.src)
  return UOp(Ops.LINEAR, linear.dtype, calls), dict(res.var_vals)


def realize(uops: list[UOp], devices: list[str]) -> dict[UOp, UOp]:
  """Compute `uops` into buffers; returns node -> buffer view for every realized node. Graphs on
  tuple devices are first lowered to one graph per device (schedule/multi.py). The one toposort
  of the targets serves both the tuple-device check and callify."""
  with realize_lock: return _realize(uops, devices)


# The graph realized last (its target and toposort), held until the next realize: an eager
# loop's next step rebuilds what does not depend on new inputs (a weight's transpose, reshape or
# broadcast: about 500 of the 1,300 new nodes of a MiniLM forward) from the hash-cons cache; the
# very same graph again (the same expression of the same buffers) is found with its callify result
# (`recallify`), and a graph shaped like it (new inputs) is matched to it node by node
# (`recallify_alike`). What it pins is that graph's leaf buffers, until the next realize.
_held_graph: tuple[tuple[UOp, ...], tuple[UOp, ...]] = ((), ())


def _realize(uops: list[UOp], devices: list[str]) -> dict[UOp, UOp]:
  global _held_graph
  held, held_nodes = _held_graph
  if len(uops) == 1 and (res := recallify(uops[0], devices[0])) is not None:  # the same graph
    run_linear(_schedule_for(res.body, len(res.bufs), devices[0]), res.bufs, res.var_vals)
    same = len(held) == 1 and held[0] is uops[0]
    _held_graph = (tuple(uops), held_nodes if same else ())
    return res.becomes
  nodes = graph_nodes(UOp(Ops.SINK, dtypes.void, tuple(uops)))  # calls' bodies left out
  res = None
  key = _template_key(uops, devices, nodes)
  if key is not None and held_nodes:  # an eager step on new inputs, alike the last: one device
    last = held[0] if len(held) == 1 else held_nodes[-1]
    res = recallify_alike(nodes, devices[0], last, held_nodes)
  if res is None:
    if has_function(nodes) and (multi.uses_tuple_devices(uops, devices, nodes) or
                                not resolvable_calls(nodes)):
      # realize the calls' results, then map the callers' nodes to them
      inlined = inline_functions(uops)
      done = realize(inlined, devices)
      return {**done, **{u: done[v] for u, v in zip(uops, inlined) if v in done}}
    if (plan := multi.lower_multi(uops, devices, nodes)) is not None:
      return plan.finish(_realize(plan.uops, plan.devices))
    res = callify(uops, devices, nodes)  # resolves the calls in its walk
  if key is not None: remember(key, devices[0], res)
  run_linear(_schedule_for(res.body, len(res.bufs), devices[0]), res.bufs, res.var_vals)
  _held_graph = (tuple(uops), tuple(nodes))
  return res.becomes


def _template_key(uops: list[UOp], devices: list[str], nodes: dict[UOp, None]) -> UOp | None:
  """The node a callify result of `uops` is remembered under (`remember`): the target, or for
  several targets on one device (a training step: the loss and the optimizer's assigns) the
  SINK of them that closes their toposort `nodes`; None for targets on several devices."""
  if len(uops) == 1: return uops[0]
  if any(d != devices[0] for d in devices) or not isinstance(devices[0], str): return None
  return next(reversed(nodes))


@dataclass
class Runner:
  """A compiled kernel ready to launch on one device."""
  name: str
  program: Program
  estimates: Estimates
  global_size: tuple[int, ...] = (1,)
  local_size: tuple[int, ...] | None = None  # work items per work group (GPU targets)


_runners: dict[tuple[UOp, str, int, bool, str, bool], Runner] = {}
_compiled_ahead: set[tuple[UOp, str, int, bool, str, bool]] = set()  # (schedule, device, ...)


def forget_programs() -> None:
  """Drop this process's compiled programs and the command buffers made of them (what a new
  process starts without): the next run compiles again, from the disk cache where it can."""
  _runners.clear()
  _compiled_ahead.clear()
  _batched.clear()


def _codegen(kernel: UOp, ren: Renderer) -> compcache.KernelSource:
  """Run the codegen pipeline on a kernel AST: its source, work estimates and launch size."""
  linear, trace = traced_call("kernel", full_rewrite, kernel, ren)
  name = linear.arg.name if linear.arg is not None else "kernel"
  ks = compcache.KernelSource(name, ren.render(name, linear), estimate(linear),
                              *launch_dims(linear))
  if trace is not None:
    trace.name = name
    trace.info.update(src=ks.src, device=ren.device, graph=linear,
                      opts=list(getattr(linear.arg, "applied_opts", ())))
  return ks


def _load(dev: Compiled, ks: compcache.KernelSource) -> Program:
  """The loaded program for `ks`; a cached binary the loader rejects is rebuilt and rewritten."""
  if dev.compiler is None: return dev.runtime(ks.name, ks.src.encode())
  try: return dev.runtime(ks.name, dev.compiler.compile_cached(ks.src))
  except OSError as e:
    if DEBUG >= 1: print(f"loading {ks.name} failed ({e}), recompiling")
    return dev.runtime(ks.name, dev.compiler.compile_cached(ks.src, refresh=True))


def _settings() -> tuple[int, bool, str, bool]:
  """The knobs that choose a kernel's code (part of each runner's key), read again only after a
  knob was set (every run asks: the four reads took 0.6 us)."""
  global _read_settings
  gen, settings = _read_settings
  if gen != knobs.generation:
    settings = (int(BEAM), bool(NOOPT), str(MARCH), bool(CHECK_OOB))
    _read_settings = (knobs.generation, settings)
  return settings


_read_settings: tuple[int, tuple[int, bool, str, bool]] = (-1, (0, False, "", False))


def _runner_key(kernel: UOp, device: str) -> tuple[UOp, str, int, bool, str, bool]:
  return (kernel, device, *_settings())


def _kernel_source(kernel: UOp, device: str) -> compcache.KernelSource:
  """The rendered kernel, from the disk cache when another process produced it."""
  ren = Device[device].renderer
  if DEBUG >= 3: print(f"kernel AST:\n{kernel!r}")
  threads = cpu_threads() if ren.has_threads else 1
  if BEAM >= 1 and IGNORE_BEAM_CACHE: ks = _codegen(kernel, ren)  # a fresh search, not the cache's
  else: ks = compcache.cached_kernel(kernel, device, ren, threads, lambda: _codegen(kernel, ren))
  if DEBUG >= 4: print(ks.src)
  return ks


def _add_runner(key: tuple, ks: compcache.KernelSource, program: Program) -> Runner:
  r = _runners[key] = Runner(ks.name, program, ks.estimates, ks.global_size, ks.local_size)
  GlobalCounters.programs_compiled += 1
  return r


def get_runner(kernel: UOp, device: str) -> Runner:
  """The compiled program for a kernel AST on a device (compiled once per optimizer setting:
  BEAM, NOOPT, the target ISA and CHECK_OOB choose different code for the same kernel). Codegen
  results come from the disk cache when another process produced them (engine/compcache.py)."""
  key = _runner_key(kernel, device)
  if (r := _runners.get(key)) is not None: return r
  if kernel.op is Ops.COLLECTIVE:  # an MPI call, launched like a kernel (runtime/collective.py)
    prog = collective_program(kernel, device)
    r = _runners[key] = Runner(kernel.arg.kind, prog, Estimates(0, prog.nbytes))
    return r
  t0 = time.perf_counter()
  dev = Device[device]
  ks = _kernel_source(kernel, device)
  t1 = time.perf_counter()
  r = _add_runner(key, ks, _load(dev, ks))
  if PROFILE:
    profile.record(f"codegen {ks.name}", "codegen", device, t0, t1)
    profile.record(f"compile {ks.name}", "compile", device, t1)
  if DEBUG >= 1:
    codegen_ms, compile_ms = (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3
    print(f"compiled {ks.name} for {device}: codegen {codegen_ms:.2f} ms, "
          f"compile {compile_ms:.2f} ms")
  return r


def compile_ahead(kernels: list[UOp], device: str) -> None:
  """Make the runners `get_runner` would make for the kernels that have none yet, the compiler
  running on every core at once where the device's compiler allows it (a first call of a model
  compiles tens of kernels: one after another they took twice as long on two cores). Codegen
  stays on this thread (Python); a compile error is raised here, as get_runner raises it."""
  comp = Device[device].compiler
  if comp is None or not comp.compiles_in_parallel or cpu_threads() < 2: return
  todo = [k for k in dict.fromkeys(kernels)
          if _runner_key(k, device) not in _runners and k.op is not Ops.COLLECTIVE]
  if len(todo) < 2: return
  t0 = time.perf_counter()
  sources = [_kernel_source(k, device) for k in todo]
  t1 = time.perf_counter()
  with ThreadPoolExecutor(min(cpu_threads(), len(sources))) as pool:
    libs = list(pool.map(lambda ks: comp.compile_cached(ks.src), sources))
  for k, ks, lib in zip(todo, sources, libs):
    try: program = Device[device].runtime(ks.name, lib)
    except OSError: program = _load(Device[device], ks)  # a cached binary the loader rejects
    _add_runner(_runner_key(k, device), ks, program)
  if PROFILE:
    profile.record(f"codegen {len(todo)} kernels", "codegen", device, t0, t1)
    profile.record(f"compile {len(todo)} kernels", "compile", device, t1)
  if DEBUG >= 1:
    print(f"compiled {len(todo)} kernels for {device}: codegen {(t1 - t0) * 1e3:.2f} ms, "
          f"compile {(time.perf_counter() - t1) * 1e3:.2f} ms on {cpu_threads()} threads")


def count_launch(runner: Runner, device: str, t: float | None) -> None:
  est = runner.estimates
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += est.flops
  GlobalCounters.global_mem += est.mem_bytes
  if t is not None: GlobalCounters.time_sum_s += t
  if t is not None and DEBUG >= 2:
    rate = ""
    if t > 0: rate = f"{est.flops / t * 1e-9:8.2f} GFLOPS {est.mem_bytes / t * 1e-9:8.2f} GB/s"
    print(f"*** {device:8s} {GlobalCounters.kernel_count:4d} {runner.name:30s} "
          f"{t * 1e6:10.2f} us {rate}")


@dataclass(frozen=True)
class Launch:
  """One CALL of a schedule: the kernel, its buffers' slots, its device (None: the first
  argument's) and the names of its symbolic variables in kernel-argument order (their values
  come from the run's `var_vals`)."""
  kernel: UOp
  slots: tuple[int, ...]
  device: str | None
  variables: tuple[str, ...] = ()


def kernel_variables(kernel: UOp) -> tuple[str, ...]:
  """The names of a kernel's variables in argument order (their slots, see finalize_kernel)."""
  if kernel.op is Ops.COPY: return ()
  found = {u.arg.slot: u.arg.name for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.name}
  return tuple(found[i] for i in sorted(found))


@dataclass(frozen=True)
class Placement:
  """Where an intermediate lives: in the arena of `device` (None: the first argument's) at
  `offset` bytes, `size` elements of `dtype`."""
  device: str | None
  offset: int
  size: int
  dtype: DType


@dataclass(frozen=True)
class LaunchPlan:
  """What running a schedule needs, derived once per (schedule, number of arguments): the
  launches, and the memory plan of the intermediates (one arena per device)."""
  launches: tuple[Launch, ...]
  inter: dict[int, Placement]  # intermediate slot -> its place
  arenas: dict[str | None, int]  # device -> arena bytes

  @property
  def inter_bytes(self) -> int:
    """What the intermediates would take without sharing memory."""
    return sum(p.size * p.dtype.itemsize for p in self.inter.values())


_plans: dict[tuple[UOp, int], LaunchPlan] = {}


def launch_plan(linear: UOp, nargs: int) -> LaunchPlan:
  """The launches of `linear` when slots below `nargs` are arguments (cached); intermediates
  are placed by lifetime (schedule/memory.py), per device."""
  if (plan := _plans.get((linear, nargs))) is not None: return plan
  launches: list[Launch] = []
  uses: dict[int, list[int]] = {}  # intermediate slot -> [first, last] launch
  kinds: dict[int, tuple[str | None, int, DType]] = {}
  for i, call in enumerate(linear.src):
    params = call.src[1:]
    device = next((p.arg.device for p in params if p.arg.device is not None), None)
    device = None if device is None else Device.canonicalize(device)
    launches.append(Launch(call.src[0], tuple(p.arg.slot for p in params), device,
                           kernel_variables(call.src[0])))
    for p in params:
      if p.arg.slot < nargs: continue
      uses.setdefault(p.arg.slot, [i, i])[1] = i
      kinds.setdefault(p.arg.slot, (device, p.shape[0], p.dtype))
  inter: dict[int, Placement] = {}
  arenas: dict[str | None, int] = {}
  for dev in dict.fromkeys(d for d, _, _ in kinds.values()):
    slots = [s for s, k in kinds.items() if k[0] == dev]
    mem = plan_memory([Lifetime(uses[s][0], uses[s][1], kinds[s][1] * kinds[s][2].itemsize)
                       for s in slots])
    for s, off in zip(slots, mem.offsets): inter[s] = Placement(dev, off, kinds[s][1], kinds[s][2])
    arenas[dev] = mem.size
  return bounded_put(_plans, (linear, nargs), LaunchPlan(tuple(launches), inter, arenas),
                     4 * SCHEDULE_CACHE_SIZE)


@dataclass
class CapturedLaunch:
  """A launch as a capture saw it: the program (None: a COPY from bufs[1] into bufs[0]), its
  buffers, device and symbolic variables (names, in kernel-argument order)."""
  runner: Runner | None
  bufs: list[Buffer]
  device: str
  variables: tuple[str, ...] = ()


class Capture:
  """What a TinyJit capture records of the runs inside it (engine/jit.py reads it): each
  launch, which buffers are intermediates (arena views), the buffers whose contents a replay
  must refill first, the variable values the runs used, the buffers its assigns write and the
  lazy values made before it (the frontend's writes read these two)."""

  def __init__(self) -> None:
    self.launches: list[CapturedLaunch] = []
    self.intermediates: dict[Buffer, None] = {}
    self.refills: list[tuple[Buffer, Callable[[], bytes]]] = []
    self.var_vals: dict[str, int] = {}
    self.written: dict[UOp, None] = {}  # the buffers the captured assigns write (frontend/writes)
    self.before: dict[UOp, None] = {}  # the lazy values that were live when the capture began


class CaptureStack(threading.local):
  """The calling thread's active capture (at most one): a capture records only its own thread's
  launches, and another thread may realize and read values meanwhile."""

  def __init__(self) -> None: self.stack: list[Capture] = []
  def __bool__(self) -> bool: return bool(self.stack)
  def __getitem__(self, i: int) -> Capture: return self.stack[i]
  def append(self, cap: Capture) -> None: self.stack.append(cap)
  def pop(self) -> Capture: return self.stack.pop()


capturing = CaptureStack()


class CaptureError(RuntimeError):
  """Something happened inside a TinyJit capture that a replay could not repeat."""


def launch_values(variables: tuple[str, ...], var_vals: dict[str, int], name: str) -> list[int]:
  """The values of a kernel's variables, in its argument order."""
  try: return [var_vals[v] for v in variables]
  except KeyError as e:
    raise UnboundVariableError(f"kernel {name} needs a value for the variable {e.args[0]!r}; the "
                               f"run binds {sorted(var_vals)}") from None


def _slot_buffers(plan: LaunchPlan, args: tuple[UOp, ...], fallback: str) -> list[Buffer]:
  """The Buffer of every slot of a run, allocated: the arguments', then the intermediates'
  (views of one fresh arena per device)."""
  bufs = [buffer_of(a).ensure_allocated() for a in args]
  if not plan.inter: return bufs
  arenas = {d: Buffer(d or fallback, n, dtypes.uint8) for d, n in plan.arenas.items()}
  # holes for the intermediates' slots, all filled below: mypy cannot see it
  bufs += [None] * (max(plan.inter) + 1 - len(bufs))  # type: ignore[list-item]
  for s, p in plan.inter.items():
    bufs[s] = arenas[p.device].view(p.offset, p.size, p.dtype).ensure_allocated()
  return bufs


class BatchedRun:
  """A schedule's launches on one device as one native command buffer (`Compiled.batch`), kept
  for every later run of the schedule: a run points the arguments whose memory moved (new output
  buffers; a fresh arena is mostly the same memory again) and makes one native call, with no
  Python and no GIL between kernels (an eager MiniLM forward spent 1.2 ms launching 123)."""

  def __init__(self, batch: Batch, plan: LaunchPlan, runners: list[Runner],
               slot_bufs: list[Buffer]) -> None:
    self.batch, self.plan, self.runners = batch, plan, runners
    self.uses: dict[int, list[tuple[int, int]]] = {}  # slot -> (launch, argument) reading it
    for i, launch in enumerate(plan.launches):
      for j, slot in enumerate(launch.slots): self.uses.setdefault(slot, []).append((i, j))
    # the launches that take variables' values: set at every run, after their buffers
    self.valued = [(i, launch) for i, launch in enumerate(plan.launches) if launch.variables]
    self.addresses = {slot: slot_bufs[slot].address() for slot in self.uses}
    self.flops = sum(r.estimates.flops for r in runners)
    self.mem_bytes = sum(r.estimates.mem_bytes for r in runners)

  def point(self, slot: int, address: int) -> None:
    """Slot `slot` is at `address` for the next run."""
    if self.addresses.get(slot) == address: return
    for launch, arg in self.uses.get(slot, ()): self.batch.set_arg(launch, arg, address)
    self.addresses[slot] = address

  def run(self, args: tuple[UOp, ...], var_vals: dict[str, int], fallback: str) -> None:
    plan = self.plan
    bufs = [buffer_of(a) for a in args]  # held until the batch has run
    addresses, point = self.addresses, self.point
    for slot, buf in enumerate(bufs):  # point's check inlined: most arguments did not move
      if (address := buf._address) is None: address = buf.address()
      if addresses.get(slot) != address: point(slot, address)
    if plan.arenas:
      arenas = {d: Buffer(d or fallback, n, dtypes.uint8) for d, n in plan.arenas.items()}
      for slot, p in plan.inter.items(): point(slot, arenas[p.device].address() + p.offset)
    for i, launch in self.valued:
      values = launch_values(launch.variables, var_vals, self.runners[i].name)
      for k, v in enumerate(values): self.batch.set_arg(i, len(launch.slots) + k, v)
    self.batch()
    GlobalCounters.kernel_count += len(self.runners)
    GlobalCounters.global_ops += self.flops
    GlobalCounters.global_mem += self.mem_bytes


_batched: dict[tuple, BatchedRun | None] = {}  # (schedule, nargs, device, settings) -> its batch


def batched_run(linear: UOp, args: tuple[UOp, ...], plan: LaunchPlan, fallback: str,
                settings: tuple, var_vals: dict[str, int]) -> BatchedRun | None:
  """The command buffer of a schedule whose launches are all kernels on one device that has
  them (made on its first run), else None."""
  key = (linear, len(args), fallback, *settings)
  made: BatchedRun | None | Literal[False] = _batched.get(key, False)
  if made is not False: return made
  devices = {launch.device or fallback for launch in plan.launches}
  if len(devices) != 1 or any(launch.kernel.op is Ops.COPY for launch in plan.launches):
    _batched[key] = None
    return None
  device = devices.pop()
  slot_bufs = _slot_buffers(plan, args, fallback)
  runners = [get_runner(launch.kernel, device) for launch in plan.launches]
  items = [(r.program, [slot_bufs[s] for s in launch.slots], r.global_size,
            launch_values(launch.variables, var_vals, r.name))
           for r, launch in zip(runners, plan.launches)]
  batch = Device[device].batch(items)
  run = None if batch is None else BatchedRun(batch, plan, runners, slot_bufs)
  return bounded_put(_batched, key, run, 4 * SCHEDULE_CACHE_SIZE)


def run_linear(linear: UOp, args: tuple[UOp, ...], var_vals: dict[str, int] | None = None) -> None:
  """Launch every CALL of a schedule; intermediates live in one arena per device. `var_vals`
  (name -> value) gives each kernel's symbolic variables their values for this run. Outside a
  TinyJit capture and per-kernel timing (DEBUG>=2, PROFILE), a schedule on a device with native
  command buffers runs as one (`BatchedRun`)."""
  var_vals = var_vals or {}
  fallback = Device.canonicalize(args[0].arg.device if args else Device.DEFAULT)
  settings = _settings()  # read once: a run's launches all use the same
  # the command buffer made at an earlier run (it was compiled ahead then)
  if (run := _batched.get((linear, len(args), fallback, *settings))) is not None and \
      not capturing and not (DEBUG >= 2 or PROFILE):
    run.run(args, var_vals, fallback)
    return
  plan = launch_plan(linear, len(args))
  if (ahead := (linear, fallback, *settings)) not in _compiled_ahead:
    for dev in dict.fromkeys(launch.device or fallback for launch in plan.launches):
      compile_ahead([launch.kernel for launch in plan.launches if launch.kernel.op is not Ops.COPY
                     and (launch.device or fallback) == dev], dev)
    if len(_compiled_ahead) >= 4 * SCHEDULE_CACHE_SIZE: _compiled_ahead.clear()
    _compiled_ahead.add(ahead)
  if plan.launches and not capturing and not (DEBUG >= 2 or PROFILE) and \
      (run := batched_run(linear, args, plan, fallback, settings, var_vals)) is not None:
    run.run(args, var_vals, fallback)
    return
  slot_bufs = _slot_buffers(plan, args, fallback)
  capture = capturing[-1] if capturing else None
  if capture is not None:
    capture.intermediates.update(dict.fromkeys(slot_bufs[s] for s in plan.inter))
  prof = bool(PROFILE)
  wait = DEBUG >= 2 or prof
  for launch in plan.launches:
    device = launch.device or fallback
    bufs = [slot_bufs[s] for s in launch.slots]
    st = time.perf_counter() if prof else 0.0
    if launch.kernel.op is Ops.COPY:
      bufs[0].copyin(bufs[1].copyout())
      if prof: record_copy(bufs[1], bufs[0], st)
      if capture is not None: capture.launches.append(CapturedLaunch(None, bufs, device))
      if DEBUG >= 2: print(f"*** COPY {bufs[1].device} -> {bufs[0].device} {bufs[0].nbytes} bytes")
      continue
    runner = _runners.get((launch.kernel, device, *settings)) or get_runner(launch.kernel, device)
    vals = launch_values(launch.variables, var_vals, runner.name) if launch.variables else ()
    if prof: st = time.perf_counter()
    t = runner.program(*bufs, global_size=runner.global_size, local_size=runner.local_size,
                       vals=vals, wait=wait)
    if prof: record_launch(runner, device, st, t)
    if capture is not None:
      capture.launches.append(CapturedLaunch(runner, bufs, device, launch.variables))
      capture.var_vals.update(var_vals)
    count_launch(runner, device, t)


def record_launch(runner: Runner, device: str, start: float, t: float | None) -> None:
  """A kernel launch for the profiler (its device time `t` when it reported one)."""
  est = runner.estimates
  profile.record(runner.name, "kernel", device, start, seconds=t, flops=est.flops,
                 mem_bytes=est.mem_bytes)


def record_copy(src: Buffer, dst: Buffer, start: float) -> None:
  """A buffer copy between devices for the profiler."""
  profile.record(f"COPY {src.device} -> {dst.device}", "copy", dst.device, start,
                 mem_bytes=dst.nbytes)
