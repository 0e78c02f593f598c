// Layered layout of a DAG (sources on top, the root at the bottom), written for this viewer:
// 1. rank: the longest path from each node to the root (a leaf sits just above its deepest use),
// 2. order within a layer: a few barycenter sweeps (mean position of the neighbours),
// 3. x: each node at the mean x of its neighbours, pushed right where it would overlap.
// Linear in nodes and edges per sweep, so 10k-node graphs lay out in tens of milliseconds.
"use strict";

const LAYOUT = { layerGap: 40, nodeGap: 14, nodeH: 44, charW: 6.6, minW: 48, maxW: 260 };

function nodeWidth(label) {
  const chars = Math.max(...label.map((l) => l.length));
  return Math.min(LAYOUT.maxW, Math.max(LAYOUT.minW, chars * LAYOUT.charW + 16));
}

// order: node ids, sources before consumers; srcs(id) -> source ids; label(id) -> lines.
// Returns {pos: Map id -> {x, y, w, h}, width, height}.
function layoutDag(order, srcs, label) {
  const rank = new Map();
  const users = new Map();
  for (const id of order) users.set(id, []);
  for (const id of order) for (const s of srcs(id)) if (users.has(s)) users.get(s).push(id);
  for (let i = order.length - 1; i >= 0; i--) {
    const id = order[i];
    let r = 0;
    for (const u of users.get(id)) r = Math.max(r, rank.get(u) + 1);
    rank.set(id, r);
  }
  const maxRank = order.reduce((m, id) => Math.max(m, rank.get(id)), 0);
  const layers = Array.from({ length: maxRank + 1 }, () => []);
  for (const id of order) layers[maxRank - rank.get(id)].push(id);  // layer 0 on top
  const pos = new Map();
  layers.forEach((layer, li) => layer.forEach((id, k) => {
    const lines = label(id);
    pos.set(id, { x: k, y: li * (LAYOUT.nodeH + LAYOUT.layerGap), w: nodeWidth(lines),
                  h: LAYOUT.nodeH, layer: li });
  }));
  const ups = (id) => srcs(id).filter((s) => pos.has(s));
  const downs = (id) => users.get(id);
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    const seq = down ? layers : layers.slice().reverse();
    for (const layer of seq) orderByBarycenter(layer, pos, down ? ups : downs);
  }
  for (const layer of layers) layer.forEach((id, k) => { pos.get(id).x = k; });
  placeX(layers, pos, ups, downs);
  let minX = Infinity, maxX = -Infinity;
  for (const p of pos.values()) { minX = Math.min(minX, p.x - p.w / 2); maxX = Math.max(maxX, p.x + p.w / 2); }
  for (const p of pos.values()) p.x -= minX;
  return { pos, width: maxX - minX, height: layers.length * (LAYOUT.nodeH + LAYOUT.layerGap) };
}

function orderByBarycenter(layer, pos, nbrs) {
  const key = new Map();
  for (const id of layer) {
    const ns = nbrs(id);
    key.set(id, ns.length ? ns.reduce((a, n) => a + pos.get(n).x, 0) / ns.length : pos.get(id).x);
  }
  layer.sort((a, b) => key.get(a) - key.get(b));
  const scale = layer.length > 1 ? 1 : 0;
  layer.forEach((id, k) => { pos.get(id).x = k * scale + (scale ? 0 : key.get(id)); });
}

function placeX(layers, pos, ups, downs) {
  // start from the index order spread out, then pull each node towards its neighbours
  for (const layer of layers) {
    let x = 0;
    for (const id of layer) { const p = pos.get(id); x += p.w / 2; p.x = x; x += p.w / 2 + LAYOUT.nodeGap; }
  }
  for (let pass = 0; pass < 3; pass++) {
    const down = pass % 2 === 0;
    const seq = down ? layers : layers.slice().reverse();
    for (const layer of seq) {
      const want = layer.map((id) => {
        const ns = down ? ups(id) : downs(id);
        return ns.length ? ns.reduce((a, n) => a + pos.get(n).x, 0) / ns.length : pos.get(id).x;
      });
      packLayer(layer, want, pos);
    }
  }
}

// Place a layer's nodes (in order) as close to `want` as the gaps allow: push right, then
// shift the whole layer so that it is centred on what its nodes wanted.
function packLayer(layer, want, pos) {
  let right = -Infinity, shift = 0;
  layer.forEach((id, k) => {
    const p = pos.get(id);
    p.x = Math.max(want[k], right + p.w / 2 + LAYOUT.nodeGap);
    right = p.x + p.w / 2;
    shift += want[k] - p.x;
  });
  if (!layer.length) return;
  shift /= layer.length;
  for (const id of layer) pos.get(id).x += shift;
}
