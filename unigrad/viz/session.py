"""Tracing a program for the viewer: `run_script` (the CLI) and the `VIZ=1` exit hook.

Tracing turns on `VIZ` (every schedule and kernel is recorded, see uop/upat.py `traced_call`)
and keeps schedules and kernels out of the disk cache's hits (`CACHELEVEL=1`: a cached kernel is
never lowered, so it would have no rewrites to show). A script that raises still gives a viewer:
what was traced up to the error, and the error itself.
"""
from __future__ import annotations

import atexit
import pathlib
import runpy
import sys
import tempfile
import traceback
from dataclasses import dataclass
from types import TracebackType

from unigrad.engine import profile
from unigrad.knobs import CACHELEVEL, VIZ, VIZ_PORT
from unigrad.uop.upat import traces
from unigrad.viz.export import Viewer, export
from unigrad.viz.serve import PortInUseError, bind, serve

__all__ = ["ScriptResult", "start_tracing", "run_script", "viewer", "install_exit_hook",
           "cancel_exit_hook"]

_state: dict[str, object] = {"hooked": False, "error": None}


def start_tracing() -> None:
  """Record every schedule and kernel from now on."""
  VIZ.value = 1
  if CACHELEVEL > 1: CACHELEVEL.value = 1


@dataclass
class ScriptResult:
  """How a traced script ended: its exit status and, if it raised, the traceback text."""
  status: int
  error: str | None


def run_script(path: str, args: list[str]) -> ScriptResult:
  """Run `path` as `__main__` with `args` as its argv, tracing; a raise becomes the result."""
  start_tracing()
  saved = sys.argv
  sys.argv = [path, *args]
  try: runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return ScriptResult(code, None if code == 0 else f"SystemExit: {e.code}")
  except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 (the viewer shows any error)
    return ScriptResult(1, _script_traceback(e, path))
  finally: sys.argv = saved
  return ScriptResult(0, None)


def _script_traceback(e: BaseException, path: str) -> str:
  """The traceback of `e` from the script's own frames on (runpy's and ours left out)."""
  tb = e.__traceback__
  script = pathlib.Path(path).resolve()
  while tb is not None and pathlib.Path(tb.tb_frame.f_code.co_filename).resolve() != script:
    tb = tb.tb_next
  return "".join(traceback.format_exception(type(e), e, tb or e.__traceback__))


def viewer(title: str, error: str | None) -> Viewer:
  """A viewer of everything traced so far (and the profile events, if any)."""
  return Viewer(list(traces), error, title, list(profile.events))


# ---- VIZ=1 in any program ----

def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
  _state["error"] = "".join(traceback.format_exception(kind, value, tb))
  sys.__excepthook__(kind, value, tb)


def _serve_at_exit() -> None:
  v = viewer(" ".join(sys.argv) or "unigrad", _state["error"])  # type: ignore[arg-type]
  try: server = bind(int(VIZ_PORT))
  except PortInUseError as e:
    out = export(v, tempfile.mkdtemp(prefix="unigrad-viz-"))
    print(f"unigrad viz: {e}; the viewer was written to {out} instead", file=sys.stderr)
    return
  serve(server, v, open_browser=True)


def cancel_exit_hook() -> None:
  """The CLI serves (or exports) its own viewer: VIZ=1 in its environment adds no second one."""
  atexit.unregister(_serve_at_exit)


def install_exit_hook() -> None:
  """VIZ=1: trace the whole program and serve the viewer when it exits."""
  if _state["hooked"]: return
  _state["hooked"] = True
  start_tracing()
  sys.excepthook = _excepthook
  atexit.register(_serve_at_exit)
