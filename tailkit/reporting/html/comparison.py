"""``tailkit compare A B --html FILE``: the comparison's page.

What it shows: the change per octave of the training count and per many/medium/few group with
their 95 % paired-bootstrap intervals and q-values (:mod:`tailkit.reporting.compare_tests`), a
volcano plot of the labels that could be tested (change against −log10 p, the labels beyond
chance coloured), both runs' per-bin values against the training count, and a table of every
compared label — searchable by name or id, sortable by training rows, test rows, either run's
value, the change or q — whose rows open that label's test rows with both runs' top-k.

At a million labels the page stays small: the per-label columns and the test rows' rankings
travel as typed arrays (:func:`~tailkit.reporting.html.page.packed`), the table renders only
the rows in view, and names are sent only for the labels the page can show (those compared,
true on a test row or ranked in a top-k), and not at all where a name is just the id.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from tailkit.evaluation.outcomes import Outcomes
from tailkit.reporting.compare import Comparison
from tailkit.reporting.html.page import packed, render


def _frame_columns(frame: pl.DataFrame, names: list[str]) -> dict[str, list[Any]]:
    return {n: frame[n].to_list() for n in names if n in frame.columns}


def _names(c: Comparison, shown: np.ndarray) -> dict[str, Any] | None:
    """Names of the ``shown`` label ids as ``{"ids": i32, "text": "name\\nname…"}``; None when
    every name is its id (a synthetic or numbered label set)."""
    frame = c.a.frame.select("label", "name")
    ids = frame["label"].to_numpy()
    keep = np.isin(ids, shown)
    ids = ids[keep]
    names = frame["name"].to_numpy()[keep]
    text = ["" if n is None else str(n).replace("\n", " ") for n in names]
    if all(t == str(i) or not t for t, i in zip(text, ids, strict=True)):
        return None
    order = np.argsort(ids, kind="stable")
    return {"ids": packed(ids[order], "i32"), "text": "\n".join(text[i] for i in order)}


def _rows(outcomes: tuple[Outcomes, Outcomes]) -> dict[str, Any]:
    """Both runs' rankings of every test row and the rows' true labels, for the drill-down."""
    first, second = outcomes
    indptr, labels = first.truth
    width = min(first.ranked.shape[1], second.ranked.shape[1])
    return {
        "count": first.num_rows,
        "k": width,
        "row": packed(first.rows, "i32"),
        "indptr": packed(indptr, "i32"),
        "truth": packed(labels, "i32"),
        "a": packed(first.ranked[:, :width], "i32"),
        "b": packed(second.ranked[:, :width], "i32"),
    }


def comparison_page(c: Comparison, outcomes: tuple[Outcomes | str, Outcomes | str]) -> str:
    """The page's HTML (``outcomes``: each side's row outcomes or why it has none)."""
    assert c.labels is not None
    labels = c.labels
    tested = "p" in labels.columns

    def column(name: str, dtype: str) -> dict[str, str]:
        values = labels[name].cast(pl.Float64).fill_null(np.nan).to_numpy()
        return packed(values, dtype)

    per_label = {
        "id": packed(labels["label"].to_numpy(), "i32"),
        "train": packed(labels["train_count"].to_numpy(), "i32"),
        "test": packed(labels["test_rows"].to_numpy(), "i32"),
        "a": column("a", "f32"),
        "b": column("b", "f32"),
        "change": column("change", "f32"),
    }
    if tested:
        per_label |= {
            "p": column("p", "f64"),
            "q": column("q", "f64"),
            "a_only": packed(labels["a_only"].to_numpy(), "i32"),
            "b_only": packed(labels["b_only"].to_numpy(), "i32"),
        }
    first, second = outcomes
    shown = labels["label"].to_numpy()
    rows = None
    if (
        isinstance(first, Outcomes)
        and isinstance(second, Outcomes)
        and first.data_key == second.data_key == c.data_key
    ):
        rows = _rows((first, second))
        ranked = np.concatenate([first.ranked.ravel(), second.ranked.ravel(), first.truth[1]])
        shown = np.union1d(shown, ranked[ranked >= 0])
    summary = [
        "labels",
        "test_rows",
        "a",
        "b",
        "change",
        "change_low",
        "change_high",
        "q",
        "improved",
        "worsened",
        "same",
    ]
    data = {
        "a": c.a.source.spec,
        "b": c.b.source.spec,
        "metric": c.metric,
        "data_key": c.data_key,
        "tested": tested,
        "untested": c.untested,
        "testable": c.testable,
        "q_level": 0.05,
        "bins": {
            "count_low": c.bins["count_low"].to_list(),
            "count_high": c.bins["count_high"].to_list(),
            **_frame_columns(c.bins, summary),
        },
        "groups": {"group": c.groups["group"].to_list(), **_frame_columns(c.groups, summary)},
        "curves": _frame_columns(c.curves, ["train_count", "labels", "test_rows", "a", "b"]),
        "labels": per_label,
        "names": _names(c, shown),
        "rows": rows,
    }
    return render("compare", f"tailkit compare: {c.b.source.spec} against {c.a.source.spec}", data)
