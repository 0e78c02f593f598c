"""The program cache: each kernel AST compiled once per device and setting, loaded and ready.

`get_runner(kernel, device)` runs the codegen pipeline to its PROGRAM(LINEAR, SOURCE, BINARY)
(codegen/pipeline.py), with the device's renderer and compiler, and loads the binary with the
device's Program class. The rendered half comes from the disk cache when another process made it
(engine/compcache.py); the compiler keeps the binaries on disk. Kernels are keyed by their AST
(hash-consing makes equal kernels the same node) and the knobs that choose their code (BEAM,
NOOPT, MARCH, CHECK_OOB). `compile_ahead` makes the runners of a schedule's new kernels together,
compiling on every core. One `ProgramCache` per process (`programs`), kept until
`forget_programs()` (engine/execute.py: a test's "new process").
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from unigrad import knobs
from unigrad.codegen.linearize import Estimates
from unigrad.codegen.pipeline import to_compiled, to_rendered
from unigrad.codegen.program import ProgramInfo, program_binary
from unigrad.engine import compcache, profile
from unigrad.helpers import GlobalCounters, cpu_threads
from unigrad.knobs import (BEAM, CHECK_OOB, DEBUG, IGNORE_BEAM_CACHE, MARCH, NOOPT, PREFETCH,
                           PROFILE)
from unigrad.renderer import Renderer
from unigrad.runtime.collective import collective_program
from unigrad.runtime.device import Device, Program
from unigrad.uop import Ops, UOp
from unigrad.uop.upat import traced_call

__all__ = ["Runner", "ProgramCache", "programs", "get_runner", "compile_ahead", "settings",
           "renderer_for", "compile_progress", "PROGRESS_AFTER_S"]

# the knobs that choose a kernel's code: BEAM, NOOPT, MARCH, CHECK_OOB, PREFETCH
Settings = tuple[int, bool, str, bool, int]


@dataclass
class Runner:
  """A program ready to launch on one device: its info (name, device, estimates, launch size),
  the loaded program, and the PROGRAM(LINEAR, SOURCE, BINARY) codegen built it from (None for a
  program no codegen made: a collective's, runtime/collective.py)."""
  info: ProgramInfo
  program: Program
  program_uop: UOp | None = None

  @property
  def name(self) -> str: return self.info.name
  @property
  def estimates(self) -> Estimates: return self.info.estimates
  @property
  def global_size(self) -> tuple[int, ...]: return self.info.global_size
  @property
  def local_size(self) -> tuple[int, ...] | None: return self.info.local_size
  @property
  def src(self) -> str: return "" if self.program_uop is None else self.program_uop.src[1].arg


Key = tuple[UOp, str, int, bool, str, bool, int]  # (kernel, device, *settings)


class ProgramCache:
  """Loaded programs by (kernel, device, settings); see the module docstring."""

  def __init__(self) -> None:
    self.runners: dict[Key, Runner] = {}
    self._settings: tuple[int, Settings] = (-1, (0, False, "", False, 0))

  def settings(self) -> Settings:
    """The knobs that choose a kernel's code, read again only after a knob was set (every run
    asks: the five reads took under 1 us)."""
    gen, values = self._settings
    if gen != knobs.generation:
      values = (int(BEAM), bool(NOOPT), str(MARCH), bool(CHECK_OOB), int(PREFETCH))
      self._settings = (knobs.generation, values)
    return values

  def key(self, kernel: UOp, device: str) -> Key: return (kernel, device, *self.settings())

  def forget(self) -> None: self.runners.clear()


programs = ProgramCache()


def settings() -> Settings: return programs.settings()


def renderer_for(device: str) -> Renderer:
  """The renderer of `device`'s kernels: the device owns it."""
  return Device[device].renderer


PROGRESS_AFTER_S = 2.0


class CompileProgress:
  """The new kernels of one run being generated: once PROGRESS_AFTER_S seconds have passed, a
  line on stderr says how many are done (rewritten in place on a terminal; elsewhere one line
  when they are all done), so a long first call does not look like a hang."""

  def __init__(self, total: int, device: str) -> None:
    self.total, self.device, self.done = total, device, 0
    self.t0 = self.shown = time.perf_counter()
    self.tty = sys.stderr.isatty()
    self.printed = False

  def tick(self) -> None:
    self.done += 1
    now = time.perf_counter()
    if self.tty and now - self.t0 > PROGRESS_AFTER_S and now - self.shown > 0.25:
      self.shown, self.printed = now, True
      print(f"\rgenerating kernels for {self.device}: {self.done}/{self.total} "
            f"({now - self.t0:.1f} s)", end="", file=sys.stderr, flush=True)

  def close(self) -> None:
    if (took := time.perf_counter() - self.t0) > PROGRESS_AFTER_S:
      print(f"{chr(13) if self.printed else ''}compiled {self.done} kernels for {self.device} in "
            f"{took:.1f} s (later runs of the same shapes reuse them)", file=sys.stderr,
            flush=True)


_progress: list[CompileProgress] = []  # the active one (at most one: realize holds its lock)


@contextlib.contextmanager
def compile_progress(kernels: list[UOp], device: str) -> Iterator[None]:
  """Report progress while the kernels of `kernels` that have no runner yet are generated."""
  todo = sum(1 for k in dict.fromkeys(kernels) if k.op is not Ops.COLLECTIVE
             and programs.key(k, device) not in programs.runners)
  if not todo or _progress:
    yield
    return
  _progress.append(prog := CompileProgress(todo, device))
  try: yield
  finally:
    _progress.pop()
    prog.close()


def _rendered(kernel: UOp, device: str) -> UOp:
  """The kernel lowered and rendered (PROGRAM(LINEAR, SOURCE)), from the disk cache when another
  process made it."""
  ren = Device[device].renderer
  if DEBUG >= 3: print(f"kernel AST:\n{kernel!r}")
  if BEAM >= 1 and IGNORE_BEAM_CACHE: prog = _traced_render(kernel, device)  # a fresh search
  else: prog = compcache.cached_kernel(kernel, device, ren, ren.threads,
                                       lambda: _traced_render(kernel, device))
  if DEBUG >= 4: print(prog.src[1].arg)
  if _progress: _progress[-1].tick()
  return prog


def _traced_render(kernel: UOp, device: str) -> UOp:
  ren = Device[device].renderer
  prog, trace = traced_call("kernel", to_rendered, kernel, ren)
  if trace is not None:
    trace.name = prog.arg.name
    linear = prog.src[0]
    trace.info.update(src=prog.src[1].arg, device=ren.device, graph=linear,
                      opts=list(getattr(linear.arg, "applied_opts", ())))
  return prog


def _load(rendered: UOp, device: str, binary: bytes | None = None) -> Runner:
  """The loaded runner of a rendered PROGRAM; a cached binary the loader rejects is rebuilt."""
  dev = Device[device]
  prog = to_compiled(rendered, dev.renderer, binary)
  try: loaded = dev.runtime(prog.arg.name, prog.src[2].arg)
  except OSError as e:
    if DEBUG >= 1: print(f"loading {prog.arg.name} failed ({e}), recompiling")
    prog = to_compiled(rendered, dev.renderer, program_binary(rendered, refresh=True))
    loaded = dev.runtime(prog.arg.name, prog.src[2].arg)
  GlobalCounters.programs_compiled += 1
  return Runner(prog.arg, loaded, prog)


def get_runner(kernel: UOp, device: str) -> Runner:
  """The compiled program for a kernel AST on a device (see the module docstring)."""
  key = programs.key(kernel, device)
  if (r := programs.runners.get(key)) is not None: return r
  if kernel.op is Ops.COLLECTIVE:  # an MPI call, launched like a kernel (runtime/collective.py)
    prog = collective_program(kernel, device)
    r = programs.runners[key] = Runner(ProgramInfo(getattr(prog, "name", kernel.arg.kind), device,
                                                   Estimates(0, prog.nbytes)), prog)
    return r
  t0 = time.perf_counter()
  rendered = _rendered(kernel, device)
  t1 = time.perf_counter()
  r = programs.runners[key] = _load(rendered, device)
  _report(r.name, device, t0, t1)
  return r


def _report(what: str, device: str, t0: float, t1: float, threads: int = 1) -> None:
  """The profiler's events and the DEBUG line for kernels generated from t0 to t1 and compiled
  from t1 to now (on `threads` threads)."""
  if PROFILE:
    profile.record(f"codegen {what}", "codegen", device, t0, t1)
    profile.record(f"compile {what}", "compile", device, t1)
  if DEBUG >= 1:
    print(f"compiled {what} for {device}: codegen {(t1 - t0) * 1e3:.2f} ms, "
          f"compile {(time.perf_counter() - t1) * 1e3:.2f} ms"
          + (f" on {threads} threads" if threads > 1 else ""))


def compile_ahead(kernels: list[UOp], device: str) -> None:
  """Make the runners `get_runner` would make for the kernels that have none yet, the compiler
  running on every core at once where the device's compiler allows it (a first call of a model
  compiles tens of kernels: one after another they took twice as long on two cores). Codegen
  stays on this thread (Python); a compile error is raised here, as get_runner raises it."""
  comp = Device[device].compiler
  if comp is None or not comp.compiles_in_parallel or cpu_threads() < 2: return
  todo = [k for k in dict.fromkeys(kernels)
          if k.op is not Ops.COLLECTIVE and programs.key(k, device) not in programs.runners]
  if len(todo) < 2: return
  t0 = time.perf_counter()
  rendered = [_rendered(k, device) for k in todo]
  t1 = time.perf_counter()
  with ThreadPoolExecutor(min(cpu_threads(), len(rendered))) as pool:
    binaries = list(pool.map(program_binary, rendered))
  for k, prog, binary in zip(todo, rendered, binaries):
    programs.runners[programs.key(k, device)] = _load(prog, device, binary)
  _report(f"{len(todo)} kernels", device, t0, t1, cpu_threads())
