"""Recompiles a user can see: why a schedule missed the cache, and a warning when one graph keeps
missing it.

A schedule-cache miss for a function body of the same form as one scheduled before (the same ops
and dtypes in the same order: only shapes or constants differ) is a recompile the program could
avoid. `note_miss` counts them per form; with DEBUG>=1 it prints which shape or constant changed
and how many times this form was scheduled; the RECOMPILE_WARNING-th time it warns once (per
form) that a bound `Variable` or a few padded bucket sizes would let one compile serve them all.
The table is bounded (the forms seen last); it lives for the process.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from unigrad.helpers import bounded_put
from unigrad.knobs import DEBUG
from unigrad.uop import Ops, UOp

__all__ = ["note_miss", "RecompileWarning", "RECOMPILE_WARNING", "what_changed"]

RECOMPILE_WARNING = 8  # the recompile of one form that warns
FORMS_KEPT = 256


class RecompileWarning(UserWarning):
  """One graph was scheduled and compiled again and again for new shapes or constants."""


@dataclass
class Form:
  """How often bodies of one form were scheduled, and the last one."""
  count: int
  last: UOp
  warned: bool = False


_forms: dict[tuple, Form] = {}


def _form(body: UOp) -> tuple:
  return tuple((u.op, u.dtype) for u in body.toposort() if u.op is not Ops.VCONST)


def what_changed(old: UOp, new: UOp) -> str:
  """The first shape or constant in which two bodies of one form differ, in words."""
  for a, b in zip(old.toposort(), new.toposort()):
    if a.op is Ops.VCONST or a is b: continue
    if a.op is Ops.CONST and a.arg != b.arg: return f"a constant changed ({a.arg!r} -> {b.arg!r})"
    if a.shape != b.shape and a.op is not Ops.CONST:
      return f"a shape changed ({a.op.name} {a.shape} -> {b.shape})"
  return "an argument changed"


def note_miss(body: UOp) -> None:
  """A schedule-cache miss for `body` (see the module docstring)."""
  key = _form(body)
  form = _forms.get(key)
  if form is None:
    bounded_put(_forms, key, Form(1, body), FORMS_KEPT)
    return
  form.count += 1
  why = what_changed(form.last, body)
  form.last = body
  if DEBUG >= 1: print(f"schedule cache miss: this graph was scheduled {form.count} times; {why}")
  if form.count >= RECOMPILE_WARNING and not form.warned:
    form.warned = True
    warnings.warn(f"one graph has been scheduled and compiled {form.count} times for new shapes "
                  f"or constants ({why}): give the size that changes as a bound Variable "
                  "(Variable('n', lo, hi).bind(n)), pad to a few bucket sizes, or pass the "
                  "constant as a Tensor, so one compile serves every call", RecompileWarning,
                  stacklevel=4)
