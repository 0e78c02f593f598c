"""An OpenAI-compatible HTTP server for one model: `python -m unigrad.llm serve --port 8000`.

Endpoints: `GET /v1/models` (and `/v1/models/<name>`), `POST /v1/completions` and
`POST /v1/chat/completions`, answered whole or, with `"stream": true`, as server-sent events in
OpenAI's chunk format ending with `data: [DONE]`. The bodies are api.py's.

Built on the standard library's `http.server.ThreadingHTTPServer`: no dependency to install or
keep up with, and enough for what this is, one model on one machine served to a few local
clients. Each connection gets a thread (a slow client reading or sending does not hold up the
others), but generation runs one request at a time under a lock: the model has one KV cache,
and requests are never interleaved into each other's. A waiting request waits for the lock.
For many clients or a public address, put a production server in front or use llama.cpp/vLLM.

Nothing a client sends stops the server: bad bodies and fields are answered with OpenAI-style
errors (400, 404, 405, 413), a client that goes away mid-stream ends its generation (the lock is
released for the next request), and an unexpected exception is a 500 for that request alone.
"""
from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from unigrad.llm import api
from unigrad.llm.api import APIError, GenerationRequest, ModelInfo
from unigrad.llm.chat import ChatTemplate
from unigrad.llm.completion import Completion, stop_token_ids
from unigrad.llm.generate import Generator
from unigrad.llm.tokenizer import Tokenizer

__all__ = ["LLMServer", "make_server"]

MAX_BODY = 8 << 20  # bytes of a request body: far more than a full context of text
DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class LLMServer(ThreadingHTTPServer):
  """The HTTP server and what it serves: a generator, its tokenizer and chat template, and the
  lock that makes requests take turns at the model. `disconnects` counts streams whose client
  went away (their generation stopped)."""
  daemon_threads = True  # a connection's thread does not keep the process alive

  def __init__(self, address: tuple[str, int], generator: Generator, tokenizer: Tokenizer,
               chat: ChatTemplate, info: ModelInfo, quiet: bool = False) -> None:
    super().__init__(address, Handler)
    self.generator, self.tokenizer, self.chat, self.info = generator, tokenizer, chat, info
    self.quiet = quiet
    self.lock = threading.Lock()
    self.disconnects = 0

  @property
  def url(self) -> str:
    """The base URL of the API (`http://127.0.0.1:8000/v1`)."""
    host, port = self.server_address[:2]
    return f"http://{host}:{port}/v1"


def make_server(generator: Generator, tokenizer: Tokenizer, chat: ChatTemplate, port: int = 0,
                host: str = "127.0.0.1", name: str = "unigrad", quiet: bool = False) -> LLMServer:
  """A server for an already-loaded model, bound and listening (port 0: a free port, see
  `.url`); `serve_forever()` (in a thread, for tests) serves it. `name` is the model's id."""
  info = ModelInfo(name, generator.model.max_context, stop_token_ids(tokenizer))
  return LLMServer((host, port), generator, tokenizer, chat, info, quiet)


class Handler(BaseHTTPRequestHandler):
  """One connection: routes a request, answers JSON or a stream of events."""
  server: LLMServer
  server_version = "unigrad-llm"
  timeout = 60  # seconds a silent client may hold its thread (reading a request or its body)

  def do_GET(self) -> None: self._dispatch("GET")
  def do_POST(self) -> None: self._dispatch("POST")
  def do_PUT(self) -> None: self._dispatch("PUT")
  def do_DELETE(self) -> None: self._dispatch("DELETE")
  def do_PATCH(self) -> None: self._dispatch("PATCH")

  def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
    if not self.server.quiet: super().log_message(format, *args)

  def _dispatch(self, method: str) -> None:
    """Answers the request; an error becomes an OpenAI error body (500 for a bug of ours)."""
    try:
      self._route(method, urlsplit(self.path).path.rstrip("/"))
    except APIError as e:
      self._send_json(e.status, e.body())
    except DISCONNECTS:
      self.close_connection = True
    except Exception:  # noqa: BLE001 (one request's bug must not reach the server)
      traceback.print_exc(file=sys.stderr)
      err = APIError(500, "The server failed on this request", kind="server_error")
      try: self._send_json(500, err.body())
      except (OSError, ValueError): self.close_connection = True

  def _route(self, method: str, path: str) -> None:
    routes: dict[str, Callable[[], None]] = {
      "/v1/models": self._models, "/v1/completions": self._completions,
      "/v1/chat/completions": self._chat_completions}
    if path.startswith("/v1/models/"): return self._check_method(method, "GET", self._model)
    if path not in routes:
      raise APIError(404, f"Unknown path {path or '/'}; this server answers /v1/models, "
                     "/v1/completions and /v1/chat/completions", code="unknown_url")
    self._check_method(method, "GET" if path == "/v1/models" else "POST", routes[path])

  def _check_method(self, method: str, allowed: str, answer: Callable[[], None]) -> None:
    if method != allowed:
      raise APIError(405, f"{method} is not allowed on {urlsplit(self.path).path}; use {allowed}",
                     code="method_not_allowed")
    answer()

  # ---- endpoints ----

  def _models(self) -> None:
    self._send_json(200, api.models_body(self.server.info))

  def _model(self) -> None:
    name = urlsplit(self.path).path.rstrip("/")[len("/v1/models/"):]
    models = api.models_body(self.server.info)["data"]
    found = [m for m in models if m["id"] == name]
    if not found:
      raise APIError(404, f"The model '{name}' does not exist", param="model",
                     code="model_not_found")
    self._send_json(200, found[0])

  def _completions(self) -> None:
    s = self.server
    req = api.parse_completion(self._read_json(), s.tokenizer, s.info)
    self._answer(req, api.new_id("cmpl"), api.completion_body, api.completion_events)

  def _chat_completions(self) -> None:
    s = self.server
    req = api.parse_chat(self._read_json(), s.tokenizer, s.chat, s.info)
    self._answer(req, api.new_id("chatcmpl"), api.chat_body, api.chat_events)

  def _answer(self, req: GenerationRequest, rid: str,
              body: Callable[[str, str, Completion], dict[str, Any]],
              events: Callable[[str, str, Completion, bool], Iterator[dict[str, Any]]]) -> None:
    """Generates under the lock: the whole answer, or its events as they are generated."""
    s = self.server
    done = Completion(s.generator, s.tokenizer, req.prompt_ids, req.params, req.stop)
    with s.lock:
      if req.stream: return self._stream(events(rid, s.info.name, done, req.include_usage))
      done.run()
    self._send_json(200, body(rid, s.info.name, done))

  # ---- the wire ----

  def _read_json(self) -> Any:
    """The request body, parsed; APIError for a missing, oversized or malformed one."""
    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
      raise APIError(411, "Send the body with a Content-Length (chunked bodies are not read)")
    try: length = int(self.headers.get("Content-Length", "0"))
    except ValueError: raise APIError(400, "Content-Length is not a number") from None
    if length < 0: raise APIError(400, "Content-Length is negative")
    if length > MAX_BODY:
      self.close_connection = True
      raise APIError(413, f"The body has {length} bytes; at most {MAX_BODY} are read")
    try: data = self.rfile.read(length)
    except TimeoutError:
      self.close_connection = True
      raise APIError(408, f"The body did not arrive within {self.timeout} s") from None
    if not data.strip(): raise APIError(400, "The request body is empty; send a JSON object")
    try: return json.loads(data)
    except (ValueError, RecursionError) as e:
      raise APIError(400, f"The request body is not valid JSON: {e}") from None

  def _send_json(self, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _stream(self, events: Iterator[dict[str, Any]]) -> None:
    """Writes each event as it comes, then `[DONE]`. A client gone away stops the events (and
    with them the generation); an error while generating is sent as an error event."""
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.end_headers()
    self.close_connection = True  # the stream's end is the connection's end
    try:
      try:
        for event in events: self._write_event(json.dumps(event))
      except DISCONNECTS: raise
      except Exception:  # noqa: BLE001 (the status is sent: report the failure in the stream)
        traceback.print_exc(file=sys.stderr)
        err = APIError(500, "The server failed while generating", kind="server_error")
        self._write_event(json.dumps(err.body()))
      self._write_event("[DONE]")
    except DISCONNECTS:
      self.server.disconnects += 1  # under the lock: one stream at a time
    finally:
      events.close()

  def _write_event(self, data: str) -> None:
    self.wfile.write(f"data: {data}\n\n".encode())
    self.wfile.flush()
