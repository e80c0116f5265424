// tailkit compare A B --html: changes per octave and group with their tests, a volcano plot, a
// searchable table of every compared label and, for a chosen label, its test rows' top-k.
"use strict";
(function () {
  const data = TK.data();
  const page = document.getElementById("page");
  page.textContent = "";
  const L = data.labels, n = L.id.length;
  const section = (title, id) => {
    const s = TK.el("section", { id }, page);
    TK.el("h2", {}, s, title);
    return s;
  };
  const signed = (v) => (v === null || Number.isNaN(v) ? "–" : (v > 0 ? "+" : "") + (100 * v).toFixed(2));
  const qText = (v) => (v === null || v === undefined || Number.isNaN(v) ? "–"
    : v === 0 ? "< 1e-300" : v < 1e-4 ? v.toExponential(1) : v.toPrecision(2));

  // label id → name, built once (names are sent only where they are not the id)
  let nameMap = null;
  const nameOf = (id) => {
    if (!data.names) return String(id);
    if (!nameMap) {
      nameMap = new Map();
      const text = data.names.text.split("\n");
      data.names.ids.forEach((v, i) => nameMap.set(v, text[i]));
    }
    const found = nameMap.get(id);
    return found === undefined || found === "" ? String(id) : found;
  };

  // "name (id)" where labels have names, the id alone where they do not
  const named = (id) => (data.names ? `${nameOf(id)} (${id})` : String(id));

  TK.el("h1", {}, page, `${data.b} against ${data.a}`);
  TK.el("p", { class: "lead" }, page,
    `Per-label ${data.metric} of ${n.toLocaleString("en")} labels with test rows; change = ` +
    `${data.b} − ${data.a}, in points. Data key ${data.data_key}.`);
  TK.el("p", { class: "lead" }, page, data.tested
    ? `Tested: each bin and group by a paired bootstrap over the test rows (95 % interval, ` +
      `Benjamini–Hochberg q); each label with enough discordant rows by McNemar's exact test ` +
      `(${data.testable.toLocaleString("en")} labels), q across them.`
    : `Not tested: ${data.untested}.`);

  function summaryTable(parent, frame, first, id) {
    const columns = [first,
      { key: "labels", label: "labels", numeric: true },
      { key: "test_rows", label: "test rows", numeric: true },
      { key: "a", label: data.a, numeric: true, descending: true },
      { key: "b", label: data.b, numeric: true, descending: true },
      { key: "change", label: "change", numeric: true, descending: true },
      { key: "interval", label: "95 % interval", numeric: true },
      { key: "q", label: "q", numeric: true },
      { key: "improved", label: "improved", numeric: true, descending: true },
      { key: "worsened", label: "worsened", numeric: true, descending: true },
      { key: "same", label: "same", numeric: true, descending: true }];
    const rows = frame.labels.map((_, i) => {
      const q = frame.q ? frame.q[i] : null;
      const beyond = q !== null && q !== undefined && q < data.q_level;
      const row = {
        labels: { text: frame.labels[i].toLocaleString("en"), value: frame.labels[i] },
        test_rows: { text: frame.test_rows[i].toLocaleString("en"), value: frame.test_rows[i] },
        a: { text: TK.pct(frame.a[i]), value: frame.a[i] },
        b: { text: TK.pct(frame.b[i]), value: frame.b[i] },
        change: { text: signed(frame.change[i]), value: frame.change[i],
          cls: beyond ? (frame.change[i] > 0 ? "up" : "down") : "" },
        interval: frame.change_low ? { text: frame.change_low[i] === null ? "–"
          : `[${signed(frame.change_low[i])}, ${signed(frame.change_high[i])}]`, value: frame.change_low[i] }
          : { text: "–" },
        q: { text: qText(q), value: q },
        improved: { text: String(frame.improved[i]), value: frame.improved[i] },
        worsened: { text: String(frame.worsened[i]), value: frame.worsened[i] },
        same: { text: String(frame.same[i]), value: frame.same[i] },
      };
      row[first.key] = first.cell(i);
      return row;
    });
    const table = TK.sortableTable(parent, columns, rows, { id });
    table.classList.add("changes");
    return table;
  }

  const octaves = section("By training rows (octaves)", "octaves");
  summaryTable(octaves, data.bins, { key: "range", label: "training rows",
    cell: (i) => ({ text: data.bins.count_low[i] === data.bins.count_high[i] - 1 ? String(data.bins.count_low[i])
      : `${data.bins.count_low[i]}–${data.bins.count_high[i] - 1}`, value: data.bins.count_low[i] }) }, "octaves-table");
  const groups = section("By group", "groups");
  summaryTable(groups, data.groups, { key: "group", label: "group",
    cell: (i) => ({ text: data.groups.group[i], value: i }) }, "groups-table");
  TK.el("p", { class: "hint" }, groups, "Green or red: the change is beyond chance (q < 0.05).");

  const curves = section("Per-label value by training rows", "curves");
  TK.lineChart(curves, {
    title: `mean per-label ${data.metric} per quarter octave`, xLabel: "training rows of the label",
    yLabel: data.metric, xLog: true, width: 1040, height: 340, fmt: (v) => TK.pct(v),
    yFormat: TK.pctTick,
    series: [data.a, data.b].map((name, s) => ({ name, x: data.curves.train_count,
      y: s ? data.curves.b : data.curves.a,
      note: (j) => `; ${data.curves.labels[j]} labels, ${data.curves.test_rows[j]} test rows` })),
  });

  let unseen = 0;
  data.curves.train_count.forEach((c, j) => { if (!(c > 0)) unseen += data.curves.labels[j]; });
  if (unseen) {
    TK.el("p", { class: "hint", id: "unseen-labels" }, curves, `${unseen.toLocaleString("en")} label${unseen === 1 ? "" : "s"} ` +
      `with no training row ${unseen === 1 ? "is" : "are"} not drawn here (the axis is logarithmic); ` +
      "the tables count them.");
  }

  let volcano = null;
  if (data.tested) {
    const v = section("Labels beyond chance", "volcano");
    const idx = [];
    for (let i = 0; i < n; i++) if (!Number.isNaN(L.p[i])) idx.push(i);
    const x = Float64Array.from(idx, (i) => 100 * L.change[i]);
    const y = Float64Array.from(idx, (i) => -Math.log10(Math.max(L.p[i], 1e-300)));
    const classes = Uint8Array.from(idx, (i) => (L.q[i] < data.q_level ? (L.change[i] > 0 ? 1 : 2) : 0));
    volcano = TK.scatter(v, {
      title: `${idx.length.toLocaleString("en")} testable labels: change against −log10 p (McNemar)`,
      xLabel: `change of ${data.metric} (points)`, yLabel: "−log10 p", x, y, classes,
      colors: ["#8a949e", "#1a7f37", "#b42318"], width: 1040, height: 380,
      describe: (j) => { const i = idx[j]; return `${nameOf(L.id[i])} (id ${L.id[i]}): ${signed(L.change[i])}, ` +
        `p ${qText(L.p[i])}, q ${qText(L.q[i])}, ${L.test[i]} test rows`; },
      onPick: (j) => pick(idx[j]),
    });
    volcano.indexOf = new Map(idx.map((i, j) => [i, j]));
    TK.el("p", { class: "hint" }, v, "Green: gained, red: lost, beyond chance (q < 0.05); grey: not. " +
      "Labels with fewer discordant rows than the test needs are not drawn. Click a point for its rows.");
  }

  const table = section("Labels", "labels");
  const cols = [
    { key: "id", label: "id", numeric: true, get: (i) => L.id[i], text: (i) => String(L.id[i]), width: "9%" },
    { key: "name", label: "name", get: (i) => nameOf(L.id[i]), text: (i) => nameOf(L.id[i]), width: "27%" },
    { key: "train", label: "training rows", numeric: true, descending: true, get: (i) => L.train[i], text: (i) => L.train[i].toLocaleString("en") },
    { key: "test", label: "test rows", numeric: true, descending: true, get: (i) => L.test[i], text: (i) => L.test[i].toLocaleString("en") },
    { key: "a", label: data.a, numeric: true, descending: true, get: (i) => L.a[i], text: (i) => TK.pct(L.a[i]) },
    { key: "b", label: data.b, numeric: true, descending: true, get: (i) => L.b[i], text: (i) => TK.pct(L.b[i]) },
    { key: "change", label: "change", numeric: true, descending: true, get: (i) => L.change[i], text: (i) => signed(L.change[i]) },
  ];
  if (data.tested) cols.push({ key: "q", label: "q", numeric: true, get: (i) => L.q[i], text: (i) => qText(L.q[i]) });
  const labelTable = TK.virtualTable(table, n, cols, {
    id: "label-table", placeholder: "search a label by name or id",
    search: (i, q) => String(L.id[i]) === q || nameOf(L.id[i]).toLowerCase().includes(q),
    onPick: (i) => pick(i), height: 420,
  });
  const drill = TK.el("div", { class: "drill", id: "drill" }, table);
  TK.el("p", { class: "hint" }, drill, "Click a label for its test rows under both runs.");

  // A label's test rows (an index from label to rows, built on the first pick).
  let rowsOf = null;
  function labelRows(label) {
    const R = data.rows;
    if (!rowsOf) {
      rowsOf = new Map();
      for (let r = 0; r < R.count; r++) {
        for (let j = R.indptr[r]; j < R.indptr[r + 1]; j++) {
          const l = R.truth[j];
          if (!rowsOf.has(l)) rowsOf.set(l, []);
          rowsOf.get(l).push(r);
        }
      }
    }
    return rowsOf.get(label) || [];
  }
  const LIMIT = 200;
  function pick(i) {
    const id = L.id[i];
    drill.textContent = "";
    TK.el("h3", {}, drill, `${nameOf(id)} (label ${id})`);
    let line = `${L.train[i].toLocaleString("en")} training rows, ${L.test[i].toLocaleString("en")} test rows; ` +
      `${data.metric}: ${data.a} ${TK.pct(L.a[i])}, ${data.b} ${TK.pct(L.b[i])} (${signed(L.change[i])})`;
    if (data.tested) {
      line += `; rows only ${data.a} ranks it: ${L.a_only[i]}, only ${data.b}: ${L.b_only[i]}; ` +
        `p ${qText(L.p[i])}, q ${qText(L.q[i])}`;
    }
    TK.el("p", {}, drill, line);
    if (volcano && volcano.indexOf) volcano.mark(volcano.indexOf.has(i) ? volcano.indexOf.get(i) : -1);
    if (!data.rows) { TK.el("p", { class: "hint" }, drill, "No row outcomes: the rows cannot be shown."); return; }
    const R = data.rows, k = R.k;
    const ranks = (ranked, r) => { for (let j = 0; j < k; j++) if (ranked[r * k + j] === id) return j; return k; };
    // the rows where the runs differ (one ranks the label within the metric's depth, the
    // other not) come first
    const depth = Number(data.metric.split("@")[1]) || 1;
    const differs = (r) => (ranks(R.a, r) < depth) !== (ranks(R.b, r) < depth);
    const all = labelRows(id);
    const rows = all.filter(differs).concat(all.filter((r) => !differs(r)));
    const t = TK.el("table", { class: "grid-table", id: "drill-rows" }, drill);
    const head = TK.el("tr", {}, TK.el("thead", {}, t));
    for (const h of ["test row", "true labels", `${data.a} top-${k}`, `${data.b} top-${k}`]) TK.el("th", {}, head, h);
    const body = TK.el("tbody", {}, t);
    const ranking = (ranked, r, td) => {
      for (let j = 0; j < k; j++) {
        const l = ranked[r * k + j];
        if (l < 0) continue;
        if (td.childNodes.length) td.appendChild(document.createTextNode(", "));
        TK.el("span", { class: l === id ? "hit" : "" }, td, named(l));
      }
    };
    for (const r of rows.slice(0, LIMIT)) {
      const tr = TK.el("tr", {}, body);
      TK.el("td", { class: "num" }, tr, String(R.row[r]));
      const truth = [];
      for (let j = R.indptr[r]; j < R.indptr[r + 1]; j++) truth.push(named(R.truth[j]));
      TK.el("td", { style: "white-space:normal" }, tr, truth.join(", "));
      ranking(R.a, r, TK.el("td", { style: "white-space:normal" }, tr));
      ranking(R.b, r, TK.el("td", { style: "white-space:normal" }, tr));
    }
    const split = all.filter(differs).length;
    const within = depth === 1 ? "first" : `within the top ${depth}`;
    TK.el("p", { class: "hint" }, drill, `${split} of ${rows.length} rows rank it ${within} in one run only; ` +
      "they come first" + (rows.length > LIMIT ? `; the first ${LIMIT} rows are shown.` : "."));
    drill.dataset.label = String(id);
  }
  page.labelTable = labelTable;
  document.body.dataset.ready = "true";
}());
