"""NumericalFunction: a traced function exported as one standalone C source (seed 003).

A frozen dataclass with cached properties, one per codegen stage, each derived from the one
before: `function_graph` (tracing, trace.py), `schedule` (callify and scheduling, lower.py),
`rendered_kernels` (the CPU device's codegen and C renderer), `header` and `source` (final
rendering, csource.py). Calling it compiles `source` once and runs it natively (native.py).

Renderer choice: the kernels are those of the CPU device (`renderer_for("CPU")`: its vector
width, its THREAD chunks), so an exported function computes exactly what `Tensor.realize` does,
bit for bit. Their vectors are GCC/clang vector extensions, which any gcc or clang compiles for
any target (`-march=native` only makes them faster). Where the kernels use vectors wider than the
target's baseline registers (the AVX-512 width of the machine that exported them, compiled
without -mavx512f), the ABI warning of gcc and clang for the always-inlined vector helpers is
switched off in the file; gcc still prints an informational note about them (no error;
`-Wno-psabi` or `-march=native` removes it). The file compiles with `-Wall -Wextra -Werror`
under gcc and clang (csource.py); the public name is checked by names.py. Floating-point
contraction must stay off as on the CPU device (`-std=c11` gives it with gcc, the file tells
clang with a pragma, gcc in C++ or GNU mode needs `-ffp-contract=off` on FMA targets).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unigrad.codegen.linearize import launch_size
from unigrad.codegen.pipeline import full_rewrite
from unigrad.engine.programs import renderer_for
from unigrad.export.csource import KernelSource, render_header, render_source
from unigrad.export.lower import ExportPlan, Slot, lower
from unigrad.export.names import name_problem
from unigrad.export.native import BUILD_FLAGS, NativeFunction, compile_library
from unigrad.export.trace import EXPORT_DEVICE, ExportError, TensorSpec, Trace, to_spec, trace
from unigrad.export.vmap import VmapError, vmap
from unigrad.frontend.tensor import Tensor
from unigrad.knobs import Context
from unigrad.renderer.cstyle import CRenderer
from unigrad.uop import Ops, UOp

__all__ = ["NumericalFunction"]



@dataclass(frozen=True, init=False)
class NumericalFunction:
  """`fn` traced on `example_inputs` (Tensors or `(shape, dtype)` pairs) and exported as C.

  `threads`: None renders the CPU device's own kernels (bit for bit what unigrad computes); an
  int renders them as for a CPU device with that many threads (`THREADS`): `threads=1` gives
  kernels shaped for the single-threaded loop the file runs by default, often faster there, equal
  bit for bit to unigrad run with `THREADS=1`. Random numbers drawn inside `fn` are frozen: the
  generator's state is a captured constant, so every call sees the same draw.

  >>> nf = NumericalFunction(lambda x: (x * 2).sum(), ((4,), dtypes.float32), name="twice")
  >>> print(nf.header)   # void twice(const float *in0, float *out0);
  >>> nf(Tensor([1.0, 2, 3, 4]))   # compiled and run natively
  """
  fn: Callable[..., Any]
  example_inputs: tuple[TensorSpec, ...]
  export_name: str | None
  threads: int | None

  def __init__(self, fn: Callable[..., Any], *example_inputs: Any, name: str | None = None,
               threads: int | None = None):
    if not callable(fn): raise TypeError(f"NumericalFunction needs a function, got {fn!r}")
    specs = tuple(to_spec(x, f"example input {i}") for i, x in enumerate(example_inputs))
    if name is not None and (why := name_problem(name)) is not None:
      raise ValueError(f"name {name!r} cannot name the exported C function: it {why}; "
                       "choose another name")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
      raise ValueError(f"threads must be an int >= 1 or None, got {threads!r}")
    object.__setattr__(self, "fn", fn)
    object.__setattr__(self, "example_inputs", specs)
    object.__setattr__(self, "export_name", name)
    object.__setattr__(self, "threads", threads)
    if self.batched:
      for i, (s, m) in enumerate(zip(specs, self.mapped)):
        if m and not s.shape:
          raise ValueError(f"example input {i}: a mapped input needs a batch axis, got shape ()")

  @functools.cached_property
  def name(self) -> str:
    """The public C function's name: `name=`, else the function's name when it can name a C
    function (names.py: not `<lambda>`, `exp` or `int`), else `fn`."""
    if self.export_name is not None: return self.export_name
    fn_name = getattr(self.fn, "__name__", "")
    return fn_name if isinstance(fn_name, str) and name_problem(fn_name) is None else "fn"

  @functools.cached_property
  def batched(self) -> bool:
    """Whether the batch size is a runtime argument (`svmap`)."""
    return isinstance(self.fn, vmap) and self.fn.runtime_batch

  @functools.cached_property
  def mapped(self) -> tuple[bool, ...]:
    """For an svmap export, which inputs carry the batch axis (all False otherwise)."""
    if not self.batched: return (False,) * len(self.example_inputs)
    assert isinstance(self.fn, vmap)
    try: axes = self.fn.axes(len(self.example_inputs))
    except VmapError as e: raise ValueError(str(e)) from e
    return tuple(a is not None for a in axes)

  @functools.cached_property
  def input_specs(self) -> tuple[TensorSpec, ...]:
    """What the kernels see of each input: one example's shape under svmap."""
    return tuple(TensorSpec(s.shape[1:], s.dtype) if m else s
                 for s, m in zip(self.example_inputs, self.mapped))

  @functools.cached_property
  def _trace(self) -> Trace:
    fn = self.fn.fn if self.batched else self.fn  # svmap: the kernels are one example's
    return trace(fn, self.input_specs, self.name)

  @functools.cached_property
  def function_graph(self) -> UOp:
    """The traced `FUNCTION(TUPLE(results...), *inputs, *captured)` (the function layer's)."""
    return self._trace.function

  @functools.cached_property
  def output_specs(self) -> tuple[TensorSpec, ...]:
    """Each output's shape (one example's under svmap) and dtype."""
    return self._trace.outputs

  @functools.cached_property
  def _plan(self) -> ExportPlan: return lower(self._trace)

  @functools.cached_property
  def schedule(self) -> UOp:
    """The `LINEAR` of kernel CALLs over PARAM slots (categories in `buffers`)."""
    return self._plan.schedule

  @functools.cached_property
  def buffers(self) -> dict[int, Slot]:
    """Slot -> its `Slot` (category input/output/constant/intermediate, index, size, dtype)."""
    return dict(self._plan.slots)

  @functools.cached_property
  def _kernels(self) -> dict[UOp, KernelSource]:
    if self.threads is None: return self._render_kernels()
    with Context(THREADS=self.threads): return self._render_kernels()

  def _render_kernels(self) -> dict[UOp, KernelSource]:
    ren = renderer_for(EXPORT_DEVICE)
    assert isinstance(ren, CRenderer)
    out: dict[UOp, KernelSource] = {}
    taken = {self.name}  # a kernel never takes the public function's name
    for launch in self._plan.launches:
      if launch.ast.op is Ops.COPY or launch.ast in out: continue
      linear = full_rewrite(launch.ast, ren)
      if any(u.op is Ops.PARAM and u.arg.name is not None for u in linear.src):
        raise ExportError(f"{self.name}: a kernel takes a symbolic variable; symbolic shapes "
                          "are not exported (use svmap for a runtime batch size)")
      base = linear.arg.name if linear.arg is not None else "kernel"
      name = next(n for n in (base, *(f"{base}_{i}" for i in range(1, len(out) + 2)))
                  if n not in taken)
      taken.add(name)
      helpers, text = ren.render_parts(name, linear)
      out[launch.ast] = KernelSource(name, helpers, text, launch_size(linear)[0])
    return out

  @functools.cached_property
  def rendered_kernels(self) -> dict[str, str]:
    """Kernel name -> its C source (each alone, as the CPU device compiles it)."""
    return {k.name: k.source for k in self._kernels.values()}

  @functools.cached_property
  def header(self) -> str:
    """The declaration of the public function (a `.h` file's contents)."""
    return render_header(self.name, *self._interface, self.mapped if self.batched else None)

  @functools.cached_property
  def _interface(self) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return self.input_specs, self.output_specs

  @functools.cached_property
  def source(self) -> str:
    """The whole standalone C file."""
    return render_source(self.name, self._plan, self._kernels, *self._interface,
                         self.mapped if self.batched else None)

  @functools.cached_property
  def build_command(self) -> str:
    """A command that compiles `source` (saved as NAME.c) into an object file."""
    return f"cc {' '.join(BUILD_FLAGS)} -Wall -Werror -c {self.name}.c -o {self.name}.o"

  @functools.cached_property
  def _native(self) -> NativeFunction:
    lib = compile_library(self.source, self.name)
    return NativeFunction(getattr(lib, self.name), self.input_specs, self.output_specs,
                          self.mapped if self.batched else None)

  def __call__(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
    """Run the exported C natively on `inputs` (CPU Tensors); a single output is returned as a
    Tensor, several as a tuple."""
    outs = self._native(*inputs)
    return outs[0] if len(outs) == 1 else outs
