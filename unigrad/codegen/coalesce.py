"""Coalesce: scalar loads and stores of neighbouring elements become one vector access.

GPU targets compute on scalars (a work item is one lane of the hardware's SIMD), but a memory
access can move a few elements at once (`float4`): on those targets (a renderer with
`access_lanes`) the unrolled UPCAST lanes that expand wrote side by side read and write memory
together.
Consumes: a lowered kernel (loads committed, integer index types), no vector values.
Produces: the same kernel where, for k in the renderer's `access_lanes` (widest first),
  * k ungated LOADs of one GLOBAL buffer at `base + c`, ..., `base + c + k-1` (the same base
    expression) are one `LOAD(INDEX(buf, base + c))` of a k-lane vector, each read as GEP(v, i);
  * k ungated STOREs of that form among the sources of one GROUP (the lanes of an unrolled
    loop) are one STORE of STACK(v0, ..., vk-1).
Only 4-byte element types are grouped (the C dialects' vector types). With `access_aligned`
(CUDA: a `float4` access needs a 16-byte address) a group is formed only where `base + c` is
provably a multiple of k: c and every coefficient of the base are. Buffers normally start aligned
(device allocations and the memory planner's offsets, schedule/memory.ALIGN, are multiples of 16
bytes); the CUDA renderer still checks a buffer's address, for views at odd offsets.
Invariants: every element is read and written exactly as before; the order of a buffer's
accesses within one work item is unchanged where it matters (stores depend on their values).
"""
from __future__ import annotations

from collections.abc import Callable

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.renderer import Renderer
from unigrad.uop.rewrite import rebuild
from unigrad.uop import Ops, UOp
from unigrad.uop.symbolic import linear_terms

__all__ = ["coalesce", "VECTOR_ELEMENTS"]

VECTOR_ELEMENTS = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
Key = tuple[UOp, frozenset[tuple[UOp, int]]]


def _access_key(ix: UOp) -> tuple[Key, int] | None:
  """(buffer, base terms) and the constant offset of a GLOBAL INDEX, or None."""
  if ix.op is not Ops.INDEX or ix.src[0].op is not Ops.PARAM: return None
  if ix.src[0].addrspace is not AddrSpace.GLOBAL or len(ix.src) != 2: return None
  terms, const = linear_terms(ix.src[1])
  return (ix.src[0], frozenset(terms.items())), const


def _is_aligned(key: Key, c: int, k: int) -> bool:
  return c % k == 0 and all(coeff % k == 0 for _, coeff in key[1])


def _runs(offsets: dict[int, UOp], key: Key, lanes: tuple[int, ...],
          aligned: bool) -> list[list[UOp]]:
  """Disjoint runs of k consecutive offsets (widest k first), each in offset order."""
  out: list[list[UOp]] = []
  free = dict(offsets)
  for k in lanes:
    for c in sorted(free):
      if c not in free or any(c + i not in free for i in range(k)): continue
      if aligned and not _is_aligned(key, c, k): continue
      out.append([free.pop(c + i) for i in range(k)])
  return out


def _groups(nodes: list[UOp], index_of: Callable[[UOp], UOp], lanes: tuple[int, ...],
            aligned: bool) -> list[list[UOp]]:
  """`nodes` (loads or stores) grouped into runs of neighbouring addresses."""
  by_key: dict[Key, dict[int, UOp]] = {}
  for u in nodes:
    if (got := _access_key(index_of(u))) is None: continue
    by_key.setdefault(got[0], {}).setdefault(got[1], u)
  return [run for key, offs in by_key.items() for run in _runs(offs, key, lanes, aligned)]


def _is_candidate(u: UOp, dt: DType) -> bool:
  return dt in VECTOR_ELEMENTS and u.src[0].op is Ops.INDEX


def _fold_loads(ast: UOp, ren: Renderer) -> UOp:
  loads = [u for u in ast.toposort() if u.op is Ops.LOAD and len(u.src) == 1
           and _is_candidate(u, u.dtype)]
  sub: dict[UOp, UOp] = {}
  for run in _groups(loads, lambda u: u.src[0], ren.access_lanes, ren.access_aligned):
    vec = UOp(Ops.LOAD, run[0].dtype.vec(len(run)), (run[0].src[0],))
    sub.update({u: UOp(Ops.GEP, u.dtype, (vec,), (i,)) for i, u in enumerate(run)})
  return ast.substitute(sub) if sub else ast


def _fold_group(g: UOp, ren: Renderer) -> UOp:
  """A GROUP whose neighbouring scalar STOREs become vector STOREs."""
  stores = [u for u in g.src if u.op is Ops.STORE and len(u.src) == 2
            and _is_candidate(u, u.src[1].dtype)]
  runs = _groups(stores, lambda u: u.src[0], ren.access_lanes, ren.access_aligned)
  if not runs: return g
  first = {run[0]: run for run in runs}
  folded = {u for run in runs for u in run}
  src: list[UOp] = []
  for u in g.src:
    if u in first:
      run = first[u]
      val = UOp(Ops.STACK, u.src[1].dtype.vec(len(run)), tuple(s.src[1] for s in run))
      src.append(u.replace(src=(u.src[0], val)))
    elif u not in folded: src.append(u)
  return g.replace(src=tuple(src))


def coalesce(ast: UOp, ren: Renderer) -> UOp:
  """The kernel with neighbouring accesses as vector accesses (see the module docstring)."""
  if not ren.access_lanes: return ast
  ast = _fold_loads(ast, ren)
  memo: dict[UOp, UOp] = {}
  for u in ast.toposort():  # bottom up: a GROUP sees its sources already folded
    new_src = tuple([memo[s] for s in u.src])
    x = rebuild(u, new_src)
    memo[u] = _fold_group(x, ren) if x.op is Ops.GROUP else x
  return memo[ast]
