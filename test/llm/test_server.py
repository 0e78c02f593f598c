"""llm/server.py: the OpenAI-compatible server on the packaged model, driven by the official
`openai` client (models, completions and chat, whole and streamed, stop strings, seeds, usage)
and by raw HTTP (error bodies for bad requests, a client leaving mid-stream, garbage on the
socket, concurrent requests served one after another). Greedy answers must equal what a
Completion gives on the same generator."""
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from unigrad.llm.completion import Completion, stop_token_ids
from unigrad.llm.generate import SamplingParams
from unigrad.llm.server import make_server

openai = pytest.importorskip("openai", reason="the server is tested with the official client")

NAME = "smollm2"
PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(llm):
  """The server on a free port, serving the shared model from a thread."""
  srv = make_server(llm.generator, llm.tokenizer, llm.chat, name=NAME, quiet=True)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()


@pytest.fixture(scope="module")
def client(server):
  return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def expected(server, llm, prompt_ids, max_tokens, stop=()):
  """The greedy completion of `prompt_ids`, computed on the server's generator (holding its lock
  so that no request runs meanwhile)."""
  params = SamplingParams(max_tokens=max_tokens, stop_ids=stop_token_ids(llm.tokenizer))
  with server.lock:
    return Completion(llm.generator, llm.tokenizer, prompt_ids, params, stop).run()


def chat_ids(llm, messages):
  return llm.tokenizer.encode(llm.chat.apply(messages), add_special_tokens=False)


# ---- the openai client ----

def test_models_lists_the_model(client):
  assert [m.id for m in client.models.list().data] == [NAME]
  assert client.models.retrieve(NAME).id == NAME


def test_completion_is_the_greedy_completion(client, server, llm):
  want = expected(server, llm, llm.tokenizer.encode(PROMPT), 8)
  r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0)
  assert r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
  assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 8, 13)


def test_streamed_completion_joins_to_the_same_text(client, server, llm):
  want = expected(server, llm, llm.tokenizer.encode(PROMPT), 8)
  chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8,
                                          temperature=0, stream=True,
                                          stream_options={"include_usage": True}))
  text = "".join(c.choices[0].text for c in chunks if c.choices)
  assert text == want.text and len(chunks) > 3
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
  assert chunks[-1].usage.completion_tokens == 8


def test_chat_is_the_greedy_reply(client, server, llm):
  want = expected(server, llm, chat_ids(llm, QUESTION), 24)
  r = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=24, temperature=0)
  assert r.choices[0].message.role == "assistant"
  assert r.choices[0].message.content == want.text and "Paris" in want.text
  assert r.choices[0].finish_reason == "stop"  # at <|im_end|>, before max_tokens
  assert r.usage.prompt_tokens == len(want.prompt_ids)
  assert r.usage.completion_tokens == len(want.ids)


def test_streamed_chat_joins_to_the_same_reply(client, server, llm):
  want = expected(server, llm, chat_ids(llm, QUESTION), 24)
  chunks = list(client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=24,
                                               temperature=0, stream=True))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
  assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_strings_cut_the_text(client):
  r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0,
                                stop=["."])
  assert (r.choices[0].text, r.choices[0].finish_reason) == (" Paris", "stop")
  # " Paris.\n\nThe answer is:" with float32 matvecs, " Paris.\n\nThe United States..." with
  # int8 ones (test_model.py test_int8_matvecs_greedy_ids): either stop string cuts there
  r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0,
                                stop=["answer", "United"], stream=False)
  assert r.choices[0].text == " Paris.\n\nThe "


def test_a_seed_repeats_a_sampled_completion(client):
  def run():
    return client.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0.9,
                                     top_p=0.95, seed=11).choices[0].text
  assert run() == run()


def test_a_prompt_of_token_ids(client, llm):
  ids = llm.tokenizer.encode(PROMPT)
  r = client.completions.create(model=NAME, prompt=ids, max_tokens=2, temperature=0)
  assert r.choices[0].text == " Paris."


# ---- raw HTTP ----

def request(server, method, path, body=None, raw=None):
  """(status, parsed JSON body) of one request; `raw` bytes are sent as the body as they are."""
  host, port = server.server_address[:2]
  conn = http.client.HTTPConnection(host, port, timeout=60)
  data = raw if raw is not None else None if body is None else json.dumps(body).encode()
  conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
  r = conn.getresponse()
  out = r.status, json.loads(r.read())
  conn.close()
  return out


BAD_REQUESTS = {
  "malformed JSON": ("/v1/completions", None, b'{"prompt": "x",'),
  "not an object": ("/v1/completions", [1, 2], None),
  "empty body": ("/v1/chat/completions", None, b""),
  "deep nesting": ("/v1/completions", None, b"[" * 100_000 + b"]" * 100_000),
  "not UTF-8": ("/v1/completions", None, b'{"prompt": "\xff\xfe"}'),
  "no prompt": ("/v1/completions", {"max_tokens": 4}, None),
  "empty prompt": ("/v1/completions", {"prompt": ""}, None),
  "prompt of bad ids": ("/v1/completions", {"prompt": [1, -5]}, None),
  "two prompts": ("/v1/completions", {"prompt": ["a", "b"]}, None),
  "prompt a number": ("/v1/completions", {"prompt": 5}, None),
  "max_tokens 0": ("/v1/completions", {"prompt": "x", "max_tokens": 0}, None),
  "max_tokens a string": ("/v1/completions", {"prompt": "x", "max_tokens": "8"}, None),
  "max_tokens a float": ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, None),
  "max_tokens a bool": ("/v1/completions", {"prompt": "x", "max_tokens": True}, None),
  "negative temperature": ("/v1/completions", {"prompt": "x", "temperature": -1}, None),
  "NaN temperature": ("/v1/completions", None, b'{"prompt": "x", "temperature": NaN}'),
  "top_p 0": ("/v1/completions", {"prompt": "x", "top_p": 0}, None),
  "top_p above 1": ("/v1/completions", {"prompt": "x", "top_p": 1.5}, None),
  "seed a string": ("/v1/completions", {"prompt": "x", "seed": "1"}, None),
  "stop a number": ("/v1/completions", {"prompt": "x", "stop": 3}, None),
  "five stop strings": ("/v1/completions", {"prompt": "x", "stop": list("abcde")}, None),
  "stream a string": ("/v1/completions", {"prompt": "x", "stream": "yes"}, None),
  "n 2": ("/v1/completions", {"prompt": "x", "n": 2}, None),
  "no messages": ("/v1/chat/completions", {"max_tokens": 4}, None),
  "messages not a list": ("/v1/chat/completions", {"messages": "hi"}, None),
  "no message": ("/v1/chat/completions", {"messages": []}, None),
  "a message not an object": ("/v1/chat/completions", {"messages": ["hi"]}, None),
  "a bad role": ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]},
                 None),
  "an image part": ("/v1/chat/completions", {"messages": [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
  "prompt too long": ("/v1/completions", {"prompt": "word " * 3000}, None),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_requests_get_openai_error_bodies(server, case):
  path, body, raw = BAD_REQUESTS[case]
  status, out = request(server, "POST", path, body, raw)
  assert status == 400, out
  assert set(out["error"]) == {"message", "type", "param", "code"}
  assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"]


def test_error_fields_name_the_parameter(server):
  _, out = request(server, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})
  assert out["error"]["param"] == "max_tokens" and "at least 1" in out["error"]["message"]
  _, out = request(server, "POST", "/v1/completions", {"prompt": "word " * 3000})
  assert out["error"]["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404(server, client):
  status, out = request(server, "POST", "/v1/completions", {"model": "gpt-9", "prompt": "x"})
  assert status == 404 and out["error"]["code"] == "model_not_found"
  with pytest.raises(openai.NotFoundError):
    client.chat.completions.create(model="gpt-9", messages=QUESTION, max_tokens=1)
  assert request(server, "GET", "/v1/models/gpt-9")[0] == 404


def test_unknown_paths_and_methods(server):
  status, out = request(server, "GET", "/v2/things")
  assert status == 404 and out["error"]["code"] == "unknown_url"
  assert request(server, "POST", "/", {"prompt": "x"})[0] == 404
  assert request(server, "GET", "/v1/completions")[0] == 405
  assert request(server, "DELETE", "/v1/models")[0] == 405


def test_an_oversized_body_is_refused_unread(server):
  host, port = server.server_address[:2]
  with socket.create_connection((host, port), timeout=30) as s:
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    head = s.recv(4096)
  assert head.startswith(b"HTTP/1.0 413")


def test_garbage_on_the_socket_does_not_stop_the_server(server, client):
  host, port = server.server_address[:2]
  for junk in (b"\x00\x01\x02 garbage\r\n\r\n", b"GET\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"
               b"Content-Length: nope\r\n\r\n", b"\r\n" * 3):
    with socket.create_connection((host, port), timeout=30) as s:
      s.sendall(junk)
      s.shutdown(socket.SHUT_WR)
      while s.recv(4096): pass
  r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=1, temperature=0)
  assert r.choices[0].text == " Paris"


def test_a_client_leaving_mid_stream_stops_its_generation(server, client):
  """The client reads the first piece of a 200-token stream and hangs up; the server notices at
  its next write, stops generating and serves the next request."""
  before = server.disconnects
  host, port = server.server_address[:2]
  body = json.dumps({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 200, "temperature": 0,
                     "stream": True}).encode()
  with socket.create_connection((host, port), timeout=60) as s:
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b'"text": "' not in received: received += s.recv(4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: reset
  r = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=2, temperature=0)
  assert r.choices[0].text == " Paris."
  assert server.disconnects == before + 1


def test_concurrent_requests_take_turns(server, client, llm):
  prompts = {PROMPT: 6, "def add(a, b):": 6}
  want = {p: expected(server, llm, llm.tokenizer.encode(p), n).text for p, n in prompts.items()}
  got, errors = {}, []

  def ask(p):
    try: got[p] = client.completions.create(model=NAME, prompt=p, max_tokens=prompts[p],
                                            temperature=0).choices[0].text
    except Exception as e: errors.append(e)  # noqa: BLE001 (reported by the assert)
  threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
  for t in threads: t.start()
  for t in threads: t.join(120)
  assert not errors and got == want


def test_the_serve_command(model_path):
  """`python -m unigrad.llm serve --port 0` serves on a free port it names; Ctrl-C stops it."""
  root = Path(__file__).resolve().parents[2]
  # SIGINT's default disposition in the child, as in a terminal: a background job (a CI step under
  # nohup) starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler
  proc = subprocess.Popen([sys.executable, "-m", "unigrad.llm", "serve", "--port", "0", "--model",
                           model_path, "--name", "m"], cwd=root, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    # (a cold compile cache prints progress lines first)
    lines, url = [], None
    while len(lines) < 20 and url is None:
      lines.append(proc.stderr.readline())
      if not lines[-1]: break
      url = re.search(r"at (http://\S+/v1)", lines[-1])
    assert url, "".join(lines)
    c = openai.OpenAI(base_url=url.group(1), api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in c.models.list().data] == ["m"]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
  finally:
    proc.kill()
    proc.stderr.close()
