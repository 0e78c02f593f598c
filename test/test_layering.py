"""The package's layering, read from every module's imports (ast: module level, function level
and `if TYPE_CHECKING:` blocks alike, since each is a dependency of the design).

Rules held here:
1. A module imports only modules of its own layer or of a lower tier of `LAYERS`; layers that
   share a tier are peers and do not import each other.
2. Neither engine/ nor codegen/ imports a device module (runtime/ops_*.py): they ask
   `Device[...]` for its renderer, compiler, allocator and capabilities.
3. No module imports another module's private name (`from unigrad.x import _name`).
An edge that breaks rule 1 or 2 today and that issue 26 removes is listed in `KNOWN_VIOLATIONS`;
the test fails on any edge not listed, and on a listed edge that is gone (delete it from the list).

Why `LAYERS` is not the order of ARCHITECTURE.md's package list. That list (knobs, helpers,
dtype, uop, frontend, schedule, codegen, renderer, runtime, engine, shape, nn, ...) is in the order
of the pipeline, and read as an import order ("a module imports only what is listed above it") it
would forbid what the design rests on: the frontend realizes tensors through the engine
(frontend -> engine, runtime, schedule), the scheduler asks codegen (rangeify and scatter use
codegen's expand and simplify), codegen asks the renderer's capabilities and the Device registry
(codegen -> renderer, runtime), and the frontend's strides use shape/. Nothing imports the other
way. So the tiers are derived from the imports the code has, and none of them is broken:
  knobs < helpers < dtype: the core modules, importing nothing above them;
  uop: the IR; shape: views over it (spec 004), needing only uop;
  renderer < runtime: a device module owns its renderer; the registry, Buffer and protocols are
    what codegen and the engine use;
  codegen < schedule < engine: the engine drives the scheduler and codegen;
  frontend: Tensor, which realizes through the engine;
  nn, multi: libraries of Tensor code (layers and state; the spec's collectives);
  export, viz, llm, onnx, distributed: the top packages, clients of the frontend and the engine,
    peers of each other;
  the public surface: tinygrad's module paths (unigrad.tensor, .device, .jit, .linalg, .ops),
    then `unigrad/__init__.py`; nothing inside the package imports them.
"""
from __future__ import annotations

import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "unigrad"

# tiers, lowest first: a layer is a top-level module or package of unigrad ("unigrad": the root)
LAYERS: tuple[tuple[str, ...], ...] = (
  ("knobs",),
  ("helpers",),
  ("dtype",),
  ("uop",),
  ("shape",),
  ("renderer",),
  ("runtime",),
  ("codegen",),
  ("schedule",),
  ("engine",),
  ("frontend",),
  ("nn", "multi"),
  ("export", "viz", "llm", "onnx", "distributed"),
  ("device", "jit", "linalg", "ops", "tensor"),
  ("unigrad",),
)
NO_DEVICE_MODULES = ("engine", "codegen")  # layers that may not import runtime/ops_*.py

# (importer, imported) edges that break a rule today; each goes when its issue-26 item lands
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def tier(name: str) -> int:
  return next(i for i, names in enumerate(LAYERS) if name in names)


Import = tuple[str, tuple[str, ...], int]  # (imported module, names taken from it, line)


def imports_in(source: str, package: str) -> list[Import]:
  """Every unigrad import in `source`, a module of `package` (relative imports resolve against
  it); `from unigrad.x import y` where unigrad.x.y is a module counts as an import of it."""
  out: list[Import] = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out += [(a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == "unigrad"]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([node.module] if node.module else []))
      if base.split(".")[0] != "unigrad": continue
      for a in node.names:
        sub = f"{base}.{a.name}"
        out.append((sub, (), node.lineno) if sub in MODULES else (base, (a.name,), node.lineno))
  return out


@functools.cache
def imports(module: str) -> tuple[Import, ...]:
  path = MODULES[module]
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  return tuple(imports_in(path.read_text(), package))


@functools.cache
def edges() -> frozenset[tuple[str, str]]:
  return frozenset((m, target) for m in MODULES for target, _, _ in imports(m))


def test_every_layer_has_a_tier() -> None:
  placed = {name for names in LAYERS for name in names}
  missing = sorted({layer(m) for m in MODULES} - placed)
  assert not missing, f"place {missing} in LAYERS (test/test_layering.py) and say why"


def layering_violations() -> set[tuple[str, str]]:
  """Edges from a module to a module of a higher tier or of a peer layer (rule 1)."""
  bad = set()
  for m, target in edges():
    a, b = layer(m), layer(target)
    if a != b and tier(b) >= tier(a): bad.add((m, target))
  return bad


def device_module_violations() -> set[tuple[str, str]]:
  """Edges from engine/ or codegen/ to a device module runtime/ops_*.py (rule 2)."""
  return {(m, t) for m, t in edges() if layer(m) in NO_DEVICE_MODULES and
          t.startswith("unigrad.runtime.ops_")}


def test_imports_point_down_the_layers() -> None:
  new = sorted(layering_violations() - KNOWN_VIOLATIONS)
  assert not new, "imports of a higher or peer layer (see LAYERS): " + ", ".join(
    f"{m} -> {t}" for m, t in new)


def test_engine_and_codegen_import_no_device_module() -> None:
  new = sorted(device_module_violations() - KNOWN_VIOLATIONS)
  assert not new, "engine/codegen import a device module (ask Device[...] instead): " + ", ".join(
    f"{m} -> {t}" for m, t in new)


def test_known_violations_still_exist() -> None:
  """The allow-list only shrinks: an edge that is gone must leave it."""
  gone = sorted(KNOWN_VIOLATIONS - layering_violations() - device_module_violations())
  assert not gone, "fixed, remove from KNOWN_VIOLATIONS: " + ", ".join(f"{m} -> {t}"
                                                                       for m, t in gone)


def test_no_private_names_across_modules() -> None:
  found = [f"{m}:{line} imports {name} from {target}" for m in MODULES
           for target, names, line in imports(m) for name in names
           if target != m and name.startswith("_") and not name.startswith("__")]
  assert not found, "make the helper public or move it: " + "; ".join(found)


def test_imports_in_sees_every_kind_of_import() -> None:
  """Function-level and TYPE_CHECKING imports count; relative imports resolve; a name that is a
  module counts as that module."""
  source = """
from typing import TYPE_CHECKING
from unigrad import knobs
import unigrad.uop.ops as ops
from . import callify
from ..codegen.expand import expand
if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor
def f():
  from unigrad.engine.realize import _private
"""
  got = {(t, names) for t, names, _ in imports_in(source, "unigrad.schedule")}
  assert got == {("unigrad.knobs", ()), ("unigrad.uop.ops", ()), ("unigrad.schedule.callify", ()),
                 ("unigrad.codegen.expand", ("expand",)), ("unigrad.frontend.tensor", ("Tensor",)),
                 ("unigrad.engine.realize", ("_private",))}
