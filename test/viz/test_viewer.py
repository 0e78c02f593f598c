"""The viewer without a browser: the CLI's export, the server, a port in use, VIZ=1."""
import errno
import json
import os
import pathlib
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, SCRIPT, read_page

from unigrad.uop import Ops, PatternMatcher, UOp, UPat, graph_rewrite, track_rewrites, traces
from unigrad.viz import PortInUseError, Viewer, bind, export, serve
from unigrad.viz.__main__ import main
from unigrad.viz.export import UnknownPageError


def test_cli_export_shows_what_was_traced_and_the_error(exported) -> None:
  out, res = exported
  assert res.returncode == 1, res.stderr
  assert "raised; the viewer shows what was traced" in res.stderr
  data = out / "viewer" / "data"
  index = read_page(data / "index.js")
  assert "ValueError: the script failed on purpose" in index["error"]
  assert "runpy" not in index["error"] and "train_step_script.py" in index["error"]
  kinds = {t["kind"] for t in index["traces"]}
  assert kinds == {"schedule", "kernel"} and index["profile"]
  for t in index["traces"]:
    assert (data / f"t{t['id']}.js").is_file()
    for j, s in enumerate(t["steps"]):
      assert all((data / f"t{t['id']}_s{j}_p{k}.js").is_file() for k in range(s["pages"]))
  kernel = next(t for t in index["traces"] if t["kind"] == "kernel")
  info = read_page(data / f"t{kernel['id']}.js")
  assert kernel["name"] in info["src"] and info["kind"] == "kernel"
  assert {"index.html", "viz.js", "graph.js", "layout.js", "timeline.js", "viz.css"} <= {
    p.name for p in (out / "viewer").iterdir()}


def test_cli_profile_writes_a_chrome_trace_and_prints_the_table(exported) -> None:
  out, res = exported
  trace = json.loads((out / "profile.json").read_text())
  cats = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
  assert {"kernel", "compile", "codegen", "copy"} <= cats
  assert "kernel launches) written to" in res.stdout and "GFLOPS" in res.stdout
  assert read_page(out / "viewer" / "data" / "profile.js") == trace


def _small_viewer() -> Viewer:
  x = UOp.variable("x", 0, 4)
  pm = PatternMatcher([(UPat(Ops.MUL, src=[UPat.var("a"), UPat.cvar("c", arg=1)]), lambda a, c: a)])
  track_rewrites("small")(lambda: graph_rewrite(UOp.sink(x * 1), pm, name="fold"))()
  return Viewer([traces[-1]], None, "small")


def test_server_sends_static_files_and_builds_pages_on_request() -> None:
  server = bind(0)
  port = server.server_address[1]
  serve(server, _small_viewer(), open_browser=False, background=True)
  try:
    base = f"http://127.0.0.1:{port}/"
    with urllib.request.urlopen(base, timeout=10) as r: assert b"<canvas id=\"graph\">" in r.read()
    with urllib.request.urlopen(base + "data/t0_s0_p0.js", timeout=10) as r:
      assert r.read().startswith(b'vizLoad("t0_s0_p0",')
    for missing in ("data/t5.js", "data/t0_s9_p0.js", "nothere.html", "data/../viz.js"):
      with pytest.raises(urllib.error.HTTPError) as e: urllib.request.urlopen(base + missing)
      assert e.value.code == 404
  finally:
    server.shutdown()
    server.server_close()


def test_unknown_pages_raise_a_typed_error(tmp_path) -> None:
  v = _small_viewer()
  with pytest.raises(UnknownPageError): v.data("t1")
  with pytest.raises(UnknownPageError): v.data("bogus")
  index = export(v, tmp_path)
  assert index.name == "index.html" and (tmp_path / "data" / "t0_s0_p0.js").is_file()


@pytest.fixture
def busy_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]


def test_port_in_use_says_so_and_names_a_free_port(busy_port) -> None:
  with pytest.raises(PortInUseError) as e: bind(busy_port)
  msg = str(e.value)
  assert msg.startswith(f"port {busy_port} ") and e.value.errno == errno.EADDRINUSE
  assert "in use" in msg and "try --port " in msg
  suggested = int(msg.split("try --port ")[1].split()[0])
  with socket.socket() as s: s.bind(("127.0.0.1", suggested))  # it is free


def test_cli_port_in_use_fails_before_the_script_runs(busy_port, capsys) -> None:
  before = len(traces)
  assert main(["--no-browser", "--port", str(busy_port), str(SCRIPT)]) == 2
  err = capsys.readouterr().err
  assert "in use" in err and "--port" in err and len(traces) == before


def test_cli_missing_script_is_an_error(capsys) -> None:
  assert main(["--export", "x", "no/such/script.py"]) == 2
  assert "no such script" in capsys.readouterr().err


def test_viz_env_traces_any_program_and_exports_when_the_port_is_taken(busy_port) -> None:
  env = {**os.environ, "VIZ": "1", "VIZ_PORT": str(busy_port)}
  code = "from unigrad import Tensor; print((Tensor.ones(3).contiguous() * 4.5).tolist())"
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert res.returncode == 0 and "[4.5, 4.5, 4.5]" in res.stdout
  assert f"port {busy_port}" in res.stderr and "the viewer was written to" in res.stderr
  index_html = res.stderr.split("the viewer was written to ")[1].split()[0]
  index = read_page(pathlib.Path(index_html).parent / "data" / "index.js")
  assert any(t["kind"] == "kernel" for t in index["traces"])
