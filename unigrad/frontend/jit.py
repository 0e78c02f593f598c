"""TinyJit: run a function on Tensors once eagerly, capture its kernels on the second call, and
replay them afterwards with the new inputs' buffers.

A replay runs none of the function's Python code: no graph building, scheduling or compiling,
only the captured launches (one native call per device where the device batches them, see
engine/jit.py). What a replay does and does not repeat:
- Inputs: every Tensor in the arguments (lists, tuples and dicts are walked) is realized first;
  the replay swaps its buffer in for the one the capture saw. An input is a value: the function
  sees its buffer, not the graph that computed it (autograd inside does not reach through a
  gathered `X[idx]` to X).
- Tensors from outside the function (weights, globals, closures) are bound at capture: the
  replay reads and writes the buffers they held then. Change their values with `assign` (a
  write still pending when the jit is called runs first); a captured tensor rebound to a new
  Tensor (`w = Tensor(...)`), deleted, or `replace`d, after the capture or by the function
  itself while it was captured, raises `JitError` naming its shape and dtype, instead of the
  replay silently reading the old buffer (a capture cannot see names, only that no tensor holds
  the buffer any more: one still held elsewhere, say by an optimizer, is not noticed). A
  captured tensor that is still lazy (never realized) is part of the captured graph: realize
  it before the first call.
- Side effects on buffers (optimizer `assign`s, BatchNorm running statistics) repeat: the kernels
  that wrote them are replayed.
- Random numbers: each replay draws fresh numbers exactly as an eager call would (the capture
  records which buffers hold a random stream's (key, counter) and refills them).
- Outputs: the returned Tensors are views of buffers the program owns; the next call overwrites
  them (copy one with `.clone()` to keep it). Their values read out are the caller's: `item`,
  `tolist` and `numpy()` copy (numpy() shares other tensors' memory, PyTorch's way, but a
  result's array would change under its holder at the next call: tinygrad's numpy() always
  copies). Passed back as the next call's inputs (a recurrence's state) they are copied first.
  Non-Tensor results are returned as captured.
- Python code is not replayed: reading tensor values (`item`, `tolist`, `numpy`) inside the
  function while it is captured raises `CaptureError`; a Python branch on a non-Tensor argument
  is safe (each distinct non-Tensor argument value gets its own capture: a numpy array by its
  contents, another unhashable object by identity), on outside state not.
- A new input signature (shapes, dtypes, devices, non-Tensor argument values, `Tensor.training`)
  starts over for that signature (an eager call, then a capture); the last `JIT_CAPTURES`
  signatures are kept. A different number or kind of arguments (a Tensor where the first call
  had another type) raises `JitError`; keyword arguments may come in any order.
- Symbolic shapes: a bound `Variable` passed as an argument or in an input's shape is part of
  the program, not of the signature: a new value replays the same kernels with the value passed
  at launch (no recompile, no recapture).
- Threads: a jit runs one call at a time (its reentrant `jit.lock`). Its results are its own
  buffers, overwritten by the next call from any thread: a thread sharing a jit holds `jit.lock`
  across a call and the reads of its results (`with step.lock: loss = step(x).item()`), or
  clones them inside it
  (`.clone().realize()`). A capture records only its own thread's launches: other threads may
  realize and read values meanwhile.
- `jit.reset()` forgets every capture (after rebinding a captured tensor on purpose). `JIT=0`
  runs the function eagerly on every call.
"""
from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unigrad import engine
from unigrad.engine.interrupts import deferred_interrupts
from unigrad.engine.capture import capture, is_capturing
from unigrad.engine.jit import CapturedProgram
from unigrad.frontend.function import (TensorLeaf, flatten_tensors, structure_key,
                                       tensor_signature, unflatten_tensors)
from unigrad.frontend import writes
from unigrad.frontend.interop import replay_results
from unigrad.frontend.tensor import Tensor, all_tensors, realize_stale_values
from unigrad.helpers import bounded_put
from unigrad.knobs import JIT, JIT_CAPTURES
from unigrad.schedule.callify import buffer_base
from unigrad.uop import UOp
from unigrad.uop.variable import bound_values, shape_str, unbind_values, variables

__all__ = ["TinyJit", "JitError"]


class JitError(RuntimeError):
  """A jitted function was called in a way its capture cannot serve."""


@dataclass
class Entry:
  """What one input signature has: how often it was called, then its captured program and the
  structure of its results (Tensors as their buffer views)."""
  calls: int = 0
  program: CapturedProgram | None = None
  input_nodes: tuple[UOp, ...] = ()
  out_tree: Any = None
  out_uops: tuple[tuple[UOp, Any], ...] = ()
  out_reads_input: tuple[bool, ...] = ()  # per result: does its view read an input's buffer
  owned: frozenset = frozenset()  # the Buffers of the results a replay writes (not inputs')
  written: dict[UOp, None] = field(default_factory=dict)  # the buffers its assigns write
  outside: list[OutsideBuffer] = field(default_factory=list)  # captured tensors' buffers
  watch: list[tuple[weakref.ref, UOp]] = field(default_factory=list)  # one holder of each
  # set when a watched holder dies (a weak reference's callback), with the rebind count the
  # watch was made at (LiveTensors.rebinds): while neither moved, no holder changed
  watch_refs: list[weakref.ref] = field(default_factory=list)
  watch_died: list[bool] = field(default_factory=lambda: [True])
  watch_rebinds: int = -1

  def make_watch(self) -> None:
    """Watch the first holder of each outside buffer (see TinyJit._check_outside)."""
    self.watch = [ob.first_holder() for ob in self.outside]
    died = self.watch_died = [False]

    def on_death(_: weakref.ref) -> None: died[0] = True
    self.watch_refs = [weakref.ref(t, on_death) for ref, _ in self.watch
                       if (t := ref()) is not None]
    self.watch_rebinds = all_tensors.rebinds


@dataclass
class OutsideBuffer:
  """A buffer the captured program uses that belonged to tensors made outside the function (a
  weight, a global): a replay uses this very buffer, so one of `holders` (weak references, each
  with the node it held) must still hold it. None does after `W = Tensor(...)` rebound the name,
  `del`, or `W.replace(...)`: the replay would silently read the old value."""
  buffer: Any
  holders: list[tuple[weakref.ref, UOp]]
  desc: str  # shape and dtype, for the error

  def is_held(self) -> bool:
    for ref, u in self.holders:
      if (t := ref()) is None: continue
      if t.uop is u: return True
      if (b := buffer_base(t.uop)) is not None and engine.buffer_of(b).base is self.buffer:
        return True
    return False

  def first_holder(self) -> tuple[weakref.ref, UOp]:
    """A holder that still holds the buffer, with the node it holds now."""
    for ref, _ in self.holders:
      if (t := ref()) is not None and (b := buffer_base(t.uop)) is not None and \
         engine.buffer_of(b).base is self.buffer: return ref, t.uop
    raise AssertionError("first_holder of a buffer no tensor holds")


class TinyJit:
  """Capture a function's kernels on its second call and replay them on later calls.

  >>> @TinyJit
  ... def step(x): return (x * 2).sum()
  >>> for _ in range(3): step(Tensor.ones(4)).item()
  8.0
  """

  def __init__(self, fxn: Callable[..., Any]) -> None:
    self.fxn = fxn
    self.entries: dict[Any, Entry] = {}
    self.skeleton: Any = None
    self.lock = threading.RLock()  # one call at a time (see the module docstring: Threads)
    functools.update_wrapper(self, fxn)

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    return self if obj is None else functools.partial(self.__call__, obj)

  def reset(self) -> None:
    """Forget every capture: the next call runs eagerly, the one after captures again."""
    with self.lock:
      self.entries.clear()
      self.skeleton = None

  @property
  def captured(self) -> CapturedProgram | None:
    """The most recently captured program (None before the second call)."""
    progs = [e.program for e in self.entries.values() if e.program is not None]
    return progs[-1] if progs else None

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if not JIT or is_capturing(): return self.fxn(*args, **kwargs)  # inside another capture
    with self.lock: return self._call(args, kwargs)

  def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
    if writes.pending: Tensor.realize_all()  # an assign to a captured tensor lands before the call
    kwargs = dict(sorted(kwargs.items()))  # keyword order is no part of the signature
    found: dict[int, Tensor] = {}
    tree = flatten_tensors((args, kwargs), found)
    self._check_skeleton(tree)
    inputs = _prepare(list(found.values()))
    var_vals = bound_values([*_uops_in(tree), *(d for t in inputs for d in t.shape)])
    key = (structure_key(_unbound(tree)), tuple(_input_key(t) for t in inputs),
           Tensor.training, bool(Tensor.no_grad))
    entry = self.entries.pop(key, None) or Entry()
    bounded_put(self.entries, key, entry, max(1, int(JIT_CAPTURES)))  # most recently used last
    entry.calls += 1
    if entry.program is not None:
      self._check_outside(entry, "since the capture")
      return _replay(entry, inputs, var_vals)
    inputs = [_as_value(t) for t in inputs]  # the function sees each input as a value
    call_args, call_kwargs = unflatten_tensors(tree, inputs)
    if entry.calls == 1: return _realized(self.fxn(*call_args, **call_kwargs))
    return self._capture(entry, inputs, call_args, call_kwargs)

  def _capture(self, entry: Entry, inputs: list[Tensor], call_args: Any, call_kwargs: Any) -> Any:
    """Run the function once more, recording its launches into `entry`'s program."""
    before = all_tensors.alive()
    with capture() as cap:
      cap.before = {t.uop: None for t in before}
      start, refs = _held_buffers(before), [weakref.ref(t) for t in before]
      del before  # the function may drop them: a name rebound inside it is checked below
      result = _realized(self.fxn(*call_args, **call_kwargs))
    entry.written = cap.written
    outs: dict[int, Tensor] = {}
    entry.out_tree = flatten_tensors(result, outs)
    # a replay's results have no autograd history: neither have the capture's, whose history
    # would keep every buffer realized on the way alive, in the program for good
    for t in outs.values(): engine.history.forget(t.uop)
    entry.program = CapturedProgram.from_capture(cap, [engine.buffer_of(t.uop) for t in inputs])
    entry.input_nodes = tuple(buffer_base(t.uop) for t in inputs)
    entry.outside = self._outside_buffers(entry.program, inputs, start, refs)
    entry.make_watch()
    entry.out_uops = tuple((t.uop, t.device) for t in outs.values())
    ins = set(entry.input_nodes)  # the results that read an input (returned as it is, a view)
    entry.out_reads_input = tuple(any(n in ins for n in t.uop.toposort()) for t in outs.values())
    entry.owned = frozenset(engine.buffer_of(t.uop).base for t, reads in
                            zip(outs.values(), entry.out_reads_input)
                            if not reads and buffer_base(t.uop) is not None)
    replay_results.update(entry.owned)  # numpy() of a result is a copy (frontend/interop.py)
    return result

  def _outside_buffers(self, program: CapturedProgram, inputs: list[Tensor],
                       start: dict[Any, list[tuple[weakref.ref, UOp]]],
                       refs: list[weakref.ref]) -> list[OutsideBuffer]:
    """The buffers `program` uses that tensors from outside the function hold (`refs`, the
    tensors live when the capture began, and `start`, their buffers then), inputs aside (a
    replay swaps those). A buffer of `start` whose every holder died during the capture was
    rebound inside the function (`self.h = self.h + x`): each replay would read its old value."""
    used = {b.base for b in program.args} - {engine.buffer_of(t.uop).base for t in inputs}
    for buf, holders in start.items():
      if buf in used and all(ref() is None for ref, _ in holders):
        self._rebound(_describe_node(holders[0][1]), "while the function was being captured")
    alive = [t for r in refs if (t := r()) is not None]
    return [OutsideBuffer(buf, holders, _describe_node(holders[0][1]))
            for buf, holders in _held_buffers(alive).items() if buf in used]

  def _check_outside(self, entry: Entry, when: str) -> None:
    """Every captured outside tensor's buffer is still held by a tensor that held it (see
    OutsideBuffer), else JitError: the replay would read the buffer of a tensor that is gone.
    Where no watched holder died and no tensor got a new node since the watch was made, nothing
    is looked at (SmolLM2's decode step: 455 weights, 0.3 ms a step once its kernels had pushed
    them out of the caches)."""
    if not entry.watch_died[0] and entry.watch_rebinds == all_tensors.rebinds: return
    for ref, u in entry.watch:  # the fast path: the first holder of each buffer is unchanged
      if (t := ref()) is None or t.uop is not u: break
    else:
      entry.make_watch()
      return
    for ob in entry.outside:
      if not ob.is_held(): self._rebound(ob.desc, when)
    entry.make_watch()

  def _rebound(self, desc: str, when: str) -> None:
    self.entries.clear()  # nothing captured can be trusted to read the right buffers
    raise JitError(f"TinyJit({self._name}): a tensor from outside the function ({desc}) that the "
                   f"captured kernels use was rebound, deleted or replaced {when} (`w = "
                   "Tensor(...)` instead of `w.assign(...)`); a replay would keep using its old "
                   "buffer. Write new values with assign(), pass the tensor as an argument, or "
                   "call reset() after rebinding it")

  @property
  def _name(self) -> str: return getattr(self.fxn, "__name__", "function")

  def _check_skeleton(self, tree: Any) -> None:
    """The arguments' kinds (Tensor or not, counts, keyword names) must match the first call."""
    skel = _skeleton(tree)
    if self.skeleton is None: self.skeleton = skel
    if skel == self.skeleton: return
    where = _first_difference(self.skeleton, skel, "arguments")
    raise JitError(f"TinyJit({self._name}): {where}; a jitted "
                   "function must be called with the same number and kind of arguments (call "
                   "reset() to start over)")


def _held_buffers(tensors: list[Tensor]) -> dict[Any, list[tuple[weakref.ref, UOp]]]:
  """The device Buffer of each realized single-device tensor of `tensors`, with (a weak
  reference to the tensor, its node) for each tensor holding it."""
  held: dict[Any, list[tuple[weakref.ref, UOp]]] = {}
  for t in tensors:
    if (b := buffer_base(t.uop)) is None or not engine.is_realized(t.uop): continue
    held.setdefault(engine.buffer_of(b).base, []).append((weakref.ref(t), t.uop))
  return held


def _describe_node(u: UOp) -> str: return f"shape {shape_str(u.shape)}, {u.dtype!r}"


def _prepare(inputs: list[Tensor]) -> list[Tensor]:
  """Each input realized into a row-major buffer of its own (a view or a buffer shared with an
  earlier input is copied first: a replay swaps whole buffers)."""
  seen: set[UOp] = set()
  out = []
  for t in inputs:
    if not engine.is_realized(t.uop) or buffer_base(t.uop) in seen:
      t = t.contiguous() if engine.is_realized(t.uop) else t
      t.realize()
      if buffer_base(t.uop) in seen: t = t.contiguous().realize()
    seen.add(buffer_base(t.uop))
    out.append(t)
  return out


def _as_value(t: Tensor) -> Tensor:
  """`t` as the function must see it: its buffer, with no autograd history behind it. A realized
  gather `X[idx]` remembers the graph that computed it (engine.history), and backward would
  differentiate that graph instead, reading X and this call's `idx` rather than the input's
  buffer: a replay swaps in the new input, but such kernels would still read the old `idx`.
  The same Buffer under a fresh BUFFER node has no history."""
  if t.uop not in engine.history or (base := buffer_base(t.uop)) is None: return t
  fresh = engine.buffer_from(engine.buffer_of(base))
  return Tensor._from_uop(t.uop.substitute({base: fresh}), t.device)


def _realized(result: Any) -> Any:
  """`result` with every Tensor in it realized (in one run)."""
  found: dict[int, Tensor] = {}
  flatten_tensors(result, found)
  Tensor.realize_all(*found.values())
  return result


def _replay(entry: Entry, inputs: list[Tensor], var_vals: dict[str, int]) -> Any:
  assert entry.program is not None
  inputs = [_unowned(entry, t) for t in inputs]
  # one launch at a time with other threads' realizes; a Ctrl-C waits for every launch
  with engine.realize_lock, deferred_interrupts():
    realize_stale_values(entry.written)  # lazy values reading what the replay overwrites
    entry.program.replay([engine.buffer_of(t.uop) for t in inputs], var_vals)
    engine.mark_written(entry.written)
  sub = {old: buffer_base(t.uop) for old, t in zip(entry.input_nodes, inputs)}
  outs = [Tensor._from_uop(_rebind(u.substitute(sub) if reads else u, var_vals), dev)
          for (u, dev), reads in zip(entry.out_uops, entry.out_reads_input)]
  return unflatten_tensors(entry.out_tree, outs)


def _unowned(entry: Entry, t: Tensor) -> Tensor:
  """`t`, copied first if its buffer is one of the replay's own results (a result fed back as
  the next call's input, `(a, b) -> (b, a + b)`): the replay would overwrite it while reading it,
  or return it as a view of an input after writing its next value into it."""
  if engine.buffer_of(t.uop).base not in entry.owned: return t
  return t.contiguous().realize()


def _input_key(t: Tensor) -> Any:
  """An input's part of a capture's key: its shape, dtype and device, bound variables unbound
  (a static shape, the usual case, needs no walk)."""
  for d in t.shape:
    if type(d) is not int: return _unbound(tensor_signature(t))
  return (t.shape, t.dtype, t.device)


def _uops_in(tree: Any) -> list[UOp]:
  """The UOps among the non-Tensor arguments (bound variables pass their values this way)."""
  if isinstance(tree, UOp): return [tree]
  if isinstance(tree, (list, tuple)): return [u for x in tree for u in _uops_in(x)]
  if isinstance(tree, dict): return [u for x in tree.values() for u in _uops_in(x)]
  return []


def _unbound(tree: Any) -> Any:
  """`tree` with every UOp's bound variables unbound: a new value of a variable is the same
  program (its kernels take the value at launch)."""
  if isinstance(tree, UOp): return unbind_values(tree)[0]
  if isinstance(tree, (list, tuple)): return type(tree)(_unbound(x) for x in tree)
  if isinstance(tree, dict): return {k: _unbound(v) for k, v in tree.items()}
  return tree


def _rebind(u: UOp, var_vals: dict[str, int]) -> UOp:
  """`u` (a captured output view) with its bound variables bound to this call's values."""
  if not var_vals: return u
  sub = {v: v.unbind()[0].bind(var_vals[v.arg.name]) for v in variables([u])
         if v.arg.value is not None and v.arg.name in var_vals}
  return u.substitute(sub) if sub else u


def _skeleton(tree: Any) -> Any:
  if isinstance(tree, TensorLeaf): return "Tensor"
  if isinstance(tree, (list, tuple)): return (type(tree).__name__, *map(_skeleton, tree))
  if isinstance(tree, dict): return ("dict", *((k, _skeleton(v)) for k, v in tree.items()))
  return type(tree).__name__


def _first_difference(want: Any, got: Any, path: str) -> str:
  """Where two skeletons first differ, as `path: expected X, got Y`."""
  if isinstance(want, tuple) and isinstance(got, tuple) and want[:1] == got[:1]:
    if len(want) != len(got):
      return f"{path}: expected {len(want) - 1} entries, got {len(got) - 1}"
    for i, (w, g) in enumerate(zip(want[1:], got[1:])):
      if w != g:
        name = w[0] if want[0] == "dict" and isinstance(w, tuple) else i
        inner_w = w[1] if want[0] == "dict" else w
        inner_g = g[1] if want[0] == "dict" else g
        if want[0] == "dict" and w[0] != g[0]:
          return f"{path}: expected keyword {w[0]!r}, got {g[0]!r}"
        return _first_difference(inner_w, inner_g, f"{path}[{name!r}]")
  return f"{path}: expected {_describe(want)}, got {_describe(got)}"


def _describe(skel: Any) -> str: return skel[0] if isinstance(skel, tuple) else skel
