"""Renderer base: a target's capabilities and how a LINEAR becomes source text.

Target differences live here as data (which ops the target has natively, whether it runs THREAD
axes, vector width), not as branches inside codegen stages: instruction selection decomposes
every op that is not in `supported_ops`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from unigrad.dtype import DType, dtypes
from unigrad.helpers import cpu_threads
from unigrad.knobs import EMULATED_DTYPES
from unigrad.uop import GroupOp, Ops, UOp

# the dtypes a renderer can keep in memory as their bits and compute in float32
EMULABLE_DTYPES = frozenset({dtypes.float16, dtypes.bfloat16})


def knob_emulated_dtypes() -> frozenset[DType]:
  """The dtypes the EMULATED_DTYPES knob names (comma-separated dtype names)."""
  return _named_dtypes(str(EMULATED_DTYPES.value))


@functools.cache
def _named_dtypes(names: str) -> frozenset[DType]:
  out = set()
  for name in filter(None, (n.strip().lower() for n in names.split(","))):
    dt = getattr(dtypes, name.removeprefix("dtypes."), None)
    if not isinstance(dt, DType) or dt not in EMULABLE_DTYPES:
      known = ", ".join(sorted(d.name for d in EMULABLE_DTYPES))
      raise ValueError(f"EMULATED_DTYPES names {name!r}, which no renderer can emulate "
                       f"(emulable: {known})")
    out.add(dt)
  return frozenset(out)


@dataclass(frozen=True)
class Renderer:
  """What a target supports, and `render(name, linear) -> source`."""
  device: str = "NULL"
  supported_ops: frozenset[Ops] = frozenset()
  has_threads: bool = False
  emulated_dtypes: frozenset = frozenset()
  vector_bytes: int = 0  # width of the target's vector registers (0: no vector values)
  stream_bytes: int = 0  # outputs this big are written around the caches (0: never)
  prefetch_bytes: int = 0  # streamed loads prefetch this many bytes ahead in all (0: never)
  vector_registers: int = 0  # how many vector registers the target has (0: no vector values)
  # GPU targets: output axes run as work groups x work items (SPECIAL gidx/lidx, codegen/gpudims)
  has_local: bool = False
  global_max: tuple[int, ...] = ()  # work groups per launch dimension
  local_max: int = 0  # work items per work group
  shared_bytes: int = 0  # LOCAL (shared) memory per work group
  # vector memory accesses (codegen/coalesce.py): the lanes one load or store may move, widest
  # first (empty: scalar accesses only), and whether its address must be a multiple of the lanes
  access_lanes: tuple[int, ...] = ()
  access_aligned: bool = False
  tensor_cores: tuple = ()  # the TensorCore shapes of the TC opt (codegen/opt/tc.py)
  # a native byte dot product (x86 AVX2 or VNNI): DOT4 is in supported_ops and runs as one
  # instruction sequence per vector (nn/quantized.py's int8 matvec takes it)
  byte_dot: bool = False

  def render(self, name: str, linear: UOp) -> str: raise NotImplementedError

  @property
  def threads(self) -> int:
    """The OS threads a kernel's THREAD axis is split over: the host's (`THREADS` knob, else
    every usable core) on a target that runs THREAD axes, else 1."""
    return cpu_threads() if self.has_threads else 1

  def emulates(self, dt: DType) -> bool:
    """Whether `dt` lives in memory as its bits and computes in float32 on this target: the
    renderer's own emulated dtypes and those the EMULATED_DTYPES knob names."""
    return dt.scalar() in self.emulated_dtypes | knob_emulated_dtypes()


class PythonRenderer(Renderer):
  """The PYTHON device runs the LINEAR itself: its source is the LINEAR's evaluable repr."""

  def __init__(self, emulate: Renderer | None = None) -> None:
    """`emulate`: a GPU renderer whose launch limits and tensor cores this one takes, so the
    PYTHON device runs the GPU lowering (work groups, LOCAL memory, WMMA) of that target."""
    super().__init__("PYTHON", frozenset(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}), False)
    if emulate is None or not emulate.has_local: return
    for name in ("has_local", "global_max", "local_max", "shared_bytes", "tensor_cores"):
      object.__setattr__(self, name, getattr(emulate, name))

  def render(self, name: str, linear: UOp) -> str:
    return repr(linear.replace(arg=None))  # the instructions; the KernelInfo is not needed to run
