"""The graph and rewrite viewer: `python -m unigrad.viz SCRIPT.py` or `VIZ=1`.

Every schedule and kernel is traced (each graph_rewrite call and codegen stage, each rule that
fired with its source line); the viewer lists them, draws their UOp graphs, steps through the
rewrites and shows each kernel's source, and the profiler's timeline (PROFILE=1). Plain HTML,
CSS and JavaScript (static/) served by http.server or exported as files.
"""
from unigrad.viz.export import Viewer, export
from unigrad.viz.serve import PortInUseError, bind, serve
from unigrad.viz.session import install_exit_hook, run_script, start_tracing, viewer

__all__ = ["PortInUseError", "Viewer", "bind", "export", "install_exit_hook", "run_script",
           "serve", "start_tracing", "viewer"]
