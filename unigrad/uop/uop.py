"""UOp: the one node type of the IR, immutable and hash-consed, with the traversal API of draft 002.

Building the same (op, dtype, src, arg, tag) twice returns the same object, so `is` is structural
equality. The cache holds nodes weakly: a graph no one references is freed. Derived properties are
computed on first use, bottom-up over the not-yet-cached part of the graph with an explicit stack,
so 100k-node chains never hit Python's recursion limit. Lookup-or-insert in the cache and the
removal of a freed node's entry hold one lock, so threads building the same node get one node.
"""
from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union

from unigrad.dtype import AddrSpace, DType, dtypes, truncate
from unigrad.helpers import bounded_put
from unigrad.uop import properties as props
from unigrad.uop.alu import float_bits
from unigrad.uop.ops import ARITY, AxisType, Invalid, InvalidType, Ops, ParamArg, RangeArg
from unigrad.uop.printer import pyrender
from unigrad.uop.printer import render as render_expr
from unigrad.uop.rewrite import graph_rewrite, substitute
from unigrad.uop.symbolic import pm_simplify

T = TypeVar("T")
sint = Union[int, "UOp"]  # a size: a Python int or a symbolic index UOp

_ucache: dict[tuple, weakref.ref] = {}
# re-entrant: a node freed by the garbage collector while this thread holds it removes its entry
_ucache_lock = threading.RLock()


_INT = frozenset({int})
_INT_TUPLE = object()  # marks a key made of a tuple of plain ints (shapes, axes: the usual args)


_KEYED = frozenset({float, int, bool, tuple})  # the arg types `_arg_key` makes a key of their own


def _arg_key(arg: Any) -> Any:
  """Part of the hash-cons key: keeps 1, 1.0 and True apart, -0.0 apart from 0.0, and makes
  every nan equal, also inside tuples (VCONST values, PERMUTE axes, FLIP flags)."""
  if arg is None: return None
  t = type(arg)
  if t is float: return (t, float_bits(arg))
  if t is int or t is bool: return (t, arg)
  if t is tuple:
    if set(map(type, arg)) <= _INT: return (_INT_TUPLE, arg)  # no element needs a key of its own
    return (t, tuple(_arg_key(a) for a in arg))
  return arg


def _check_new(op: Any, dtype: Any, src: tuple, arg: Any) -> None:
  """Reject a malformed node before it is made (exact type checks first: a hot path)."""
  if type(op) is not Ops: raise TypeError(f"UOp op must be an Ops member, got {op!r}")
  if type(dtype) is not DType and not isinstance(dtype, DType):
    raise TypeError(f"{op!r}: dtype must be a DType, got {dtype!r}")
  for s in src:
    if type(s) is not UOp and not isinstance(s, UOp): _bad_source(op, src)
  if (n := ARITY.get(op)) is not None and len(src) != n:
    raise ValueError(f"{op!r} takes {n} source(s), got {len(src)}")


def _bad_source(op: Ops, src: tuple) -> None:
  i, s = next((i, s) for i, s in enumerate(src) if not isinstance(s, UOp))
  raise TypeError(f"{op!r}: source {i} must be a UOp, got {type(s).__name__} {s!r}")


class UOpMetaClass(type):
  def __call__(cls, op: Ops, dtype: DType | None = None, src: Iterable[UOp] = (), arg: Any = None,
               tag: Any = None) -> UOp:
    src = src if type(src) is tuple else tuple(src)
    if dtype is None:
      _check_new(op, dtypes.void, src, arg)
      dtype = props.derive_dtype(op, src, arg)
    key = (op, dtype, src, arg if arg is None or type(arg) not in _KEYED else _arg_key(arg),
           tag if tag is None else _arg_key(tag))
    try:
      ref = _ucache.get(key)
    except TypeError:
      _check_new(op, dtype, src, arg)  # a non-UOp source is the better message
      raise TypeError(f"{op!r}: arg and tag must be hashable, got {arg!r} / {tag!r}") from None
    if ref is not None and (node := ref()) is not None: return node  # a live node: no lock needed
    _check_new(op, dtype, src, arg)
    node = _new_node(cls)  # __init__'s work inlined: the fields, then the key it is cached under
    _set_op(node, op); _set_dtype(node, dtype); _set_src(node, src)  # noqa: E702
    _set_arg(node, arg); _set_tag(node, tag); _set_key(node, key)  # noqa: E702
    ref = weakref.ref(node)
    with _ucache_lock:  # another thread may have made it meanwhile: its node is the one
      if (old := _ucache.setdefault(key, ref)) is ref: return node
      if (other := old()) is not None: return other  # ours is dropped (its entry is not ours)
      _ucache[key] = ref
      return node


def fresh_node(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any = None) -> UOp:
  """`UOp(op, dtype, src, arg)` for a node that cannot exist yet: its arg holds a slot never
  given out before, or a source is such a node (a realize's new BUFFER and its view). Made and
  cached without the cache lookup and checks, which could only pass (two nodes: 5.8 -> 5.0 us).
  `arg` is None or a typed arg (its own hash-cons key: no number, no tuple)."""
  node = _new_node(UOp)
  key = (op, dtype, src, arg, None)
  _set_op(node, op); _set_dtype(node, dtype); _set_src(node, src)  # noqa: E702
  _set_arg(node, arg); _set_tag(node, None); _set_key(node, key)  # noqa: E702
  ref = weakref.ref(node)
  with _ucache_lock: _ucache[key] = ref
  return node


def _derived(compute: Callable[[UOp], Any]) -> property:
  """A property cached per node and evaluated iteratively over the uncached sources."""
  name = "_" + compute.__name__.removeprefix("derive_")

  def get(self: UOp) -> Any:
    d = self.__dict__
    if name in d: return d[name]
    for s in self.src:
      if s.src and name not in s.__dict__: break
    else:  # the usual case: every source has it, or is a leaf that needs no other node for it
      v = d[name] = compute(self)
      return v
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      u, ready = stack.pop()
      if name in u.__dict__: continue
      if ready:
        u.__dict__[name] = compute(u)
        continue
      stack.append((u, True))
      stack.extend((s, False) for s in u.src if name not in s.__dict__)
    return d[name]
  return property(get, doc=compute.__doc__)


_FIELDS = frozenset({"op", "dtype", "src", "arg", "tag", "_key"})


_NO_VALUE: Any = object()


def _const_args(first: Any, second: Any) -> tuple[DType, Any]:
  """(dtype, value) of a tinygrad-ordered `UOp.const(value, dtype)` or `UOp.const(value)`."""
  if second is _NO_VALUE or second is None: return dtypes.from_py(first), first
  if isinstance(second, DType): return second, first
  raise TypeError(f"UOp.const needs a DType and a value, got {first!r} and {second!r}")


class UOp(metaclass=UOpMetaClass):
  """A node `(op, dtype, src, arg, tag)`, immutable: build changed copies with `replace`.

  `UOp(op, dtype, src, arg, tag)` returns the existing node when one with equal fields is alive
  (args compare by type and bits: 1, 1.0 and True differ, so do 0.0 and -0.0; nans are equal).
  With `dtype=None` the dtype is derived from the op and sources. Bad input raises at once: a
  non-Ops op or non-UOp source TypeError, an unhashable arg or tag TypeError, the wrong number of
  sources for a fixed-arity elementwise op ValueError."""
  __slots__ = ("op", "dtype", "src", "arg", "tag", "_key", "__weakref__", "__dict__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  tag: Any
  _key: tuple  # the hash-cons key it was made under

  if TYPE_CHECKING:  # UOpMetaClass.__call__ makes the nodes; this is its signature for mypy
    def __init__(self, op: Ops, dtype: DType | None = None, src: Iterable[UOp] = (),
                 arg: Any = None, tag: Any = None) -> None: ...

  def __setattr__(self, name: str, value: Any) -> None:
    if name in _FIELDS: raise AttributeError(f"UOp is immutable: use u.replace({name}=...)")
    object.__setattr__(self, name, value)

  def __delattr__(self, name: str) -> None:
    if name in _FIELDS: raise AttributeError("UOp is immutable")
    object.__delattr__(self, name)

  def __del__(self) -> None:
    try:
      key = self._key  # the hash-cons key it was made under
      with _ucache_lock:
        ref = _ucache.get(key)
        # during __del__ the weakref still answers self: the entry is ours unless rebuilt since
        if ref is not None and ((node := ref()) is None or node is self): del _ucache[key]
    except (AttributeError, TypeError, KeyError):  # half-built node or interpreter shutdown
      pass

  def __reduce__(self) -> tuple: return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))

  def __repr__(self) -> str: return pyrender(self)

  # ---- derived properties (uop/properties.py) ----
  # declared `property`: properties.py reads them in the uop <-> properties import cycle, where
  # mypy cannot infer an attribute's type from the call that makes it
  shape: property = _derived(props.derive_shape)
  device: property = _derived(props.derive_device)
  addrspace: property = _derived(props.derive_addrspace)
  min_max: property = _derived(props.derive_min_max)
  axis: property = _derived(props.derive_axis)
  grad_free: property = _derived(props.derive_grad_free)
  _open_ranges: property = _derived(props.derive_ranges)

  @property
  def ranges(self) -> dict[UOp, None]:
    """The RANGEs open at this node (a RANGE is open at itself)."""
    # not cached on a RANGE: {self: None} in its own __dict__ would be a reference cycle
    return {self: None} | self._open_ranges if self.op is Ops.RANGE else self._open_ranges

  @property
  def vmin(self) -> Any: return self.min_max[0]

  @property
  def vmax(self) -> Any: return self.min_max[1]

  @property
  def ndim(self) -> int: return len(self.shape)

  @property
  def size(self) -> sint:
    shape = self.shape
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else _sprod(shape)

  # ---- traversal ----

  def toposort(self, gate: Callable[[UOp], bool] | None = None,
               bodies: bool = True) -> dict[UOp, None]:
    """Every node reachable from self, sources before consumers. `gate(node)` False skips the
    node and whatever lies only below it; `bodies=False` (without a gate) leaves out the bodies
    of FUNCTION calls."""
    if gate is None: return _toposort(self, bodies)
    out: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(self, False)]
    push, pop = stack.append, stack.pop  # a hot loop: no generator, bound methods
    while stack:
      node, ready = pop()
      if ready:  # in a DAG a node is finished once: it is never reached again while pending
        out[node] = None
        continue
      if node in out: continue
      if gate is not None and not gate(node): continue
      push((node, True))
      for s in reversed(node.src):
        if s not in out: push((s, False))
    return out

  def topovisit(self, visitor: Callable[[UOp], T], cache: dict[UOp, T] | NodeMap[T]) -> T:
    """Apply `visitor` to every node not yet in `cache`, sources first; the root's result."""
    for node in self.toposort(lambda n: n not in cache):
      cache[node] = visitor(node)
    return cache[self]

  @property
  def backward_slice_with_self(self) -> dict[UOp, None]:
    return self.toposort()

  @property
  def backward_slice(self) -> dict[UOp, None]:
    """Every node that feeds into self (self excluded)."""
    out = self.toposort()
    del out[self]
    return out

  def op_in_backward_slice_with_self(self, *ops: Ops) -> bool:
    opset = set(ops)
    seen: set[UOp] = set()
    stack = [self]
    while stack:
      u = stack.pop()
      if u.op in opset: return True
      for s in u.src:
        if s not in seen:
          seen.add(s)
          stack.append(s)
    return False

  def get_consumer_map(self) -> dict[UOp, dict[UOp, None]]:
    return consumer_map_from_toposort(self.toposort())

  # ---- single-node operations ----

  def replace(self, **kwargs: Any) -> UOp:
    """A copy with the given fields changed; self when nothing changes."""
    new = (kwargs.pop("op", self.op), kwargs.pop("dtype", self.dtype), kwargs.pop("src", self.src),
           kwargs.pop("arg", self.arg), kwargs.pop("tag", self.tag))
    if kwargs: raise TypeError(f"replace() got unknown field(s) {sorted(kwargs)}")
    if all(a is b for a, b in zip(new, (self.op, self.dtype, self.src, self.arg, self.tag))):
      return self
    return UOp(*new)

  def is_like(self, other: UOp) -> bool:
    """Whether `other` has this node's op, dtype, arg and tag, whatever its sources (compared as
    the hash-cons keys hold them: 0.0 and -0.0 differ, so do 1, 1.0 and True)."""
    a, b = self._key, other._key  # `is` first: a DType's == is a Python call
    return a[0] is b[0] and (a[1] is b[1] or a[1] == b[1]) and (a[3] is b[3] or a[3] == b[3]) \
      and (a[4] is b[4] or a[4] == b[4])

  def with_src(self, src: tuple[UOp, ...]) -> UOp:
    """`replace(src=src)` for a tuple of UOps, the step of every rewriting walk: the key of a
    live node is looked up with this node's key parts, before any checks."""
    k = self._key
    ref = _ucache.get((k[0], k[1], src, k[3], k[4]))
    if ref is not None and (node := ref()) is not None: return node
    return UOp(self.op, self.dtype, src, self.arg, self.tag)

  def f(self, op: Ops, **kwargs: Any) -> UOp:
    """`UOp(op, ..., src=(self,))`: a new node with self as its only source."""
    dtype = kwargs.pop("dtype", None)
    return UOp(op, dtype, (self,), **kwargs)

  def detach(self) -> UOp: return UOp(Ops.DETACH, self.dtype, (self,))

  def cast(self, dtype: DType) -> UOp:
    return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))

  def bitcast(self, dtype: DType) -> UOp:
    return self if dtype == self.dtype else UOp(Ops.BITCAST, dtype, (self,))

  def sink(self, *srcs: UOp) -> UOp:
    """`UOp.sink(a, b, ...)` (or `a.sink(b, ...)`): a SINK collecting the given nodes."""
    return UOp(Ops.SINK, dtypes.void, (self, *srcs))

  def group(self, *srcs: UOp) -> UOp:
    """`UOp.group(a, b, ...)`: a GROUP (void) ordering the given effects together."""
    return UOp(Ops.GROUP, dtypes.void, (self, *srcs))

  def stack(self, *srcs: UOp) -> UOp:
    """`UOp.stack(a, b, ...)`: the (k,)-shaped STACK of k scalars of one dtype."""
    return UOp(Ops.STACK, self.dtype, (self, *srcs))

  def store(self, value: UOp) -> UOp:
    """STORE `value` through this INDEX (or buffer); void."""
    return UOp(Ops.STORE, dtypes.void, (self, value))

  def load(self) -> UOp:
    """LOAD through this INDEX: the element it points at."""
    return UOp(Ops.LOAD, self.dtype, (self,))

  @staticmethod
  def invalid(dtype: DType = dtypes.index) -> UOp:
    """The spec's Invalid constant (a dead index: loads give the alternative, stores drop)."""
    return UOp(Ops.CONST, dtype, arg=Invalid)

  def const_like(self, value: Any) -> UOp:
    """A CONST of self's dtype (Python bools for comparisons give bool constants)."""
    return UOp.const(self.dtype, value)

  # ---- constructors ----

  @staticmethod
  def const(dtype: Any, value: Any = _NO_VALUE) -> UOp:
    """A scalar CONST holding `value` as `dtype` would (`Invalid` marks a dead index). tinygrad's
    order `UOp.const(value, dtype)` works too (a DType is never a value), and `UOp.const(value)`
    takes the value's PyTorch dtype."""
    if not isinstance(dtype, DType): dtype, value = _const_args(dtype, value)
    elif value is _NO_VALUE: raise TypeError(f"UOp.const({dtype!r}) needs a value")
    if isinstance(value, UOp): return value
    if dtype.count > 1:
      return UOp(Ops.STACK, dtype.scalar(), (UOp.const(dtype.scalar(), value),) * dtype.count)
    if isinstance(value, InvalidType): return UOp(Ops.CONST, dtype, arg=value)
    return UOp(Ops.CONST, dtype, arg=truncate(dtype, value))

  @staticmethod
  def vconst(dtype: DType, values: Iterable[Any]) -> UOp:
    return UOp(Ops.VCONST, dtype, arg=tuple(truncate(dtype, v) for v in values))

  @staticmethod
  def variable(name: str, vmin: int, vmax: int, dtype: DType = dtypes.index) -> UOp:
    """A bounded symbolic variable: PARAM(shape (), vmin, vmax) named `name`."""
    if not isinstance(name, str) or not name:
      raise TypeError(f"variable name must be a non-empty str, got {name!r}")
    if isinstance(vmin, int) and isinstance(vmax, int) and vmin > vmax:
      raise ValueError(f"variable {name!r}: min {vmin} > max {vmax}")
    bounds = (UOp.const(dtype, vmin), UOp.const(dtype, vmax))
    arg = ParamArg(-1, dtype, None, AddrSpace.REG, name)
    return UOp(Ops.PARAM, dtype, (shape_uop(()), *bounds), arg)

  def bind(self, value: int) -> UOp:
    """This variable bound to `value`: the same variable, carrying the value to the launches.
    `UOp.variable("n", 1, 64).bind(3)`; a value outside [min, max] raises ValueError."""
    if self.op is not Ops.PARAM or self.arg.name is None or len(self.src) != 3:
      raise TypeError(f"bind needs a variable (UOp.variable), got {self.op!r}")
    if isinstance(value, bool) or not isinstance(value, int):
      raise TypeError(f"variable {self.arg.name!r}: bind needs an int, got {value!r}")
    lo, hi = self.vmin, self.vmax
    if not lo <= value <= hi:
      raise ValueError(f"variable {self.arg.name!r}: value {value} is outside its range "
                       f"[{lo}, {hi}]")
    return UOp(Ops.PARAM, self.dtype, self.src, dc_replace(self.arg, value=value))

  def unbind(self) -> tuple[UOp, int]:
    """(the unbound variable, its value) of a bound variable."""
    if self.op is not Ops.PARAM or self.arg.name is None or self.arg.value is None:
      raise TypeError(f"unbind needs a bound variable, got {self.render(simplify=False)}")
    return UOp(Ops.PARAM, self.dtype, self.src, dc_replace(self.arg, value=None)), self.arg.value

  @property
  def is_variable(self) -> bool:
    """Whether this is a symbolic variable (a named PARAM with bounds), bound or not."""
    return self.op is Ops.PARAM and self.arg.name is not None

  @staticmethod
  def range(bound: sint, idx: int, axis_type: AxisType = AxisType.LOOP) -> UOp:
    return UOp(Ops.RANGE, None, (as_uop(bound),), RangeArg(idx, axis_type))

  # ---- values ----

  def sintify(self) -> sint:
    """The int if self is an int CONST, else self."""
    return self.arg if self.op is Ops.CONST and type(self.arg) is int else self

  def simplify(self, tracked: bool = False) -> UOp:
    """The node rewritten by the symbolic rules to a fixed point."""
    return graph_rewrite(self, pm_simplify, name="simplify")

  def ssimplify(self) -> UOp | Any:
    """simplify(), then the constant's value if the result is a CONST."""
    ret = self.simplify()
    return ret.arg if ret.op is Ops.CONST else ret

  def substitute(self, dvars: dict[UOp, UOp], name: str | None = None, extra_pm: Any = None) -> UOp:
    """Replace the keys of `dvars` by their values everywhere below self (values are not
    looked into); then `extra_pm`, if given, rewrites the result."""
    return substitute(self, dvars, extra_pm)

  def render(self, simplify: bool = True, pm: Any = None) -> str:
    """A readable expression, e.g. `((r0*4)+r1)`."""
    return render_expr(self.simplify() if simplify else self, pm)

  # ---- ALU builders ----

  def alu(self, op: Ops, *srcs: UOp | Any) -> UOp:
    """`op` over self and `srcs`; Python scalars become constants of self's dtype."""
    ops = tuple(s if isinstance(s, UOp) else UOp.const(self.dtype, s) for s in srcs)
    return UOp(op, None, (self, *ops))  # comparisons derive bool (a vector of bools for vectors)

  def _ralu(self, op: Ops, other: Any) -> UOp: return UOp.const(self.dtype, other).alu(op, self)

  def __add__(self, x: Any) -> UOp: return self.alu(Ops.ADD, x)
  def __radd__(self, x: Any) -> UOp: return self._ralu(Ops.ADD, x)
  def __sub__(self, x: Any) -> UOp: return self.alu(Ops.ADD, x.neg() if isinstance(x, UOp) else -x)
  def __rsub__(self, x: Any) -> UOp: return self.neg().alu(Ops.ADD, x)
  def __mul__(self, x: Any) -> UOp: return self.alu(Ops.MUL, x)
  def __rmul__(self, x: Any) -> UOp: return self._ralu(Ops.MUL, x)
  def __floordiv__(self, x: Any) -> UOp: return self.alu(Ops.IDIV, x)
  def __rfloordiv__(self, x: Any) -> UOp: return self._ralu(Ops.IDIV, x)
  def __mod__(self, x: Any) -> UOp: return self.alu(Ops.MOD, x)
  def __rmod__(self, x: Any) -> UOp: return self._ralu(Ops.MOD, x)
  def __truediv__(self, x: Any) -> UOp:
    _check_float_div(self)
    return self.alu(Ops.MUL, x.alu(Ops.RECIP) if isinstance(x, UOp) else _recip(x))
  def __rtruediv__(self, x: Any) -> UOp: return _check_float_div(self).recip().alu(Ops.MUL, x)
  def __neg__(self) -> UOp: return self.neg()
  def __and__(self, x: Any) -> UOp: return self.alu(Ops.AND, x)
  def __rand__(self, x: Any) -> UOp: return self._ralu(Ops.AND, x)
  def __or__(self, x: Any) -> UOp: return self.alu(Ops.OR, x)
  def __ror__(self, x: Any) -> UOp: return self._ralu(Ops.OR, x)
  def __xor__(self, x: Any) -> UOp: return self.alu(Ops.XOR, x)
  def __rxor__(self, x: Any) -> UOp: return self._ralu(Ops.XOR, x)
  def __lshift__(self, x: Any) -> UOp: return self.alu(Ops.SHL, x)
  def __rshift__(self, x: Any) -> UOp: return self.alu(Ops.SHR, x)
  def __rlshift__(self, x: Any) -> UOp: return self._ralu(Ops.SHL, x)
  def __rrshift__(self, x: Any) -> UOp: return self._ralu(Ops.SHR, x)
  def __lt__(self, x: Any) -> UOp: return self.alu(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> UOp:
    return x.alu(Ops.CMPLT, self) if isinstance(x, UOp) else self._ralu(Ops.CMPLT, x)
  def __le__(self, x: Any) -> UOp: return (self > x).logical_not()
  def __ge__(self, x: Any) -> UOp: return (self < x).logical_not()
  def __invert__(self) -> UOp:
    return self.logical_not() if self.dtype == dtypes.bool else self.alu(Ops.XOR, -1)

  def __bool__(self) -> bool:
    """A bool node is truthy only when its value is proven; any other node is an object."""
    if self.dtype != dtypes.bool: return True
    lo, hi = self.min_max
    if lo == hi: return bool(lo)
    raise TypeError(f"the truth of {self.render(simplify=False)} depends on symbolic values")

  def neg(self) -> UOp:
    return self.alu(Ops.CMPNE, True) if self.dtype == dtypes.bool else self.alu(Ops.MUL, -1)

  def logical_not(self) -> UOp: return self.alu(Ops.CMPNE, True)
  def eq(self, x: Any) -> UOp: return self.ne(x).logical_not()
  def ne(self, x: Any) -> UOp: return self.alu(Ops.CMPNE, x)
  def maximum(self, x: Any) -> UOp: return self.alu(Ops.MAX, x)
  def minimum(self, x: Any) -> UOp: return (self < x).where(self, x)

  def where(self, a: Any, b: Any) -> UOp:
    dt = a.dtype if isinstance(a, UOp) else b.dtype if isinstance(b, UOp) else dtypes.from_py(a)
    ua = a if isinstance(a, UOp) else UOp.const(dt, a)
    ub = b if isinstance(b, UOp) else UOp.const(dt, b)
    return UOp(Ops.WHERE, dt, (self, ua, ub))

  def recip(self) -> UOp: return self.alu(Ops.RECIP)
  def trunc(self) -> UOp: return self.alu(Ops.TRUNC)
  def sqrt(self) -> UOp: return self.alu(Ops.SQRT)
  def exp2(self) -> UOp: return self.alu(Ops.EXP2)
  def log2(self) -> UOp: return self.alu(Ops.LOG2)
  def sin(self) -> UOp: return self.alu(Ops.SIN)
  def pow(self, x: Any) -> UOp: return self.alu(Ops.POW, x)
  def mulacc(self, b: Any, c: Any) -> UOp: return self.alu(Ops.MULACC, b, c)  # self*b + c
  def threefry(self, key: UOp) -> UOp: return self.alu(Ops.THREEFRY, key)


# the slot setters, which bypass the immutability guard (only UOpMetaClass.__call__ uses them)
_set_op, _set_dtype, _set_src, _set_arg, _set_tag, _set_key = (
  vars(UOp)[f].__set__ for f in ("op", "dtype", "src", "arg", "tag", "_key"))
_new_node: Callable[[type], Any] = object.__new__


def _check_float_div(u: UOp) -> UOp:
  if not dtypes.is_float(u.dtype):
    raise TypeError(f"'/' needs a float UOp, got {u.dtype!r}: use //")
  return u


def _recip(x: Any) -> float:
  """1/x for a Python number, inf (with x's sign) for zero."""
  return 1 / x if x != 0 else math.copysign(math.inf, x)


def as_uop(x: sint) -> UOp:
  """An index UOp for a size (an int becomes a CONST)."""
  if isinstance(x, UOp): return x
  if isinstance(x, bool) or not isinstance(x, int):
    raise TypeError(f"a size must be an int or UOp, got {x!r}")
  return UOp.const(dtypes.index, x)


# static shape -> its VCONST: every movement op asks for one (held, so a hit makes no node)
_static_shapes: dict[tuple[sint, ...], UOp] = {}  # (only tuples of plain ints are put in)
STATIC_SHAPE_CACHE = 4096


def shape_uop(shape: Iterable[sint]) -> UOp:
  """A (k,)-shaped index UOp holding a shape: VCONST when static, else STACK of index values."""
  if type(shape) is not tuple: shape = tuple(shape)
  for d in shape:  # a loop, not a set of the types: every movement op passes here
    if type(d) is not int: break
  else:  # plain ints only: no key here equals another type's
    if (u := _static_shapes.get(shape)) is not None: return u
    return bounded_put(_static_shapes, shape, UOp(Ops.VCONST, dtypes.index, (), shape),
                       STATIC_SHAPE_CACHE)
  if all(isinstance(d, int) and not isinstance(d, bool) for d in shape):  # int subclasses
    return UOp(Ops.VCONST, dtypes.index, arg=shape)
  return UOp(Ops.STACK, dtypes.index, tuple(as_uop(d) for d in shape))


def _sprod(shape: Iterable[sint]) -> sint:
  """The product of sizes; symbolic factors stay in front of constants (n*4, not 1*n*4)."""
  out: sint = 1
  for d in shape:
    if isinstance(out, int) and out == 1: out = d
    else: out = out * d if isinstance(out, UOp) else d * out
  return out


def _toposort(root: UOp, bodies: bool = True) -> dict[UOp, None]:
  """`root.toposort()` without a gate, in the same order: the node on top of the stack goes to
  the output once every source is there, else its first missing source goes on the stack (in a
  DAG a node is never on the stack twice; no (node, flag) pairs are made). `bodies=False` leaves
  out the bodies of calls (a FUNCTION's first source)."""
  out: dict[UOp, None] = {}
  stack = [root]
  push, pop = stack.append, stack.pop  # a hot loop: no generator, bound methods
  function = None if bodies else Ops.FUNCTION  # no node's op is None
  while stack:
    node = stack[-1]
    for s in node.src[1:] if node.op is function else node.src:
      if s not in out:
        push(s)
        break
    else:
      out[node] = None
      pop()
  return out


def consumer_map_from_toposort(nodes: Iterable[UOp]) -> dict[UOp, dict[UOp, None]]:
  """node -> its consumers, for every node of a toposorted collection."""
  out: dict[UOp, dict[UOp, None]] = {}
  for u in nodes:
    out.setdefault(u, {})
    for s in u.src: out.setdefault(s, {})[u] = None
  return out


class NodeMap(Generic[T]):
  """A map from UOps to values that keeps each value on its node (an attribute of the node's own
  `__dict__`, beside its cached derived properties): an entry lives exactly as long as its node,
  as in a WeakKeyDictionary, but an access is one dict operation where a WeakKeyDictionary made a
  weak reference for each (0.4 us; every realize looks up its buffers and template and records
  its history). Not iterable: what the nodes hold is not listed anywhere."""

  def __init__(self, name: str) -> None:
    self.attr = f"_map_{name}"

  def get(self, u: UOp, default: Any = None) -> Any: return u.__dict__.get(self.attr, default)
  def __contains__(self, u: UOp) -> bool: return self.attr in u.__dict__
  def __setitem__(self, u: UOp, value: T) -> None: u.__dict__[self.attr] = value
  def pop(self, u: UOp, default: Any = None) -> Any: return u.__dict__.pop(self.attr, default)

  def __getitem__(self, u: UOp) -> T:
    try: return u.__dict__[self.attr]
    except KeyError: raise KeyError(u) from None


all_metadata: weakref.WeakKeyDictionary[UOp, tuple] = weakref.WeakKeyDictionary()
