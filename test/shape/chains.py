"""Shared by the shape tests: random chains of movement ops (as tensor-graph UOps and as a
ShapeTracker built by its methods), an index-expression evaluator and what rangeify builds."""
import itertools
import math

from hypothesis import strategies as st

from unigrad.dtype import dtypes
from unigrad.schedule.indexing import Kernel, RangeifyCtx, pm_rangeify
from unigrad.shape import ShapeTracker
from unigrad.uop import AxisType, GroupOp, Invalid, Ops, ParamArg, UOp, graph_rewrite, shape_uop

MAX_NUMEL = 160


def evaluate(u: UOp, env: dict[UOp, int]) -> object:
  """The value of an index expression (RANGEs and variables from `env`); Invalid propagates
  through arithmetic, as a dead index does in a kernel."""
  vals: dict[UOp, object] = dict(env)
  for x in u.toposort(lambda n: n not in env):
    if x.op is Ops.CONST: vals[x] = x.arg
    elif x.op is Ops.WHERE:
      c, a, b = (vals[s] for s in x.src)
      vals[x] = Invalid if c is Invalid else (a if c else b)
    elif x.op in GroupOp.ALU:
      args = [vals[s] for s in x.src]
      vals[x] = Invalid if any(a is Invalid for a in args) else _alu(x.op, args)
    else: raise AssertionError(f"unexpected {x.op} in an index expression")
  return vals[u]


def _alu(op: Ops, a: list) -> object:
  table = {Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y,
           Ops.IDIV: lambda x, y: abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1),
           Ops.MOD: lambda x, y: x - abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) * y,
           Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y,
           Ops.AND: lambda x, y: x and y if isinstance(x, bool) else x & y,
           Ops.OR: lambda x, y: x or y if isinstance(x, bool) else x | y,
           Ops.MAX: max, Ops.NEG: lambda x: -x}
  return table[op](*a)


def flat_param(numel: int) -> UOp:
  return UOp(Ops.PARAM, dtypes.float32, (shape_uop((numel,)),), ParamArg(0, dtypes.float32, "NULL"))


def rangeify_index(x: UOp) -> tuple[UOp, tuple[UOp, ...]]:
  """What rangeify builds to read `x` (a movement chain over a PARAM) at fresh ranges."""
  ctx = RangeifyCtx(1, "NULL")
  ctx.current = Kernel(ast=x, key=x, writes=x)
  rngs = tuple(ctx.new_range(s, AxisType.LOOP) for s in x.shape)
  value = graph_rewrite(UOp(Ops.INDEX, x.dtype, (x, *rngs)), pm_rangeify, ctx=ctx, bottom_up=True)
  return value, rngs


def read_rangeified(value: UOp, env: dict[UOp, int]) -> tuple[bool, object]:
  """(valid, position) of a rangeified read: WHERE(gate, INDEX(PARAM, idx), 0) nests."""
  ok = True
  while value.op is Ops.WHERE:
    ok = ok and bool(evaluate(value.src[0], env))
    value = value.src[1]
  assert value.op is Ops.INDEX and value.src[0].op is Ops.PARAM, value.op
  pos = evaluate(value.src[1], env)
  return ok and pos is not Invalid, pos


def assert_same_reads(x: UOp, tracker: ShapeTracker, env: dict[UOp, int] | None = None,
                      shape: tuple[int, ...] | None = None) -> None:
  env = dict(env or {})
  value, rngs = rangeify_index(x)
  idx, valid = tracker.to_indexed_uops(rngs)
  for point in itertools.product(*(range(s) for s in (shape or x.shape))):
    at = {**env, **dict(zip(rngs, point))}
    ok_r, pos_r = read_rangeified(value, at)
    ok_s = bool(evaluate(valid, at))
    assert ok_r == ok_s, f"validity differs at {point}: rangeify {ok_r}, tracker {ok_s}"
    if ok_s: assert evaluate(idx, at) == pos_r, f"position differs at {point}"


# ---- random chains of movement ops ----

def _factorizations(n: int, draw: st.DrawFn) -> tuple[int, ...]:
  """A random shape with product n (prime factors grouped, size-1 axes sprinkled in)."""
  primes, k = [], 2
  while n > 1:
    while n % k == 0: primes.append(k); n //= k  # noqa: E702
    k += 1
  primes = draw(st.permutations(primes))
  cuts = sorted(draw(st.sets(st.integers(1, max(len(primes) - 1, 1)), max_size=3)))
  dims = [math.prod(primes[a:b]) for a, b in zip([0, *cuts], [*cuts, len(primes)])]
  dims = [d for d in dims if d != 1] or [1]
  for _ in range(draw(st.integers(0, 2))): dims.insert(draw(st.integers(0, len(dims))), 1)
  return tuple(dims)


@st.composite
def movement_chain(draw: st.DrawFn, numel: int | None = None) -> tuple[UOp, ShapeTracker]:
  """A random chain of movement ops over a flat buffer (of `numel` elements if given)."""
  if numel is None: shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  else: shape = _factorizations(numel, draw)
  numel = math.prod(shape)
  x = UOp(Ops.RESHAPE, dtypes.float32, (flat_param(numel), shape_uop(shape)))
  tracker = ShapeTracker.from_shape((numel,)).reshape(shape)
  for _ in range(draw(st.integers(1, 7))):
    x, tracker = _step(draw, x, tracker)
  return x, tracker


def _step(draw: st.DrawFn, x: UOp, t: ShapeTracker) -> tuple[UOp, ShapeTracker]:
  shape, dt = tuple(x.shape), x.dtype
  kind = draw(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip"]))
  if kind == "reshape":
    new = _factorizations(math.prod(shape), draw)
    return UOp(Ops.RESHAPE, dt, (x, shape_uop(new))), t.reshape(new)
  if kind == "permute":
    order = tuple(draw(st.permutations(range(len(shape)))))
    return UOp(Ops.PERMUTE, dt, (x,), order), t.permute(order)
  if kind == "expand":
    new = tuple(draw(st.integers(1, 3)) if s == 1 else s for s in shape)
    if math.prod(new) > MAX_NUMEL: return x, t
    return UOp(Ops.EXPAND, dt, (x, shape_uop(new))), t.expand(new)
  if kind == "flip":
    flags = tuple(draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape))))
    return UOp(Ops.FLIP, dt, (x,), flags), t.flip(flags)
  if kind == "pad":
    pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
    new = tuple(s + b + a for s, (b, a) in zip(shape, pads))
    if math.prod(new) > MAX_NUMEL: return x, t
    pad = UOp(Ops.PAD, dt, (x, shape_uop([b for b, _ in pads]), shape_uop(new)))
    return pad, t.pad(pads)
  bounds = []
  for s in shape:
    b = draw(st.integers(0, s - 1))
    bounds.append((b, draw(st.integers(b + 1, s))))
  sizes = [e - b for b, e in bounds]
  shrink = UOp(Ops.SHRINK, dt, (x, shape_uop([b for b, _ in bounds]), shape_uop(sizes)))
  return shrink, t.shrink(tuple(bounds))
