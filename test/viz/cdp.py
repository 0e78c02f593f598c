"""A minimal Chrome DevTools Protocol client over a standard-library websocket, for the viewer's
browser tests: start headless Chromium, open a page, evaluate JavaScript, take a screenshot."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
  return next((p for b in BROWSERS if (p := shutil.which(b)) is not None), None)


class WebSocket:
  """A client websocket (RFC 6455): text frames out (masked), whole messages in."""

  def __init__(self, url: str, timeout: float = 30.0) -> None:
    m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
    if m is None: raise ValueError(f"not a ws:// url: {url}")
    self.sock = socket.create_connection((m[1], int(m[2])), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    self.sock.sendall((f"GET {m[3]} HTTP/1.1\r\nHost: {m[1]}:{m[2]}\r\nUpgrade: websocket\r\n"
                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head: head += self._recv(1)
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
      raise ConnectionError(head.decode(errors="replace"))

  def _recv(self, n: int) -> bytes:
    out = b""
    while len(out) < n:
      chunk = self.sock.recv(n - len(out))
      if not chunk: raise ConnectionError("websocket closed")
      out += chunk
    return out

  def send(self, text: str) -> None:
    data, mask = text.encode(), os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                            bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                            bytes([0x80 | 127]) + struct.pack(">Q", n))
    self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

  def recv(self) -> str:
    parts: list[bytes] = []
    while True:
      b0, b1 = self._recv(2)
      n = b1 & 0x7F
      if n == 126: n = struct.unpack(">H", self._recv(2))[0]
      elif n == 127: n = struct.unpack(">Q", self._recv(8))[0]
      payload = self._recv(n)
      op = b0 & 0x0F
      if op == 0x8: raise ConnectionError("websocket closed by the browser")
      if op in (0x9, 0xA): continue  # ping/pong
      parts.append(payload)
      if b0 & 0x80: return b"".join(parts).decode()

  def close(self) -> None: self.sock.close()


class Browser:
  """Headless Chromium with one page, driven through the DevTools protocol."""

  def __init__(self, exe: str, width: int = 1400, height: int = 900) -> None:
    self.profile = tempfile.mkdtemp(prefix="unigrad-cdp-")
    self.proc = subprocess.Popen(
      [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
       "--disable-dev-shm-usage", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
       f"--window-size={width},{height}", "about:blank"],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = self._port()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
      targets = json.load(r)
    page = next(t for t in targets if t.get("type") == "page")
    self.ws = WebSocket(page["webSocketDebuggerUrl"])
    self.next_id = 0
    self.events: list[dict[str, Any]] = []

  def _port(self) -> int:
    """The DevTools port, from the line Chromium prints on stderr."""
    deadline = time.time() + 60
    assert self.proc.stderr is not None
    while time.time() < deadline:
      line = self.proc.stderr.readline()
      if not line and self.proc.poll() is not None: break
      if (m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)): return int(m[1])
    raise RuntimeError("Chromium did not start its DevTools server")

  def call(self, method: str, **params: Any) -> dict[str, Any]:
    self.next_id += 1
    self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
    while True:
      msg = json.loads(self.ws.recv())
      if msg.get("id") == self.next_id:
        if "error" in msg: raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})
      self.events.append(msg)

  def eval(self, expr: str) -> Any:
    """The value of a JavaScript expression (awaited if it is a promise)."""
    r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in r: raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
    return r["result"].get("value")

  def wait_for(self, expr: str, timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
      if (v := self.eval(expr)): return v
      time.sleep(0.1)
    raise TimeoutError(f"waited {timeout} s for {expr}")

  def open(self, url: str) -> None:
    self.call("Page.enable")
    self.call("Page.navigate", url=url)

  def screenshot(self) -> bytes:
    return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

  def console_errors(self) -> list[str]:
    return [str(e["params"]) for e in self.events if e.get("method") == "Runtime.exceptionThrown"]

  def close(self) -> None:
    self.ws.close()
    self.proc.terminate()
    try: self.proc.wait(10)
    except subprocess.TimeoutExpired: self.proc.kill()
    shutil.rmtree(self.profile, ignore_errors=True)
