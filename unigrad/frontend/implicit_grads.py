"""The gradients of tensors whose `requires_grad` is None (tinygrad's default), kept lazily.

tinygrad's `loss.backward()` gives `.grad` to every float tensor the loss depends on; PyTorch only
to those with `requires_grad=True`. unigrad gives both: True tensors as PyTorch (a `.grad` tensor,
accumulated), None ones as tinygrad, but such a gradient costs nothing until it is read. It is
not a live Tensor (a realize that overwrites a buffer computes every live lazy value reading it
first, frontend/writes.py: an input batch's gradient would be computed at every optimizer step),
not even a graph: backward() keeps on the tensor what it needs to differentiate for it
(`_implicit_grad`: the root, its gradient, the tensor's node), and the first read of `.grad`
differentiates and makes it a Tensor (the class attribute `ImplicitGrad`, consulted only while
the tensor has no `grad` of its own), so a PyTorch-style loop's input batch costs no graph
building either.

A read after a buffer the graph reads was overwritten (an optimizer step after `backward()`)
raises: the values it was made from are gone (read `.grad` before the step, or set
requires_grad=True). So does a read of contributions of several `backward()` calls with a write
in between (only the last one's is kept). Setting `t.grad = None` forgets it.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unigrad import engine
from unigrad.uop import UOp

if TYPE_CHECKING:
  from unigrad.frontend.tensor import Tensor


@dataclass(frozen=True)
class Recipe:
  """What one backward() needs to give a tensor its gradient: the root graph, the gradient
  flowing into it, and the tensor's node in it."""
  root: UOp
  root_grad: UOp
  target: UOp


@dataclass(frozen=True)
class PendingGrad:
  """A None tensor's gradient, not yet differentiated: the recipes of the backward() calls that
  reached it, the write epoch they were made in, and whether earlier ones were dropped (a write
  came between two backward() calls)."""
  recipes: tuple[Recipe, ...]
  epoch: int
  partial: bool = False


def keep(t: Tensor, recipe: Recipe) -> None:
  """Add a backward()'s contribution to the lazy gradient of `t` (requires_grad None, no `.grad`
  tensor of its own)."""
  d = t.__dict__
  prev = None if "grad" in d else d.get("_implicit_grad")
  d.pop("grad", None)  # `t.grad` now reads the class attribute (ImplicitGrad)
  epoch = engine.history.epoch
  if prev is None: d["_implicit_grad"] = PendingGrad((recipe,), epoch)
  elif prev.epoch == epoch:
    d["_implicit_grad"] = PendingGrad((*prev.recipes, recipe), epoch, prev.partial)
  else: d["_implicit_grad"] = PendingGrad((recipe,), epoch, True)


Differentiate = Callable[[UOp, UOp, list[UOp]], dict[UOp, UOp]]


class ImplicitGrad:
  """`Tensor.grad` of a tensor with no `grad` of its own: its kept gradient, differentiated now
  (`differentiate` is compute_gradient) and made its own `grad`, or None."""

  def __init__(self, differentiate: Differentiate) -> None: self.differentiate = differentiate

  def __get__(self, t: Any, owner: Any = None) -> Any:
    if t is None: return self
    p: PendingGrad | None = t.__dict__.get("_implicit_grad")
    if p is None: return None
    if p.partial:
      raise RuntimeError("this tensor's .grad (requires_grad=None) sums several backward() calls "
                         "with a buffer write in between (an optimizer step), of which only the "
                         "last is kept; read .grad after each backward(), or set "
                         "requires_grad=True to accumulate it")
    if any(engine.history.current((r.root, p.epoch)) is None for r in p.recipes):
      raise RuntimeError("this tensor's .grad (requires_grad=None) was made by backward() from "
                         "buffers overwritten since (an optimizer step): read .grad before the "
                         "step, or set requires_grad=True to have it computed with the step")
    del t.__dict__["_implicit_grad"]
    gs = [self.differentiate(r.root, r.root_grad, [r.target]).get(r.target) for r in p.recipes]
    total = None
    for g in gs:
      if g is not None: total = g if total is None else total + g
    grad = t._wrap(total) if total is not None else t.zeros_like()
    t.__dict__["grad"] = grad
    return grad
