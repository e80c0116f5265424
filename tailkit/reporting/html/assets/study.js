// reports/index.html: a study's table, figures, settings and provenance, from its data block.
"use strict";
(function () {
  const data = TK.data();
  const page = document.getElementById("page");
  page.textContent = "";
  const section = (title, id) => {
    const s = TK.el("section", { id }, page);
    TK.el("h2", {}, s, title);
    return s;
  };

  TK.el("h1", {}, page, `tailkit study: ${data.title}`);
  TK.el("p", { class: "lead" }, page, data.size);
  TK.el("p", { class: "study" }, page, data.study);

  // The experiments table: sortable, marks as in summary.md, a row's settings on click.
  const results = section("Experiments", "experiments");
  const columns = [{ key: "experiment", label: "experiment" }, { key: "method", label: "method" }];
  if (data.table.several) columns.push({ key: "seeds", label: "seeds", numeric: true });
  data.table.columns.forEach((c) => columns.push({ key: c.key, label: c.header, numeric: true,
    descending: c.higher, title: c.key }));
  const rows = data.table.rows.map((r) => {
    const row = {
      experiment: { text: r.unpaired ? `${r.name} †` : r.name, value: r.name },
      method: { text: r.method, cls: "wrap" },
      seeds: { text: String(r.seeds), value: r.seeds },
    };
    r.cells.forEach((c, j) => {
      row[data.table.columns[j].key] = {
        text: c.text + (c.tie ? " ≈" : ""),
        value: c.value,
        cls: c.best ? "best" : c.tie ? "tie" : "",
        title: c.p === null || c.p === undefined ? "" : `Holm-adjusted p against the best: ${c.p.toPrecision(2)}`,
      };
    });
    return row;
  });
  TK.sortableTable(results, columns, rows, {
    id: "experiments-table",
    details: (i) => settingsOf(data.table.rows[i].name),
  });
  TK.el("p", { class: "legend-text" }, results, data.legend);
  TK.el("p", { class: "hint" }, results, "Click a column's header to sort, a row for its settings and provenance.");

  function settingsOf(name) {
    const d = data.details[name] || { settings: {}, differing: [] };
    const box = TK.el("div", { class: "settings" });
    const dl = TK.el("dl", {}, box);
    for (const [key, value] of Object.entries(d.settings)) {
      TK.el("dt", { class: d.differing.includes(key) ? "differs" : "" }, dl, key);
      TK.el("dd", {}, dl, value === null ? "–" : String(value));
    }
    if (d.fingerprints && Object.keys(d.fingerprints).length) {
      TK.el("h4", {}, box, "Code");
      const ul = TK.el("ul", {}, box);
      for (const [part, fp] of Object.entries(d.fingerprints)) TK.el("li", {}, ul, `${part}: ${fp}`);
    }
    return box;
  }
  if (data.shared) TK.el("p", { class: "shared" }, results, data.shared);

  // Learning curves: against seconds and steps, the two validation metrics.
  const names = Object.keys(data.curves);
  const curves = section("Learning curves", "curves");
  const grid = TK.el("div", { class: "charts" }, curves);
  for (const [metric, label] of data.curve_metrics) {
    for (const axis of ["seconds", "step"]) {
      TK.lineChart(grid, {
        title: `${label} against ${axis === "step" ? "steps" : "seconds"}`,
        xLabel: axis, yLabel: label, fmt: (v) => TK.pct(v),
        yFormat: TK.pctTick,
        series: names.map((n) => ({ name: n, x: data.curves[n][axis], y: data.curves[n][metric] })),
      });
    }
  }

  // Groups: bars with their 95 % intervals.
  const groups = section(data.groups_title, "groups");
  TK.barChart(groups, {
    categories: data.groups.names, yLabel: data.groups_axis,
    fmt: (v) => TK.pct(v), yFormat: TK.pctTick,
    series: data.groups.series,
  });

  // Per frequency bin: each experiment's mean per-label value with its bootstrap band.
  const bins = section(data.bins_title, "bins");
  const binNames = Object.keys(data.bins);
  TK.lineChart(bins, {
    xLabel: "training rows of the label", yLabel: data.bins_axis,
    xLog: true, width: 1040, height: 380, fmt: (v) => TK.pct(v), yFormat: TK.pctTick,
    series: binNames.map((n) => {
      const b = data.bins[n];
      return { name: n, x: b.train_count, y: b.value, low: b.low, high: b.high,
        note: (j) => `; ${b.labels[j]} labels, ${b.test_rows[j]} test rows` };
    }),
  });
  TK.el("p", { class: "hint" }, bins, data.bins_note);
  const unseen = binNames.length ? data.bins[binNames[0]] : null;
  if (unseen) {
    let labels = 0;
    unseen.train_count.forEach((c, j) => { if (!(c > 0)) labels += unseen.labels[j]; });
    if (labels) {
      TK.el("p", { class: "hint", id: "unseen-labels" }, bins, `${labels.toLocaleString("en")} label${labels === 1 ? "" : "s"} with ` +
        `no training row ${labels === 1 ? "is" : "are"} not drawn here (the axis is logarithmic).`);
    }
  }

  // Samplers and provenance.
  if (Object.keys(data.samplers).length) {
    const samplers = section("Sampler fits", "samplers");
    const keys = [...new Set(Object.values(data.samplers).flatMap((s) => Object.keys(s)))];
    const cols = [{ key: "sampler", label: "sampler" }, ...keys.map((k) => ({ key: k, label: k, numeric: true }))];
    const rowsOf = Object.entries(data.samplers).map(([name, fit]) => {
      const row = { sampler: { text: name } };
      for (const k of keys) {
        const v = fit[k];
        row[k] = { text: typeof v === "number" ? TK.num(v) : v === undefined || v === null ? "–" : String(v),
          value: typeof v === "number" ? v : null };
      }
      return row;
    });
    TK.sortableTable(samplers, cols, rowsOf, { id: "samplers-table" });
  }
  const prov = section("Provenance", "provenance");
  const ul = TK.el("ul", {}, prov);
  for (const line of data.provenance) TK.el("li", {}, ul, line);
  document.body.dataset.ready = "true";
}());
