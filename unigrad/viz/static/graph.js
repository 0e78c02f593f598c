// Drawing a UOp graph on a canvas: nodes coloured by op group, each shared node once, edges from
// sources down to consumers, pan (drag) and zoom (wheel), culling to the visible rectangle and
// fewer details when zoomed out, so that 10k-node graphs stay responsive.
"use strict";

const GROUP_COLORS = {
  source: "#ffd58a", movement: "#9fd3ff", reduce: "#ff9d8a", memory: "#c7b0ff",
  control: "#b9e6a8", call: "#d8d8d8", alu: "#ffffff", vector: "#f6c1e5", other: "#eeeeee",
};
const MARK_COLORS = { new: "#2a9d2a", rewritten: "#e63946", target: "#1d6fd8", removed: "#e63946" };

// A page's nodes: rows [op, group, dtype, arg, [src ids], kind, tag] plus nodes the replay
// builds. Rows of one kind (op, dtype, arg, tag) over the same sources are one node, as the
// UOps they stand for are hash-consed.
class NodeStore {
  constructor(rows) {
    this.rows = rows.slice();
    this.keys = new Map();
    rows.forEach((r, i) => { const k = this.key(r); if (!this.keys.has(k)) this.keys.set(k, i); });
  }
  key(r) { return `${r[5]}|${r[4].join(",")}`; }
  make(row) {
    const k = this.key(row);
    let id = this.keys.get(k);
    if (id === undefined) { id = this.rows.length; this.rows.push(row); this.keys.set(k, id); }
    return id;
  }
  srcs(id) { return this.rows[id][4]; }
  // every node reachable from root, sources before consumers
  toposort(root) {
    const out = [], seen = new Set([root]), stack = [[root, 0]];
    while (stack.length) {
      const top = stack[stack.length - 1], s = this.rows[top[0]][4];
      if (top[1] < s.length) {
        const c = s[top[1]++];
        if (!seen.has(c)) { seen.add(c); stack.push([c, 0]); }
      } else { out.push(top[0]); stack.pop(); }
    }
    return out;
  }
  label(id) {
    const r = this.rows[id], lines = [r[0]];
    if (r[2] && r[2] !== "dtypes.void") lines.push(r[2].replace(/^dtypes\./, ""));
    if (r[3]) lines.push(r[3].length > 36 ? r[3].slice(0, 35) + "…" : r[3]);
    if (r[6]) lines.push(`tag ${r[6]}`.slice(0, 36));
    return lines;
  }
  // root with the rewrites in `done` (id -> id) applied the way graph_rewrite applied them: a
  // node is replaced when reached and again when rebuilt over rewritten sources, and each
  // replacement is processed in turn (unigrad/viz/data.py _replay). null if they loop.
  replay(root, done) {
    const memo = new Map(), busy = new Set(), stack = [[root, 0, -1]];
    let budget = 50 * (this.rows.length + 16);
    while (stack.length) {
      if (--budget < 0) return null;
      const [n, stage, other] = stack.pop();
      if (stage === 0) {
        if (memo.has(n) || busy.has(n)) continue;
        busy.add(n);
        const r = done.get(n);
        if (r !== undefined && r !== n) {
          if (busy.has(r)) return null;
          stack.push([n, 2, r], [r, 0, -1]);
          continue;
        }
        stack.push([n, 1, -1]);
        for (const s of this.rows[n][4]) if (!memo.has(s)) stack.push([s, 0, -1]);
      } else if (stage === 1) {
        const row = this.rows[n], src = row[4].map((s) => (memo.has(s) ? memo.get(s) : s));
        const x = src.every((v, k) => v === row[4][k]) ? n : this.make([row[0], row[1], row[2], row[3], src, row[5], row[6]]);
        const r = done.get(x);
        if (r === undefined || r === x) { memo.set(n, x); busy.delete(n); continue; }
        if (busy.has(r)) return null;
        stack.push([n, 2, r], [r, 0, -1]);
      } else {
        memo.set(n, memo.has(other) ? memo.get(other) : other);
        busy.delete(n);
      }
    }
    return memo.has(root) ? memo.get(root) : root;
  }
}

class GraphView {
  constructor(canvas, onPick) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.onPick = onPick;
    this.store = null; this.order = []; this.layout = null; this.marks = new Map();
    this.tx = 20; this.ty = 20; this.scale = 1; this.dirty = false; this.selected = null;
    this.bindEvents();
    new ResizeObserver(() => this.resize()).observe(canvas.parentElement);
  }
  resize() {
    const r = this.canvas.parentElement.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.max(1, r.width * dpr); this.canvas.height = Math.max(1, r.height * dpr);
    this.canvas.style.width = r.width + "px"; this.canvas.style.height = r.height + "px";
    this.request();
  }
  // show the graph below `root`; marks: Map id -> "new" | "rewritten" | "target"
  show(store, root, marks, keepView) {
    this.store = store; this.marks = marks || new Map(); this.selected = null;
    this.order = root === null || root === undefined ? [] : store.toposort(root);
    const t0 = performance.now();
    this.layout = layoutDag(this.order, (id) => store.srcs(id), (id) => store.label(id));
    this.canvas.dataset.layoutMs = (performance.now() - t0).toFixed(1);
    this.canvas.dataset.nodes = String(this.order.length);
    if (!keepView) {
      this.fit();
      // too small to read: zoom in on the node that changed (f or "fit" shows it all)
      const changed = [...this.marks].find(([, m]) => m === "target" || m === "rewritten");
      if (this.scale < 0.45 && changed) this.focus(changed[0]);
    }
    this.request();
  }
  fit() {
    if (!this.layout) return;
    const w = this.canvas.width / (window.devicePixelRatio || 1), h = this.canvas.height / (window.devicePixelRatio || 1);
    const lw = Math.max(this.layout.width, 1), lh = Math.max(this.layout.height, 1);
    this.scale = Math.min(1.5, Math.max(0.02, Math.min((w - 40) / lw, (h - 40) / lh)));
    this.tx = (w - lw * this.scale) / 2; this.ty = 20;
    this.request();
  }
  focus(id) {
    const p = this.layout && this.layout.pos.get(id);
    if (!p) return;
    const w = this.canvas.width / (window.devicePixelRatio || 1), h = this.canvas.height / (window.devicePixelRatio || 1);
    this.scale = Math.max(this.scale, 0.6);
    this.tx = w / 2 - p.x * this.scale; this.ty = h / 2 - (p.y + p.h / 2) * this.scale;
    this.request();
  }
  request() {
    if (this.dirty) return;
    this.dirty = true;
    requestAnimationFrame(() => { this.dirty = false; this.draw(); });
  }
  draw() {
    const ctx = this.ctx, dpr = window.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#fafafa"; ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    if (!this.layout) return;
    const s = this.scale * dpr;
    ctx.setTransform(s, 0, 0, s, this.tx * dpr, this.ty * dpr);
    const x0 = -this.tx / this.scale, y0 = -this.ty / this.scale;
    const view = { x0, y0, x1: x0 + this.canvas.width / s, y1: y0 + this.canvas.height / s };
    this.drawEdges(ctx, view);
    const drawn = this.drawNodes(ctx, view);
    this.canvas.dataset.drawn = String(drawn);
  }
  drawEdges(ctx, v) {
    const pos = this.layout.pos, curved = this.scale > 0.15;
    ctx.lineWidth = 1 / this.scale > 4 ? 4 : Math.max(1, 1 / this.scale);
    ctx.strokeStyle = "#9a9a9a";
    ctx.beginPath();
    for (const id of this.order) {
      const b = pos.get(id);
      for (const s of this.store.srcs(id)) {
        const a = pos.get(s);
        if (!a) continue;
        const ax = a.x, ay = a.y + a.h, bx = b.x, by = b.y;
        if (Math.max(ax, bx) < v.x0 || Math.min(ax, bx) > v.x1 || by < v.y0 || ay > v.y1) continue;
        ctx.moveTo(ax, ay);
        if (curved) { const my = (ay + by) / 2; ctx.bezierCurveTo(ax, my, bx, my, bx, by); } else ctx.lineTo(bx, by);
      }
    }
    ctx.stroke();
  }
  drawNodes(ctx, v) {
    const pos = this.layout.pos, text = this.scale > 0.35;
    let drawn = 0;
    ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "top";
    for (const id of this.order) {
      const p = pos.get(id), x = p.x - p.w / 2;
      if (x > v.x1 || x + p.w < v.x0 || p.y > v.y1 || p.y + p.h < v.y0) continue;
      drawn++;
      const row = this.store.rows[id], mark = this.marks.get(id);
      ctx.fillStyle = GROUP_COLORS[row[1]] || GROUP_COLORS.other;
      ctx.fillRect(x, p.y, p.w, p.h);
      ctx.lineWidth = mark || id === this.selected ? 3 : 1;
      ctx.strokeStyle = id === this.selected ? "#000" : mark ? MARK_COLORS[mark] : "#555";
      ctx.strokeRect(x, p.y, p.w, p.h);
      if (!text) continue;
      ctx.fillStyle = "#111";
      this.store.label(id).forEach((line, k) => {
        ctx.font = k === 0 ? "bold 11px ui-monospace, monospace" : "10px ui-monospace, monospace";
        ctx.fillText(line.length * LAYOUT.charW > p.w ? line.slice(0, Math.floor((p.w - 8) / LAYOUT.charW)) : line,
                     x + 5, p.y + 4 + k * 13, p.w - 8);
      });
    }
    return drawn;
  }
  pick(cx, cy) {
    if (!this.layout) return null;
    const x = (cx - this.tx) / this.scale, y = (cy - this.ty) / this.scale;
    for (const id of this.order) {
      const p = this.layout.pos.get(id);
      if (Math.abs(x - p.x) <= p.w / 2 && y >= p.y && y <= p.y + p.h) return id;
    }
    return null;
  }
  bindEvents() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, moved: false }; });
    window.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
      this.tx += dx; this.ty += dy; drag.x = e.clientX; drag.y = e.clientY;
      this.request();
    });
    window.addEventListener("mouseup", (e) => {
      if (drag && !drag.moved && e.target === c) {
        const r = c.getBoundingClientRect();
        this.selected = this.pick(e.clientX - r.left, e.clientY - r.top);
        if (this.onPick) this.onPick(this.selected);
        this.request();
      }
      drag = null;
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = c.getBoundingClientRect(), mx = e.clientX - r.left, my = e.clientY - r.top;
      const f = Math.exp(-e.deltaY * 0.0015), ns = Math.min(4, Math.max(0.01, this.scale * f));
      this.tx = mx - (mx - this.tx) * (ns / this.scale); this.ty = my - (my - this.ty) * (ns / this.scale);
      this.scale = ns;
      this.request();
    }, { passive: false });
  }
}
