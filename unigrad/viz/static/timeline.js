// The timeline tab: a Chrome trace (the profiler's, or a profile.json the user opens) drawn as
// one row per device and thread, bars coloured by category; wheel zooms time, drag pans, a
// hover shows the event. Below it, the kernels by total time (calls, ms, GFLOPS, GB/s).
"use strict";

const CAT_COLORS = { kernel: "#4e79a7", copy: "#f28e2b", codegen: "#76b7b2", compile: "#59a14f" };
const ROW_H = 22, LABEL_W = 170;

class Timeline {
  constructor(canvas, info, table) {
    this.canvas = canvas; this.ctx = canvas.getContext("2d"); this.info = info; this.table = table;
    this.rows = []; this.t0 = 0; this.t1 = 1; this.v0 = 0; this.v1 = 1;
    this.bindEvents();
    new ResizeObserver(() => this.resize()).observe(canvas.parentElement);
  }
  load(trace) {
    const events = Array.isArray(trace) ? trace : trace.traceEvents || [];
    const names = new Map(), rows = new Map();
    for (const e of events) {
      if (e.ph === "M" && e.name === "process_name") names.set(`p${e.pid}`, e.args.name);
      if (e.ph === "M" && e.name === "thread_name") names.set(`t${e.pid}.${e.tid}`, e.args.name);
    }
    for (const e of events) {
      if (e.ph !== "X") continue;
      const k = `${e.pid}.${e.tid}`;
      if (!rows.has(k)) rows.set(k, { name: `${names.get("p" + e.pid) || e.pid} / ${names.get(`t${k}`) || e.tid}`, events: [] });
      rows.get(k).events.push(e);
    }
    this.rows = [...rows.values()];
    const xs = this.rows.flatMap((r) => r.events);
    this.t0 = xs.length ? Math.min(...xs.map((e) => e.ts)) : 0;
    this.t1 = xs.length ? Math.max(...xs.map((e) => e.ts + e.dur)) : 1;
    this.v0 = this.t0; this.v1 = Math.max(this.t1, this.t0 + 1);
    this.canvas.dataset.events = String(xs.length);
    this.fillTable(xs);
    this.resize();
  }
  fillTable(xs) {
    const by = new Map();
    for (const e of xs) {
      if (e.cat !== "kernel" && e.cat !== "copy") continue;
      const r = by.get(e.name) || { calls: 0, us: 0, flops: 0, bytes: 0 };
      const us = e.args && e.args.device_us !== undefined ? e.args.device_us : e.dur;
      r.calls++; r.us += us; r.flops += (e.args && e.args.flops) || 0; r.bytes += (e.args && e.args.bytes) || 0;
      by.set(e.name, r);
    }
    const rows = [...by.entries()].sort((a, b) => b[1].us - a[1].us).slice(0, 50);
    const head = "<tr><th>kernel</th><th>calls</th><th>total ms</th><th>GFLOPS</th><th>GB/s</th></tr>";
    this.table.innerHTML = head + rows.map(([n, r]) => {
      const s = Math.max(r.us * 1e-6, 1e-12);
      return `<tr><td>${escapeHtml(n)}</td><td>${r.calls}</td><td>${(r.us / 1e3).toFixed(3)}</td>` +
        `<td>${(r.flops / s * 1e-9).toFixed(2)}</td><td>${(r.bytes / s * 1e-9).toFixed(2)}</td></tr>`;
    }).join("");
  }
  resize() {
    const r = this.canvas.parentElement.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    const h = Math.max(80, this.rows.length * ROW_H + 30);
    this.canvas.width = Math.max(1, r.width * dpr); this.canvas.height = h * dpr;
    this.canvas.style.width = r.width + "px"; this.canvas.style.height = h + "px";
    this.draw();
  }
  x(t) { const w = this.canvas.width / (window.devicePixelRatio || 1) - LABEL_W; return LABEL_W + (t - this.v0) / (this.v1 - this.v0) * w; }
  draw() {
    const ctx = this.ctx, dpr = window.devicePixelRatio || 1, w = this.canvas.width / dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, this.canvas.height / dpr);
    ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
    let drawn = 0;
    this.rows.forEach((row, i) => {
      const y = 24 + i * ROW_H;
      ctx.fillStyle = i % 2 ? "#f4f4f4" : "#fff"; ctx.fillRect(0, y, w, ROW_H);
      for (const e of row.events) {
        const a = this.x(e.ts), b = this.x(e.ts + e.dur);
        if (b < LABEL_W || a > w) continue;
        drawn++;
        ctx.fillStyle = CAT_COLORS[e.cat] || "#999";
        ctx.fillRect(Math.max(a, LABEL_W), y + 3, Math.max(1, b - Math.max(a, LABEL_W)), ROW_H - 6);
        if (b - a > 40) { ctx.fillStyle = "#fff"; ctx.fillText(e.name, Math.max(a, LABEL_W) + 3, y + ROW_H / 2, b - Math.max(a, LABEL_W) - 6); }
      }
      ctx.fillStyle = "#222"; ctx.fillText(row.name, 4, y + ROW_H / 2, LABEL_W - 8);
    });
    ctx.fillStyle = "#333";
    const span = this.v1 - this.v0;
    for (let k = 0; k <= 4; k++) {
      const t = this.v0 + span * k / 4;
      ctx.fillText(`${((t - this.t0) / 1e3).toFixed(3)} ms`, LABEL_W + (w - LABEL_W) * k / 4 - (k === 4 ? 70 : 0), 12);
    }
    this.canvas.dataset.drawn = String(drawn);
  }
  eventAt(cx, cy) {
    const row = this.rows[Math.floor((cy - 24) / ROW_H)];
    if (!row) return null;
    return row.events.find((e) => cx >= this.x(e.ts) - 1 && cx <= this.x(e.ts + e.dur) + 1) || null;
  }
  bindEvents() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener("mousedown", (e) => { drag = e.clientX; });
    window.addEventListener("mouseup", () => { drag = null; });
    c.addEventListener("mousemove", (e) => {
      const r = c.getBoundingClientRect();
      if (drag !== null) {
        const dt = (e.clientX - drag) / (r.width - LABEL_W) * (this.v1 - this.v0);
        this.v0 -= dt; this.v1 -= dt; drag = e.clientX; this.draw();
        return;
      }
      const ev = this.eventAt(e.clientX - r.left, e.clientY - r.top);
      this.info.textContent = ev ? `${ev.name} [${ev.cat}]  ${(ev.dur / 1e3).toFixed(3)} ms  ${JSON.stringify(ev.args || {})}` : "";
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = c.getBoundingClientRect(), f = Math.exp(e.deltaY * 0.002);
      const t = this.v0 + (e.clientX - r.left - LABEL_W) / (r.width - LABEL_W) * (this.v1 - this.v0);
      this.v0 = t - (t - this.v0) * f; this.v1 = t + (this.v1 - t) * f;
      this.draw();
    }, { passive: false });
  }
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"]/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[ch]));
}
