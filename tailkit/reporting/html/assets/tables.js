// Tables: a small sortable one (every row in the DOM) and a virtualised one for up to millions
// of rows (only the rows in view are in the DOM; sorting and search run on typed arrays).
"use strict";

// Sort indices by a key function, nulls last whichever the direction, ties by index.
TK.order = function (n, key, descending) {
  const keys = new Array(n);
  for (let i = 0; i < n; i++) keys[i] = key(i);
  const idx = Array.from({ length: n }, (_, i) => i);
  const sign = descending ? -1 : 1;
  idx.sort((a, b) => {
    const ka = keys[a], kb = keys[b];
    const na = ka === null || ka === undefined || Number.isNaN(ka);
    const nb = kb === null || kb === undefined || Number.isNaN(kb);
    if (na || nb) return na === nb ? a - b : na ? 1 : -1;
    if (ka < kb) return -sign;
    if (ka > kb) return sign;
    return a - b;
  });
  return idx;
};

function sortHeader(th, column, state, apply) {
  th.setAttribute("aria-sort", "none");
  th.tabIndex = 0;
  const go = () => {
    const descending = state.key === column.key ? !state.descending : !!column.descending;
    state.key = column.key;
    state.descending = descending;
    for (const other of th.parentNode.children) other.setAttribute("aria-sort", "none");
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    apply();
  };
  th.addEventListener("click", go);
  th.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
}

// columns: [{key, label, numeric, descending (first click), title}]; rows: [{key: {text, value,
// cls, title}}] ; o.details(row) → an element shown under the row when it is clicked.
TK.sortableTable = function (parent, columns, rows, o = {}) {
  const scroll = TK.el("div", { class: "table-scroll" }, parent);  // a wide table scrolls itself
  const table = TK.el("table", { class: "grid-table sortable", id: o.id || "" }, scroll);
  const head = TK.el("tr", {}, TK.el("thead", {}, table));
  const body = TK.el("tbody", {}, table);
  const state = { key: null, descending: false };
  const render = () => {
    body.textContent = "";
    let order = rows.map((_, i) => i);
    if (state.key !== null) {
      order = TK.order(rows.length, (i) => {
        const cell = rows[i][state.key];
        return cell ? (cell.value !== undefined ? cell.value : cell.text) : null;
      }, state.descending);
    }
    for (const i of order) {
      const tr = TK.el("tr", { "data-row": String(i) }, body);
      for (const c of columns) {
        const cell = rows[i][c.key] || { text: "–" };
        const td = TK.el("td", { class: (c.numeric ? "num " : "") + (cell.cls || "") }, tr, cell.text);
        if (cell.title) td.title = cell.title;
      }
      if (o.details) {
        tr.classList.add("expandable");
        tr.addEventListener("click", () => {
          const next = tr.nextSibling;
          if (next && next.classList.contains("details")) { next.remove(); return; }
          const row = document.createElement("tr");
          row.className = "details";
          const td = TK.el("td", { colspan: String(columns.length) }, row);
          td.appendChild(o.details(i));
          tr.after(row);
        });
      }
    }
  };
  for (const c of columns) {
    const th = TK.el("th", { class: c.numeric ? "num" : "", scope: "col", "data-key": c.key }, head, c.label);
    if (c.title) th.title = c.title;
    sortHeader(th, c, state, render);
  }
  render();
  return table;
};

// n rows, columns: [{key, label, numeric, get(i) → value for sorting, text(i) → shown}];
// o.search(i, query) → bool, o.onPick(i), o.height (px), o.rowHeight (px).
TK.virtualTable = function (parent, n, columns, o = {}) {
  const wrap = TK.el("div", { class: "vtable", id: o.id || "" }, parent);
  const bar = TK.el("div", { class: "vbar" }, wrap);
  const search = o.search ? TK.el("input", { type: "search", placeholder: o.placeholder || "search",
    "aria-label": o.placeholder || "search", class: "vsearch" }, bar) : null;
  const count = TK.el("span", { class: "vcount" }, bar);
  const table = TK.el("table", { class: "grid-table" }, wrap);
  const head = TK.el("tr", {}, TK.el("thead", {}, table));
  const scroller = TK.el("div", { class: "vscroll", style: `height:${o.height || 420}px` }, wrap);
  const spacer = TK.el("div", { class: "vspacer" }, scroller);
  const inner = TK.el("table", { class: "grid-table vbody" }, scroller);
  const body = TK.el("tbody", {}, inner);
  const rowHeight = o.rowHeight || 24;
  const state = { key: null, descending: false };
  let shown = Int32Array.from({ length: n }, (_, i) => i);
  let filtered = shown;
  // fixed layout, the same widths in the header's table and the body's: the columns line up
  const given = columns.filter((c) => c.width).map((c) => parseFloat(c.width));
  const rest = (100 - given.reduce((a, b) => a + b, 0)) / Math.max(columns.length - given.length, 1);
  const widths = columns.map((c) => c.width || `${rest}%`);
  const colgroup = (t) => { const g = TK.el("colgroup", {}, t); widths.forEach((w) => TK.el("col", { style: `width:${w}` }, g)); };
  colgroup(table); colgroup(inner);
  const draw = () => {
    const first = Math.max(0, Math.floor(scroller.scrollTop / rowHeight) - 5);
    const last = Math.min(filtered.length, first + Math.ceil((o.height || 420) / rowHeight) + 10);
    inner.style.transform = `translateY(${first * rowHeight}px)`;
    body.textContent = "";
    for (let r = first; r < last; r++) {
      const i = filtered[r];
      const tr = TK.el("tr", { "data-index": String(i), style: `height:${rowHeight}px` }, body);
      for (const c of columns) TK.el("td", { class: c.numeric ? "num" : "" }, tr, c.text(i));
      if (o.onPick) tr.addEventListener("click", () => o.onPick(i));
    }
    count.textContent = `${filtered.length.toLocaleString("en")} of ${n.toLocaleString("en")} labels`;
  };
  const refilter = () => {
    const q = search ? search.value.trim().toLowerCase() : "";
    if (!q) filtered = shown;
    else {
      const keep = [];
      for (const i of shown) if (o.search(i, q)) keep.push(i);
      filtered = Int32Array.from(keep);
    }
    spacer.style.height = `${filtered.length * rowHeight}px`;
    // a short list (a search's few matches) takes only its own height
    scroller.style.height = `${Math.min(o.height || 420, filtered.length * rowHeight + 2)}px`;
    scroller.scrollTop = 0;
    draw();
  };
  for (const c of columns) {
    const th = TK.el("th", { class: c.numeric ? "num" : "", scope: "col", "data-key": c.key }, head, c.label);
    if (c.title) th.title = c.title;
    sortHeader(th, c, state, () => {
      const col = columns.find((k) => k.key === state.key);
      shown = Int32Array.from(TK.order(n, col.get, state.descending));
      refilter();
    });
  }
  scroller.addEventListener("scroll", () => window.requestAnimationFrame(draw));
  if (search) search.addEventListener("input", refilter);
  refilter();
  wrap.sortBy = (key, descending) => {
    state.key = key; state.descending = descending;
    const col = columns.find((k) => k.key === key);
    shown = Int32Array.from(TK.order(n, col.get, descending));
    for (const th of head.children) {
      th.setAttribute("aria-sort", th.dataset.key === key ? (descending ? "descending" : "ascending") : "none");
    }
    refilter();
  };
  return wrap;
};
