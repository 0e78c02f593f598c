"""The pattern language (UPat), rule tables (PatternMatcher) and rewrite tracking.

A UPat constrains op, dtype, arg and sources; `src` is a tuple (positional), a list (any
permutation: commutative matching) or a single UPat (repeated for every source). A name binds
the matched node; a name used twice must bind the same node. A PatternMatcher dispatches on the
node's op and rejects early when a pattern's required source ops are missing; a callback gets the
bindings as keyword arguments (plus `ctx` if it takes one) and returns a replacement or None.
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
from unigrad.uop.ops import Ops

if TYPE_CHECKING:
  from unigrad.uop.uop import UOp

Store = dict[str, Any]


class UPat:
  """A pattern over UOps. See the module docstring for the forms of `src`."""
  __slots__ = ("op", "dtype", "arg", "name", "src", "_repeat", "allow_any_len", "early_reject",
               "_any", "tag")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = None,
               name: str | None = None, allow_any_len: bool = False,
               custom_early_reject: set[Ops] | None = None, tag: Any = None) -> None:
    self.op = None if op is None else (frozenset((op,)) if isinstance(op, Ops) else frozenset(op))
    self.dtype = None if dtype is None else (frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype))
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
    required = {next(iter(p.op)) for p in first if p.op is not None and len(p.op) == 1 and p._any is None}
    self.early_reject = frozenset(custom_early_reject if custom_early_reject is not None else required)

  # ---- constructors ----
  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    """Any node, bound to `name`."""
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None, arg: Any = None) -> UPat:
    """A CONST or VCONST, bound to `name`."""
    return UPat((Ops.CONST, Ops.VCONST), dtype, name=name, arg=arg)

  @staticmethod
  def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
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
    return UPat.any(self if name is None else self.named(name), UPat(Ops.CAST, name=name, src=(self,)))

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
      out = [r for p in self._any for r in p.match(u, dict(store))]
      if self.name is not None:
        out = [r for r in out if r.setdefault(self.name, u) is u]
      return out
    if self.op is not None and u.op not in self.op: return []
    if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype: return []
    if self.arg is not None and not _arg_eq(self.arg, u.arg): return []
    if self.tag is not None and self.tag != u.tag: return []
    if self.name is not None and store.setdefault(self.name, u) is not u: return []
    if self._repeat is not None: return _match_srcs(u.src, (self._repeat,) * len(u.src), store)
    if self.src is None: return [store]
    out: list[Store] = []
    for pats in self.src:
      if len(pats) != len(u.src) and not (self.allow_any_len and len(u.src) >= len(pats)): continue
      out.extend(_match_srcs(u.src, pats, dict(store) if len(self.src) > 1 else store))
    return out


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
  """An ordered rule table: the first rule whose callback returns non-None wins."""

  def __init__(self, patterns: Sequence[tuple[UPat, Callable[..., Any]]]) -> None:
    self.patterns = list(patterns)
    self.rules = [Rule(p, f, _takes_ctx(f), _location(f)) for p, f in self.patterns]
    self.pdict: dict[Ops, list[Rule]] = {op: [] for op in Ops}
    for rule in self.rules:
      for op in _root_ops(rule.pat): self.pdict[op].append(rule)

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return _combine(self, other)

  def rewrite(self, u: UOp, ctx: Any = None) -> Any:
    """The first non-None callback result for `u` (a node other than `u`), else None."""
    rules = self.pdict[u.op]
    if not rules: return None
    src_ops = {s.op for s in u.src}
    for rule in rules:
      if not rule.pat.early_reject <= src_ops: continue
      for store in rule.pat.match(u, {}):
        ret = rule.fxn(ctx=ctx, **store) if rule.takes_ctx else rule.fxn(**store)
        if ret is not None and ret is not u: return ret
    return None

  def rewrite_tracked(self, u: UOp, ctx: Any = None) -> Any:
    """rewrite(), recording per-rule statistics and each rewrite in the active traces."""
    rules = self.pdict[u.op]
    src_ops = {s.op for s in u.src}
    for rule in rules:
      stats = match_stats.setdefault(rule.location, RuleStats(rule.location))
      stats.tries += 1
      if not rule.pat.early_reject <= src_ops: continue
      t0 = time.perf_counter()
      for store in rule.pat.match(u, {}):
        ret = rule.fxn(ctx=ctx, **store) if rule.takes_ctx else rule.fxn(**store)
        if ret is not None and ret is not u:
          stats.hits += 1
          stats.seconds += time.perf_counter() - t0
          for trace in active_traces: trace.records.append(RewriteRecord(rule.location, u, ret))
          return ret
      stats.seconds += time.perf_counter() - t0
    return None


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
class RewriteTrace:
  """Every rewrite recorded while a `track_rewrites` function ran."""
  name: str
  records: list[RewriteRecord] = field(default_factory=list)


match_stats: dict[str, RuleStats] = {}
active_traces: list[RewriteTrace] = []
traces: list[RewriteTrace] = []


def track_rewrites(name: str | Callable | None = None) -> Callable:
  """Decorator: record every rule that fires while the function runs, into `traces`.

  Usable as `@track_rewrites()` or `@track_rewrites("name")`.
  """
  def deco(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      trace = RewriteTrace(name if isinstance(name, str) else fn.__name__)
      active_traces.append(trace)
      try: return fn(*args, **kwargs)
      finally:
        active_traces.remove(trace)
        traces.append(trace)
    return wrapper
  return deco(name) if callable(name) else deco
