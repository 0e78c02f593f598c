"""OptKernel: a kernel AST with its axes, to which Opts apply one at a time (purely).

Axes are the kernel's RANGEs sorted by (axis type order, id): THREAD and LOOP axes first, then
REDUCE, then UPCAST and UNROLL. `apply(opt)` returns a new OptKernel; an illegal opt raises
KernelOptError and leaves the kernel untouched. `vector_range(vector_bytes)` is the range codegen
would make vector lanes (codegen/vectorize.py's choose_vector_range, asked once per kernel);
`with_vector` records a choice, which `finalize` writes into the KernelInfo for expand to keep.
A kernel whose KernelInfo says it is not `parallel` takes no THREAD or LOCAL split.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from unigrad.codegen.expand import identity_element
from unigrad.codegen.opt import SPLIT_FROM, KernelOptError, Opt, OptOps
from unigrad.codegen.opt.pack import PACK_SLOTS_START, pack_ast
from unigrad.codegen.opt.tc import tensor_core_ast
from unigrad.codegen.vectorize import choose_vector_range
from unigrad.renderer.tensor_core import TensorCore
from unigrad.dtype import dtypes
from unigrad.uop.rewrite import rebuild
from unigrad.uop import AxisType, KernelInfo, Ops, RangeArg, UOp
from unigrad.uop.ops import AXIS_ORDER, Invalid


def axis_key(r: UOp) -> tuple[int, int]: return (AXIS_ORDER[r.arg.axis_type], r.arg.id)


def _rebuild_ends(x: UOp, parts: tuple[UOp, ...]) -> UOp:
  """END over several ranges, innermost first."""
  for r in sorted(parts, key=axis_key, reverse=True): x = UOp(Ops.END, x.dtype, (x, r))
  return x


def replace_range(ast: UOp, r: UOp, expr: UOp, parts: tuple[UOp, ...]) -> UOp:
  """Use `expr` for `r` in every value; loops closing `r` close each of `parts` instead."""
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():
    if u is r:
      memo[u] = expr
      continue
    if u.op is Ops.END and u.src[1] is r:
      memo[u] = _rebuild_ends(memo[u.src[0]], parts)
      continue
    if u.op is Ops.REDUCE and r in u.src[1:]:
      rs = tuple(p for s in u.src[1:] for p in (parts if s is r else (s,)))
      memo[u] = u.replace(src=(memo[u.src[0]], *rs))
      continue
    new_src = tuple([memo[s] for s in u.src])
    memo[u] = rebuild(u, new_src)
  return normalize_ends(memo[ast])


def normalize_ends(ast: UOp) -> UOp:
  """Every chain END(END(x, a), b)... nests its loops in axis order: outermost first, so UPCAST and
  UNROLL loops sit innermost, right around the stores they repeat."""
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():
    if u.op is Ops.END:
      base, rs = u, []
      while base.op is Ops.END:
        rs.append(base.src[1])
        base = base.src[0]
      memo[u] = _rebuild_ends(memo[base], tuple(rs))
      continue
    new_src = tuple([memo[s] for s in u.src])
    memo[u] = rebuild(u, new_src)
  return memo[ast]


@dataclass(frozen=True)
class OptKernel:
  ast: UOp
  applied: tuple[Opt, ...] = ()
  dont_use_locals: bool = False
  vector: tuple[int, ...] | None = None  # the vector range's id as chosen (KernelInfo.vector)

  @functools.cached_property
  def axes(self) -> list[UOp]:
    return sorted((u for u in self.ast.toposort() if u.op is Ops.RANGE), key=axis_key)

  @property
  def sizes(self) -> list[int]:
    return [r.src[0].arg if r.src[0].op is Ops.CONST else -1 for r in self.axes]

  @property
  def max_sizes(self) -> list[int]:
    """Each loop's size, a symbolic one at its largest value (for work estimates)."""
    return [int(r.src[0].vmax) for r in self.axes]

  def axis_types(self) -> list[AxisType]: return [r.arg.axis_type for r in self.axes]

  def name(self) -> str:
    """`r_` (reduce) or `E_`, then each loop as its axis-type letter and size."""
    types = self.axis_types()
    is_reduce = any(t in (AxisType.REDUCE, AxisType.UNROLL, AxisType.GROUP_REDUCE) for t in types)
    prefix = "r" if is_reduce else "E"
    sizes = (s if s >= 0 else "n" for s in self.sizes)  # n: a symbolic loop
    return "_".join([prefix, *(f"{t.letter}{s}" for t, s in zip(types, sizes))])

  def finalize(self) -> UOp:
    """The AST with its KernelInfo (name, applied opts, the vector range chosen)."""
    info = self.ast.arg if isinstance(self.ast.arg, KernelInfo) else KernelInfo()
    return self.ast.replace(arg=replace(info, name=self.name(), applied_opts=self.applied,
                                        dont_use_locals=self.dont_use_locals, vector=self.vector))

  @functools.cached_property
  def _vectors(self) -> dict[int, UOp | None]: return {}

  def vector_range(self, vector_bytes: int) -> UOp | None:
    """The range codegen would make vector lanes on a target with `vector_bytes` vectors (chosen
    once per kernel and width)."""
    if vector_bytes not in self._vectors:
      self._vectors[vector_bytes] = choose_vector_range(self.ast, vector_bytes)
    return self._vectors[vector_bytes]

  def with_vector(self, r: UOp | None) -> OptKernel:
    """This kernel with `r` recorded as its vector range (None: no vector)."""
    out = replace(self, vector=() if r is None else (r.arg.id,))
    out.__dict__.update({k: v for k, v in self.__dict__.items() if k in ("axes", "_vectors")})
    return out  # the same AST: what was derived of it holds

  @property
  def parallel(self) -> bool:
    return not isinstance(self.ast.arg, KernelInfo) or self.ast.arg.parallel

  def _axis(self, axis: int | None) -> UOp:
    if axis is None or not 0 <= axis < len(self.axes):
      raise KernelOptError(f"axis {axis} out of range: the kernel has {len(self.axes)} axes")
    return self.axes[axis]

  def apply(self, opt: Opt) -> OptKernel:
    """This kernel with `opt` applied (raises KernelOptError if it cannot apply)."""
    if opt.op is not OptOps.PACK and any(o.op is OptOps.PACK for o in self.applied):
      raise KernelOptError("PACK must be the last opt")
    if opt.op is OptOps.SPLIT: ast = self._split(opt)
    elif opt.op is OptOps.PADTO: ast = self._padto(opt)
    elif opt.op is OptOps.SWAP: ast = self._swap(opt)
    elif opt.op is OptOps.NOLOCALS:
      if any(t is AxisType.LOCAL for t in self.axis_types()):
        raise KernelOptError("NOLOCALS after LOCAL")
      return replace(self, applied=self.applied + (opt,), dont_use_locals=True)
    elif opt.op is OptOps.TC: ast = self._tc(opt)
    elif opt.op is OptOps.PACK: ast = self._pack(opt)
    else: raise KernelOptError(f"unknown opt {opt!r}")
    return OptKernel(ast, self.applied + (opt,), self.dont_use_locals)

  def _tc(self, opt: Opt) -> UOp:
    """TC(reduce axis, TensorCore): the matmul on tensor cores (codegen/opt/tc.py)."""
    if self.applied: raise KernelOptError("TC must be the first opt")
    if not isinstance(opt.arg, TensorCore):
      raise KernelOptError(f"TC takes one of the target's tensor cores (a TensorCore of its "
                           f"renderer), got {opt.arg!r}")
    r = self._axis(opt.axis)
    if r.arg.axis_type is not AxisType.REDUCE:
      raise KernelOptError(f"TC applies to a REDUCE axis, not {r.arg.axis_type.name}")
    return tensor_core_ast(self.ast, r, opt.arg)

  def _pack(self, opt: Opt) -> UOp:
    """PACK(axis, slot): the input in `slot` read from a panel copied once per iteration of
    `axis` (codegen/opt/pack.py)."""
    if not isinstance(opt.arg, int):
      raise KernelOptError(f"PACK takes a PARAM slot, got {opt.arg!r}")
    new_id = max(a.arg.id for a in self.axes) + 1
    panels = sum(o.op is OptOps.PACK for o in self.applied)
    return pack_ast(self.ast, self._axis(opt.axis), opt.arg, new_id, PACK_SLOTS_START + panels)

  def _split(self, opt: Opt) -> UOp:
    k, target, top = opt.arg
    r = self._axis(opt.axis)
    n = r.src[0].arg if r.src[0].op is Ops.CONST else None
    src_type = r.arg.axis_type
    if target not in SPLIT_FROM or src_type not in SPLIT_FROM[target]:
      raise KernelOptError(f"cannot split a {target.name} axis out of a {src_type.name} axis")
    if target is AxisType.LOCAL and self.dont_use_locals:
      raise KernelOptError("LOCAL after NOLOCALS")
    if target in (AxisType.THREAD, AxisType.LOCAL) and not self.parallel:
      raise KernelOptError(f"a {target.name} split of a kernel whose iterations run in order")
    if target is AxisType.THREAD and any(t is AxisType.THREAD for t in self.axis_types()):
      raise KernelOptError("a kernel has at most one THREAD axis")
    if n is None: raise KernelOptError(f"axis {opt.axis} has a symbolic size")
    if not isinstance(k, int) or k <= 1 or n % k or n == 0:  # 0 % k == 0, but 0 trips have no lanes
      raise KernelOptError(f"axis {opt.axis} of size {n} cannot be split by {k}")
    new_id = max(a.arg.id for a in self.axes) + 1
    old = UOp.range(n // k, r.arg.id, src_type)
    new = UOp.range(k, new_id, target)
    expr = new * (n // k) + old if top else old * k + new
    return replace_range(self.ast, r, expr, (old, new))

  def _padto(self, opt: Opt) -> UOp:
    r = self._axis(opt.axis)
    m = opt.arg
    n = r.src[0].arg if r.src[0].op is Ops.CONST else None
    if n is None or not isinstance(m, int) or m <= 1:
      raise KernelOptError(f"PADTO {m} on axis {opt.axis}")
    if r.arg.axis_type in (AxisType.UPCAST, AxisType.UNROLL, AxisType.THREAD):
      raise KernelOptError(f"cannot pad a {r.arg.axis_type.name} axis")
    padded = math.ceil(n / m) * m
    if padded == n:
      raise KernelOptError(f"axis {opt.axis} of size {n} is already a multiple of {m}")
    if padded > 4 * n: raise KernelOptError(f"PADTO {m} would more than quadruple axis {opt.axis}")
    new = UOp.range(padded, r.arg.id, r.arg.axis_type)
    ast = replace_range(self.ast, r, new, (new,))
    clamp = (new < n).where(new, n - 1) if stores_all_depend_on(ast, new) else None
    return mask_padded(ast, new, new < n, clamp)

  def _swap(self, opt: Opt) -> UOp:
    a, b = self._axis(opt.axis), self._axis(opt.arg)
    if (a is b or a.arg.axis_type != b.arg.axis_type
        or a.arg.axis_type not in (AxisType.LOOP, AxisType.GLOBAL)):
      raise KernelOptError("SWAP needs two different LOOP/GLOBAL axes")
    a2 = a.replace(arg=RangeArg(b.arg.id, a.arg.axis_type))
    b2 = b.replace(arg=RangeArg(a.arg.id, b.arg.axis_type))
    memo: dict[UOp, UOp] = {}
    for u in self.ast.toposort():
      if u is a or u is b:
        memo[u] = a2 if u is a else b2
        continue
      new_src = tuple([memo[s] for s in u.src])
      if u.op is Ops.END and u.src[1] in (a, b): new_src = (new_src[0], b2 if u.src[1] is a else a2)
      memo[u] = rebuild(u, new_src)
    return memo[self.ast]


def stores_all_depend_on(ast: UOp, r: UOp) -> bool:
  """Whether every STORE's address depends on output range `r` (so an iteration of r stores
  only its own elements), and no REDUCE runs over r."""
  if r.arg.axis_type not in (AxisType.LOOP, AxisType.GLOBAL): return False
  nodes = ast.toposort()
  if any(u.op is Ops.REDUCE and r in u.src[1:] for u in nodes): return False
  return all(r in u.src[0].src[1].toposort() for u in nodes if u.op is Ops.STORE)


def mask_padded(ast: UOp, r: UOp, valid: UOp, clamp: UOp | None = None) -> UOp:
  """Iterations of `r` outside `valid` touch no memory and add the identity to reductions. With
  `clamp` (an index in bounds; only where every store depends on r, see stores_all_depend_on),
  reads use it for r instead of a gate: a padded iteration reads real elements and stores
  nothing, and the reads stay plain loads (a register tile's gated loads of A ran at half speed
  in its inner loop)."""
  stored = {u.src[0] for u in ast.toposort() if u.op is Ops.STORE}
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():
    new_src = tuple([memo[s] for s in u.src])
    x = rebuild(u, new_src)
    if x.op is Ops.INDEX and x.src[0].op is Ops.PARAM and r in x.src[1].toposort():
      if clamp is not None and u not in stored:
        x = x.replace(src=(x.src[0], x.src[1].substitute({r: clamp})))
      else: x = x.replace(src=(x.src[0], valid.where(x.src[1], UOp.const(dtypes.index, Invalid))))
    elif x.op is Ops.REDUCE and r in x.src[1:]:
      ident = UOp.const(x.dtype, identity_element(x.arg.op, x.dtype))
      x = x.replace(src=(valid.where(x.src[0], ident), *x.src[1:]))
    memo[u] = x
  return memo[ast]
