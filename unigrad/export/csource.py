"""Csource: assemble the exported C file from the rendered kernels and the export plan.

Consumes: an `ExportPlan` (lower.py), the kernels rendered by the CPU device's own C renderer
(the same kernels `Tensor.realize` runs, so results match bit for bit), the input and output
specs and the public name.
Produces: the header (the public declaration) and the source: a prelude, each helper once, the
kernels as `static` functions, the constants as `static const` unions of their exact bits and
their typed values, one `static` scratch array per intermediate dtype (shared by lifetime, the
memory plan), and `void NAME(const T0 *in0, ..., T *out0, ...)` calling the kernels in order.
Invariants: the file needs no header but `<stdint.h>` and `<stddef.h>`, no library but libm,
compiles with `-std=c11 -O2 -Wall -Wextra -Werror` under gcc and clang, and as C++ (`restrict`
and `_Bool` are mapped), with or without `-march=native`; float16/bfloat16 arrays are 16-bit
patterns (`uint16_t`); a kernel with THREAD chunks runs them in a loop, in parallel under OpenMP
(`-fopenmp`) when the compiler has it; the function keeps state in its static scratch arrays, so
two calls must not run at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass

from unigrad.dtype import DType, dtypes
from unigrad.export.lower import Category, ExportPlan, Slot
from unigrad.export.native import BUILD_FLAGS
from unigrad.export.trace import TensorSpec
from unigrad.renderer.cstyle import PRELUDE, STORAGE
from unigrad.uop import UOp

__all__ = ["KernelSource", "render_header", "render_source", "c_type"]

# what C11 and C++ spell differently; no contraction of a*b+c into an fma the kernels did not ask
# for (gcc: -ffp-contract=off, the default with -std=c11); vector helpers wider than the target's
# baseline registers are static, called only from this file, so the ABI warning of gcc and clang
# about them (-Wpsabi) does not apply
PORTABILITY = """\
#include <stddef.h>
#ifdef __cplusplus
#define restrict __restrict
#define _Bool bool
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#if __has_warning("-Wpsabi")
#pragma clang diagnostic ignored "-Wpsabi"
#endif
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
"""
# the prelude and helpers are a small library of which a file calls a part (a float32 file never
# rounds to half: `__rh` is unused), and a kernel takes its `core_id` even when it runs one chunk:
# these two warnings are off for the kernels' part of the file only, the public function is checked
KERNEL_WARNINGS_OFF = """\
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif"""
KERNEL_WARNINGS_ON = "#if defined(__GNUC__)\n#pragma GCC diagnostic pop\n#endif"
HEX_PER_LINE = 8


@dataclass(frozen=True)
class KernelSource:
  """One rendered kernel: its C name, the helpers it needs, its function text and how many
  core_id chunks one launch runs."""
  name: str
  helpers: dict[str, str]
  function: str
  chunks: int

  @property
  def source(self) -> str:
    """The kernel alone, as the CPU device compiles it."""
    return PRELUDE + "\n".join(self.helpers.values()) + "\n" + self.function


def c_type(dt: DType) -> str:
  """The C type of an array element of `dt` at the exported interface (`bool` from
  <stdbool.h> in C, C++'s own `bool`)."""
  if dt == dtypes.bool: return "bool"
  return "uint16_t" if dt in (dtypes.float16, dtypes.bfloat16) else STORAGE[dt]


def _bits_type(dt: DType) -> str: return f"uint{8 * dt.itemsize}_t"


def _params(ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...], batched: bool) -> str:
  args = ["int batch"] if batched else []
  args += [f"const {c_type(s.dtype)} *in{i}" for i, s in enumerate(ins)]
  args += [f"{c_type(s.dtype)} *out{i}" for i, s in enumerate(outs)]
  return ", ".join(args) or "void"


def _dims(s: TensorSpec, batched: bool) -> str:
  """`float[batch, 8, 8]`: an array's dtype and shape."""
  return f"{s.dtype.name}[{', '.join((['batch'] if batched else []) + [str(d) for d in s.shape])}]"


def render_header(name: str, ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...],
                  mapped: tuple[bool, ...] | None = None) -> str:
  """The public declaration, with each array's shape and dtype in a comment (`mapped`: svmap's
  batched inputs, whose shapes get a leading `batch`)."""
  guard = f"{name.upper()}_H"
  batched = mapped is not None
  doc = [f" * in{i}: {_dims(s, bool(mapped and mapped[i]))}" for i, s in enumerate(ins)]
  doc += [f" * out{i}: {_dims(s, batched)}" for i, s in enumerate(outs)]
  if batched: doc.insert(0, " * batch: the number of examples (the mapped arrays' first axis)")
  lines = [f"#ifndef {guard}", f"#define {guard}", "#include <stdint.h>", "#ifndef __cplusplus",
           "#include <stdbool.h>", "#endif",
           f"/* {name}: exported by unigrad.export. Arrays are C-contiguous, row-major;",
           " * outputs must not overlap inputs. float16/bfloat16 values are 16-bit patterns.",
           *doc, " */", "#ifdef __cplusplus", 'extern "C" {', "#endif",
           f"void {name}({_params(ins, outs, batched)});",
           "#ifdef __cplusplus", "}", "#endif", f"#endif /* {guard} */", ""]
  return "\n".join(lines)


def _constant(name: str, data: bytes, dt: DType) -> str:
  """`static const union { bits[N]; values[N]; } name`: the exact bits, read as `name.v`."""
  size = dt.itemsize
  words = [int.from_bytes(data[i:i + size], "little") for i in range(0, len(data), size)] or [0]
  suffix = "ull" if size == 8 else "u"
  lits = [f"0x{w:0{2 * size}x}{suffix}" for w in words]
  rows = [", ".join(lits[i:i + HEX_PER_LINE]) for i in range(0, len(lits), HEX_PER_LINE)]
  body = ",\n  ".join(rows)
  n = len(words)
  return (f"static const union {{ {_bits_type(dt)} bits[{n}]; {STORAGE[dt]} v[{n}]; }} "
          f"{name} __attribute__((aligned(64))) = {{{{\n  {body}}}}};")


@dataclass(frozen=True)
class _Names:
  """How the public function refers to each buffer."""
  name: str
  ins: tuple[TensorSpec, ...]
  outs: tuple[TensorSpec, ...]
  mapped: tuple[bool, ...] | None  # svmap: which inputs advance with the batch loop

  def scratch(self, dt: DType) -> str: return f"{self.name}_scratch_{dt.name}"

  def buffer(self, slot: Slot) -> str:
    ct = STORAGE[slot.dtype]
    if slot.category is Category.INTERMEDIATE: return f"{self.scratch(slot.dtype)} + {slot.offset}"
    if slot.category is Category.CONSTANT: return f"({ct}*){self.name}_c{slot.index}.v"
    spec = (self.ins if slot.category is Category.INPUT else self.outs)[slot.index]
    is_input = slot.category is Category.INPUT
    ptr = f"{'in' if is_input else 'out'}{slot.index}"
    if self.mapped is not None and (not is_input or self.mapped[slot.index]):
      ptr = f"({ptr} + (size_t)b * {spec.numel}u)"
    return f"({ct}*){ptr}"


def _launch(names: _Names, kernel: KernelSource | None, slots: tuple[Slot, ...]) -> list[str]:
  """The C statements of one launch: a kernel call per chunk, or an element copy."""
  args = [names.buffer(s) for s in slots]
  if kernel is None:  # CALL(COPY, dst, src)
    return [f"for (size_t i = 0; i < {slots[0].size}u; i++) ({args[0]})[i] = ({args[1]})[i];"]
  if kernel.chunks == 1: return [f"{kernel.name}({', '.join(args)}, 0);"]
  return [f"{names.name.upper()}_PARALLEL_FOR",
          f"for (int c = 0; c < {kernel.chunks}; c++) {kernel.name}({', '.join(args)}, c);"]


def render_source(name: str, plan: ExportPlan, kernels: dict[UOp, KernelSource],
                  ins: tuple[TensorSpec, ...], outs: tuple[TensorSpec, ...],
                  mapped: tuple[bool, ...] | None = None) -> str:
  """The whole C file (see the module docstring); `mapped` (svmap): the function loops over a
  runtime batch, advancing the outputs and the mapped inputs by one example each time."""
  names = _Names(name, ins, outs, mapped)
  batched = mapped is not None
  helpers: dict[str, str] = {}
  for k in kernels.values(): helpers.update(k.helpers)
  macro = f"{name.upper()}_PARALLEL_FOR"
  parallel = ["#if defined(_OPENMP)", f'#define {macro} _Pragma("omp parallel for")', "#else",
              f"#define {macro}", "#endif"]
  build = (f"/* build: cc {' '.join(BUILD_FLAGS)} -c {name}.c  (any C11 or C++ compiler of the gcc "
           "or clang family;\n * -march=native only for speed, -fopenmp runs THREAD chunks in "
           "parallel) */")
  parts = [render_header(name, ins, outs, mapped), build, PORTABILITY, KERNEL_WARNINGS_OFF,
           PRELUDE, *helpers.values(), "\n".join(parallel), ""]
  # each kernel stays a function of its own, as on the CPU device: inlined into the public
  # function, gcc optimizes the loops worse (the digits CNN ran ~2x slower)
  parts += [f"static __attribute__((noinline)) {k.function}" for k in kernels.values()]
  parts.append(KERNEL_WARNINGS_ON)
  parts += [_constant(f"{name}_c{i}", d, dt)
            for i, (d, dt) in enumerate(zip(plan.constants, plan.constant_dtypes))]
  parts += [f"static {STORAGE[dt]} {names.scratch(dt)}[{max(n, 1)}] __attribute__((aligned(64)));"
            for dt, n in plan.scratch.items()]
  body = []
  for launch in plan.launches:
    kernel = kernels.get(launch.ast)
    body += _launch(names, kernel, tuple(plan.slots[s] for s in launch.slots))
  for dst, src in plan.copies:  # an output holding the same value as an earlier one
    spec = outs[dst]
    body += _launch(names, None, (Slot(Category.OUTPUT, dst, spec.numel, spec.dtype),
                                  Slot(Category.OUTPUT, src, spec.numel, spec.dtype)))
  indent = "    " if batched else "  "
  lines = [indent + ln for ln in body]
  if batched: lines = ["  for (int b = 0; b < batch; b++) {", *lines, "  }"]
  parts.append(f"void {name}({_params(ins, outs, batched)}) {{\n" + "\n".join(lines) + "\n}\n")
  return "\n".join(parts)
