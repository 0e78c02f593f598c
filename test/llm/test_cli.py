"""`python -m unigrad.llm`: --prompt --json in a fresh process gives the Generator's greedy ids,
--stop cuts the streamed text, bad options fail before the model loads, --chat reads turns from
a pipe, keeps the conversation within the context, and runs in a real terminal under tmux
(replies streamed, Ctrl-C stops one, Ctrl-D quits)."""
import json
import os
import shutil
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest

from unigrad.llm.cli import LoadedModel, chat_prompt
from unigrad.llm.generate import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
COMMAND = [sys.executable, "-m", "unigrad.llm"]


def run_cli(*args, stdin=None, timeout=300):
  return subprocess.run([*COMMAND, *args], input=stdin, capture_output=True, text=True, env=ENV,
                        cwd=ROOT, timeout=timeout)


def test_prompt_json_gives_the_generators_greedy_ids(llm):
  r = run_cli("--prompt", "The capital of France is", "--json", "--max-tokens", "8")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)  # one JSON object and nothing else on stdout
  ids = llm.tokenizer.encode("The capital of France is")
  assert out["prompt_ids"] == ids
  assert out["ids"] == list(llm.generator.generate(ids, SamplingParams(max_tokens=8)))
  assert out["text"] == llm.tokenizer.decode(out["ids"]) and out["finish_reason"] == "length"
  assert out["first_token_s"] >= out["load_s"] > 0
  assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0


def test_prompt_streams_the_text_and_stops_at_a_stop_string(model_path):
  r = run_cli("--prompt", "The capital of France is", "--max-tokens", "8", "--stop", ".",
              "--model", model_path)
  assert r.returncode == 0, r.stderr
  assert r.stdout == " Paris\n"
  assert "2 tokens (stop)" in r.stderr


@pytest.mark.parametrize("args, message", [
  (["--prompt", "x", "--top-p", "0"], "top_p must be in (0, 1]"),
  (["--prompt", "x", "--max-tokens", "0"], "max_tokens must be at least 1"),
  (["--chat", "--json"], "--json goes with --prompt"),
  (["--max-tokens", "4"], "one of the arguments --prompt --chat is required"),
  (["--prompt", "x", "--max-context", "0"], "must be at least 2, got 0"),
  (["serve", "--port", "70000"], "must be in [0, 65535], got 70000")])
def test_bad_options_fail_before_loading(args, message):
  t0 = time.perf_counter()
  r = run_cli(*args)
  assert r.returncode == 2 and message in r.stderr
  assert time.perf_counter() - t0 < 15  # the model (seconds to load) was not read


def test_a_missing_model_file_is_an_error(tmp_path):
  r = run_cli("--prompt", "x", "--model", str(tmp_path / "none.gguf"))
  assert r.returncode == 1 and "none.gguf: no such model file" in r.stderr


def test_chat_reads_turns_from_a_pipe_until_exit(model_path):
  r = run_cli("--chat", "--max-tokens", "16", "--model", model_path,
              stdin="What is the capital of France?\n/reset\n/exit\nnever read\n")
  assert r.returncode == 0, r.stderr
  assert "Paris" in r.stdout


def fake_model(llm, max_context):
  """The loaded model's tokenizer and template with a smaller context (chat_prompt reads no
  more of the generator than its model's max_context)."""
  gen = types.SimpleNamespace(model=types.SimpleNamespace(max_context=max_context))
  return LoadedModel(gen, llm.tokenizer, llm.chat, llm.path, 0.0)


def test_chat_drops_the_oldest_turns_to_fit_the_context(llm):
  system = {"role": "system", "content": "Be terse."}
  turns = [{"role": r, "content": f"{r} turn {i} " * 8} for i in range(4)
           for r in ("user", "assistant")][:-1]
  history = [system, *turns]
  ids = chat_prompt(fake_model(llm, 160), history, reserve=16)
  assert len(ids) + 16 <= 160
  assert history[0] == system and history[-1] == turns[-1] and len(history) < 1 + len(turns)
  assert history[1]["role"] == "user"  # a turn is dropped with its reply


def test_chat_refuses_a_message_longer_than_the_context(llm):
  history = [{"role": "user", "content": "word " * 400}]
  assert chat_prompt(fake_model(llm, 128), history, reserve=16) is None and history == []


# ---- a real terminal ----

def pane(session):
  out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                       text=True, check=True).stdout
  return "\n".join(line for line in out.splitlines() if line.strip())


def wait_for(session, done, timeout=180):
  """The pane's text once `done(text)` holds; fails with the pane shown after `timeout` s."""
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    text = pane(session)
    if done(text): return text
    time.sleep(0.3)
  pytest.fail(f"the terminal never showed what was awaited; it shows:\n{pane(session)}")


def send(session, *keys):
  subprocess.run(["tmux", "send-keys", "-t", session, *keys], check=True)


def is_prompt_after(text, marker):
  """The reply after the line holding `marker` has ended: a fresh `>` prompt follows it."""
  return marker in text and text[text.rindex(marker):].rstrip().endswith("\n>")


@pytest.fixture
def terminal(model_path, tmp_path):
  """A tmux session running `--chat` (its exit status written to a file), killed at the end."""
  if shutil.which("tmux") is None: pytest.skip("tmux is not installed (apt-get install tmux)")
  session, status = f"unigrad-chat-{uuid.uuid4().hex[:8]}", tmp_path / "status"
  command = (f"cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m unigrad.llm --chat "
             f"--max-tokens 200 --model {model_path}; echo $? > {status}")
  subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", command],
                 check=True)
  yield session, status
  subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def type_line(session, line):
  """Types `line` and presses Enter once the terminal shows all of it: under load a key sent
  before readline has drawn the previous ones is still read, but a Ctrl-C sent after an Enter the
  program has not yet read flushes that Enter (the tty discards pending input on SIGINT)."""
  send(session, "-l", line)
  wait_for(session, lambda t: t.endswith(line))
  send(session, "Enter")


def test_chat_in_a_terminal(terminal):
  session, status = terminal
  wait_for(session, lambda t: t.endswith("\n>"))  # loaded, asking
  type_line(session, "What is the capital of France?")
  text = wait_for(session, lambda t: is_prompt_after(t, "capital of France?"))
  assert "Paris" in text.split("capital of France?")[1]
  type_line(session, "And of Germany?")  # the conversation is kept: "of Germany" suffices
  text = wait_for(session, lambda t: is_prompt_after(t, "And of Germany?"))
  assert "Berlin" in text.split("And of Germany?")[1]
  type_line(session, "Tell me a very long story about a dragon and a knight.")
  wait_for(session, lambda t: "and a knight." in t
           and len(t.split("and a knight.")[-1].strip()) > 20)  # it is replying
  send(session, "C-c")
  text = wait_for(session, lambda t: is_prompt_after(t, "and a knight."))
  assert "[stopped]" in text.split("and a knight.")[1]
  send(session, "C-d")
  end = time.monotonic() + 30
  while not status.exists() and time.monotonic() < end: time.sleep(0.2)
  assert status.read_text().strip() == "0"
