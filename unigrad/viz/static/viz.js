// The viewer: the list of schedules and kernels, each one's steps (graph_rewrite calls and
// codegen stages), stepping through a step's rewrites with the graph before and after each, the
// kernel source, and the profiler timeline. Data pages are scripts calling vizLoad(key, data).
"use strict";

const $ = (sel) => document.querySelector(sel);
const pages = new Map(), waiting = new Map();

window.vizLoad = (key, data) => {
  pages.set(key, data);
  const w = waiting.get(key);
  if (w) { waiting.delete(key); w.resolve(data); }
};

function load(key) {
  if (pages.has(key)) return Promise.resolve(pages.get(key));
  if (waiting.has(key)) return waiting.get(key).promise;
  const w = {};
  w.promise = new Promise((resolve, reject) => { w.resolve = resolve; w.reject = reject; });
  waiting.set(key, w);
  const s = document.createElement("script");
  s.src = `data/${key}.js`;
  s.onerror = () => { waiting.delete(key); w.reject(new Error(`cannot load data/${key}.js`)); };
  document.head.appendChild(s);
  return w.promise;
}

const state = { index: null, trace: null, step: null, pos: 0, before: false, split: false,
                pageCache: new Map() };
let graph = null, graphBefore = null, timeline = null;

function status(text) { $("#status").textContent = text; }

async function main() {
  graph = new GraphView($("#graph"), (id) => showNode(graph, id));
  graphBefore = new GraphView($("#graph-before"), (id) => showNode(graphBefore, id));
  timeline = new Timeline($("#timeline"), $("#tl-info"), $("#tl-table"));
  bindUi();
  try { state.index = await load("index"); } catch (e) { status(String(e)); return; }
  const idx = state.index;
  document.title = `unigrad viz: ${idx.title}`;
  $("#title").textContent = idx.title;
  if (idx.error) { $("#error").hidden = false; $("#error pre").textContent = idx.error; }
  renderTraceList();
  status(`${idx.traces.length} traces`);
  if (idx.profile) timeline.load(await load("profile"));
  else $("#tl-info").textContent = "No profile in this run: run with --profile (or PROFILE=1), or open a profile.json.";
  const first = idx.traces.find((t) => t.kind === "kernel") || idx.traces[0];
  if (first) await selectTrace(first.id);
  document.body.dataset.ready = "1";
}

function renderTraceList() {
  const ul = $("#trace-list"), filter = $("#filter").value.toLowerCase();
  ul.innerHTML = "";
  for (const t of state.index.traces) {
    if (filter && !t.name.toLowerCase().includes(filter)) continue;
    const li = document.createElement("li");
    li.className = `trace ${t.kind}` + (state.trace === t.id ? " selected" : "");
    li.dataset.id = t.id;
    const failed = t.steps.some((s) => s.failed && s.name !== "result");
    li.innerHTML = `<span class="kind">${t.kind}</span> <span class="name">${escapeHtml(t.name)}</span>` +
      `<span class="count">${t.records}</span>` + (failed ? ' <span class="failed">error</span>' : "");
    li.onclick = () => selectTrace(t.id);
    ul.appendChild(li);
  }
}

async function selectTrace(id) {
  state.trace = id;
  renderTraceList();
  const t = state.index.traces[id];
  $("#steps-title").textContent = t.name;
  const ul = $("#step-list");
  ul.innerHTML = "";
  t.steps.forEach((s, j) => {
    const li = document.createElement("li");
    li.className = "step" + (s.failed && s.name !== "result" ? " failed" : "");
    li.style.paddingLeft = `${6 + 14 * s.depth}px`;
    li.dataset.step = j;
    li.innerHTML = `<span class="name">${escapeHtml(s.name)}</span><span class="count">${s.records || ""}</span>`;
    li.onclick = () => selectStep(j, 0);
    ul.appendChild(li);
  });
  load(`t${id}`).then(showSource, (e) => status(String(e)));
  const start = t.steps.findIndex((s) => s.records > 0);
  await selectStep(start >= 0 ? start : 0, start >= 0 ? 1 : 0);
}

function showSource(info) {
  $("#opts").textContent = info.kind === "kernel" ? `${info.name} on ${info.device}; opts: ${info.opts.length ? info.opts.join(", ") : "(none)"}` :
    `${info.name}: a schedule has no source; its kernels follow it in the list.`;
  $("#source").textContent = info.src || "";
}

function stepInfo() { return state.index.traces[state.trace].steps[state.step]; }
function stepLength(s) { return s.records > 0 ? s.records : 1; }

async function selectStep(j, pos) {
  state.step = j;
  for (const li of document.querySelectorAll("#step-list li")) li.classList.toggle("selected", +li.dataset.step === j);
  const s = stepInfo(), slider = $("#rec-slider");
  slider.max = String(stepLength(s));
  await showPos(pos, false);
}

// page `p` of the current step with its states: states[k] is the graph after k of its rewrites
async function stepPage(p) {
  const key = `t${state.trace}_s${state.step}_p${p}`;
  const cached = state.pageCache.get(key);
  if (cached) return cached;
  const data = await load(key);
  const page = { data, store: new NodeStore(data.nodes), states: new Map() };
  state.pageCache.set(key, page);
  return page;
}

// the graph after the first k rewrites of a page (null where they do not replay)
function pageState(page, k) {
  if (page.states.has(k)) return page.states.get(k);
  const d = page.data, done = new Map(d.prior);
  for (const r of d.records.slice(0, k)) done.set(r.before, r.after);
  const out = k === 0 ? d.start : page.store.replay(d.before, done);
  page.states.set(k, out);
  return out;
}

function diffMarks(store, from, to, mark) {
  const marks = new Map();
  if (from === null || to === null) return marks;
  const have = new Set(store.toposort(from));
  for (const id of store.toposort(to)) if (!have.has(id)) marks.set(id, mark);
  return marks;
}

async function showPos(pos, keepView) {
  const s = stepInfo();
  pos = Math.max(0, Math.min(stepLength(s), pos));
  state.pos = pos;
  $("#rec-slider").value = String(pos);
  $("#rec-count").textContent = s.records ? `${pos} / ${s.records}` : pos ? "output" : "input";
  const per = state.index.page_records;
  const page = await stepPage(pos > 0 && s.records ? Math.floor((pos - 1) / per) : 0);
  const d = page.data, store = page.store, info = $("#rewrite-info");
  if (pos === 0) {
    setSplit(false);
    graph.show(store, d.before, new Map(), keepView);
    info.innerHTML = `<b>${escapeHtml(s.name)}</b>: the input graph` +
      (s.records ? ` (${s.records} rewrites: ▶ or → steps through them)` : s.failed ? " (this step raised)" : " (▶ shows its output)");
    return;
  }
  if (!s.records) {  // a stage without rewrites of its own: its input and output
    const gone = diffMarks(store, d.after, d.before, "removed"), added = diffMarks(store, d.before, d.after, "new");
    showGraphs(store, d.before, gone, d.after, added, keepView);
    info.innerHTML = `<b>${escapeHtml(s.name)}</b>: ` + (state.split ? "the input and output graphs" :
      `the ${state.before ? "input" : "output"} graph`) + ` (${gone.size} nodes replaced, ${added.size} new)`;
    return;
  }
  const k = (pos - 1) % per, r = d.records[k];
  const prev = pageState(page, k), next = pageState(page, k + 1);
  const beforeMarks = diffMarks(store, next, prev, "removed");
  beforeMarks.set(r.before, "rewritten");
  const afterMarks = diffMarks(store, prev, next, "new");
  afterMarks.set(r.after, "target");
  const beforeRoot = prev === null ? r.before : prev, afterRoot = next === null ? r.after : next;
  showGraphs(store, beforeRoot, beforeMarks, afterRoot, afterMarks, keepView);
  const which = state.split ? "before | after" : state.before ? "before" : "after";
  info.innerHTML = `<span class="which">rewrite ${pos} of ${s.records}, ${which}</span> ` +
    `<span class="rule-loc">${escapeHtml(r.file)}:${r.line}</span> <code class="rule-code">${escapeHtml(r.code)}</code>` +
    (prev === null || next === null ? ' <span class="failed">(graph replay failed: the rewritten node alone)</span>' : "");
}

// the graph before a rewrite and the graph after it: side by side, or the one asked for
function showGraphs(store, beforeRoot, beforeMarks, afterRoot, afterMarks, keepView) {
  setSplit(state.split);
  if (state.split) {
    graphBefore.show(store, beforeRoot, beforeMarks, keepView);
    graph.show(store, afterRoot, afterMarks, keepView);
  } else if (state.before) graph.show(store, beforeRoot, beforeMarks, keepView);
  else graph.show(store, afterRoot, afterMarks, keepView);
}

function setSplit(on) {
  if ($("#pane-before").hidden !== on) return;
  $("#pane-before").hidden = !on;
  $("#label-after").hidden = !on;
  graph.resize();
  graphBefore.resize();
}

function showNode(view, id) {
  const box = $("#node-info");
  if (id === null || !view.store) { box.hidden = true; return; }
  const r = view.store.rows[id];
  const users = view.order.filter((u) => view.store.srcs(u).includes(id)).length;
  box.hidden = false;
  box.innerHTML = `<b>${r[0]}</b> #${id}<br>${escapeHtml(r[2])}<br><pre>${escapeHtml(r[3])}</pre>` +
    `sources: ${r[4].map((x) => "#" + x).join(" ") || "-"}<br>users: ${users}`;
}

function switchTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== `${name}-tab`;
  if (name === "timeline") timeline.resize();
  if (name === "graph") { graph.resize(); graphBefore.resize(); }
}

function bindUi() {
  for (const b of document.querySelectorAll("#tabs button")) b.onclick = () => switchTab(b.dataset.tab);
  $("#filter").oninput = renderTraceList;
  $("#prev").onclick = () => showPos(state.pos - 1, false);
  $("#next").onclick = () => showPos(state.pos + 1, false);
  $("#rec-slider").oninput = (e) => showPos(+e.target.value, false);
  $("#show-before").onchange = (e) => { state.before = e.target.checked; showPos(state.pos, true); };
  $("#split").onchange = (e) => { state.split = e.target.checked; showPos(state.pos, false); };
  $("#fit").onclick = () => { graph.fit(); graphBefore.fit(); };
  $("#profile-file").onchange = (e) => {
    const f = e.target.files[0];
    if (f) f.text().then((t) => timeline.load(JSON.parse(t)));
  };
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT" && e.target.type !== "checkbox") return;  // its own keys
    if (e.key === "ArrowRight") showPos(state.pos + 1, false);
    else if (e.key === "ArrowLeft") showPos(state.pos - 1, false);
    else if (e.key === "b") { $("#show-before").checked = state.before = !state.before; showPos(state.pos, true); }
    else if (e.key === "s") { $("#split").checked = state.split = !state.split; showPos(state.pos, false); }
    else if (e.key === "f") { graph.fit(); graphBefore.fit(); }
  });
}

window.addEventListener("DOMContentLoaded", main);
