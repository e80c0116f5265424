// tailkit's page helpers and charts: the data block, SVG lines with bands, grouped bars with
// error bars, and a canvas scatter for thousands of points. No library, no request.
"use strict";
const TK = {};

TK.PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
TK.color = (i) => TK.PALETTE[i % TK.PALETTE.length];

// base64 → bytes: the browser's own decoder where it has one, else a plain loop (a mapping
// function per character costs ten times as much at a million labels)
TK.bytes = function (b64) {
  if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(b64);
  const text = atob(b64), out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
};

// The page's data: JSON, with {"$array": dtype, "b64": ...} turned into typed arrays.
TK.data = function () {
  const types = { i32: Int32Array, f32: Float32Array, f64: Float64Array };
  const revive = (key, value) => {
    if (value && typeof value === "object" && value.$array) {
      return new types[value.$array](TK.bytes(value.b64).buffer);
    }
    return value;
  };
  return JSON.parse(document.getElementById("tailkit-data").textContent, revive);
};

TK.el = function (tag, attrs, parent, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
};

const SVG_NS = "http://www.w3.org/2000/svg";
TK.svg = function (tag, attrs, parent) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
};

TK.pct = (v, digits = 2) => (v === null || v === undefined || Number.isNaN(v) ? "–"
  : (100 * v).toFixed(digits));
TK.num = (v) => (v === null || v === undefined || Number.isNaN(v) ? "–"
  : Math.abs(v) >= 1000 ? Math.round(v).toLocaleString("en") : String(+v.toPrecision(4)));

TK.tooltip = (function () {
  let tip = null;
  return {
    show(event, text) {
      if (!tip) tip = TK.el("div", { class: "tip", role: "tooltip" }, document.body);
      tip.textContent = text;
      tip.style.display = "block";
      tip.style.left = `${event.pageX + 12}px`;
      tip.style.top = `${event.pageY + 12}px`;
    },
    hide() { if (tip) tip.style.display = "none"; },
  };
}());

// A linear or log10 scale from a domain to a pixel range, with readable ticks.
TK.scale = function (lo, hi, from, to, log) {
  if (log) { lo = Math.log10(Math.max(lo, 1e-12)); hi = Math.log10(Math.max(hi, 1e-12)); }
  if (!(hi > lo)) { hi = lo + 1; lo -= 0; }
  const f = (v) => from + ((log ? Math.log10(Math.max(v, 1e-12)) : v) - lo) / (hi - lo) * (to - from);
  f.ticks = function () {
    if (log) {  // decades; with fewer than three, their 2× and 5× too
      const steps = hi - lo < 2.5 ? [1, 2, 5] : [1];
      const out = [];
      for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) {
        for (const m of steps) {
          const v = m * 10 ** e, at = Math.log10(v);
          if (at >= lo - 1e-9 && at <= hi + 1e-9) out.push(v);
        }
      }
      return out.length ? out : [10 ** lo];
    }
    const raw = (hi - lo) / 5, mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toFixed(10));
    return out;
  };
  return f;
};

function extent(arrays, pad) {
  let lo = Infinity, hi = -Infinity;
  for (const a of arrays) for (const v of a) if (v !== null && Number.isFinite(v)) {
    lo = Math.min(lo, v); hi = Math.max(hi, v);
  }
  if (!Number.isFinite(lo)) return [0, 1];
  const p = (hi - lo || Math.abs(hi) || 1) * (pad || 0);
  return [lo - p, hi + p];
}

// Percent tick labels with as many decimals as the ticks' step needs.
TK.pctTick = (v, step) => TK.pct(v, step * 100 >= 1 ? 0 : step * 100 >= 0.1 ? 1 : 2);

function axes(svg, x, y, box, o) {
  const g = TK.svg("g", { class: "axes" }, svg);
  const yTicks = y.ticks(), step = yTicks.length > 1 ? Math.abs(yTicks[1] - yTicks[0]) : 1;
  for (const t of yTicks) {
    TK.svg("line", { x1: box.left, x2: box.right, y1: y(t), y2: y(t), class: "grid" }, g);
    TK.svg("text", { x: box.left - 6, y: y(t) + 4, "text-anchor": "end" }, g).textContent =
      o.yFormat ? o.yFormat(t, step) : TK.num(t);
  }
  for (const t of x.ticks()) {
    TK.svg("line", { x1: x(t), x2: x(t), y1: box.bottom, y2: box.bottom + 5, class: "tick" }, g);
    TK.svg("text", { x: x(t), y: box.bottom + 18, "text-anchor": "middle" }, g).textContent =
      TK.num(t);
  }
  TK.svg("line", { x1: box.left, x2: box.right, y1: box.bottom, y2: box.bottom, class: "axis" }, g);
  TK.svg("text", { x: (box.left + box.right) / 2, y: box.bottom + 36, "text-anchor": "middle",
    class: "label" }, g).textContent = o.xLabel || "";
  TK.svg("text", { x: 14, y: (box.top + box.bottom) / 2, "text-anchor": "middle", class: "label",
    transform: `rotate(-90 14 ${(box.top + box.bottom) / 2})` }, g).textContent = o.yLabel || "";
}

// A chart's figure, its caption, its size (o.width × o.height, else the chart's default) and
// the plotting box inside the axes' margins.
function frame(parent, o, width, height) {
  const wrap = TK.el("figure", { class: "chart" }, parent);
  if (o.title) TK.el("figcaption", {}, wrap, o.title);
  const W = o.width || width, H = o.height || height;
  return { wrap, W, H, box: { left: 58, right: W - 12, top: 10, bottom: H - 44 } };
}

function legend(parent, names, toggle) {
  const list = TK.el("div", { class: "legend" }, parent);
  names.forEach((name, i) => {
    const item = TK.el("button", { type: "button", class: "key", "data-series": name }, list);
    TK.el("span", { class: "swatch", style: `background:${TK.color(i)}` }, item);
    TK.el("span", {}, item, name);
    if (toggle) item.addEventListener("click", () => item.classList.toggle("off", !toggle(i)));
  });
}

// Lines (one per series) over x, each with an optional band [low, high]; hover shows the
// nearest point, the legend toggles a series.
TK.lineChart = function (parent, o) {
  const { wrap, W, H, box } = frame(parent, o, 520, 300);
  const svg = TK.svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": o.title || "" }, wrap);
  // a log axis has no place for x ≤ 0: such points are left out (the caller says so)
  const drawn = (s, j) => (!o.xLog || s.x[j] > 0) && s.y[j] !== null && Number.isFinite(s.y[j]);
  const xs = o.series.map((s) => Array.from(s.x).filter((v) => !o.xLog || v > 0));
  const ys = o.series.flatMap((s) => [s.y, s.low || [], s.high || []]);
  const [x0, x1] = extent(xs, 0);
  const [y0, y1] = o.yDomain || extent(ys, 0.05);
  const x = TK.scale(o.xLog ? Math.max(x0, 1e-3) : x0, x1, box.left, box.right, o.xLog);
  const y = TK.scale(y0, y1, box.bottom, box.top, false);
  axes(svg, x, y, box, o);
  const layers = o.series.map((s, i) => {
    const g = TK.svg("g", { class: "series", "data-series": s.name }, svg);
    const pts = [];
    for (let j = 0; j < s.x.length; j++) if (drawn(s, j)) pts.push(j);
    if (s.low && s.high) {
      const up = pts.filter((j) => s.low[j] !== null && s.high[j] !== null);
      if (up.length) {
        const d = up.map((j) => `${x(s.x[j])},${y(s.high[j])}`).concat(
          up.slice().reverse().map((j) => `${x(s.x[j])},${y(s.low[j])}`));
        TK.svg("polygon", { points: d.join(" "), fill: TK.color(i), class: "band" }, g);
      }
    }
    TK.svg("polyline", { points: pts.map((j) => `${x(s.x[j])},${y(s.y[j])}`).join(" "),
      stroke: TK.color(i), class: "line" }, g);
    if (pts.length < 80) for (const j of pts) {
      TK.svg("circle", { cx: x(s.x[j]), cy: y(s.y[j]), r: 2.5, fill: TK.color(i) }, g);
    }
    return { g, pts, s, i, on: true };
  });
  svg.addEventListener("mousemove", (event) => {
    const r = svg.getBoundingClientRect(), px = (event.clientX - r.left) * W / r.width,
      py = (event.clientY - r.top) * H / r.height;
    let best = null, dist = 400;
    for (const l of layers) if (l.on) for (const j of l.pts) {
      const d = (x(l.s.x[j]) - px) ** 2 + (y(l.s.y[j]) - py) ** 2;
      if (d < dist) { dist = d; best = [l, j]; }
    }
    if (!best) { TK.tooltip.hide(); return; }
    const [l, j] = best, s = l.s;
    const band = s.low && s.low[j] !== null ? ` [${o.fmt(s.low[j])}, ${o.fmt(s.high[j])}]` : "";
    TK.tooltip.show(event, `${s.name}: ${o.xLabel} ${TK.num(s.x[j])}, ${o.yLabel} ` +
      `${o.fmt(s.y[j])}${band}${s.note ? s.note(j) : ""}`);
  });
  svg.addEventListener("mouseleave", () => TK.tooltip.hide());
  legend(wrap, o.series.map((s) => s.name), (i) => {
    layers[i].on = !layers[i].on;
    layers[i].g.style.display = layers[i].on ? "" : "none";
    return layers[i].on;
  });
  return wrap;
};

// Bars grouped by category, one per series, with error bars [low, high] where given.
TK.barChart = function (parent, o) {
  const { wrap, W, H, box } = frame(parent, o, 520, 300);
  const svg = TK.svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": o.title || "" }, wrap);
  const values = o.series.flatMap((s) => [s.values, s.high || []]);
  const [, top] = extent(values, 0.05);
  const y = TK.scale(0, Math.max(top, 1e-9), box.bottom, box.top, false);
  const x = { ticks: () => [] };
  axes(svg, Object.assign(() => 0, x), y, box, o);
  const n = o.series.length, slot = (box.right - box.left) / o.categories.length;
  const bar = Math.min(28, (slot * 0.8) / Math.max(n, 1));
  o.categories.forEach((cat, c) => {
    const mid = box.left + slot * (c + 0.5);
    TK.svg("text", { x: mid, y: box.bottom + 18, "text-anchor": "middle" }, svg).textContent = cat;
    o.series.forEach((s, i) => {
      const v = s.values[c];
      if (v === null || !Number.isFinite(v)) return;
      const left = mid - (n * bar) / 2 + i * bar;
      const rect = TK.svg("rect", { x: left, y: y(v), width: bar - 2, height: box.bottom - y(v),
        fill: TK.color(i), class: "bar", "data-series": s.name }, svg);
      const lo = s.low ? s.low[c] : null, hi = s.high ? s.high[c] : null;
      if (lo !== null && hi !== null && lo !== undefined) {
        const cx = left + (bar - 2) / 2;
        TK.svg("line", { x1: cx, x2: cx, y1: y(lo), y2: y(hi), class: "whisker" }, svg);
      }
      const band = lo !== null && lo !== undefined ? ` [${o.fmt(lo)}, ${o.fmt(hi)}]` : "";
      rect.addEventListener("mousemove", (e) => TK.tooltip.show(e, `${s.name}, ${cat}: ${o.fmt(v)}${band}`));
      rect.addEventListener("mouseleave", () => TK.tooltip.hide());
    });
  });
  legend(wrap, o.series.map((s) => s.name), null);
  return wrap;
};

// Up to millions of points on a canvas: x, y typed arrays, a colour class per point; hover
// names the nearest point, a click picks it.
TK.scatter = function (parent, o) {
  const { wrap, W, H, box } = frame(parent, o, 640, 360);
  const holder = TK.el("div", { class: "canvas-holder", style: `width:${W}px;height:${H}px` }, wrap);
  const canvas = TK.el("canvas", { width: W, height: H }, holder);
  const svg = TK.svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "overlay" }, holder);
  const [x0, x1] = extent([o.x], 0.05), [, y1] = extent([o.y], 0.05);
  const reach = Math.max(Math.abs(x0), Math.abs(x1), 1e-9);  // symmetric: no change in the middle
  const x = TK.scale(-reach, reach, box.left, box.right, false);
  const y = TK.scale(0, Math.max(y1, 1), box.bottom, box.top, false);
  axes(svg, x, y, box, o);
  TK.svg("line", { x1: x(0), x2: x(0), y1: box.top, y2: box.bottom, class: "grid" }, svg);
  if (o.hLine !== undefined) {
    TK.svg("line", { x1: box.left, x2: box.right, y1: y(o.hLine), y2: y(o.hLine), class: "threshold" }, svg);
  }
  const ctx = canvas.getContext("2d");
  const px = new Float32Array(o.x.length), py = new Float32Array(o.x.length);
  const cell = 8, cols = Math.ceil(W / cell), grid = new Map();
  for (let i = 0; i < o.x.length; i++) {
    px[i] = x(o.x[i]); py[i] = y(o.y[i]);
    const key = Math.floor(py[i] / cell) * cols + Math.floor(px[i] / cell);
    if (!grid.has(key)) grid.set(key, []);
    grid.get(key).push(i);
  }
  const colors = o.colors || ["#999"];
  const dot = o.x.length < 5000 ? 5 : 3;
  for (let c = 0; c < colors.length; c++) {
    ctx.fillStyle = colors[c];
    ctx.globalAlpha = c === 0 ? 0.35 : 0.8;
    for (let i = 0; i < px.length; i++) {
      if ((o.classes ? o.classes[i] : 0) === c) ctx.fillRect(px[i] - dot / 2, py[i] - dot / 2, dot, dot);
    }
  }
  let marker = null;
  const nearest = (event) => {
    const r = canvas.getBoundingClientRect(), mx = event.clientX - r.left, my = event.clientY - r.top;
    let best = -1, dist = 100;
    for (let dy = -1; dy <= 1; dy++) for (let dx = -1; dx <= 1; dx++) {
      const key = (Math.floor(my / cell) + dy) * cols + Math.floor(mx / cell) + dx;
      for (const i of grid.get(key) || []) {
        const d = (px[i] - mx) ** 2 + (py[i] - my) ** 2;
        if (d < dist) { dist = d; best = i; }
      }
    }
    return best;
  };
  svg.addEventListener("mousemove", (event) => {
    const i = nearest(event);
    if (i < 0) { TK.tooltip.hide(); return; }
    TK.tooltip.show(event, o.describe(i));
  });
  svg.addEventListener("mouseleave", () => TK.tooltip.hide());
  svg.addEventListener("click", (event) => { const i = nearest(event); if (i >= 0 && o.onPick) o.onPick(i); });
  wrap.mark = (i) => {
    if (marker) marker.remove();
    marker = i < 0 ? null : TK.svg("circle", { cx: px[i], cy: py[i], r: 6, class: "marker" }, svg);
  };
  return wrap;
};
