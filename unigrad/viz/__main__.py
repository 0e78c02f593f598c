"""`python -m unigrad.viz [--port N] [--no-browser] [--export DIR] [--profile] SCRIPT.py [args]`.

Runs the script with rewrite tracking on, then serves the viewer on http://127.0.0.1:PORT (or
writes it to DIR with --export: DIR/index.html opens without a server). The port is taken before
the script runs, so a port in use is reported at once, with a free port to use instead.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from unigrad.knobs import PROFILE
from unigrad.viz.export import export
from unigrad.viz.serve import PortInUseError, bind, serve
from unigrad.viz.session import cancel_exit_hook, run_script, viewer


def parse(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m unigrad.viz", description=__doc__.split("\n")[0])
  p.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
  p.add_argument("--no-browser", action="store_true", help="do not open a browser")
  p.add_argument("--export", metavar="DIR", help="write the viewer to DIR instead of serving it")
  p.add_argument("--profile", action="store_true", help="also profile (PROFILE=1): the timeline")
  p.add_argument("script", help="the Python script to trace")
  p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
  return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  args = parse(sys.argv[1:] if argv is None else argv)
  cancel_exit_hook()
  if not pathlib.Path(args.script).is_file():
    print(f"unigrad viz: no such script: {args.script}", file=sys.stderr)
    return 2
  server = None
  if args.export is None:
    try: server = bind(args.port)
    except PortInUseError as e:
      print(f"unigrad viz: {e}", file=sys.stderr)
      return 2
  if args.profile: PROFILE.value = 1
  result = run_script(args.script, args.args)
  if result.error is not None:
    print(f"unigrad viz: {args.script} raised; the viewer shows what was traced before it and "
          f"the error", file=sys.stderr)
  v = viewer(" ".join([args.script, *args.args]), result.error)
  if server is None:
    print(f"unigrad viz: wrote {export(v, args.export)}")
    return result.status
  serve(server, v, open_browser=not args.no_browser)
  return result.status


if __name__ == "__main__": sys.exit(main())
