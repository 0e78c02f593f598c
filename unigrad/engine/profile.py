"""The profiler: with `PROFILE=1`, every kernel launch, buffer copy and compile is recorded.

Each event has a name, a category (kernel, copy, codegen, compile), the device, the Python thread
that issued it and its start and end times (host clock, `time.perf_counter`); a kernel launch also
carries the time the device reported (launches wait for completion while profiling) and its work
estimates (FLOPs, bytes moved). At exit the events are written in the Chrome trace-event format to
`PROFILE_PATH` (profile.json: opens in Perfetto, chrome://tracing and the viewer's timeline tab)
and the top `PROFILE_TOP` kernels by total time are printed (calls, time, GFLOPS, GB/s).
"""
from __future__ import annotations

import atexit
import json
import pathlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from unigrad.knobs import PROFILE, PROFILE_PATH, PROFILE_TOP

__all__ = ["ProfileEvent", "events", "record", "chrome_trace", "write_trace", "kernel_table",
           "finish", "is_profiling"]


@dataclass(frozen=True)
class ProfileEvent:
  """One recorded operation. `seconds` is the device's own time where it reported one."""
  name: str
  cat: str
  device: str
  thread: str
  start: float
  end: float
  seconds: float
  flops: int = 0
  mem_bytes: int = 0


events: list[ProfileEvent] = []
ORIGIN = time.perf_counter()  # trace timestamps count from here (import time)
_state = {"exit_hook": False}


def is_profiling() -> bool: return bool(PROFILE)


def record(name: str, cat: str, device: str, start: float, end: float | None = None,
           seconds: float | None = None, flops: int = 0, mem_bytes: int = 0) -> None:
  """Record one event (`end` defaults to now, `seconds` to `end - start`); the first one
  arranges for the trace and the table at exit."""
  end = time.perf_counter() if end is None else end
  secs = end - start if seconds is None else seconds
  thread = threading.current_thread().name
  events.append(ProfileEvent(name, cat, device, thread, start, end, secs, flops, mem_bytes))
  if not _state["exit_hook"]:
    _state["exit_hook"] = True
    atexit.register(_at_exit)


def _us(t: float) -> float: return round((t - ORIGIN) * 1e6, 3)


def chrome_trace(evs: list[ProfileEvent] | None = None) -> dict[str, Any]:
  """The events as a Chrome trace: one process per device, one thread row per Python thread."""
  evs = events if evs is None else evs
  pids = {d: i + 1 for i, d in enumerate(sorted({e.device for e in evs}))}
  tids: dict[tuple[str, str], int] = {}
  out: list[dict[str, Any]] = []
  for dev, pid in pids.items():
    out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": dev}})
  for e in evs:
    key = (e.device, e.thread)
    if key not in tids:
      tids[key] = len(tids) + 1
      out.append({"ph": "M", "name": "thread_name", "pid": pids[e.device], "tid": tids[key],
                  "args": {"name": e.thread}})
    args: dict[str, Any] = {"device_us": round(e.seconds * 1e6, 3)}
    if e.flops: args["GFLOPS"] = round(e.flops / max(e.seconds, 1e-12) * 1e-9, 3)
    if e.mem_bytes: args["GB/s"] = round(e.mem_bytes / max(e.seconds, 1e-12) * 1e-9, 3)
    if e.flops or e.mem_bytes: args.update(flops=e.flops, bytes=e.mem_bytes)
    out.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": pids[e.device], "tid": tids[key],
                "ts": _us(e.start), "dur": round(max(e.end - e.start, 0.0) * 1e6, 3),
                "args": args})
  return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(path: str | pathlib.Path, evs: list[ProfileEvent] | None = None) -> pathlib.Path:
  """Write the Chrome trace of `evs` (default: every event so far) to `path`."""
  p = pathlib.Path(path)
  p.write_text(json.dumps(chrome_trace(evs)))
  return p


def kernel_table(evs: list[ProfileEvent] | None = None, top: int = 20) -> str:
  """The `top` kernels (and copies) by total time: calls, total ms, share, GFLOPS, GB/s."""
  evs = events if evs is None else evs
  rows: dict[str, list[float]] = {}
  for e in evs:
    if e.cat not in ("kernel", "copy"): continue
    r = rows.setdefault(e.name, [0, 0.0, 0, 0])
    r[0] += 1
    r[1] += e.seconds
    r[2] += e.flops
    r[3] += e.mem_bytes
  total = sum(r[1] for r in rows.values()) or 1e-12
  lines = [f"{'kernel':40s} {'calls':>6s} {'total ms':>10s} {'%':>6s} {'GFLOPS':>9s} {'GB/s':>9s}"]
  for name, (calls, secs, flops, mem) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
    s = max(secs, 1e-12)
    lines.append(f"{name[:40]:40s} {int(calls):6d} {secs * 1e3:10.3f} {secs / total * 100:6.1f} "
                 f"{flops / s * 1e-9:9.2f} {mem / s * 1e-9:9.2f}")
  return "\n".join(lines)


def finish(path: str | pathlib.Path | None = None, out: TextIO = sys.stdout) -> pathlib.Path:
  """Write the trace (to `path`, default PROFILE_PATH) and print the kernel table."""
  p = write_trace(str(PROFILE_PATH) if path is None else path)
  launches = sum(1 for e in events if e.cat == "kernel")
  print(f"profile: {len(events)} events ({launches} kernel launches) written to {p}", file=out)
  print(kernel_table(top=int(PROFILE_TOP)), file=out)
  return p


def _at_exit() -> None:
  if PROFILE and events: finish()
