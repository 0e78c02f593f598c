"""Run a command buffer: eager realizes, TinyJit replays and the constant folding of the C export
all run their work here.

An `Executor` is a command buffer (engine/commands.py) bound to loaded programs on concrete
devices: each entry's runner (engine/programs.py; a schedule's new kernels compiled together
first), and its segments: runs of consecutive kernels on one device that has native command
buffers (`Compiled.batch`) become one native call with no Python and no GIL between kernels (an
eager MiniLM forward spent 1.2 ms launching 123 kernels one by one). Copies, and kernels on
devices without batches, run one by one. A run points the batches at the slots whose memory
moved (new output buffers; a fresh arena is mostly the same memory again) and sets the symbolic
variables' values. Executors are kept per (command buffer, fallback device, settings), bounded,
until `forget_programs()`.
At DEBUG>=2 or PROFILE every launch runs on its own, timed, printed and profiled. Inside a TinyJit
capture each run is recorded with its buffers (engine/capture.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from unigrad.dtype import dtypes
from unigrad.engine import profile
from unigrad.engine.capture import capturing
from unigrad.engine.commands import COMMANDS_CACHE_SIZE, CommandBuffer, launch_values
from unigrad.engine.programs import (Runner, compile_ahead, compile_progress, get_runner,
                                     programs)
from unigrad.helpers import GlobalCounters, bounded_put
from unigrad.knobs import DEBUG, PROFILE
from unigrad.runtime.collective import replay_programs
from unigrad.runtime.device import Batch, Buffer, Device
from unigrad.uop import Ops

__all__ = ["Executor", "executor", "run_commands", "forget_programs", "count_launch",
           "record_launch", "record_copy"]


@dataclass
class Segment:
  """Entries `start..stop` of an executor, run by one native batch (or one by one if None)."""
  start: int
  stop: int
  batch: Batch | None = None


class Executor:
  """See the module docstring."""

  def __init__(self, cb: CommandBuffer, fallback: str, replay: bool = False) -> None:
    """`replay`: a TinyJit capture's executor (its collectives run their replay programs)."""
    self.cb, self.fallback = cb, fallback
    self.devices = [e.device or fallback for e in cb.entries]
    self.runners: list[Runner | None] = []
    for dev in dict.fromkeys(self.devices):
      kernels = [e.ast for e, d in zip(cb.entries, self.devices) if d == dev and not e.is_copy]
      with compile_progress(kernels, dev):
        compile_ahead(kernels, dev)
        for k in kernels: get_runner(k, dev)
    self.runners = [None if e.is_copy else get_runner(e.ast, d)
                    for e, d in zip(cb.entries, self.devices)]
    if replay: self._replay_collectives()
    self.segments: list[Segment] | None = None  # made at the first untimed run
    self.value_args: list[tuple[Callable[[int, int, Any], None], int, int, str]] = []
    self.uses: dict[int, list[tuple[Batch, int, int]]] = {}  # slot -> (batch, launch, argument)
    self.addresses: dict[int, int] = {}  # slot -> the address its batches point at
    self.valued = [(i, e) for i, e in enumerate(cb.entries) if e.variables]
    self.kernels = sum(r is not None for r in self.runners)
    self.flops = sum(r.estimates.flops for r in self.runners if r is not None)
    self.mem_bytes = sum(r.estimates.mem_bytes for r in self.runners if r is not None)
    self.views_needed = True  # whether a run needs the intermediates as Buffers (no batch)
    # what the batches point at: the Buffers of the last run's arguments and its arenas
    self.last_args: list[Buffer] = []
    self.last_arenas: dict[str | None, Buffer] | None = None

  def _replay_collectives(self) -> None:
    """The collectives' runners get the programs a replay runs (runtime/collective.py)."""
    at = [i for i, e in enumerate(self.cb.entries) if e.ast.op is Ops.COLLECTIVE]
    runners = [r for i in at if (r := self.runners[i]) is not None]
    if not runners: return
    for i, r, prog in zip(at, runners, replay_programs([r.program for r in runners])):
      self.runners[i] = replace(r, program=prog)

  def arenas(self) -> dict[str | None, Buffer]:
    """Fresh memory for the intermediates: one arena per device."""
    return {d: Buffer(d or self.fallback, n, dtypes.uint8) for d, n in self.cb.arenas.items()}

  def slot_buffers(self, args: Sequence[Buffer], arenas: dict[str | None, Buffer]) -> list[Buffer]:
    """The Buffer of every slot: the arguments', then the intermediates' (arena views)."""
    bufs = [b.ensure_allocated() for b in args]
    if not self.cb.inter: return bufs
    # holes for the intermediates' slots, all filled below: mypy cannot see it
    bufs += [None] * (max(self.cb.inter) + 1 - len(bufs))  # type: ignore[list-item]
    for s, p in self.cb.inter.items():
      bufs[s] = arenas[p.device].view(p.offset, p.size, p.dtype).ensure_allocated()
    return bufs

  def run(self, args: Sequence[Buffer], var_vals: dict[str, int],
          arenas: dict[str | None, Buffer] | None = None) -> list[Buffer] | None:
    """Run every entry with `args` as the argument slots and the intermediates in `arenas`
    (fresh ones if None). Returns every slot's Buffer when the run made them (a capture records
    them), else None."""
    own = arenas is None
    if arenas is None: arenas = self.arenas()
    if DEBUG >= 2 or PROFILE or capturing or self.views_needed:
      self.last_args, self.last_arenas = [], None  # this run may point the batches elsewhere
      bufs = self.slot_buffers(args, arenas)
      if DEBUG >= 2 or PROFILE: self._run_timed(bufs, var_vals)
      else: self._run(bufs, var_vals)
      if capturing:
        capturing[-1].record(self.cb, bufs, var_vals)
        # the capture keeps the arena's views (their sizes) to the end; nothing reads them after
        # this run, so an arena made for it gives its memory back now
        if own:
          for arena in arenas.values(): arena.deallocate()
      return bufs
    last, addresses = self.last_args, self.addresses
    for slot, buf in enumerate(args):  # most arguments are the same Buffers as last run
      if slot < len(last) and buf is last[slot]: continue
      if (address := buf._address) is None: address = buf.ensure_allocated().address()
      if addresses.get(slot) != address: self._point(slot, address)
    self.last_args = list(args)
    if arenas is not self.last_arenas:  # a replay keeps its arena: pointed once
      base = {d: a.address() for d, a in arenas.items()}
      for slot, p in self.cb.inter.items():  # a fresh arena is mostly the same memory again
        if addresses.get(slot) != (address := base[p.device] + p.offset): self._point(slot, address)
      self.last_arenas = arenas
    self._run_segments(args, var_vals)
    return None

  def _run(self, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
    if self.segments is None: self._make_segments(bufs, var_vals)
    else:
      for slot, buf in enumerate(bufs):
        if slot in self.uses and self.addresses.get(slot) != (a := buf.address()):
          self._point(slot, a)
    self._run_segments(bufs, var_vals)

  def _run_segments(self, bufs: Sequence[Buffer], var_vals: dict[str, int]) -> None:
    assert self.segments is not None
    entries, runners = self.cb.entries, self.runners
    try:  # the variables' values of this run, into the batches' argument words
      for set_arg, launch, arg, name in self.value_args: set_arg(launch, arg, var_vals[name])
    except KeyError:  # the error naming the kernel and the variable
      for i, e in self.valued:
        launch_values(e.variables, var_vals, runners[i].name)  # type: ignore[union-attr]
      raise
    for seg in self.segments:
      if seg.batch is not None:
        seg.batch()
        continue
      for i in range(seg.start, seg.stop):
        e = entries[i]
        _launch(runners[i], [bufs[s] for s in e.slots], self._values(i, var_vals), False)
    GlobalCounters.kernel_count += self.kernels
    GlobalCounters.global_ops += self.flops
    GlobalCounters.global_mem += self.mem_bytes

  def _values(self, i: int, var_vals: dict[str, int]) -> list[int]:
    e, r = self.cb.entries[i], self.runners[i]
    return launch_values(e.variables, var_vals, r.name) if e.variables and r is not None else []

  def _segment_of(self, i: int) -> Segment:
    assert self.segments is not None
    return next(s for s in self.segments if s.start <= i < s.stop)

  def _make_segments(self, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
    """Runs of consecutive kernels on one device, each one native batch where the device has
    them (made with this run's buffers; later runs re-point them)."""
    segs: list[Segment] = []
    entries, runners, i = self.cb.entries, self.runners, 0
    while i < len(entries):
      j = i + 1
      if runners[i] is not None:
        while j < len(entries) and runners[j] is not None and self.devices[j] == self.devices[i]:
          j += 1
      batch = None
      if runners[i] is not None:
        items = [(r.program, [bufs[s] for s in entries[k].slots], r.global_size,
                  self._values(k, var_vals))
                 for k in range(i, j) if (r := runners[k]) is not None]
        batch = Device[self.devices[i]].batch(items)
      if batch is not None:
        for k in range(i, j):
          for arg, slot in enumerate(entries[k].slots):
            self.uses.setdefault(slot, []).append((batch, k - i, arg))
            self.addresses[slot] = bufs[slot].address()
      segs.append(Segment(i, j, batch))
      i = j
    self.segments = segs
    self.views_needed = not segs or any(s.batch is None for s in segs)
    # each variable argument of a batched launch: (its batch's set_arg, launch, argument, name)
    self.value_args = [(seg.batch.set_arg, i - seg.start, len(e.slots) + k, name)
                       for i, e in self.valued if (seg := self._segment_of(i)).batch is not None
                       for k, name in enumerate(e.variables)]

  def _point(self, slot: int, address: int) -> None:
    """Slot `slot` is at `address` for the next run."""
    for batch, launch, arg in self.uses.get(slot, ()): batch.set_arg(launch, arg, address)
    self.addresses[slot] = address

  def _run_timed(self, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
    """Each launch on its own, waited for, timed, printed and profiled."""
    prof = bool(PROFILE)
    for i, e in enumerate(self.cb.entries):
      lbufs = [bufs[s] for s in e.slots]
      st = time.perf_counter()
      t = _launch(self.runners[i], lbufs, self._values(i, var_vals), True)
      if (r := self.runners[i]) is None:
        if prof: record_copy(lbufs[1], lbufs[0], st)
        if DEBUG >= 2: print(f"*** COPY {lbufs[1].device} -> {lbufs[0].device} "
                             f"{lbufs[0].nbytes} bytes")
        continue
      if prof: record_launch(r, self.devices[i], st, t)
      count_launch(r, self.devices[i], t)


def _launch(runner: Runner | None, bufs: list[Buffer], vals: list[int], wait: bool
            ) -> float | None:
  """One entry: a kernel launch, or (runner None) a COPY from bufs[1] into bufs[0]."""
  if runner is None:
    st = time.perf_counter()
    bufs[0].copyin(bufs[1].copyout())
    return time.perf_counter() - st
  return runner.program(*bufs, global_size=runner.global_size, local_size=runner.local_size,
                        vals=vals, wait=wait)


_executors: dict[tuple, Executor] = {}  # (command buffer, fallback, settings) -> its executor


def executor(cb: CommandBuffer, fallback: str) -> Executor:
  """The executor of `cb` (made, and its kernels compiled, on first use)."""
  key = (cb, fallback, *programs.settings())
  if (ex := _executors.get(key)) is not None: return ex
  return bounded_put(_executors, key, Executor(cb, fallback), COMMANDS_CACHE_SIZE)


def run_commands(cb: CommandBuffer, args: Sequence[Buffer], var_vals: dict[str, int] | None = None,
                 fallback: str | None = None) -> None:
  """Run `cb` once with `args` in its argument slots (see the module docstring); `fallback` is
  the device of entries that name none (default: the first argument's)."""
  if fallback is None: fallback = Device.canonicalize(args[0].device if args else Device.DEFAULT)
  executor(cb, fallback).run(args, var_vals or {})


def forget_programs() -> None:
  """Drop this process's compiled programs and the executors made of them (what a new process
  starts without): the next run compiles again, from the disk cache where it can."""
  programs.forget()
  _executors.clear()


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


def record_launch(runner: Runner, device: str, start: float, t: float | None) -> None:
  """A kernel launch for the profiler (its device time `t` when it reported one)."""
  est = runner.estimates
  profile.record(runner.name, "kernel", device, start, seconds=t, flops=est.flops,
                 mem_bytes=est.mem_bytes)


def record_copy(src: Buffer, dst: Buffer, start: float) -> None:
  """A buffer copy between devices for the profiler."""
  profile.record(f"COPY {src.device} -> {dst.device}", "copy", dst.device, start,
                 mem_bytes=dst.nbytes)
