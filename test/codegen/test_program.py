"""The last codegen stages: render and compile end in the spec's PROGRAM(LINEAR, SOURCE, BINARY)."""
import numpy as np
import pytest

from unigrad import Tensor
from unigrad.codegen.pipeline import to_program, to_rendered
from unigrad.codegen.program import ProgramInfo, spec_program
from unigrad.engine.programs import get_runner
from unigrad.knobs import Context
from unigrad.runtime.device import Device
from unigrad.uop import Ops, UOp
from unigrad.uop.spec import SpecError


def kernel_of(t: Tensor) -> UOp:
  calls = [c for c in t.schedule().src if c.src[0].op is not Ops.COPY]
  return calls[-1].src[0]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_codegen_ends_in_a_verified_program(device):
  kernel = kernel_of((Tensor(np.arange(12, dtype=np.float32), device=device) * 2).sum())
  with Context(SPEC=1): prog = to_program(kernel, Device[device].renderer)
  assert prog.op is Ops.PROGRAM and [s.op for s in prog.src] == [Ops.LINEAR, Ops.SOURCE, Ops.BINARY]
  info = prog.arg
  assert isinstance(info, ProgramInfo) and info.device == device and info.estimates.flops > 0
  if device == "CPU":
    assert info.name in prog.src[1].arg, "the C source defines the kernel"
    assert prog.src[2].arg[:4] == b"\x7fELF", "the compiler's shared object"
  spec_program.verify(prog)


def test_the_program_spec_rejects_a_program_without_its_binary():
  kernel = kernel_of(Tensor(np.ones(4, dtype=np.float32), device="PYTHON") + 1)
  rendered = to_rendered(kernel, Device["PYTHON"].renderer)
  with pytest.raises(SpecError, match="LINEAR, SOURCE, BINARY"): spec_program.verify(rendered)
  compiled = to_program(kernel, Device["PYTHON"].renderer)
  with pytest.raises(SpecError, match="ProgramInfo"):
    spec_program.verify(compiled.replace(arg=None))
  empty = compiled.replace(src=(*compiled.src[:2], compiled.src[2].replace(arg=b"")))
  with pytest.raises(SpecError, match="empty"): spec_program.verify(empty)


def test_the_engine_launches_the_programs_codegen_built():
  kernel = kernel_of(Tensor(np.ones(8, dtype=np.float32), device="CPU").exp())
  runner = get_runner(kernel, "CPU")
  assert runner.program_uop.op is Ops.PROGRAM and runner.name == runner.program_uop.arg.name
  assert runner.program_uop.src[1].arg == runner.src
