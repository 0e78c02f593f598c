"""transpose_sums: the horizontal sums of a tile of vector partial sums become one transposed
sum, and the outputs stored side by side are computed as one vector.

A kernel whose vector lanes are partial sums along its reduce axis (the heuristics' DotPlan,
`x @ W.T` with W stored (out, in), and ReducePlan) ends each output with a horizontal sum of its
accumulator's lanes (`(v[0]+v[1])+...`, expand's split_lane_reduce): ~2 instructions a lane, and
everything after it (bias, GELU: ~100 operations) runs on scalars, once per output.
Consumes: a vectorized kernel (vectorize's output).
Produces: the same kernel where, among the STOREs of one GROUP (the unrolled outputs of a tile),
k stores of one buffer at `base + c`, ..., `base + c + k-1` whose values each hold the complete
horizontal sum of a k-lane vector (k = 4 or 8) get
  * the k sums from one transposed sum: log2(k) levels of two shuffles and one add on pairs of
    vectors (`_transposed_sum`, 21 instructions for 8 outputs of 8 lanes instead of 112),
  * their values computed as one vector (`_lanes`: the k scalar trees are the same operations on
    lane j's inputs: loads at consecutive addresses become one vector load, values the lanes
    share are broadcast) and stored with one vector store; where the trees differ, each value
    reads its lane of the transposed sum and is stored as before.
Invariants: every output gets the value it got before (sums reassociated only across lanes);
no access to the stored buffer is moved across another.
"""
from __future__ import annotations

from collections.abc import Sequence

from unigrad.dtype import AddrSpace, DType, dtypes
from unigrad.renderer import Renderer
from unigrad.uop import GroupOp, Ops, UOp
from unigrad.uop.symbolic import linear_terms

__all__ = ["transpose_sums", "lane_sums", "transposed_sum"]

SUM_OPS = frozenset({Ops.ADD, Ops.MAX, Ops.MUL})  # the ops a horizontal sum combines lanes with
PACK_DTYPES = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
# two-input shuffles (lanes of concat(a, b)) whose sum puts lanes of one output side by side, per
# level, by lane count: within 128-bit blocks (vshufps), then across the halves (k = 8)
_SHUF8 = ((0, 2, 8, 10, 4, 6, 12, 14), (1, 3, 9, 11, 5, 7, 13, 15))
LEVELS: dict[int, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]] = {
  4: (((0, 2, 4, 6), (1, 3, 5, 7)),) * 2,
  8: (_SHUF8, _SHUF8, ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))),
}

Sum = tuple[UOp, frozenset[int], Ops | None]  # (vector, lanes summed, op)


def _sum_of(u: UOp, info: dict[UOp, Sum]) -> Sum | None:
  if u.op is Ops.GEP and len(u.src) == 1 and u.src[0].dtype.count > 1 and len(u.arg) == 1:
    return u.src[0], frozenset(u.arg), None
  if u.op not in SUM_OPS or len(u.src) != 2 or u.dtype.count != 1: return None
  a, b = info.get(u.src[0]), info.get(u.src[1])
  if a is None or b is None or a[0] is not b[0] or a[1] & b[1]: return None
  if any(op not in (None, u.op) for op in (a[2], b[2])): return None
  return a[0], a[1] | b[1], u.op


def lane_sums(ast: UOp) -> dict[UOp, UOp]:
  """Each node that combines every lane of one vector (and nothing else) with one op: the
  vector."""
  info: dict[UOp, Sum] = {}
  for u in ast.toposort():
    if (s := _sum_of(u, info)) is not None: info[u] = s
  return {u: v for u, (v, lanes, op) in info.items()
          if op is not None and len(lanes) == v.dtype.count}


def _shuffle(a: UOp, b: UOp, idx: Sequence[int]) -> UOp:
  k = a.dtype.count
  lanes = tuple(UOp(Ops.GEP, a.dtype.scalar(), (a if i < k else b,), (i % k,)) for i in idx)
  return UOp(Ops.STACK, a.dtype, lanes)


def transposed_sum(vectors: Sequence[UOp], op: Ops) -> UOp:
  """The vector whose lane j combines every lane of vectors[j] with `op` (n vectors of k lanes,
  k in LEVELS, n = k or k/2 for k = 8): pairs of vectors are shuffled and combined level by
  level; with half as many vectors as lanes (an AVX2 tile's 4 rows of 8 lanes) the last level
  adds the two halves of the one vector left, [a b c d a b c d] -> [a b c d]."""
  vs, k = list(vectors), vectors[0].dtype.count
  for lo, hi in LEVELS[k][:len(vs).bit_length() - 1]:  # log2(n) levels
    pairs = zip(vs[0::2], vs[1::2])
    vs = [_shuffle(a, b, lo).alu(op, _shuffle(a, b, hi)) for a, b in pairs]
  if len(vectors) == k: return vs[0]
  half = [UOp(Ops.STACK, vs[0].dtype.scalar().vec(k // 2), tuple(
    UOp(Ops.GEP, vs[0].dtype.scalar(), (vs[0],), (i,)) for i in lanes))
    for lanes in (range(k // 2), range(k // 2, k))]
  return half[0].alu(op, half[1])


# the outputs a run of stores may have, by the lane count of their sums
RUNS: dict[int, tuple[int, ...]] = {4: (4,), 8: (8, 4)}


# ---- the outputs of a run, as one vector ----

def _address(ix: UOp) -> tuple[UOp, frozenset[tuple[UOp, int]], int] | None:
  """(buffer, base terms, constant offset) of an ungated GLOBAL INDEX, or None."""
  if ix.op is not Ops.INDEX or len(ix.src) != 2 or ix.src[0].op is not Ops.PARAM: return None
  if ix.src[0].addrspace is not AddrSpace.GLOBAL: return None
  terms, const = linear_terms(ix.src[1])
  return ix.src[0], frozenset(terms.items()), const


def _is_consecutive(ixs: Sequence[UOp]) -> bool:
  addrs = [a for ix in ixs if (a := _address(ix)) is not None]
  if len(addrs) != len(ixs): return False
  return all(a[:2] == addrs[0][:2] and a[2] == addrs[0][2] + j for j, a in enumerate(addrs))


def _concat(vectors: Sequence[UOp]) -> UOp:
  """Vectors side by side as one vector (a shuffle)."""
  if len(vectors) == 1: return vectors[0]
  k, dt = vectors[0].dtype.count, vectors[0].dtype.scalar()
  lanes = tuple(UOp(Ops.GEP, dt, (v,), (i,)) for v in vectors for i in range(k))
  return UOp(Ops.STACK, dt.vec(len(lanes)), lanes)


class _Lanes:
  """n scalar trees, runs of k, as one n-lane vector tree (None where they differ in shape);
  `sums` maps each tree's horizontal sum to its lane, `totals` are the runs' transposed sums."""

  def __init__(self, k: int, sums: dict[UOp, int], totals: list[UOp]):
    self.k, self.sums, self.totals = k, sums, totals
    self.memo: dict[tuple[UOp, ...], UOp | None] = {}

  def of(self, nodes: tuple[UOp, ...]) -> UOp | None:
    if nodes not in self.memo: self.memo[nodes] = self._build(nodes)
    return self.memo[nodes]

  def _build(self, nodes: tuple[UOp, ...]) -> UOp | None:
    first, n, k = nodes[0], len(nodes), self.k
    if any(u in self.sums for u in nodes):
      ok = all(self.sums.get(u) == p for p, u in enumerate(nodes))
      return _concat(self.totals) if ok else None
    if first.dtype.count != 1 or first.dtype.scalar() not in PACK_DTYPES | {dtypes.bool}:
      return None
    if all(u is first for u in nodes): return UOp(Ops.STACK, first.dtype.vec(n), nodes)
    if all(u.op is Ops.LOAD and len(u.src) == 1 for u in nodes):
      runs = [[u.src[0] for u in nodes[j:j + k]] for j in range(0, n, k)]
      if not all(_is_consecutive(ixs) for ixs in runs): return None
      loads = {ixs[0]: UOp(Ops.LOAD, first.dtype.vec(k), (ixs[0],)) for ixs in runs}
      return _concat([loads[ixs[0]] for ixs in runs])
    if first.op is Ops.CONST and all(u.op is Ops.CONST for u in nodes):
      return UOp(Ops.STACK, first.dtype.vec(n), nodes)
    if first.op not in GroupOp.Elementwise: return None
    if any(u.op is not first.op or u.arg != first.arg or u.dtype != first.dtype
           or len(u.src) != len(first.src) for u in nodes): return None
    src = [self.of(tuple(u.src[i] for u in nodes)) for i in range(len(first.src))]
    if any(s is None for s in src): return None
    arg = first.arg.vec(n) if isinstance(first.arg, DType) else first.arg
    return first.replace(dtype=first.dtype.vec(n), arg=arg, src=tuple(src))


def _sum_in(st: UOp, sums: dict[UOp, UOp]) -> UOp:
  return next(s for s in st.src[1].toposort() if s in sums)


def _packed_stores(runs: list[list[UOp]], sums: dict[UOp, UOp]) -> list[UOp] | None:
  """The stores of runs side by side computed as one vector (stored run by run), or None where
  their values differ in shape or read the buffer they store to."""
  buf, k = runs[0][0].src[0].src[0], len(runs[0])
  stores = [st for run in runs for st in run]
  if any(u.op is Ops.INDEX and u.src[0] is buf for st in stores for u in st.src[1].toposort()):
    return None
  found = [_sum_in(st, sums) for st in stores]
  totals = [transposed_sum([sums[f] for f in found[j:j + k]], found[j].op)
            for j in range(0, len(found), k)]
  lanes = _Lanes(k, {f: p for p, f in enumerate(found)}, totals)
  if (value := lanes.of(tuple(st.src[1] for st in stores))) is None: return None
  if len(runs) == 1: return [runs[0][0].replace(src=(runs[0][0].src[0], value))]
  dt = value.dtype.scalar()
  parts = [UOp(Ops.STACK, dt.vec(k), tuple(UOp(Ops.GEP, dt, (value,), (j * k + i,))
                                           for i in range(k))) for j in range(len(runs))]
  return [run[0].replace(src=(run[0].src[0], part)) for run, part in zip(runs, parts)]


def _summed_stores(run: list[UOp], sums: dict[UOp, UOp]) -> list[UOp]:
  """The stores of one run, each value reading its lane of the run's transposed sum."""
  found = [_sum_in(st, sums) for st in run]
  total = transposed_sum([sums[f] for f in found], found[0].op)
  return [st.replace(src=(st.src[0], st.src[1].substitute({f: UOp(Ops.GEP, f.dtype, (total,),
          (j,))}))) for j, (st, f) in enumerate(zip(run, found))]


def _run_stores(runs: list[list[UOp]], sums: dict[UOp, UOp]) -> list[UOp]:
  """Runs side by side as one vector, else each run as one, else their stores one by one."""
  if (packed := _packed_stores(runs, sums)) is not None: return packed
  if len(runs) > 1: return [st for run in runs for st in _run_stores([run], sums)]
  return _summed_stores(runs[0], sums)


def _is_packable(st: UOp, sums: dict[UOp, UOp]) -> bool:
  """A store of one complete horizontal sum of a vector of LEVELS lanes (and nothing else's)."""
  if st.op is not Ops.STORE or len(st.src) != 2 or _address(st.src[0]) is None: return False
  if st.src[1].dtype.count != 1: return False
  found = [s for s in st.src[1].toposort() if s in sums]
  return len(found) == 1 and sums[found[0]].dtype.count in LEVELS


def _runs(stores: list[UOp], sums: dict[UOp, UOp]) -> list[list[UOp]]:
  """Disjoint runs of n packable stores at consecutive addresses, each in address order, n in
  RUNS of the lane count of their sums (the longest first)."""
  by_base: dict[tuple[UOp, frozenset], dict[int, UOp]] = {}
  for st in stores:
    if not _is_packable(st, sums) or (addr := _address(st.src[0])) is None: continue
    buf, terms, const = addr
    by_base.setdefault((buf, terms), {}).setdefault(const, st)
  runs = []
  for offs in by_base.values():
    for c in sorted(offs):
      if c not in offs: continue
      k = sums[_sum_in(offs[c], sums)].dtype.count
      n = next((n for n in RUNS[k] if all(c + j in offs for j in range(n))), None)
      if n is not None: runs.append([offs.pop(c + j) for j in range(n)])
  return runs


def _bundles(runs: list[list[UOp]], vector_bytes: int) -> list[list[list[UOp]]]:
  """Runs taken together, in order, as many as fill one vector register (two runs of 8 floats
  on AVX-512: the epilogue's chains are latency-bound, and one 16-lane chain does twice the
  work of an 8-lane one in about the same time)."""
  out: list[list[list[UOp]]] = []
  for run in runs:
    last = out[-1] if out else None
    width = (len(last) + 1) * len(run) * run[0].src[1].dtype.itemsize if last else 0
    if last and len(last[0]) == len(run) and width <= vector_bytes: last.append(run)
    else: out.append([run])
  return out


def _pack_group(g: UOp, sums: dict[UOp, UOp], vector_bytes: int) -> UOp:
  runs = _runs([s for s in g.src if s.op is Ops.STORE], sums)
  if not runs: return g
  first = {b[0][0]: b for b in _bundles(runs, vector_bytes)}
  packed = {st for run in runs for st in run}
  src: list[UOp] = []
  for u in g.src:
    if u in first: src.extend(_run_stores(first[u], sums))
    elif u not in packed: src.append(u)
  return g.replace(src=tuple(src))


def _flatten(g: UOp) -> UOp:
  """A GROUP with the stores of its nested GROUPs as its own sources (the unrolled tile's
  outputs, one GROUP per unrolled axis)."""
  if not any(s.op is Ops.GROUP for s in g.src): return g
  src = [x for s in g.src for x in (_flatten(s).src if s.op is Ops.GROUP else (s,))]
  return g.replace(src=tuple(src))


def transpose_sums(ast: UOp, ren: Renderer) -> UOp:
  """The kernel with its tiles' horizontal sums transposed and packed (see the module
  docstring)."""
  if not ren.vector_bytes or not (sums := lane_sums(ast)): return ast
  nodes = ast.toposort()
  nested = {s for u in nodes if u.op is Ops.GROUP for s in u.src if s.op is Ops.GROUP}
  memo: dict[UOp, UOp] = {}
  for u in nodes:  # an outermost GROUP packs the stores of the GROUPs nested in it
    new_src = tuple(memo[s] for s in u.src)
    x = u if all(a is b for a, b in zip(new_src, u.src)) else u.replace(src=new_src)
    if x.op is Ops.GROUP and u not in nested:
      flat = _flatten(x)
      if (packed := _pack_group(flat, sums, ren.vector_bytes)) is not flat: x = packed
    memo[u] = x
  return memo[ast]
