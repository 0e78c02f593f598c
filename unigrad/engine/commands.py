"""The command buffer: the spec's LINEAR of CALLs with its memory plan, the one form in which
the engine holds work to run.

A `CommandBuffer` holds
- `linear`: LINEAR(CALL(what, PARAM...)...), each CALL running a kernel AST or a COPY between
  devices (a collective would be one more kind of entry) on the buffers its PARAMs name by slot;
- `nargs`: slots below it are the run's arguments (buffers given at each run), the others are
  intermediates, made for the run;
- `entries`: each CALL as an `Entry` (what it runs, its slots, its device, its symbolic
  variables' names in argument order);
- the memory plan of the intermediates: each one's place in one arena per device, by lifetime
  (schedule/memory.py).
Who builds it: `command_buffer(linear, nargs)` (cached per LINEAR), called by the realize path
(engine/entry.py: eager `realize` and `Tensor.schedule()` share it), by TinyJit, which joins the
runs of a capture into one (`join_runs`, engine/jit.py), and by the C export (export/lower.py).
Who runs it: engine/execute.py, for every one of them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unigrad.dtype import DType, dtypes
from unigrad.helpers import bounded_put
from unigrad.runtime.device import Buffer, Device
from unigrad.schedule.memory import Lifetime, plan_memory
from unigrad.uop import Ops, ParamArg, UOp
from unigrad.uop.uop import shape_uop
from unigrad.uop.variable import UnboundVariableError

__all__ = ["Entry", "Placement", "CommandBuffer", "command_buffer", "kernel_variables",
           "launch_values", "join_runs", "COMMANDS_CACHE_SIZE"]

COMMANDS_CACHE_SIZE = 1024


@dataclass(frozen=True)
class Entry:
  """One CALL: the kernel AST or COPY it runs, its buffers' slots, its device (None: the first
  argument's) and the names of its symbolic variables in kernel-argument order (their values
  come from the run's `var_vals`)."""
  ast: UOp
  slots: tuple[int, ...]
  device: str | None
  variables: tuple[str, ...] = ()

  @property
  def is_copy(self) -> bool: return self.ast.op is Ops.COPY


@dataclass(frozen=True)
class Placement:
  """Where an intermediate lives: in the arena of `device` (None: the first argument's) at
  `offset` bytes, `size` elements of `dtype`."""
  device: str | None
  offset: int
  size: int
  dtype: DType


@dataclass(frozen=True, eq=False)
class CommandBuffer:
  """See the module docstring (compared and hashed by identity: one per LINEAR and nargs)."""
  linear: UOp
  nargs: int
  entries: tuple[Entry, ...]
  inter: dict[int, Placement]  # intermediate slot -> its place
  arenas: dict[str | None, int]  # device -> arena bytes

  @property
  def inter_bytes(self) -> int:
    """What the intermediates would take without sharing memory."""
    return sum(p.size * p.dtype.itemsize for p in self.inter.values())

  @property
  def nslots(self) -> int: return max([self.nargs - 1, *self.inter]) + 1


def kernel_variables(kernel: UOp) -> tuple[str, ...]:
  """The names of a kernel's variables in argument order (their slots, see finalize_kernel)."""
  if kernel.op is Ops.COPY: return ()
  found = {u.arg.slot: u.arg.name for u in kernel.toposort() if u.op is Ops.PARAM and u.arg.name}
  return tuple(found[i] for i in sorted(found))


def launch_values(variables: tuple[str, ...], var_vals: dict[str, int], name: str) -> list[int]:
  """The values of a kernel's variables, in its argument order."""
  try: return [var_vals[v] for v in variables]
  except KeyError as e:
    raise UnboundVariableError(f"kernel {name} needs a value for the variable {e.args[0]!r}; the "
                               f"run binds {sorted(var_vals)}") from None


_built: dict[tuple[UOp, int], CommandBuffer] = {}


def command_buffer(linear: UOp, nargs: int) -> CommandBuffer:
  """The command buffer of `linear` when slots below `nargs` are arguments (cached)."""
  if (cb := _built.get((linear, nargs))) is not None: return cb
  entries: list[Entry] = []
  uses: dict[int, list[int]] = {}  # intermediate slot -> [first, last] entry
  kinds: dict[int, tuple[str | None, int, DType]] = {}
  for i, call in enumerate(linear.src):
    params = call.src[1:]
    device = next((p.arg.device for p in params if p.arg.device is not None), None)
    device = None if device is None else Device.canonicalize(device)
    entries.append(Entry(call.src[0], tuple(p.arg.slot for p in params), device,
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
  cb = CommandBuffer(linear, nargs, tuple(entries), inter, arenas)
  return bounded_put(_built, (linear, nargs), cb, COMMANDS_CACHE_SIZE)


def _param(slot: int, buf: Buffer) -> UOp:
  return UOp(Ops.PARAM, buf.dtype, (shape_uop((buf.size,)),), ParamArg(slot, buf.dtype,
                                                                        buf.device))


def join_runs(runs: Sequence[tuple[CommandBuffer, Sequence[Buffer]]],
              intermediates: dict[Buffer, None]) -> tuple[CommandBuffer, list[Buffer]]:
  """One command buffer running `runs` (each: a command buffer and the Buffer of each of its
  slots) one after another. Every distinct Buffer becomes a
  slot: those in `intermediates` (each run's arena views, dead after it) become intermediates,
  placed again over the whole; the others become arguments, in order of first use. Returns the
  command buffer and its arguments' Buffers."""
  slot_of: dict[Buffer, int] = {}
  args: list[Buffer] = []
  for cb, bufs in runs:
    for e in cb.entries:
      for s in e.slots:
        if (b := bufs[s]) not in slot_of and b not in intermediates:
          slot_of[b] = len(args)
          args.append(b)
  for cb, bufs in runs:
    for e in cb.entries:
      for s in e.slots:
        if (b := bufs[s]) not in slot_of: slot_of[b] = len(slot_of)
  # each PARAM names its buffer's device
  calls = [UOp(Ops.CALL, dtypes.void, (e.ast, *(_param(slot_of[bufs[s]], bufs[s])
                                                for s in e.slots)))
           for cb, bufs in runs for e in cb.entries]
  return command_buffer(UOp(Ops.LINEAR, dtypes.void, tuple(calls)), len(args)), args
