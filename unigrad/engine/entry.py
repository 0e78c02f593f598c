"""The engine's entry points: realize graph nodes into buffers, or give the command buffer that
realizing them would run.

`realize(uops, devices)` and `schedule(uops, devices)` share one path (`_prepare`): calls that
must run on their own are inlined and graphs on tuple devices lowered to one graph per device
(schedule/multi.py), then callify makes the function body over PARAMs and its arguments; the
body's schedule (the LINEAR of kernel CALLs) comes from the schedule cache (keyed by the body
node itself, as hash-consing makes equal programs the same node, with its number of arguments
and its device), else the disk cache (another process scheduled it: engine/compcache.py), else
the scheduler; `command_buffer` turns it into the command buffer (engine/commands.py).
`realize` then runs it (engine/execute.py) and returns the map from each realized node to the
buffer holding it; `schedule` returns its LINEAR with the real buffers as the arguments.
On a cache hit the work is one walk of the graph, the body rebuilt over PARAMs, and the run;
realizing the very same graph again (hash-consing rebuilds it while the previous result's
history holds it) does not walk it: callify's result is reused (`recallify`) with new output
buffers, and an eager step on new inputs alike the last is matched to it node by node
(`recallify_alike`): `Realizer` holds the graph realized last for both.
Symbolic variables: callify returns the bound values (`var_vals`, name -> int) beside the body,
which holds only the variables; each launch passes its kernel's variables' values as arguments.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from unigrad.dtype import dtypes
from unigrad.engine import compcache, profile
from unigrad.engine.buffers import buffer_of, realize_lock
from unigrad.engine.capture import CaptureError, capturing
from unigrad.engine.commands import command_buffer
from unigrad.engine.execute import run_commands
from unigrad.engine.recompiles import note_miss
from unigrad.helpers import bounded_put
from unigrad.knobs import DEBUG, PROFILE
from unigrad.runtime.device import Device
from unigrad.schedule import multi
from unigrad.schedule.callify import CallifyResult, callify, is_plain_buffer, recallify
from unigrad.schedule.callify import recallify_alike, remember
from unigrad.schedule.function import graph_nodes, has_function, inline_functions
from unigrad.schedule.function import resolvable_calls
from unigrad.schedule.schedule import create_schedule
from unigrad.uop import Ops, UOp
from unigrad.uop.upat import traced_call
from unigrad.uop.variable import concrete_shape

__all__ = ["realize", "schedule", "schedule_with_vars", "schedule_for", "copyout", "schedule_cache",
           "SCHEDULE_CACHE_SIZE"]

# (function body, number of arguments, device) -> its LINEAR (bounded; per process)
schedule_cache: dict[tuple[UOp, int, str], UOp] = {}
SCHEDULE_CACHE_SIZE = 256


def schedule_for(body: UOp, nargs: int, device: str) -> UOp:
  """The LINEAR for a function body: from this process's cache, else the disk cache, else the
  scheduler. The key holds `nargs` as the disk cache's does: the LINEAR numbers its
  intermediate buffers from `nargs` up, so the same body called with more arguments (a traced
  function's unused inputs) would read and write its intermediates in the new arguments."""
  key = (body, nargs, device)
  linear = schedule_cache.get(key)
  if linear is None:
    note_miss(body)
    t0 = time.perf_counter()
    hits = compcache.stats.schedule_hits
    linear = compcache.cached_schedule(body, nargs, device,
                                       lambda: _traced_schedule(body, nargs, device))
    bounded_put(schedule_cache, key, linear, SCHEDULE_CACHE_SIZE)
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


Finish = Callable[[dict[UOp, UOp]], dict[UOp, UOp]]  # realized targets -> the callers' targets


@dataclass
class Prepared:
  """What realizing some targets runs: callify's result (body, arguments, variable values, the
  buffer each target becomes), the device of the run, and how the callers' targets map to what
  was realized (`finish`)."""
  res: CallifyResult
  device: str
  finish: Finish


def _same(done: dict[UOp, UOp]) -> dict[UOp, UOp]: return done


class Realizer:
  """The graph realized last (its targets and toposort), held until the next realize: an eager
  loop's next step rebuilds what does not depend on new inputs (a weight's transpose, reshape or
  broadcast: about 500 of the 1,300 new nodes of a MiniLM forward) from the hash-cons cache; the
  very same graph again is found with its callify result (`recallify`), and a graph shaped like
  it (new inputs) is matched to it node by node (`recallify_alike`). What it pins is that
  graph's leaf buffers, until the next realize. One per process (`realizer`)."""

  def __init__(self) -> None:
    self.held: tuple[UOp, ...] = ()
    self.held_nodes: tuple[UOp, ...] = ()

  def release(self) -> None:
    """Hold nothing (the next realize starts without a template to match)."""
    self.held, self.held_nodes = (), ()

  def prepare(self, uops: list[UOp], devices: list[str]) -> Prepared:
    """The callify result for `uops` (see `Prepared`), by the fastest path that applies."""
    if len(uops) == 1 and (res := recallify(uops[0], devices[0])) is not None:  # the same graph
      if not (len(self.held) == 1 and self.held[0] is uops[0]): self.held_nodes = ()
      self.held = tuple(uops)
      return Prepared(res, devices[0], _same)
    nodes = graph_nodes(UOp(Ops.SINK, dtypes.void, tuple(uops)))  # calls' bodies left out
    key = _template_key(uops, devices, nodes)
    res = None
    if key is not None and self.held_nodes:  # an eager step on new inputs, alike the last
      last = self.held[0] if len(self.held) == 1 else self.held_nodes[-1]
      res = recallify_alike(nodes, devices[0], last, self.held_nodes)
    finish: Finish = _same
    device = devices[0]
    if res is None:
      targets, devs, finish, walked = _lowered(uops, devices, nodes)
      res = callify(targets, devs, walked)  # resolves the calls in its walk
      device = devs[0]
    if key is not None and finish is _same: remember(key, device, res)  # not lowered
    self.held, self.held_nodes = tuple(uops), tuple(nodes)
    return Prepared(res, device, finish)


realizer = Realizer()


def _lowered(uops: list[UOp], devices: list[str], nodes: dict[UOp, None]
             ) -> tuple[list[UOp], list[str], Finish, dict[UOp, None] | None]:
  """The targets callify takes for `uops`: calls that cannot be resolved in place (on tuple
  devices, or not resolvable) inlined, then graphs on tuple devices lowered to one graph per
  device; with how to map the realized results back to `uops`, and the toposort callify may
  reuse (None once the graph changed)."""
  steps: list[Finish] = []
  walked: dict[UOp, None] | None = nodes
  if has_function(nodes) and (multi.uses_tuple_devices(uops, devices, nodes) or
                              not resolvable_calls(nodes)):
    inlined = inline_functions(uops)
    steps.append(_through(uops, inlined))
    uops, walked = inlined, None
  if (plan := multi.lower_multi(uops, devices, walked)) is not None:
    steps.append(plan.finish)
    uops, devices, walked = plan.uops, plan.devices, None

  if not steps: return uops, devices, _same, walked

  def finish(done: dict[UOp, UOp]) -> dict[UOp, UOp]:
    for step in reversed(steps): done = step(done)
    return done
  return uops, devices, finish, walked


def _through(old: list[UOp], new: list[UOp]) -> Finish:
  """Map the realized `new` targets back to the `old` ones they replaced."""
  return lambda done: {**done, **{u: done[v] for u, v in zip(old, new) if v in done}}


def _template_key(uops: list[UOp], devices: list[str], nodes: dict[UOp, None]) -> UOp | None:
  """The node a callify result of `uops` is remembered under (`remember`): the target, or for
  several targets on one device (a training step: the loss and the optimizer's assigns) the
  SINK of them that closes their toposort `nodes`; None for targets on several devices."""
  if len(uops) == 1: return uops[0]
  if any(d != devices[0] for d in devices) or not isinstance(devices[0], str): return None
  return next(reversed(nodes))


def realize(uops: list[UOp], devices: list[str]) -> dict[UOp, UOp]:
  """Compute `uops` into buffers; returns node -> buffer view for every realized node."""
  with realize_lock:
    p = realizer.prepare(uops, devices)
    res = p.res
    cb = command_buffer(schedule_for(res.body, len(res.bufs), p.device), len(res.bufs))
    args = [buffer_of(a) for a in res.bufs]  # held until the run is done
    fallback = Device.canonicalize(res.bufs[0].arg.device if res.bufs else Device.DEFAULT)
    run_commands(cb, args, res.var_vals, fallback)
    return p.finish(res.becomes)


def schedule(uops: list[UOp], devices: list[str]) -> UOp:
  """The LINEAR of kernel CALLs that realizing `uops` would run, with the real buffers as args."""
  return schedule_with_vars(uops, devices)[0]


def schedule_with_vars(uops: list[UOp], devices: list[str]) -> tuple[UOp, dict[str, int]]:
  """`schedule`, and the values of the bound variables its kernels read (name -> int)."""
  with realize_lock:
    p = realizer.prepare(uops, devices)
    res = p.res
    linear = schedule_for(res.body, len(res.bufs), p.device)
    sub = {prm: res.bufs[prm.arg.slot] for c in linear.src for prm in c.src[1:]
           if prm.arg.slot < len(res.bufs)}
    calls = tuple(c.replace(src=(c.src[0], *(sub.get(prm, prm) for prm in c.src[1:])))
                  for c in linear.src)
    return UOp(Ops.LINEAR, linear.dtype, calls), dict(res.var_vals)


def copyout(u: UOp) -> memoryview:
  """The bytes of a realized node (a node on tuple devices: gathered onto the first device)."""
  if capturing:
    raise CaptureError("a TinyJit function read tensor values (item, tolist, numpy) while it was "
                       "being captured: a replay runs no Python code, so nothing may depend on "
                       "them; return the tensor from the function and read it outside")
  with realize_lock:
    if isinstance(u.device, tuple):
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
