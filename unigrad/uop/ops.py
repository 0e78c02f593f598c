"""The op set of the spec (drafts 000 and 001), its groups, axis types and typed args.

Declaration order matters: it is the tie-breaker of every deterministic sort (canonical operand
order, the linearizer's priority order).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from unigrad.dtype import AddrSpace, DType, Invalid, InvalidType  # noqa: F401 (re-exported)


class Ops(Enum):
  """Every UOp op. Spelled as the spec spells them (upper case)."""
  # source ops (leaves)
  PARAM = auto(); BUFFER = auto(); BUFFER_VIEW = auto(); CONST = auto(); VCONST = auto()  # noqa: E702
  BINARY = auto()
  # movement ops
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto()  # noqa: E702
  FLIP = auto(); INDEX = auto(); STACK = auto(); REPLICATED = auto()  # noqa: E702
  # reduce
  REDUCE = auto()
  # call ops
  FUNCTION = auto(); CALL = auto(); TUPLE = auto(); GETTUPLE = auto()  # noqa: E702
  # memory
  LOAD = auto(); STORE = auto(); COPY = auto()  # noqa: E702
  COLLECTIVE = auto()  # a collective over processes (MPI): a call of its own, like COPY
  # ordering
  RANGE = auto(); END = auto(); AFTER = auto(); GROUP = auto(); SINK = auto()  # noqa: E702
  LINEAR = auto()
  # markers
  CONTIGUOUS = auto(); CONTIGUOUSBACKWARD = auto(); DETACH = auto()  # noqa: E702
  # elementwise primitives
  CAST = auto(); BITCAST = auto(); RECIP = auto(); TRUNC = auto()  # noqa: E702
  ADD = auto(); MUL = auto(); MAX = auto(); MOD = auto(); IDIV = auto()  # noqa: E702
  CMPLT = auto(); CMPNE = auto()  # noqa: E702
  XOR = auto(); OR = auto(); AND = auto(); SHR = auto(); SHL = auto()  # noqa: E702
  WHERE = auto()
  # decomposed elementwise ops
  NEG = auto(); SUB = auto(); DIV = auto()  # noqa: E702
  CMPGT = auto(); CMPGE = auto(); CMPLE = auto(); CMPEQ = auto(); NOT = auto()  # noqa: E702
  EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); POW = auto()  # noqa: E702
  MULACC = auto(); THREEFRY = auto()  # noqa: E702
  # C-semantics integer division (truncating), introduced by instruction selection
  CDIV = auto(); CMOD = auto()  # noqa: E702
  # codegen ops
  BARRIER = auto(); INS = auto(); GETADDR = auto(); SPECIAL = auto()  # noqa: E702
  IF = auto(); ENDIF = auto(); WMMA = auto(); CUSTOM = auto(); ATOMICADD = auto()  # noqa: E702
  CUSTOMFUNCTION = auto(); PROGRAM = auto(); SOURCE = auto()  # noqa: E702
  GEP = auto()  # read lanes of a vector value
  NOOP = auto()
  # the 4 bytes of A (unsigned) times those of B (signed), summed into C: int32 (A and B hold the
  # bytes), introduced by instruction selection on targets with a byte dot product (VNNI, AVX2)
  DOT4 = auto()

  def __repr__(self) -> str: return f"Ops.{self.name}"
  __hash__ = object.__hash__  # members are singletons: identity hashing is exact and fast
  # no __lt__ (sorts take `op.value`): a comparison method written in Python sends every `==` of
  # two ops, and so every `op in (Ops.A, Ops.B)`, through Python's slow slot (165 ns, not 45)


class GroupOp:
  """Named sets of ops that rule tables match on."""
  Unary = frozenset({Ops.RECIP, Ops.TRUNC, Ops.NEG, Ops.NOT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT})
  Binary = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.MOD, Ops.IDIV, Ops.CMPLT, Ops.CMPNE, Ops.XOR,
                      Ops.OR, Ops.AND, Ops.SHR, Ops.SHL, Ops.SUB, Ops.DIV, Ops.CMPGT, Ops.CMPGE,
                      Ops.CMPLE, Ops.CMPEQ, Ops.POW, Ops.THREEFRY, Ops.CDIV, Ops.CMOD})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC, Ops.DOT4})
  ALU = Unary | Binary | Ternary
  Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
  Primitive = frozenset({Ops.RECIP, Ops.TRUNC, Ops.CAST, Ops.BITCAST, Ops.ADD, Ops.MUL, Ops.MAX,
                         Ops.MOD, Ops.IDIV, Ops.CMPLT, Ops.CMPNE, Ops.XOR, Ops.OR, Ops.AND, Ops.SHR,
                         Ops.SHL, Ops.WHERE})
  Decomposed = frozenset({Ops.NEG, Ops.SUB, Ops.DIV, Ops.CMPGT, Ops.CMPGE, Ops.CMPLE, Ops.CMPEQ,
                          Ops.NOT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW, Ops.MULACC,
                          Ops.THREEFRY, Ops.DOT4})
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPGT, Ops.CMPGE, Ops.CMPLE, Ops.CMPEQ})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.OR,
                          Ops.AND})
  Associative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.XOR, Ops.OR, Ops.AND})
  Idempotent = frozenset({Ops.MAX, Ops.OR, Ops.AND})
  Transcendental = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW})
  Source = frozenset({Ops.PARAM, Ops.BUFFER, Ops.BUFFER_VIEW, Ops.CONST, Ops.VCONST, Ops.BINARY})
  Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
  Reduce = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})  # the ops a REDUCE may apply
  Call = frozenset({Ops.FUNCTION, Ops.CALL})
  Marker = frozenset({Ops.CONTIGUOUS, Ops.CONTIGUOUSBACKWARD, Ops.DETACH})
  Defines = frozenset({Ops.PARAM, Ops.BUFFER})
  Irreducible = frozenset({Ops.CONST, Ops.VCONST, Ops.RANGE, Ops.PARAM, Ops.SPECIAL})
  Void = frozenset({Ops.STORE, Ops.SINK, Ops.GROUP, Ops.END, Ops.IF, Ops.ENDIF, Ops.BARRIER,
                    Ops.LINEAR, Ops.TUPLE, Ops.FUNCTION, Ops.PROGRAM, Ops.SOURCE, Ops.NOOP})
  All = frozenset(Ops)


# number of sources of each fixed-arity elementwise op
ARITY: dict[Ops, int] = {**{op: 1 for op in GroupOp.Unary | {Ops.CAST, Ops.BITCAST}},
                         **{op: 2 for op in GroupOp.Binary}, **{op: 3 for op in GroupOp.Ternary}}


class AxisType(Enum):
  """The role of a RANGE in a kernel; `letter` is the spec's one-letter name."""
  GLOBAL = "g"
  LOCAL = "l"
  WARP = "w"
  THREAD = "t"
  LOOP = "L"
  REDUCE = "R"
  GROUP_REDUCE = "G"
  UPCAST = "u"
  UNROLL = "r"

  __hash__ = object.__hash__  # members are singletons: identity hashing (Enum's hashes the name)

  @property
  def letter(self) -> str: return self.value

  def __repr__(self) -> str: return f"AxisType.{self.name}"


# the order axes are laid out in a kernel (outermost first)
AXIS_ORDER: dict[AxisType, int] = {AxisType.THREAD: 0, AxisType.GLOBAL: 1, AxisType.LOOP: 2,
                                   AxisType.WARP: 3, AxisType.LOCAL: 4, AxisType.GROUP_REDUCE: 5,
                                   AxisType.REDUCE: 6, AxisType.UPCAST: 7, AxisType.UNROLL: 8}


# ---- typed args ----

@dataclass(frozen=True)
class ParamArg:
  """Arg of PARAM and BUFFER: a slot number, the element dtype, device and address space.

  A PARAM with a `name` and bounds in its sources is a symbolic variable (slot -1 until numbered).
  A bound variable (`UOp.bind`) also carries its `value`; callify strips it (the function body and
  every kernel see the unbound variable, the value travels beside them to each launch).
  """
  slot: int
  dtype: DType
  device: str | tuple[str, ...] | None = None
  addrspace: AddrSpace = AddrSpace.GLOBAL
  name: str | None = None
  value: int | None = None

  # every realize makes a BUFFER arg and every node made hashes its arg (looked up, cached, and
  # dropped from the cache): the generated frozen __init__ (object.__setattr__ per field) took
  # 0.73 us, writing the instance dict 0.26; its hash 0.21 us
  def __init__(self, slot: int, dtype: DType, device: str | tuple[str, ...] | None = None,
               addrspace: AddrSpace = AddrSpace.GLOBAL, name: str | None = None,
               value: int | None = None) -> None:
    d = self.__dict__
    d["slot"], d["dtype"], d["device"], d["addrspace"], d["name"], d["value"] = \
      slot, dtype, device, addrspace, name, value

  def __hash__(self) -> int:
    if (h := self.__dict__.get("_hash")) is None:
      h = self.__dict__["_hash"] = hash((self.slot, self.dtype, self.device, self.addrspace,
                                         self.name, self.value))
    return h

  def __reduce__(self) -> tuple:  # the cached hash is this process's (str hashes are salted)
    return (ParamArg, (self.slot, self.dtype, self.device, self.addrspace, self.name, self.value))


@dataclass(frozen=True)
class RangeArg:
  """Arg of RANGE: a kernel-unique id and the axis type."""
  id: int
  axis_type: AxisType = AxisType.LOOP

  def __init__(self, id: int, axis_type: AxisType = AxisType.LOOP) -> None:  # noqa: A002
    self.__dict__["id"], self.__dict__["axis_type"] = id, axis_type  # see ParamArg.__init__


@dataclass(frozen=True)
class ReduceArg:
  """Arg of REDUCE: the combining op (ADD, MUL or MAX) and, in the tensor graph, the axes."""
  op: Ops
  axes: tuple[int, ...] = ()

  def __init__(self, op: Ops, axes: tuple[int, ...] = ()) -> None:
    self.__dict__["op"], self.__dict__["axes"] = op, axes  # see ParamArg.__init__


COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")
COLLECTIVE_REDUCES = ("sum", "max", "min")
COLLECTIVE_PHASES = ("", "start", "wait")


@dataclass(frozen=True)
class CollectiveArg:
  """Arg of COLLECTIVE: what every process of a group does together with its local tensor.

  `kind` is one of COLLECTIVE_KINDS; `reduce` the combining op of all_reduce and reduce_scatter
  (sum, max or min); `nranks` the size of the group and `rank` this process's place in it (both
  fix the result's shape: all_gather joins `nranks` tensors along axis 0, reduce_scatter keeps
  this rank's 1/nranks of axis 0); `peer` the root of a broadcast, the destination of a send or
  the source of a recv (-1 for the others); `tag` tells apart messages between the same pair.
  `phase`: "" for the collective; the schedule splits a group collective (not a send or recv)
  into its "start" (the transfer begins) and its "wait" (it has ended: the result may be read,
  the source overwritten), so the kernels in between run while it transfers.
  """
  kind: str
  nranks: int
  rank: int
  reduce: str | None = None
  peer: int = -1
  tag: int = 0
  phase: str = ""


@dataclass(frozen=True)
class CallInfo:
  """Arg of FUNCTION and CALL: a name and, optionally, a gradient function."""
  name: str = "f"
  grad_fxn: Any = None
  precompile: bool = False


@dataclass(frozen=True)
class KernelInfo:
  """Arg of a kernel's SINK: its name, the optimizations applied or still to apply, and the
  decisions that stages downstream read instead of making again:
  `vector`: the ids of the ranges codegen makes vector lanes (at most one; chosen by
  codegen/vectorize.py's `choose_vector_range` and recorded by the heuristics' tile in optimize,
  else by expand, which keeps it and records the range it became): None while nothing has
  chosen, () for none;
  `parallel`: False when the kernel's iterations must run in order, on one core or work item
  (a scatter's stores to repeated indices, schedule/scatter.py): no THREAD or LOCAL split, and
  a GPU target binds none of its loops to thread indices."""
  name: str = "kernel"
  applied_opts: tuple = ()
  opts_to_apply: tuple | None = None
  dont_use_locals: bool = False
  vector: tuple[int, ...] | None = None
  parallel: bool = True


