"""Trace: run a function on placeholders into the function layer's FUNCTION node, for export.

Consumes: a Python function on Tensors and one `TensorSpec` per input.
Produces: a `Trace`: `FUNCTION(TUPLE(results...), *placeholders, *captured)` (built by
`unigrad.function`, so captured tensors such as model weights are lifted to PARAMs exactly as
`@function` does), the output specs and the placeholders.
Invariants: every result is a Tensor; each Tensor the function returns is an output of its own,
in order, even when the same Tensor (or the same value) is returned twice: the FUNCTION holds
each distinct value once and `Trace.results` says which one each output holds;
multi-dimensional results are made contiguous (row-major output buffers, whatever view chain
produced them) and results that are views of an input are made contiguous too: the two fixups of
seed 003 (tinygrad needs `+ 0` for the second; here a CONTIGUOUS result always gets an output
buffer of its own, so a view of an input becomes a copy kernel, and bool results keep their
dtype). Reading a traced value in Python (data-dependent control flow) raises `ExportError` at
trace time.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from unigrad.dtype import DType, dtypes, to_dtype
from unigrad.frontend.function import FunctionError, TensorLeaf, flatten_tensors, function
from unigrad.frontend.tensor import Tensor
from unigrad.schedule.callify import CallifyError
from unigrad.uop import Ops, UOp

__all__ = ["ExportError", "TensorSpec", "Trace", "to_spec", "trace"]

EXPORT_DEVICE = "CPU"
# dtypes with no C storage type in the exported source
UNEXPORTABLE = (dtypes.index, dtypes.void)
MOVEMENT = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)


class ExportError(RuntimeError):
  """A function cannot be exported as it is (what it returned or did while being traced)."""


@dataclass(frozen=True)
class TensorSpec:
  """The shape and dtype of one input or output: a C-contiguous row-major array."""
  shape: tuple[int, ...]
  dtype: DType

  @property
  def numel(self) -> int: return math.prod(self.shape)


def to_spec(x: Any, where: str) -> TensorSpec:
  """An example input (a Tensor or a `(shape, dtype)` pair) as a TensorSpec, validated."""
  if isinstance(x, Tensor): shape, dt = tuple(x.shape), x.dtype
  elif isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], (tuple, list)):
    shape, dt = tuple(x[0]), _dtype(x[1], where)
  else:
    raise TypeError(f"{where}: expected a Tensor or a (shape, dtype) pair, got {x!r}")
  bad = [s for s in shape if not isinstance(s, int) or isinstance(s, bool) or s < 0]
  if bad:
    raise ValueError(f"{where}: invalid shape {shape}: sizes must be ints >= 0 "
                     f"(symbolic sizes are not supported here; use svmap for a runtime batch)")
  if dt in UNEXPORTABLE or dt.count != 1:
    raise TypeError(f"{where}: dtype {dt!r} has no C type in an exported function")
  return TensorSpec(shape, dt)


def _dtype(x: Any, where: str) -> DType:
  try: return to_dtype(x)
  except (TypeError, ValueError, KeyError, AttributeError) as e:
    raise TypeError(f"{where}: {x!r} is not a dtype") from e


@dataclass(frozen=True)
class Trace:
  """A traced function: its FUNCTION node (placeholders, then captured values, as arguments),
  the placeholders, the output specs, and for output i the index of the FUNCTION's result it
  holds (`results[i]`; two outputs of the same value share one)."""
  function: UOp
  placeholders: tuple[Tensor, ...]
  outputs: tuple[TensorSpec, ...]
  results: tuple[int, ...]

  @property
  def captured(self) -> tuple[UOp, ...]:
    """The values the body read from outside (model weights): the constants."""
    return self.function.src[1 + len(self.placeholders):]


def trace(fn: Callable[..., Any], specs: Sequence[TensorSpec], name: str) -> Trace:
  """Run `fn` once on `Tensor.empty` placeholders (see the module docstring)."""
  holders = tuple(Tensor.empty(*s.shape, dtype=s.dtype, device=EXPORT_DEVICE) for s in specs)
  results: list[int] = []
  traced = function(_with_fixups(fn, name, results), allow_writes=False)
  try: outs = traced(*holders)
  except CallifyError as e:
    raise ExportError(f"{name}: the function reads the value of a traced tensor in Python "
                      "(data-dependent control flow such as `if x.sum() > 0`, item(), "
                      "numpy()); an exported function must compute its results with tensor ops "
                      "only (use Tensor.where for a data-dependent choice)") from e
  except FunctionError as e: raise ExportError(f"{name}: {e}") from e
  f = outs[0].uop.src[0]
  assert f.op is Ops.FUNCTION, f"expected GETTUPLE(FUNCTION), got {f.op}"
  specs_out = tuple(TensorSpec(tuple(int(s) for s in outs[r].shape), outs[r].dtype)
                    for r in results)
  return Trace(f, holders, specs_out, tuple(results))


def _with_fixups(fn: Callable[..., Any], name: str, results: list[int]) -> Callable[..., Any]:
  """`fn` returning a tuple of its distinct result values, with seed 003's two fixups applied;
  fills `results` with the index of the value each returned Tensor holds, in order."""

  def fixed(*args: Tensor) -> tuple[Tensor, ...]:
    params = {a.uop for a in args}
    result = fn(*args)
    tree = flatten_tensors(result, {})
    if not isinstance(result, (Tensor, tuple, list)) or _has_non_tensor(tree):
      raise ExportError(f"{name} returned {_describe(result)}; an exported function must "
                        "return a Tensor or a tuple/list of Tensors")
    distinct: dict[UOp, int] = {}  # a value -> its index among the function's results
    values: list[Tensor] = []
    results.clear()
    for leaf in _leaves(result):
      t = _fixup(leaf, params)
      if t.uop not in distinct:
        distinct[t.uop] = len(values)
        values.append(t)
      results.append(distinct[t.uop])
    return tuple(values)
  fixed.__name__ = name
  return fixed


def _leaves(tree: Tensor | tuple | list) -> list[Tensor]:
  """Every Tensor of a returned tree of tuples and lists, in order, repeats included."""
  if isinstance(tree, Tensor): return [tree]
  return [t for x in tree for t in _leaves(x)]


def _has_non_tensor(tree: Any) -> bool:
  if isinstance(tree, (tuple, list)): return not tree or any(map(_has_non_tensor, tree))
  return not isinstance(tree, TensorLeaf)


def _describe(x: Any) -> str:
  if isinstance(x, (tuple, list)):
    return f"a {type(x).__name__} of ({', '.join(map(_describe, x))})"
  return type(x).__name__


def _fixup(t: Tensor, params: set[UOp]) -> Tensor:
  """Outputs that view an input get a copy of their own; multi-dim outputs are contiguous."""
  if t.dtype in UNEXPORTABLE: raise ExportError(f"output dtype {t.dtype!r} has no C type")
  u = t.uop
  while u.op in MOVEMENT: u = u.src[0]
  return t.contiguous() if t.ndim > 1 or u in params else t
