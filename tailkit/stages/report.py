"""Stage ``report``: ``reports/summary.md`` from every experiment's metrics, with figures.

For the experiments in params.yaml (one study: they share the data), the summary holds the
comparison table (best value of each column in bold), the settings that differ between the
experiments and those they share, the plugin distributions and versions behind the numbers,
and three PNG figures under ``reports/figures/``: learning curves, accuracy per many/medium/
few group, per-class accuracy against training count; and ``reports/index.html``, the
study's page (:mod:`tailkit.reporting.html.study`) with the same table and figures drawn from
data, sortable and hoverable, opened from disk with no server. The same data is written to
``plots/report/{curves,groups}.tsv``, which dvc.yaml declares as top-level plots, so
``dvc plots show`` and ``dvc plots diff`` draw one line (or bar) per experiment.

``tailkit report --export FILE`` (.parquet, .csv or .json) also writes the frame of runs the
tables are rendered from (:func:`tailkit.reporting.tables.runs_frame`), for notebooks.

``run(..., include_exps=True)`` (``tailkit report --exps``) adds every finished DVC experiment
from ``dvc exp show --json`` (``dvc exp run -S ...``, ``--queue``), grouped into studies by the
data they were trained on, and writes ``reports/experiments.md`` instead. The pipeline's own
report leaves them out because a stage's output must follow from its declared dependencies, and
hidden experiment refs are not among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.reporting.html.study import write_study_page
from tailkit.reporting.paired import metric_name, study_pairing
from tailkit.reporting.runs import (
    describe_data,
    dvc_exp_show,
    exp_runs,
    workspace_runs,
)
from tailkit.reporting.summary import (
    DVC_PLOTS_NOTE,
    FIGURES,
    MULTILABEL_FIGURES,
    group_studies,
    study_markdown,
    write_figures,
    write_plot_data,
)
from tailkit.reporting.tables import columns_for, export_runs
from tailkit.storage.atomic import atomic_path
from tailkit.storage.splits import read_meta


@dataclass(frozen=True)
class Report:
    path: Path
    text: str
    studies: int


def run(
    params: Params,
    layout: Layout,
    include_exps: bool = False,
    export: Path | None = None,
    draw: bool = True,
) -> Report:
    """Write the summary (``include_exps``: the experiments report); ``export`` also writes the
    runs frame the tables come from; ``draw=False`` skips the PNG figures."""
    meta = read_meta(layout.split)  # labels and counts: the same for every feature set
    counts = meta["train_counts"]
    if meta.get("multilabel"):
        rows = meta["train_rows"]
        size = f"{meta['num_classes']:,} labels, {rows:,} training rows"
        size += f" ({int(counts.sum()) / max(rows, 1):.2f} labels per row).\n"
    else:
        size = f"{meta['num_classes']:,} classes, {int(counts.sum()):,} training rows.\n"
    header = f"# tailkit summary: {meta['dataset']['name']}\n\n{size}"
    if not include_exps:
        runs = workspace_runs(params, layout)
        names = (metric_name(c.path) for c in columns_for(runs))
        pairing = study_pairing(runs, [n for n in names if n], layout, meta)
        data = write_plot_data(runs, layout)
        multilabel = bool(meta.get("multilabel"))
        if draw:
            write_figures(data, layout, multilabel)
        write_study_page(params, layout, runs, pairing, data, meta, size)
        captions = MULTILABEL_FIGURES if multilabel else FIGURES
        figure_links = "\n".join(
            f"![{caption}](figures/{name})\n" for name, caption in captions.items()
        )
        text = "\n".join(
            [
                header,
                study_markdown(describe_data(params), runs, pairing),
                "## Figures\n",
                figure_links,
                DVC_PLOTS_NOTE,
            ]
        )
        out, n_studies = layout.report, 1
    else:
        # exp show holds the workspace too; read its metrics files only when it has nothing
        runs = exp_runs(dvc_exp_show(layout.root), root=layout.root) or workspace_runs(
            params, layout
        )
        studies = group_studies(runs)
        sections = []
        for study_runs in studies.values():
            exps = sorted({r.source for r in study_runs if r.source})
            title = describe_data(study_runs[0].params)
            if exps:
                title += f" (with {', '.join(exps)})"
            sections.append(study_markdown(title, study_runs))
        text = header + "\n" + "\n".join(sections)
        out, n_studies = layout.experiments_report, len(studies)
    if export is not None:
        export_runs(runs, export)
    with atomic_path(out) as tmp:
        tmp.write_text(text)
    return Report(out, text, n_studies)
