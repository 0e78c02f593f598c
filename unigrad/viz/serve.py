"""Serve a viewer on 127.0.0.1 with the standard library's http.server.

Static files come from the package; `data/<key>.js` pages are built on their first request (a
large trace is sent a page at a time, as the viewer asks for it). The port is bound before the
traced script runs (`bind`), so a port in use fails at once with a free port to try instead.
"""
from __future__ import annotations

import errno
import http.server
import socket
import threading
import webbrowser
from typing import Any

from unigrad.viz.export import STATIC_DIR, UnknownPageError, Viewer

__all__ = ["PortInUseError", "bind", "free_port", "serve"]

HOST = "127.0.0.1"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".json": "application/json"}


class PortInUseError(OSError):
  """The viewer's port is taken; the message names a free one."""


def free_port() -> int:
  """A port that is free right now (the OS picks it)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((HOST, 0))
    return s.getsockname()[1]


class _Handler(http.server.BaseHTTPRequestHandler):
  viewer: Viewer | None = None

  def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
    path = self.path.split("?", 1)[0].lstrip("/") or "index.html"
    body = self._body(path)
    if body is None:
      self.send_error(404, f"no such page: {path}")
      return
    suffix = "." + path.rsplit(".", 1)[-1]
    self.send_response(200)
    self.send_header("Content-Type", _TYPES.get(suffix, "application/octet-stream") +
                     "; charset=utf-8")
    self.send_header("Content-Length", str(len(body)))
    self.send_header("Cache-Control", "no-store")
    self.end_headers()
    self.wfile.write(body)

  def _body(self, path: str) -> bytes | None:
    if path.startswith("data/") and path.endswith(".js") and self.viewer is not None:
      try: return self.viewer.script(path[5:-3]).encode()
      except UnknownPageError: return None
    f = STATIC_DIR / path
    if "/" in path or not f.is_file(): return None
    return f.read_bytes()

  def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
    return None


def bind(port: int) -> http.server.ThreadingHTTPServer:
  """A server bound to `port` on 127.0.0.1, not yet serving (PortInUseError if taken)."""
  try: return http.server.ThreadingHTTPServer((HOST, port), _Handler, bind_and_activate=True)
  except OSError as e:
    if e.errno != errno.EADDRINUSE: raise
    err = PortInUseError(f"port {port} on {HOST} is in use: another viewer or server holds it; "
                         f"try --port {free_port()} (a free port now)")
    err.errno = errno.EADDRINUSE
    raise err from None


def serve(server: http.server.ThreadingHTTPServer, viewer: Viewer, open_browser: bool,
          background: bool = False) -> threading.Thread | None:
  """Serve `viewer` on `server` until interrupted (or in a daemon thread if `background`)."""
  handler = type("VizHandler", (_Handler,), {"viewer": viewer})
  server.RequestHandlerClass = handler
  url = f"http://{HOST}:{server.server_address[1]}/"
  print(f"unigrad viz: serving {len(viewer.traces)} traces on {url} (Ctrl-C stops)", flush=True)
  if open_browser: webbrowser.open(url)
  if background:
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return t
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()
  return None
