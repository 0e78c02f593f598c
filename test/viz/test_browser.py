"""The exported viewer in a real browser: headless Chromium driven through the DevTools protocol
(test/viz/cdp.py, standard library only). Skips where no Chromium is installed."""
import re
import time

import pytest
from cdp import Browser, find_browser
from conftest import read_page

EXE = find_browser()
pytestmark = pytest.mark.skipif(EXE is None, reason="Chromium not found: the viewer's browser "
                                "tests need it (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def page(exported):
  out, _ = exported
  t0 = time.perf_counter()
  b = Browser(EXE)
  b.call("Runtime.enable")
  b.open((out / "viewer" / "index.html").as_uri())
  b.wait_for("document.body && document.body.dataset.ready === '1'", timeout=60)
  yield b, out
  b.close()
  print(f"browser tests: {time.perf_counter() - t0:.1f} s with Chromium open")


def test_lists_every_schedule_and_kernel(page) -> None:
  b, out = page
  index = read_page(out / "viewer" / "data" / "index.js")
  names = b.eval("[...document.querySelectorAll('#trace-list li .name')].map(e => e.textContent)")
  assert names == [t["name"] for t in index["traces"]]
  assert b.eval("document.querySelectorAll('#trace-list li.kernel').length") == sum(
    t["kind"] == "kernel" for t in index["traces"])
  assert b.eval("document.querySelector('#trace-list li.selected .kind').textContent") == "kernel"


def test_draws_the_graph_on_the_canvas(page) -> None:
  b, _ = page
  b.wait_for("+document.querySelector('#graph').dataset.drawn > 0")
  nodes = int(b.eval("document.querySelector('#graph').dataset.nodes"))
  assert nodes == b.eval("graph.order.length") and nodes > 5
  inked = b.eval("""(() => { const c = document.querySelector('#graph');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i] < 200 || d[i + 1] < 200) n++; return n; })()""")
  assert inked > 500  # edges and node outlines, not an empty canvas


def test_steps_through_a_rewrite_with_its_rule_and_highlights(page) -> None:
  b, _ = page
  info = b.eval("document.querySelector('#rewrite-info').textContent")
  assert info.startswith("rewrite 1 of ")
  loc = b.eval("document.querySelector('#rewrite-info .rule-loc').textContent")
  assert re.fullmatch(r"unigrad/[\w/]+\.py:\d+", loc), loc
  assert b.eval("document.querySelector('#rewrite-info .rule-code').textContent").strip()
  assert b.eval("graph.marks.size") >= 1  # the rule's result at least
  b.eval("document.querySelector('#next').click()")
  b.wait_for("document.querySelector('#rec-count').textContent.startsWith('2 / ')")
  b.eval("document.querySelector('#show-before').click()")
  b.wait_for("document.querySelector('#rewrite-info .which').textContent.endsWith('before')")
  assert b.eval("[...graph.marks.values()].includes('rewritten')")
  b.eval("document.querySelector('#show-before').click()")
  b.eval("document.querySelector('#split').click()")  # before and after side by side
  which = "document.querySelector('#rewrite-info .which').textContent"
  b.wait_for(f"{which}.endsWith('before | after')")
  assert not b.eval("document.querySelector('#pane-before').hidden")
  b.wait_for("+document.querySelector('#graph-before').dataset.drawn > 0")
  assert b.eval("[...graphBefore.marks.values()].includes('rewritten')")
  assert b.eval("[...graph.marks.values()].includes('target')")
  b.eval("document.querySelector('#split').click()")
  b.wait_for("document.querySelector('#pane-before').hidden")


def test_a_paged_step_replays_to_its_recorded_output(page) -> None:
  b, _ = page
  found = b.eval("""(async () => {
    const t = state.index.traces.find(t => t.steps.some(s => s.pages > 1));
    await selectTrace(t.id);
    const j = t.steps.findIndex(s => s.pages > 1), s = t.steps[j];
    await selectStep(j, s.records);
    const p = await stepPage(s.pages - 1);
    return [s.pages, pages.has(`t${t.id}_s${j}_p${s.pages - 1}`),
            pageState(p, p.data.records.length) === p.data.after,
            document.querySelector('#rec-count').textContent];
  })()""")
  pages, loaded, exact, count = found
  assert pages > 1 and loaded and exact and count.startswith(f"{count.split()[-1]} / ")


def test_shows_the_error_the_source_and_the_timeline(page) -> None:
  b, _ = page
  assert not b.eval("document.querySelector('#error').hidden")
  error = b.eval("document.querySelector('#error pre').textContent")
  assert "the script failed on purpose" in error
  b.eval("selectTrace(state.index.traces.find(t => t.kind === 'kernel').id)")
  b.eval("document.querySelector('#tabs button[data-tab=source]').click()")
  src = b.wait_for("document.querySelector('#source').textContent")
  assert b.eval("state.index.traces[state.trace].name") in src
  assert "opts:" in b.eval("document.querySelector('#opts').textContent")
  b.eval("document.querySelector('#tabs button[data-tab=timeline]').click()")
  assert int(b.wait_for("document.querySelector('#timeline').dataset.drawn")) > 0
  assert b.eval("document.querySelectorAll('#tl-table tr').length") > 2
  b.eval("document.querySelector('#tabs button[data-tab=graph]').click()")


def test_ten_thousand_nodes_stay_responsive(page) -> None:
  b, _ = page
  ms = b.eval("""(() => {
    const rows = [];
    let seed = 1; const rnd = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
    const groups = Object.keys(GROUP_COLORS);
    for (let i = 0; i < 10000; i++) {  // 100 layers of 100, each node over two of the layer above
      const above = 100 * Math.floor(i / 100 - 1);
      const srcs = i < 100 ? [] : [i - 100, above + Math.floor(rnd() * 100)];
      rows.push(["ADD", groups[i % groups.length], "dtypes.float", "", srcs, i, ""]);
    }
    const last = [...Array(100).keys()].map(k => 9900 + k);
    rows.push(["SINK", "call", "dtypes.void", "", last, -1, ""]);
    const t0 = performance.now();
    graph.show(new NodeStore(rows), 10000, new Map(), false);
    const t1 = performance.now();
    graph.draw();
    const t2 = performance.now();
    graph.focus(5000); graph.draw();
    const t3 = performance.now();
    return [t1 - t0, t2 - t1, t3 - t2, +graph.canvas.dataset.nodes, +graph.canvas.dataset.drawn];
  })()""")
  show_ms, fit_draw_ms, zoomed_draw_ms, nodes, drawn_zoomed = ms
  print(f"10k nodes: layout {show_ms:.0f} ms, draw all {fit_draw_ms:.0f} ms, "
        f"draw zoomed in {zoomed_draw_ms:.0f} ms ({drawn_zoomed} nodes in view)")
  assert nodes == 10001 and 0 < drawn_zoomed < nodes  # culling: only what is in view is drawn
  assert show_ms < 5000 and fit_draw_ms < 1000 and zoomed_draw_ms < 200


def test_saves_a_screenshot_without_script_errors(page, tmp_path) -> None:
  b, _ = page
  b.eval("selectTrace(state.index.traces.find(t => t.kind === 'kernel').id)")
  time.sleep(0.2)
  png = b.screenshot()
  path = tmp_path / "viewer.png"
  path.write_bytes(png)
  print(f"screenshot: {path}")
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000
  assert b.console_errors() == []
