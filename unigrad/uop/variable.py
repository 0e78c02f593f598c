"""Symbolic variables: bounded sizes that a program is compiled for once and run for any value.

Representation (spec: "a PARAM with bounds is a symbolic variable"; ARCHITECTURE.md decisions 3
and 6): `Variable("n", 1, 64)` is `PARAM(shape (), min, max)` with a `name` in its `ParamArg`.
The spec has no BIND op, so a bound variable is the same PARAM with the value recorded in its
arg (`ParamArg.value`, set by `UOp.bind`). Tensor graphs hold bound variables in their shapes
(movement ops carry shapes as index UOps, so `x[:n]` needs no special case); callify replaces
each bound variable by the unbound one and collects the values (`var_vals`, name -> int), so the
function body, the schedule cache key and every kernel AST hold only the variable and one
compiled kernel serves every value in [min, max]. The values are passed at launch: an `int`
kernel argument on CPU, an entry of the interpreter's environment on PYTHON.

A size is an `int` or an index UOp (`sint`). `concrete` evaluates one with the values bound in
it and raises `UnboundVariableError` naming the variable when one is unbound; `resolve` decides
a comparison of sizes from the variables' ranges (then their bound values).
"""
from __future__ import annotations

from collections.abc import Iterable

from unigrad.dtype import dtypes
from unigrad.uop.ops import Ops
from unigrad.uop.symbolic import sym_infer
from unigrad.uop.uop import UOp, sint

__all__ = ["Variable", "UnboundVariableError", "VariableBindError", "variables", "bound_values",
           "concrete", "concrete_shape", "resolve", "unbind_values", "simplify_size", "sizes_equal",
           "is_size", "divide_sizes", "products_equal"]


class UnboundVariableError(ValueError):
  """A symbolic size where a concrete one is needed, with a variable that has no value."""


class VariableBindError(ValueError):
  """One program binds a variable to two values (or two variables share a name)."""


def Variable(name: str, vmin: int, vmax: int) -> UOp:  # noqa: N802 (tinygrad's public name)
  """A symbolic size in [vmin, vmax]: `n = Variable("n", 1, 64)`; `n.bind(3)` gives it a value.
  Tensors can have it in their shapes (`x[:n.bind(3)]`); their kernels compile once for all n."""
  if isinstance(vmin, bool) or isinstance(vmax, bool) or not isinstance(vmin, int) \
     or not isinstance(vmax, int):
    raise TypeError(f"Variable {name!r}: min and max must be ints, got {vmin!r}, {vmax!r}")
  if vmin < 0: raise ValueError(f"Variable {name!r}: a size variable needs min >= 0, got {vmin}")
  return UOp.variable(name, vmin, vmax, dtypes.index)


def variables(x: sint | Iterable[sint]) -> list[UOp]:
  """The variables (bound or not) in a size or a shape, in first-seen order."""
  sizes = (x,) if isinstance(x, (int, UOp)) else tuple(x)
  out: dict[UOp, None] = {}
  for s in sizes:
    if isinstance(s, UOp): out.update((u, None) for u in s.toposort() if u.is_variable)
  return list(out)


def _describe(v: UOp) -> str: return f"{v.arg.name!r} in [{v.vmin}, {v.vmax}]"


def bound_values(x: sint | Iterable[sint]) -> dict[str, int]:
  """name -> value of the bound variables in a size or shape (VariableBindError on a conflict)."""
  out: dict[str, int] = {}
  for v in variables(x):
    if v.arg.value is None: continue
    if out.setdefault(v.arg.name, v.arg.value) != v.arg.value:
      raise VariableBindError(f"variable {_describe(v)} is bound to both {out[v.arg.name]} and "
                              f"{v.arg.value}")
  return out


def concrete(x: sint, what: str = "size") -> int:
  """The int value of a size for the values bound in it. Raises UnboundVariableError naming the
  variable when one has no value."""
  if isinstance(x, int): return x
  unbound = [v for v in variables(x) if v.arg.value is None]
  if unbound:
    names = ", ".join(_describe(v) for v in unbound)
    raise UnboundVariableError(f"symbolic shape where a concrete one is needed: the {what} "
                               f"{x.render()} has the unbound variable {names}; bind a value "
                               f"with `{unbound[0].arg.name}.bind(k)`")
  return int(sym_infer(x, {v: v.arg.value for v in variables(x)}))


def concrete_shape(shape: Iterable[sint]) -> tuple[int, ...]:
  """A shape with every symbolic size evaluated (see `concrete`)."""
  shape = tuple(shape)
  return tuple(concrete(s, f"size of axis {i} of shape {shape_str(shape)}")
               for i, s in enumerate(shape))


def shape_str(shape: Iterable[sint]) -> str:
  """`(n, 4)` for a shape with a variable n."""
  parts = [str(s) if isinstance(s, int) else s.render() for s in shape]
  return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


def resolve(cond: UOp | bool) -> bool:
  """A comparison of sizes decided from the variables' ranges, else from their bound values.
  Raises UnboundVariableError when neither decides it."""
  if isinstance(cond, bool): return cond
  lo, hi = cond.min_max  # most comparisons of sizes are decided by the bounds alone
  if lo == hi: return bool(lo)
  lo, hi = cond.simplify().min_max
  if lo == hi: return bool(lo)
  return bool(concrete(cond.cast(dtypes.index), "condition"))


def is_size(x: object) -> bool:
  """An int or a ()-shaped index UOp (a symbolic size)."""
  if isinstance(x, UOp): return x.dtype == dtypes.index and x.shape == ()
  return isinstance(x, int) and not isinstance(x, bool)


def simplify_size(x: sint) -> sint:
  """A size in its simplest form (an int when it is constant), so equal sizes are one node."""
  if isinstance(x, int) or x.op is Ops.PARAM: return x
  return x.simplify().sintify()


def sizes_equal(a: sint, b: sint) -> bool:
  """Whether two sizes are equal for every value of their variables (proven, not evaluated):
  the same factors, else their difference simplifies to 0."""
  if a is b: return True
  if isinstance(a, int) and isinstance(b, int): return a == b
  (ac, asyms), (bc, bsyms) = _factors((a,)), _factors((b,))
  if not asyms and not bsyms: return ac == bc
  if ac == bc and sorted(map(id, asyms)) == sorted(map(id, bsyms)): return True
  if isinstance(b, UOp): diff = (b - a).simplify()
  else:
    assert isinstance(a, UOp)  # not both ints: returned above
    diff = (-(a - b)).simplify()
  return diff.op is Ops.CONST and diff.arg == 0


def _factors(sizes: Iterable[sint]) -> tuple[int, list[UOp]]:
  """(the product of the int sizes, the symbolic sizes), products of sizes split into factors."""
  const, syms = 1, []
  stack = list(sizes)
  while stack:
    s = stack.pop()
    if isinstance(s, int): const *= s
    elif s.op is Ops.CONST: const *= s.arg
    elif s.op is Ops.MUL: stack.extend(s.src)
    else: syms.append(s)
  return const, syms


def products_equal(a: Iterable[sint], b: Iterable[sint]) -> bool:
  """Whether prod(a) == prod(b) for every value of the variables (see `sizes_equal`)."""
  a, b = tuple(a), tuple(b)
  (ac, asyms), (bc, bsyms) = _factors(a), _factors(b)
  if ac == bc and sorted(map(id, asyms)) == sorted(map(id, bsyms)): return True
  return sizes_equal(_product(a), _product(b))


def _product(sizes: Iterable[sint]) -> sint:
  out: sint = 1
  for s in sizes: out = s * out if isinstance(out, int) and isinstance(s, UOp) else out * s
  return out


def divide_sizes(num: Iterable[sint], den: Iterable[sint]) -> sint | None:
  """prod(num) / prod(den) when it divides for every value of the variables (each symbolic
  factor of den cancels one equal factor of num), else None."""
  nc, ns = _factors(num)
  dc, ds = _factors(den)
  for d in ds:
    match = next((i for i, x in enumerate(ns) if sizes_equal(x, d)), None)
    if match is None: return None
    ns.pop(match)
  if dc == 0 or nc % dc: return None
  out: sint = nc // dc
  for x in ns: out = x * out if isinstance(out, int) else out * x
  return simplify_size(out)


def unbind_values(u: UOp) -> tuple[UOp, dict[str, int]]:
  """`u` with each bound variable replaced by its variable, and name -> value."""
  vals = bound_values([u])
  sub = {v: v.unbind()[0] for v in variables([u]) if v.arg.value is not None}
  return (u.substitute(sub) if sub else u), vals
