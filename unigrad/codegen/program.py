"""The last two codegen stages: render and compile, ending in the spec's PROGRAM.

    render   LINEAR                       -> PROGRAM(LINEAR, SOURCE)
    compile  PROGRAM(LINEAR, SOURCE)      -> PROGRAM(LINEAR, SOURCE, BINARY)

Both ask the kernel's device: render uses the device's renderer (the one the earlier stages
lowered for), compile its compiler (a device without one, PYTHON, loads the source itself: its
BINARY is the source's bytes). The PROGRAM's arg, a `ProgramInfo`, is what a launch needs besides
the binary: the kernel's name, its device, its work estimates and its launch size. The engine
caches and launches PROGRAMs (engine/programs.py); its disk cache keeps the rendered half's info
and SOURCE (a PROGRAM loaded from there has an empty LINEAR: engine/compcache.py), the compiler's
own disk cache keeps the binaries.
`spec_program` is the verifier of the compile stage's output.
"""
from __future__ import annotations

from dataclasses import dataclass

from unigrad.codegen.gpudims import launch_dims
from unigrad.codegen.linearize import Estimates, estimate
from unigrad.dtype import dtypes
from unigrad.renderer import Renderer
from unigrad.runtime.device import Device
from unigrad.uop import Ops, UOp
from unigrad.uop.spec import Spec, arg_is, nsrc
from unigrad.uop.spec_kernel import spec_linear

__all__ = ["ProgramInfo", "render_program", "compile_program", "program_binary", "spec_program"]


@dataclass(frozen=True)
class ProgramInfo:
  """A PROGRAM's arg: the kernel's name, device, work estimates and launch size (global work
  groups or CPU chunks; local: work items per work group on GPU targets, else None)."""
  name: str
  device: str
  estimates: Estimates
  global_size: tuple[int, ...] = (1,)
  local_size: tuple[int, ...] | None = None


def render_program(linear: UOp, ren: Renderer) -> UOp:
  """PROGRAM(linear, SOURCE): the LINEAR rendered by `ren`, with its launch info."""
  name = linear.arg.name if linear.arg is not None else "kernel"
  info = ProgramInfo(name, ren.device, estimate(linear), *launch_dims(linear))
  source = UOp(Ops.SOURCE, dtypes.void, (), ren.render(name, linear))
  return UOp(Ops.PROGRAM, dtypes.void, (linear, source), info)


def program_binary(prog: UOp, refresh: bool = False) -> bytes:
  """The compiled bytes of a rendered PROGRAM's SOURCE, by its device's compiler (from the
  compiler's disk cache; `refresh` compiles anew: a cached binary the loader rejected)."""
  compiler = Device[prog.arg.device].compiler
  src = prog.src[1].arg
  return src.encode() if compiler is None else compiler.compile_cached(src, refresh=refresh)


def compile_program(prog: UOp, binary: bytes | None = None, refresh: bool = False) -> UOp:
  """PROGRAM(linear, SOURCE, BINARY): a rendered PROGRAM compiled (or given its `binary`,
  compiled elsewhere: the engine compiles a schedule's new kernels on several threads)."""
  if binary is None: binary = program_binary(prog, refresh)
  return prog.replace(src=(*prog.src[:2], UOp(Ops.BINARY, dtypes.uint8, (), binary)))


def _program_sources(u: UOp) -> str | None:
  ops = tuple(s.op for s in u.src)
  if ops == (Ops.LINEAR, Ops.SOURCE, Ops.BINARY): return None
  return f"sources must be (LINEAR, SOURCE, BINARY), got ({', '.join(o.name for o in ops)})"


def _nonempty(u: UOp) -> str | None: return None if u.arg else "the compiled bytes are empty"


class ProgramSpec(Spec):
  """The compile stage's output: PROGRAM(LINEAR, SOURCE, BINARY) with a ProgramInfo arg, its
  LINEAR valid for the renderers (spec_linear)."""

  def verify(self, root: UOp) -> UOp:
    self.verify_node(root)
    for u in root.src[1:]: self.verify_node(u)
    spec_linear.verify(root.src[0])
    return root


spec_program = ProgramSpec("program", {
  Ops.PROGRAM: (("sources", _program_sources),
                ("ProgramInfo arg", arg_is(ProgramInfo, "a ProgramInfo"))),
  Ops.SOURCE: (("sources", nsrc(0)), ("str arg", arg_is(str, "the source text"))),
  Ops.BINARY: (("sources", nsrc(0)), ("bytes arg", arg_is(bytes, "bytes")),
               ("non-empty", _nonempty)),
})
