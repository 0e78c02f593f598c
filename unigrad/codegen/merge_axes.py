"""Adjacent axes merged into one before the opts, where every index reads them as one.

Rangeify gives a kernel one range per dimension of its output and of its reduction. Two adjacent
ranges a (size A, outer) and b (size B, inner) of one kind are one loop over a*B + b wherever
every index arithmetic that reads them scales a exactly B times b (a contiguous (h, w) image, a
convolution weight's (cin, kh, kw) copied to (cin, kh, kw, cout)). Merged, the heuristics see one
long axis: it divides into vector lanes and threads where its parts did not (a 10x10 image takes
no 16-lane vector, its 100 pixels take 4-lane ones; the transposing copy of a (512, 256, 5) weight
had a contiguous axis of 5 and ran as scalar moves, 3 GB/s).

The test is structural and cheap (no simplification is tried): every maximal index expression
that reads a or b must be linear in them with coefficients (B*k, k), and a and b must close the
same loops (END) and the same REDUCEs. Loops run in the same order either way, so a reduction
sums in the same order.
"""
from __future__ import annotations

from collections.abc import Iterable

from unigrad.codegen.simplify import pm_kernel_simplify
from unigrad.dtype import dtypes
from unigrad.uop import AxisType, Ops, UOp, graph_rewrite
from unigrad.uop.symbolic import linear_terms

_ARITH = (Ops.ADD, Ops.MUL)


def _size(r: UOp) -> int | None:
  return r.src[0].arg if r.src[0].op is Ops.CONST and isinstance(r.src[0].arg, int) else None


def _index_arith(u: UOp) -> bool: return u.op in _ARITH and u.dtype == dtypes.index


def _reads_as_one(nodes: Iterable[UOp], a: UOp, b: UOp, inner: int) -> bool:
  """Whether every maximal index expression over a or b (an operand of a node that is not index
  arithmetic: an INDEX, a comparison, an integer division) is k*(a*inner + b) plus terms free
  of both."""
  for u in nodes:
    if u.op in (Ops.END, Ops.REDUCE) or _index_arith(u): continue
    for s in u.src:
      if s is not a and s is not b and not (_index_arith(s) and (a in s.ranges or b in s.ranges)):
        continue
      terms, _ = linear_terms(s)
      ka, kb = terms.pop(a, 0), terms.pop(b, 0)
      if ka != inner * kb or any(t is a or t is b or a in t.ranges or b in t.ranges for t in terms):
        return False
  return True


def _same_loops(nodes: Iterable[UOp], a: UOp, b: UOp) -> bool:
  """a and b close the same loops (each END over a directly around one over b) and are reduced
  by the same REDUCEs."""
  ends_a = [u for u in nodes if u.op is Ops.END and u.src[1] is a]
  ends_b = [u for u in nodes if u.op is Ops.END and u.src[1] is b]
  if len(ends_a) != len(ends_b) or any(e.src[0].op is not Ops.END or e.src[0].src[1] is not b
                                       for e in ends_a): return False
  return all((a in u.src[1:]) == (b in u.src[1:]) for u in nodes if u.op is Ops.REDUCE)


def _merge(ast: UOp, a: UOp, b: UOp, inner: int) -> UOp:
  """`ast` with a and b one range n (a's id): a reads n // inner, b n % inner."""
  n = a.replace(src=(UOp.const(dtypes.index, _size(a) * inner),))  # type: ignore[operator]
  memo: dict[UOp, UOp] = {a: n // inner, b: n % inner}
  for u in ast.toposort():
    if u in memo: continue
    if u.op is Ops.END and u.src[1] is a: memo[u] = u.replace(src=(memo[u.src[0]], n))
    elif u.op is Ops.END and u.src[1] is b: memo[u] = memo[u.src[0]]
    elif u.op is Ops.REDUCE and a in u.src[1:]:
      rs = (n if s is a else s for s in u.src[1:] if s is not b)
      memo[u] = u.replace(src=(memo[u.src[0]], *rs))
    else:
      src = tuple(memo[s] for s in u.src)
      memo[u] = u if src == u.src else u.replace(src=src)
  return memo[ast]


MERGED_TYPES = (AxisType.LOOP, AxisType.REDUCE)


def merge_axes(ast: UOp) -> UOp:
  """The simplified kernel `ast` with every mergeable pair of adjacent LOOP or REDUCE ranges
  merged (see the module docstring), innermost pairs first, simplified after each merge (the
  next pair's test reads the merged index as linear again)."""
  while True:
    nodes = ast.toposort()
    ranges = sorted((u for u in nodes if u.op is Ops.RANGE), key=lambda r: r.arg.id)
    for a, b in reversed(list(zip(ranges, ranges[1:]))):
      if a.arg.axis_type is not b.arg.axis_type or a.arg.axis_type not in MERGED_TYPES: continue
      if (inner := _size(b)) is None or _size(a) is None: continue
      if _same_loops(nodes, a, b) and _reads_as_one(nodes, a, b, inner):
        ast = graph_rewrite(_merge(ast, a, b, inner), pm_kernel_simplify, name="merge axes")
        break
    else: return ast
