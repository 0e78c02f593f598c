"""`@traced`: a composite Tensor op built once per signature, as the body of a FUNCTION.

An eager model rebuilds its whole graph at every call. A composite op such as the exact GELU
(about 60 nodes: erf's two polynomials) or attention (about 30) would rebuild all of its nodes
for each new input. Traced, its first call with a signature (the inputs' shapes, dtypes and
devices and the other arguments) runs the op on placeholders into a FUNCTION body, and every call
builds one FUNCTION over its inputs and one GETTUPLE per result. Realizing resolves the calls
(schedule/function.py), so the kernels are those of the op's own graph, and gradients flow
through (frontend/gradient.py). A graph alike the one realized last (the next step of an eager
loop) is matched to it call by call, without resolving the calls again (engine/entry.py).

The decorator only marks where the op's `op_function` (frontend/function.py) will be made: at
the op's first call, since the function machinery needs the Tensor class, which the mixins
holding the ops are part of.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["traced"]


def traced(op: F) -> F:
  """Build `op` once per signature as a FUNCTION body (see the module docstring). The op must be
  pure: no assign, no reading of values, no random numbers."""
  made: list[Callable[..., Any]] = []

  @functools.wraps(op)
  def call(*args: Any, **kwargs: Any) -> Any:
    if not made:
      from unigrad.frontend.function import op_function  # noqa: PLC0415 (imports Tensor)
      made.append(op_function(op))
    return made[0](*args, **kwargs)
  return call  # type: ignore[return-value]
