"""The pattern language (UPat), rule tables (PatternMatcher) and rewrite tracking.

A UPat constrains op, dtype, arg and sources; `src` is a tuple (positional), a list (any
permutation: commutative matching) or a single UPat (repeated for every source). A name binds
the matched node; a name used twice must bind the same node. A PatternMatcher dispatches on the
node's op; a callback gets the bindings as keyword arguments (plus `ctx` if it takes one) and
returns a replacement or None.

Speed: `UPat.match` is the reference interpreter. On first use for an op, each rule is compiled
into a small Python function (nested `if`s over op, dtype, arg, source count and name identity,
one block per permutation or alternative, ending in the callback call) that enumerates the same
bindings in the same order, so a compiled table returns exactly what the interpreter would.
Patterns whose code would be too large, or that repeat a named sub-pattern, stay interpreted.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from unigrad.dtype import DType
from unigrad.knobs import VIZ
from unigrad.uop.ops import Ops

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

Store = dict[str, Any]
DTypes = DType | Iterable[DType] | None


class UPat:
  """A pattern over UOps. See the module docstring for the forms of `src`."""
  __slots__ = ("op", "dtype", "arg", "name", "src", "_repeat", "allow_any_len", "early_reject",
               "custom_reject", "_any", "tag")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DTypes = None,
               src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = None,
               name: str | None = None, allow_any_len: bool = False,
               custom_early_reject: set[Ops] | None = None, tag: Any = None) -> None:
    self.op = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
    dts = None if dtype is None else [dtype] if isinstance(dtype, DType) else dtype
    self.dtype = None if dts is None else frozenset(dts)
    self.arg, self.name, self.tag, self.allow_any_len = arg, name, tag, allow_any_len
    self._any: tuple[UPat, ...] | None = None
    self._repeat: UPat | None = src if isinstance(src, UPat) else None
    self.src: list[tuple[UPat, ...]] | None = None
    if isinstance(src, list):
      perms = list(itertools.permutations(src)) if len(set(map(id, src))) > 1 else [tuple(src)]
      self.src = [tuple(p) for p in perms]
    elif isinstance(src, tuple): self.src = [src]
    elif src is not None and not isinstance(src, UPat):
      raise TypeError(f"UPat src must be a tuple, list or UPat, got {type(src).__name__}")
    first = src if isinstance(src, (tuple, list)) else ()
    required = {next(iter(p.op)) for p in first if p.op is not None and len(p.op) == 1}
    # only a custom set needs its own test: the computed one is implied by a match
    self.custom_reject = None if custom_early_reject is None else frozenset(custom_early_reject)
    self.early_reject = frozenset(required) if self.custom_reject is None else self.custom_reject

  # ---- constructors ----
  @staticmethod
  def var(name: str | None = None, dtype: DTypes = None) -> UPat:
    """Any node, bound to `name`."""
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype: DTypes = None, arg: Any = None) -> UPat:
    """A CONST or VCONST, bound to `name`."""
    return UPat((Ops.CONST, Ops.VCONST), dtype, name=name, arg=arg)

  @staticmethod
  def const(dtype: DTypes, value: Any) -> UPat:
    """A CONST holding exactly `value`."""
    return UPat(Ops.CONST, dtype, arg=value)

  @staticmethod
  def any(*pats: UPat, name: str | None = None) -> UPat:
    """Matches when any of `pats` matches."""
    ret = UPat(name=name)
    ret._any = pats
    return ret

  def named(self, name: str) -> UPat:
    """This pattern, binding the matched node to `name`."""
    ret = UPat.__new__(UPat)
    for slot in UPat.__slots__: setattr(ret, slot, getattr(self, slot))
    ret.name = name
    return ret

  def or_casted(self, name: str | None = None) -> UPat:
    """This pattern, or a CAST of it."""
    base = self if name is None else self.named(name)
    return UPat.any(base, UPat(Ops.CAST, name=name, src=(self,)))

  def or_after(self, name: str | None = None) -> UPat:
    """This pattern, or an AFTER whose first source matches it."""
    base = self if name is None else self.named(name)
    return UPat.any(base, UPat(Ops.AFTER, name=name, src=(self,), allow_any_len=True))

  def __repr__(self) -> str:
    ops = "any" if self.op is None else "|".join(sorted(o.name for o in self.op))
    return f"UPat({ops}{', name=' + repr(self.name) if self.name else ''})"

  # ---- matching ----
  def match(self, u: UOp, store: Store) -> list[Store]:
    """Every way `u` matches, as binding dicts extending `store`."""
    if self._any is not None:
      out: list[Store] = [r for p in self._any for r in p.match(u, dict(store))]
      if self.name is not None:
        out = [r for r in out if r.setdefault(self.name, u) is u]
      return out
    if self.op is not None and u.op not in self.op: return []
    if self.dtype is not None and not _dtype_in(u.dtype, self.dtype): return []
    if self.arg is not None and not _arg_eq(self.arg, u.arg): return []
    if self.tag is not None and self.tag != u.tag: return []
    if self.name is not None and store.setdefault(self.name, u) is not u: return []
    if self._repeat is not None: return _match_srcs(u.src, (self._repeat,) * len(u.src), store)
    if self.src is None: return [store]
    out = []
    for pats in self.src:
      if len(pats) != len(u.src) and not (self.allow_any_len and len(u.src) >= len(pats)): continue
      out.extend(_match_srcs(u.src, pats, dict(store) if len(self.src) > 1 else store))
    return out


def _dtype_in(dt: DType, allowed: frozenset[DType]) -> bool:
  return dt in allowed or dt.scalar() in allowed


def _arg_eq(want: Any, got: Any) -> bool:
  if type(want) is float and type(got) is float: return want == got or want != want and got != got
  try: return bool(want == got)
  except Exception:  # noqa: BLE001 (an arg whose __eq__ fails simply does not match)
    return False


def _match_srcs(srcs: Sequence[UOp], pats: Sequence[UPat], store: Store) -> list[Store]:
  stores = [store]
  for s, p in zip(srcs, pats):
    stores = [r for st in stores for r in p.match(s, st if len(stores) == 1 else dict(st))]
    if not stores: return []
  return stores


# ---- the pattern compiler ----

MAX_COMPILED_LINES = 4000  # a pattern whose code would be longer is interpreted instead
Matcher = Callable[["UOp", Any], Any]
Names = dict[str, str]  # pattern name -> the variable that holds the bound node
Cont = Callable[[Names, int], None]  # emits the code that runs where the tests so far hold
_NUM_OP_VALUES = max(o._value_ for o in Ops) + 1


def _has_names_or_forks(p: UPat) -> bool:
  if p.name is not None or p._any is not None or (p.src is not None and len(p.src) > 1): return True
  subs = [p._repeat] if p._repeat is not None else [q for pats in p.src or () for q in pats]
  return any(_has_names_or_forks(q) for q in subs)


class _Codegen:
  """Writes one rule as a Python function: nested `if`s, one block per alternative.

  The blocks run in the order the interpreter (`UPat.match`) yields bindings, and each ends in
  the callback call, so the compiled rule returns exactly what the interpreter loop would.
  """

  def __init__(self, fxn: Callable, takes_ctx: bool) -> None:
    self.lines: list[str] = []
    self.env: dict[str, Any] = {"_arg_eq": _arg_eq, "FXN": fxn}
    self.nvars, self.takes_ctx = 0, takes_ctx

  def const(self, obj: Any) -> str:
    name = f"K{len(self.env)}"
    self.env[name] = obj
    return name

  def var(self) -> str:
    self.nvars += 1
    return f"n{self.nvars}"

  def emit(self, ind: int, line: str) -> None:
    if len(self.lines) > MAX_COMPILED_LINES: raise _TooBig
    self.lines.append("  " * ind + line)

  def checks(self, p: UPat, v: str, root: bool) -> list[str]:
    out = []
    if p.op is not None and not root:
      out.append(f"{v}.op is {self.const(next(iter(p.op)))}" if len(p.op) == 1 else
                 f"{v}.op._value_ in {self.const(frozenset(o._value_ for o in p.op))}")
    if p.dtype is not None:
      dt = self.const(p.dtype)
      out.append(f"({v}.dtype in {dt} or {v}.dtype.scalar() in {dt})")
    if p.arg is not None:
      arg = self.const(p.arg)
      simple = type(p.arg) in (int, bool, str) and p.op is not None and p.op <= _CONST_OPS
      out.append(f"{arg} == {v}.arg" if simple else f"_arg_eq({arg}, {v}.arg)")
    if p.tag is not None: out.append(f"{self.const(p.tag)} == {v}.tag")
    if p._repeat is not None: out.append(f"all(map({self.const(_predicate(p._repeat))}, {v}.src))")
    return out

  def pat(self, p: UPat, v: str, names: Names, ind: int, cont: Cont, root: bool = False) -> None:
    """Emit the tests of `p` on variable `v`, then `cont(names, ind)` where they hold."""
    if p._any is not None:
      named: Cont = lambda nm, i: self.bind(p.name, v, nm, i, cont)  # noqa: E731
      for alt in p._any: self.pat(alt, v, names, ind, named)
      return
    conds = self.checks(p, v, root)
    if conds:
      self.emit(ind, f"if {' and '.join(conds)}:")
      ind += 1
    self.bind(p.name, v, names, ind, lambda nm, i: self.srcs(p, v, nm, i, cont))

  def bind(self, name: str | None, v: str, names: Names, ind: int, cont: Cont) -> None:
    if name is None: return cont(names, ind)
    if name not in names: return cont({**names, name: v}, ind)
    self.emit(ind, f"if {v} is {names[name]}:")
    return cont(names, ind + 1)

  def srcs(self, p: UPat, v: str, names: Names, ind: int, cont: Cont) -> None:
    if p.src is None: return cont(names, ind)
    n = len(p.src[0])
    vs = [self.var() for _ in range(n)]
    self.emit(ind, f"if len({v}.src) {'>=' if p.allow_any_len else '=='} {n}:")
    if n: self.emit(ind + 1, f"{', '.join(vs)}, = {v}.src{f'[:{n}]' if p.allow_any_len else ''}")
    for pats in p.src: self.chain(list(zip(pats, vs)), names, ind + 1, cont)

  def chain(self, todo: list[tuple[UPat, str]], names: Names, ind: int, cont: Cont) -> None:
    if not todo: return cont(names, ind)
    (p, v), rest = todo[0], todo[1:]
    self.pat(p, v, names, ind, lambda nm, i: self.chain(rest, nm, i, cont))

  def call(self, names: Names, ind: int) -> None:
    kwargs = [f"{k}={v}" for k, v in names.items()] + (["ctx=ctx"] if self.takes_ctx else [])
    self.emit(ind, f"r = FXN({', '.join(kwargs)})")
    self.emit(ind, "if r is not None and r is not u: return r")


class _TooBig(Exception):
  pass


_CONST_OPS = frozenset((Ops.CONST, Ops.VCONST))


def _predicate(p: UPat) -> Callable[[UOp], bool]:
  """A compiled test `p.match(u) != []` for a pattern without names or alternatives."""
  g = _Codegen(lambda: None, False)
  g.emit(0, "def pred(u):")
  g.pat(p, "u", {}, 1, lambda nm, i: g.emit(i, "return True"))
  g.emit(1, "return False")
  exec(compile("\n".join(g.lines), "<upat predicate>", "exec"), g.env)  # noqa: S102
  return g.env["pred"]


def compile_rule(pat: UPat, fxn: Callable, takes_ctx: bool, reject: frozenset[Ops] | None,
                 location: str = "?", dispatched: bool = False) -> Matcher:
  """`(u, ctx) -> replacement or None` for one rule: compiled Python when possible, else a
  closure over the interpreter. `reject`: the custom early-reject set, checked first.
  `dispatched`: the caller only passes nodes whose op the root pattern allows."""
  if pat._repeat is not None and _has_names_or_forks(pat._repeat):
    return _interpreted(pat, fxn, takes_ctx, reject)
  g = _Codegen(fxn, takes_ctx)
  g.emit(0, "def rule(u, ctx):")
  if reject: g.emit(1, f"if not {g.const(reject)} <= {{s.op for s in u.src}}: return None")
  try: g.pat(pat, "u", {}, 1, g.call, root=dispatched)
  except _TooBig: return _interpreted(pat, fxn, takes_ctx, reject)
  g.emit(1, "return None")
  exec(compile("\n".join(g.lines), f"<upat {location}>", "exec"), g.env)  # noqa: S102
  return g.env["rule"]


def _interpreted(pat: UPat, fxn: Callable, takes_ctx: bool, reject: frozenset[Ops] | None
                 ) -> Matcher:
  def rule(u: UOp, ctx: Any) -> Any:
    if reject and not reject <= {s.op for s in u.src}: return None
    for store in pat.match(u, {}):
      ret = fxn(ctx=ctx, **store) if takes_ctx else fxn(**store)
      if ret is not None and ret is not u: return ret
    return None
  return rule


# ---- pattern matchers ----

@dataclass(frozen=True)
class Rule:
  pat: UPat
  fxn: Callable[..., Any]
  takes_ctx: bool
  location: str


def _location(fxn: Callable) -> str:
  code = getattr(fxn, "__code__", None)
  return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fxn)


def _takes_ctx(fxn: Callable) -> bool:
  try: params = inspect.signature(fxn).parameters
  except (TypeError, ValueError): return False
  return "ctx" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class PatternMatcher:
  """An ordered rule table: the first rule whose callback returns non-None wins.

  Rules are dispatched on the node's op; each is compiled to a Python function on first use.
  """

  def __init__(self, patterns: Sequence[tuple[UPat, Callable[..., Any]]]) -> None:
    self.patterns = list(patterns)
    self.rules = [Rule(p, f, _takes_ctx(f), _location(f)) for p, f in self.patterns]
    self.pdict: dict[Ops, list[Rule]] = {op: [] for op in Ops}
    for rule in self.rules:
      for op in _root_ops(rule.pat): self.pdict[op].append(rule)
    # per op value: the compiled rules (None until first used)
    self._compiled: list[tuple[tuple[Rule, Matcher], ...] | None] = [None] * _NUM_OP_VALUES

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return _combine(self, other)

  def compiled(self, op: Ops) -> tuple[tuple[Rule, Matcher], ...]:
    """The rules for `op`, each with its compiled matcher."""
    if (ret := self._compiled[op._value_]) is not None: return ret
    ret = tuple((r, _compiled_rule(r)) for r in self.pdict[op])
    self._compiled[op._value_] = ret
    return ret

  def rewrite(self, u: UOp, ctx: Any = None) -> Any:
    """The first non-None callback result for `u` (a node other than `u`), else None."""
    rules = self._compiled[u.op._value_]
    if rules is None: rules = self.compiled(u.op)
    for _, fn in rules:
      if (ret := fn(u, ctx)) is not None: return ret
    return None

  def rewrite_tracked(self, u: UOp, ctx: Any = None) -> Any:
    """rewrite(), recording per-rule statistics and each rewrite in the active traces."""
    for rule, fn in self.compiled(u.op):
      stats = match_stats.get(rule.location)
      if stats is None: stats = match_stats[rule.location] = RuleStats(rule.location)
      stats.tries += 1
      t0 = time.perf_counter()
      ret = fn(u, ctx)
      stats.seconds += time.perf_counter() - t0
      if ret is None: continue
      stats.hits += 1
      for trace in active_traces: trace.add(RewriteRecord(rule.location, u, ret))
      return ret
    return None


@functools.lru_cache(maxsize=8192)
def _compiled_rule(rule: Rule) -> Matcher:
  custom = rule.pat.custom_reject
  return compile_rule(rule.pat, rule.fxn, rule.takes_ctx, custom, rule.location, dispatched=True)


def _root_ops(p: UPat) -> Iterable[Ops]:
  if p._any is not None: return {op for sub in p._any for op in _root_ops(sub)}
  return Ops if p.op is None else p.op


@functools.cache
def _combine(a: PatternMatcher, b: PatternMatcher) -> PatternMatcher:
  return PatternMatcher(a.patterns + b.patterns)


class TrackedPatternMatcher(PatternMatcher):
  """A PatternMatcher that always records which rule fired (see `track_rewrites`)."""

  def rewrite(self, u: UOp, ctx: Any = None) -> Any: return self.rewrite_tracked(u, ctx)


# ---- tracking ----

@dataclass
class RuleStats:
  location: str
  tries: int = 0
  hits: int = 0
  seconds: float = 0.0


@dataclass(frozen=True)
class RewriteRecord:
  """One rule firing: where the rule is written, and the node before and after."""
  location: str
  before: Any
  after: Any


@dataclass
class TraceStep:
  """One graph_rewrite call or pipeline stage inside a trace: the graph it got and gave (None
  while it runs, or if it raised), the rules that fired in it, its nesting depth."""
  name: str
  depth: int
  before: Any
  after: Any = None
  records: list[RewriteRecord] = field(default_factory=list)


@dataclass
class RewriteTrace:
  """Every rewrite recorded while a `track_rewrites` function ran, flat (`records`) and by the
  graph_rewrite call or stage it happened in (`steps`). `kind` and `info` describe what was
  traced for a viewer (a schedule, a kernel with its source and opts)."""
  name: str
  records: list[RewriteRecord] = field(default_factory=list)
  steps: list[TraceStep] = field(default_factory=list)
  kind: str = ""
  info: dict[str, Any] = field(default_factory=dict)
  open: list[TraceStep] = field(default_factory=list, repr=False)

  def add(self, rec: RewriteRecord) -> None:
    self.records.append(rec)
    if self.open: self.open[-1].records.append(rec)


match_stats: dict[str, RuleStats] = {}
active_traces: list[RewriteTrace] = []
traces: list[RewriteTrace] = []


def begin_step(name: str | None, before: Any) -> None:
  """A graph_rewrite call or stage starts on `before` (callers check `active_traces` first); an
  unnamed one takes the name of the step it runs in."""
  for trace in active_traces:
    label = name or (trace.open[-1].name if trace.open else "graph_rewrite")
    step = TraceStep(label, len(trace.open), before)
    trace.steps.append(step)
    trace.open.append(step)


def end_step(after: Any) -> None:
  """The innermost step of every active trace gave `after`."""
  for trace in active_traces:
    if trace.open: trace.open.pop().after = after


def _run_traced(trace: RewriteTrace, fn: Callable, args: Any, kwargs: Any) -> Any:
  active_traces.append(trace)
  try: return fn(*args, **kwargs)
  finally:
    active_traces.remove(trace)
    trace.open.clear()
    traces.append(trace)


def track_rewrites(name: str | Callable | None = None) -> Callable:
  """Decorator: record every rule that fires while the function runs, into `traces`.

  Usable as `@track_rewrites()` or `@track_rewrites("name")`.
  """
  def deco(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      return _run_traced(RewriteTrace(name if isinstance(name, str) else fn.__name__), fn, args,
                         kwargs)
    return wrapper
  return deco(name) if callable(name) else deco


def traced_call(kind: str, fn: Callable, *args: Any) -> tuple[Any, RewriteTrace | None]:
  """`fn(*args)` and, when VIZ is on, its trace of `kind` (the viewer's schedules and kernels;
  the caller names it and adds `info`), else None."""
  if not VIZ: return fn(*args), None
  trace = RewriteTrace(kind, kind=kind)
  return _run_traced(trace, fn, args, {}), trace
