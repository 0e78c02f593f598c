"""PROFILE=1: every kernel launch, copy and compile recorded; the Chrome trace and the table."""
import io
import json

from unigrad import Tensor, TinyJit
from unigrad.engine import profile
from unigrad.knobs import Context


def _new_events(fn) -> list[profile.ProfileEvent]:
  before = len(profile.events)
  fn()
  return profile.events[before:]


def test_profile_records_launches_copies_and_compiles_with_times() -> None:
  def run() -> None:
    with Context(PROFILE=1, CACHELEVEL=0, DEV="CPU"):
      x = Tensor([[0.5, 1.5, 2.5, 3.5]] * 9)  # copied in from the host
      (x * 0.9171 + 0.1234).sum(axis=1).tolist()  # copied out (numpy() would share the memory)
  evs = _new_events(run)
  cats = {e.cat for e in evs}
  assert {"kernel", "copy", "codegen", "compile"} <= cats
  assert all(e.start <= e.end and e.seconds >= 0 and e.device == "CPU" for e in evs)
  assert all(e.thread == "MainThread" for e in evs)
  kernels = [e for e in evs if e.cat == "kernel"]
  assert any(e.flops > 0 for e in kernels) and all(e.mem_bytes > 0 for e in kernels)
  assert {"copyin", "copyout"} <= {e.name for e in evs}


def test_profile_off_records_nothing() -> None:
  evs = _new_events(lambda: (Tensor.ones(3, 3).contiguous() * 2.5).numpy())
  assert evs == []


def test_jit_replays_are_profiled_launch_by_launch() -> None:
  @TinyJit
  def step(a: Tensor) -> Tensor: return (a * 1.75 + 0.5).sum()
  def run() -> None:
    with Context(PROFILE=1, DEV="CPU"):
      for _ in range(4): step(Tensor.ones(6).contiguous().realize()).numpy()
  evs = _new_events(run)
  names = [e.name for e in evs if e.cat == "kernel"]
  assert len(names) >= 4 and len(set(names)) < len(names)  # the replays launch the same kernels


def test_chrome_trace_has_a_process_per_device_and_complete_events(tmp_path) -> None:
  evs = [profile.ProfileEvent("k", "kernel", "CPU", "MainThread", 1.0, 1.5, 0.25, 10**9, 10**9),
         profile.ProfileEvent("c", "copy", "CL", "worker", 1.2, 1.3, 0.1, 0, 8)]
  trace = profile.chrome_trace(evs)
  meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
  assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {"CPU", "CL"}
  assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {"MainThread", "worker"}
  k = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "k")
  assert k["dur"] == 500000.0 and k["cat"] == "kernel" and k["args"]["GFLOPS"] == 4.0
  path = profile.write_trace(tmp_path / "p.json", evs)
  assert json.loads(path.read_text()) == trace


def test_kernel_table_orders_by_total_time_with_rates() -> None:
  evs = [profile.ProfileEvent("small", "kernel", "CPU", "T", 0, 1, 0.001, 2 * 10**6, 10**6),
         profile.ProfileEvent("big", "kernel", "CPU", "T", 0, 1, 0.002, 0, 0),
         profile.ProfileEvent("big", "kernel", "CPU", "T", 0, 1, 0.002, 0, 0),
         profile.ProfileEvent("compile big", "compile", "CPU", "T", 0, 1, 5.0)]
  lines = profile.kernel_table(evs, top=5).splitlines()
  assert lines[0].split() == ["kernel", "calls", "total", "ms", "%", "GFLOPS", "GB/s"]
  assert [ln.split()[0] for ln in lines[1:]] == ["big", "small"]  # compiles are not kernels
  assert lines[1].split()[1:3] == ["2", "4.000"]
  assert lines[2].split()[-2:] == ["2.00", "1.00"]
  assert len(profile.kernel_table(evs, top=1).splitlines()) == 2


def test_finish_writes_the_trace_and_prints_the_table(tmp_path) -> None:
  out = io.StringIO()
  with Context(PROFILE=1): (Tensor.ones(5).contiguous() * 3.25).numpy()
  path = profile.finish(tmp_path / "trace.json", out)
  assert json.loads(path.read_text())["traceEvents"]
  text = out.getvalue()
  assert f"written to {path}" in text and "GFLOPS" in text
