"""``tailkit compare A B``: which labels a change helped or hurt, and how often they were seen.

A and B name per-class tables (``data/evaluation/<experiment>/per_class.parquet``):

- ``EXP``: the workspace's file of experiment EXP;
- ``EXP@REV``: EXP's file at a git revision or DVC experiment REV, read through ``dvc.api``
  (a file that is not in git comes from the DVC cache);
- ``NAME:EXP``: EXP in the DVC experiment NAME, as ``tailkit report --exps`` names its rows
  (the same as ``EXP@NAME``).

The two tables are joined on the label id. Tables measured on different data (their
:func:`~tailkit.evaluation.per_class.data_key` differs) are refused. The comparison is of one
per-class metric (recall@1 by default; a multi-label table's default is recall@k), over the
labels where both tables define it (for recall: those with test rows): its change per octave of the training count and per many/medium/few
group with the number of labels that improved, worsened or stayed the same, and the labels
that gained and lost most among those with at least ``min_support`` test rows (a label seen
once on test moves by ±100 points on one row; how many were left out is said). Every sort has
a tie-break on the label id, so the output is a function of the two tables (and row outcomes)
alone.

Where both sides' row outcomes (``data/evaluation/<experiment>/rows.parquet``) are readable and
the metric is a recall, every change carries its test (:mod:`tailkit.reporting.compare_tests`):
each bin and group a 95 % paired-bootstrap interval and a Benjamini–Hochberg q-value, each
testable label McNemar's exact p and q; the labels with q < 0.05 are listed apart from the
largest changes. Otherwise the output says why its changes are untested.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from tailkit.errors import DataValidationError, TailkitError
from tailkit.evaluation.outcomes import Outcomes, read_outcomes
from tailkit.evaluation.per_class import (
    PLOT_BINS_PER_OCTAVE,
    aggregate,
    bin_edges,
    frequency_bin,
)
from tailkit.groups import DEFAULT_GROUPS, GROUPS, GroupThresholds
from tailkit.paths import Layout
from tailkit.reporting.compare_tests import (
    MIN_DISCORDANT,
    Q_LEVEL,
    key_tests,
    label_tests,
    pair_hits,
    recall_depth,
)
from tailkit.storage.label_table import read_label_table, read_table_metadata

FORMATS = ("md", "csv", "json", "parquet")
STATES = ("improved", "worsened", "same")


@dataclass(frozen=True)
class Source:
    """Where one side's table comes from: an experiment, at a revision or in the workspace."""

    spec: str  # as the user wrote it
    experiment: str
    rev: str | None  # None: the workspace

    @property
    def producer(self) -> str:
        return f"evaluate@{self.experiment}"


@dataclass(frozen=True)
class Side:
    source: Source
    frame: pl.DataFrame
    metadata: dict[str, str]

    @property
    def thresholds(self) -> GroupThresholds:
        """The many/medium/few thresholds the table's ``group`` column was made with (the
        defaults for a table written before they were recorded)."""
        recorded = self.metadata.get("tailkit.groups")
        return GroupThresholds(**json.loads(recorded)) if recorded else DEFAULT_GROUPS


def parse_source(spec: str, known: list[str]) -> Source:
    """``EXP``, ``EXP@REV`` or ``NAME:EXP``; a workspace EXP must be one of ``known``."""
    if "@" in spec:
        experiment, _, rev = spec.partition("@")
    elif ":" in spec:
        rev, _, experiment = spec.partition(":")
    else:
        experiment, rev = spec, None
    if not experiment or rev == "":
        raise TailkitError(f"compare: {spec!r} is not EXP, EXP@REV or NAME:EXP")
    if rev is None and experiment not in known:
        raise TailkitError(
            f"compare: no experiment {experiment!r} in params.yaml{_hint(spec, known)}"
        )
    return Source(spec, experiment, rev)


def workspace_experiments(root: Path, params_path: Path) -> list[str]:
    """The experiments of params.yaml and those with an evaluation folder on disk."""
    from tailkit.params import load_params

    names = set(load_params(params_path).experiments) if params_path.exists() else set()
    evaluated = Layout(root).evaluations
    if evaluated.is_dir():
        names |= {p.name for p in evaluated.iterdir() if p.is_dir()}
    return sorted(names)


def _hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else f" (experiments: {', '.join(known)})"


def _read_at_rev(root: Path, source: Source, relative: str) -> bytes:
    """The bytes of ``relative`` at ``source.rev`` (git or, for a DVC output, the cache)."""
    from dvc.api import read
    from dvc.exceptions import DvcException
    from dvc.scm import RevError, SCMError, resolve_rev
    from scmrepo.git import Git

    try:
        sha = resolve_rev(Git(root), source.rev)
    except (RevError, SCMError) as exc:
        raise TailkitError(f"compare: {source.spec}: unknown revision {source.rev!r}") from exc
    try:
        return read(relative, repo=str(root), rev=sha, mode="rb")
    except (FileNotFoundError, DvcException) as exc:
        if _locked_output(root, sha, relative):  # DVC knows it there: only the bytes are absent
            raise DataValidationError(
                f"compare: {source.spec}: {relative} is a DVC output at {source.rev} that is not "
                "in the local cache; `dvc pull` (or `dvc fetch`) gets it from a remote, or "
                f"`dvc repro {source.producer}` at that revision rebuilds it"
            ) from exc
        if not isinstance(exc, FileNotFoundError):
            said = str(exc).strip()
            first = said.splitlines()[0] if said else type(exc).__name__
            raise DataValidationError(f"compare: {source.spec}: {relative}: {first}") from exc
        raise DataValidationError(
            f"compare: {source.spec}: no {relative} at {source.rev} (experiment not evaluated "
            f"there, or its output is not in the DVC cache; `dvc repro {source.producer}` at "
            "that revision rebuilds it)"
        ) from exc


def _locked_output(root: Path, sha: str, relative: str) -> bool:
    """Whether dvc.lock at commit ``sha`` records ``relative`` as an output."""
    from scmrepo.git import Git

    try:
        with Git(root).get_fs(sha).open("dvc.lock", mode="r") as lock:
            text = lock.read()
    except (OSError, KeyError):  # no dvc.lock at that commit
        return False
    return f"- path: {relative}\n" in text


def load_side(root: Path, source: Source) -> Side:
    path = Layout(root).per_class(source.experiment)
    name = str(path) if source.rev is None else f"{path.relative_to(root)}@{source.rev}"
    data: Path | bytes = path
    if source.rev is not None:
        data = _read_at_rev(root, source, path.relative_to(root).as_posix())
    frame = read_label_table(data, name, source.producer)
    return Side(source, frame, read_table_metadata(data, name, source.producer))


def load_outcomes(root: Path, source: Source) -> Outcomes | str:
    """The side's row outcomes (:mod:`tailkit.evaluation.outcomes`), or why there are none."""
    path = Layout(root).outcomes(source.experiment)
    relative = path.relative_to(root).as_posix()
    if source.rev is None:
        if not path.exists():
            return f"{source.spec} has no {relative} (evaluated before tailkit kept row outcomes)"
        return read_outcomes(path, source.producer)
    try:
        data = _read_at_rev(root, source, relative)
    except DataValidationError as exc:
        return str(exc).removeprefix("compare: ")
    return read_outcomes(pa.BufferReader(data), source.producer, f"{relative}@{source.rev}")


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    metric: str
    bins: pl.DataFrame  # per octave of the training count
    groups: pl.DataFrame  # many / medium / few / all
    gained: pl.DataFrame
    lost: pl.DataFrame
    curves: pl.DataFrame  # per quarter octave, for the figure
    min_support: int = 1  # test rows a label needs to be listed as gained or lost
    unlisted: int = 0  # labels with a change but fewer test rows than that
    # the labels whose change is beyond chance (compare_tests; empty when untested)
    significant_gains: pl.DataFrame | None = None
    significant_losses: pl.DataFrame | None = None
    testable: int = 0  # labels with enough discordant rows for McNemar's test
    untested: str = ""  # why the changes carry no test ("" when they do)
    # every compared label: id, name, counts, both values, change (and its test's columns)
    labels: pl.DataFrame | None = None

    @property
    def data_key(self) -> str:
        return self.a.metadata.get("tailkit.data_key", "")


def default_metric(side: Side) -> str:
    if side.metadata.get("tailkit.multilabel") == "true":
        return f"recall@{side.metadata.get('tailkit.k', '5')}"
    return "recall@1"


def _summary(joined: pl.DataFrame, keys: np.ndarray) -> pl.DataFrame:
    """Per key: labels, test rows, both sides' mean, their change and the state counts."""
    change = joined["change"].to_numpy()
    out = aggregate(
        keys,
        {
            "test_rows": joined["test_rows"].to_numpy(),
            "improved": change > 0,
            "worsened": change < 0,
            "same": change == 0,
        },
        {"a": joined["a"].to_numpy(), "b": joined["b"].to_numpy()},
    )
    return out.with_columns((pl.col("b") - pl.col("a")).alias("change")).select(
        "key", "labels", "test_rows", "a", "b", "change", *STATES
    )


def compare(
    a: Side,
    b: Side,
    metric: str | None = None,
    top: int = 10,
    min_support: int = 1,
    outcomes: tuple[Outcomes | str, Outcomes | str] | None = None,
) -> Comparison:
    """The comparison of ``metric`` between the two tables (module docstring), with the paired
    tests of :mod:`tailkit.reporting.compare_tests` from both sides' ``outcomes`` (a string:
    why a side has none)."""
    key_a, key_b = (s.metadata.get("tailkit.data_key", "?") for s in (a, b))
    if key_a != key_b or len(a.frame) != len(b.frame):
        raise DataValidationError(
            f"compare: {a.source.spec} and {b.source.spec} were evaluated on different data "
            f"(data keys {key_a} and {key_b}); a per-class comparison needs the same labels "
            "and test rows"
        )
    metric = metric or default_metric(a)
    for side in (a, b):
        if metric not in side.frame.columns:
            options = [c for c in side.frame.columns if c.startswith(("recall@", "precision@"))]
            raise TailkitError(
                f"compare: {side.source.spec} has no {metric!r} column (it has {', '.join(options)})"
            )
    joined = (
        a.frame.select(
            "label",
            "name",
            "train_count",
            "group",
            pl.col("support").alias("test_rows"),
            pl.col(metric).alias("a"),
        )
        .with_columns(b.frame[metric].alias("b"))
        # the labels the metric is defined for on both sides (recall: those with test rows)
        .filter(pl.col("a").is_not_null() & pl.col("b").is_not_null())
        .with_columns((pl.col("b") - pl.col("a")).alias("change"))
    )
    counts = joined["train_count"].to_numpy()
    bins = _summary(joined, frequency_bin(counts, 1)).rename({"key": "bin"})
    low, high = bin_edges(bins["bin"].to_numpy(), 1)
    bins = bins.with_columns(
        pl.Series("count_low", low.astype(np.int64)),
        pl.Series("count_high", high.astype(np.int64)),
    )
    # the Enum's order: many, medium, few
    codes = joined["group"].to_physical().to_numpy().astype(np.int64)
    groups = pl.concat(
        [_summary(joined, codes), _summary(joined, np.full(len(joined), len(GROUPS)))]
    )
    names = np.asarray([*GROUPS, "all"])[groups["key"].to_numpy()]
    groups = groups.drop("key").insert_column(0, pl.Series("group", names))
    columns = ["label", "name", "train_count", "test_rows", "a", "b", "change"]
    # ties (±100 points on one-row labels are common) go to the label with more test rows
    order = ["change", "test_rows", "label"]
    unlisted = int(((joined["test_rows"] < min_support) & (joined["change"] != 0)).sum())
    tested = _tests(a, joined, bins, outcomes, metric)
    significant: tuple[pl.DataFrame | None, pl.DataFrame | None] = (None, None)
    testable, untested = 0, tested if isinstance(tested, str) else ""
    if not isinstance(tested, str):
        by_key, by_label = tested
        bins = (
            bins.with_columns(pl.col("bin").cast(pl.String).alias("key"))
            .join(by_key, on="key", how="left", maintain_order="left")
            .drop("key")
        )
        groups = groups.join(
            by_key.rename({"key": "group"}), on="group", how="left", maintain_order="left"
        )
        joined = joined.join(by_label, on="label", how="left", maintain_order="left")
        columns += ["a_only", "b_only", "p", "q"]
        testable = int(joined["p"].is_not_null().sum())
        beyond = joined.filter(pl.col("q") < Q_LEVEL)
        significant = (
            beyond.filter(pl.col("change") > 0)
            .sort(["q", "change", "label"], descending=[False, True, False])
            .select(columns)
            .head(top),
            beyond.filter(pl.col("change") < 0)
            .sort(["q", "change", "label"])
            .select(columns)
            .head(top),
        )
    listable = joined.filter(pl.col("test_rows") >= min_support)
    gained = listable.filter(pl.col("change") > 0).sort(order, descending=[True, True, False])
    lost = listable.filter(pl.col("change") < 0).sort(order, descending=[False, True, False])
    quarter = frequency_bin(counts, PLOT_BINS_PER_OCTAVE)
    curves = _summary(joined, quarter).with_columns(
        aggregate(quarter, {}, {"train_count": counts})["train_count"]
    )
    return Comparison(
        a,
        b,
        metric,
        bins,
        groups,
        gained.select(columns).head(top),
        lost.select(columns).head(top),
        curves,
        min_support,
        unlisted,
        *significant,
        testable,
        untested,
        joined,
    )


def _tests(
    a: Side,
    joined: pl.DataFrame,
    bins: pl.DataFrame,
    outcomes: tuple[Outcomes | str, Outcomes | str] | None,
    metric: str,
) -> tuple[pl.DataFrame, pl.DataFrame] | str:
    """The per-bin-and-group and per-label tests (:mod:`compare_tests`), or why there are
    none."""
    if outcomes is None:
        return "no row outcomes were read"
    for side in outcomes:
        if isinstance(side, str):
            return side
    first, second = outcomes
    assert not isinstance(first, str) and not isinstance(second, str)
    key = a.metadata.get("tailkit.data_key")
    if not (first.data_key == second.data_key == key):
        return "the row outcomes are not of the rows the per-class tables scored"
    depth = recall_depth(metric, first.ranked.shape[1])
    if depth is None:
        return f"the paired tests are of recall@j (j up to {first.ranked.shape[1]}), not {metric}"
    pairs = pair_hits(first, second, depth)
    ids = a.frame["label"].to_numpy()
    # positional masks over the per-class rows, scattered to label ids
    kept = a.frame["label"].is_in(joined["label"].implode()).to_numpy()
    bin_of = frequency_bin(a.frame["train_count"].to_numpy(), 1)
    codes = a.frame["group"].to_physical().to_numpy()
    chosen = {str(value): kept & (bin_of == value) for value in bins["bin"].to_list()}
    chosen.update({group: kept & (codes == code) for code, group in enumerate(GROUPS)})
    chosen["all"] = kept
    size = int(max(ids.max(initial=-1), pairs.labels.max(initial=-1))) + 1
    keys = {}
    for name, rows in chosen.items():
        mask = np.zeros(size, dtype=bool)
        mask[ids[rows]] = True
        keys[name] = mask
    return key_tests(pairs, keys), label_tests(pairs)


# ---------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:+.2f}"


def _count_range(low: int, high: int) -> str:
    if high <= 1:
        return "0"
    return str(low) if high - low == 1 else f"{low}–{high - 1}"


def _q(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def _tested(row: dict, tested: bool) -> str:
    """The interval of the change and its q-value, as extra cells (nothing when untested)."""
    if not tested:
        return ""
    low, high = row.get("change_low"), row.get("change_high")
    interval = "–" if low is None or high is None else f"[{_signed(low)}, {_signed(high)}]"
    return f" | {interval} | {_q(row.get('q'))}"


def _tests_note(c: Comparison) -> str:
    if c.untested:
        return f"No test of these changes: {c.untested}."
    return (
        "95 % interval: of the change, by a paired bootstrap over the test rows (both runs on "
        "the same resamples); q: its Benjamini–Hochberg q-value across all the rows of both "
        "tables above (a change with q < 0.05 is beyond chance at a 5 % false-discovery rate)."
    )


def _label_rows(frame: pl.DataFrame, a: str, b: str, tested: bool) -> list[str]:
    extra = " | only A | only B | q" if tested else ""
    lines = [
        f"| label | name | training rows | test rows | {a} | {b} | change{extra} |",
        "|---:|---|---:|---:|---:|---:|---:|" + ("---:|" * 3 if tested else ""),
    ]
    for row in frame.iter_rows(named=True):
        name = str(row["name"]).replace("|", "\\|")
        cells = f" | {row['a_only']} | {row['b_only']} | {_q(row.get('q'))}" if tested else ""
        lines.append(
            f"| {row['label']} | {name} | {row['train_count']} | {row['test_rows']} | "
            f"{_pct(row['a'])} | {_pct(row['b'])} | {_signed(row['change'])}{cells} |"
        )
    return lines


def markdown(c: Comparison) -> str:
    a, b = c.a.source.spec, c.b.source.spec
    tested = not c.untested
    tested_cols = ["95 % interval", "q"] if tested else []
    tested_head = "".join(f" | {h}" for h in tested_cols)
    evaluated = int(c.groups.filter(pl.col("group") == "all")["labels"].sum())
    lines = [
        f"# {b} against {a}: per-class {c.metric}",
        "",
        (
            f"{evaluated:,} labels where both define it, of {len(c.a.frame):,}; data key "
            f"{c.data_key}. Values in %; change = {b} − {a}."
        ),
        "",
        "## By training rows (octaves)",
        "",
        (
            f"| training rows | labels | test rows | {a} | {b} | change{tested_head} | "
            "improved | worsened | same |"
        ),
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(tested_cols) + "---:|---:|---:|",
    ]
    for row in c.bins.iter_rows(named=True):
        lines.append(
            f"| {_count_range(row['count_low'], row['count_high'])} | {row['labels']} | "
            f"{row['test_rows']} | {_pct(row['a'])} | {_pct(row['b'])} | "
            f"{_signed(row['change'])}{_tested(row, tested)} | {row['improved']} | "
            f"{row['worsened']} | {row['same']} |"
        )
    lines += [
        "",
        "## By group",
        "",
        (
            f"| group | labels | test rows | {a} | {b} | change{tested_head} | improved | "
            "worsened | same |"
        ),
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(tested_cols) + "---:|---:|---:|",
    ]
    for row in c.groups.iter_rows(named=True):
        lines.append(
            f"| {row['group']} | {row['labels']} | {row['test_rows']} | {_pct(row['a'])} | "
            f"{_pct(row['b'])} | {_signed(row['change'])}{_tested(row, tested)} | "
            f"{row['improved']} | {row['worsened']} | {row['same']} |"
        )
    lines += ["", _tests_note(c)]
    if c.unlisted:
        lines += [
            "",
            (
                f"{c.unlisted:,} labels that changed have fewer than {c.min_support} test rows "
                "and are left out of the lists below (`--min-support`); the tables above count "
                "them."
            ),
        ]
    if tested:
        assert c.significant_gains is not None and c.significant_losses is not None
        lines += [
            "",
            "## Labels changed beyond chance",
            "",
            (
                f"{c.testable:,} labels were testable (at least {MIN_DISCORDANT} test rows on "
                "which exactly one run ranks the label within the top j: McNemar's exact test "
                "on those rows; the others cannot reach p < 0.05). q: Benjamini–Hochberg "
                f"across the tested labels; listed: q < {Q_LEVEL}. Only A / only B: the rows "
                "only that run gets right."
            ),
        ]
        for title, frame in (
            ("significant gains", c.significant_gains),
            ("significant losses", c.significant_losses),
        ):
            lines += ["", f"### {len(frame)} {title}", ""]
            lines += _label_rows(frame, a, b, tested) if len(frame) else ["None."]
    for title, frame in (("gained most", c.gained), ("lost most", c.lost)):
        lines += ["", f"## The {len(frame)} labels that {title}", ""]
        lines += _label_rows(frame, a, b, tested)
    return "\n".join(lines) + "\n"


def long_frame(c: Comparison) -> pl.DataFrame:
    """Every table of the comparison in one frame, a ``table`` column saying which (for CSV
    and Parquet): ``bin`` rows keyed by their count range, ``group`` rows by group, and the
    ``significant-gains``, ``significant-losses``, ``gained`` and ``lost`` labels by id; with
    the tests' columns (``change_low``, ``change_high``, ``p``, ``q``; ``a_only``, ``b_only``
    for labels) where compare ran them."""
    tests = [] if c.untested else ["change_low", "change_high", "p", "q"]
    stats = ["labels", "test_rows", "a", "b", "change", *tests, *STATES]
    bins = c.bins.select(
        pl.lit("bin").alias("table"),
        pl.format("{}-{}", "count_low", "count_high").alias("key"),
        *stats,
    )
    groups = c.groups.select(pl.lit("group").alias("table"), pl.col("group").alias("key"), *stats)
    label_tests = [] if c.untested else ["a_only", "b_only", "p", "q"]
    labels = [
        frame.select(
            pl.lit(name).alias("table"),
            pl.col("label").cast(pl.String).alias("key"),
            "name",
            "train_count",
            "test_rows",
            "a",
            "b",
            "change",
            *label_tests,
        )
        for name, frame in _label_lists(c)
    ]
    out = pl.concat([bins, groups, *labels], how="diagonal_relaxed")
    return out.rename({"a": c.a.source.spec, "b": c.b.source.spec}).with_columns(
        pl.lit(c.metric).alias("metric")
    )


def _label_lists(c: Comparison) -> list[tuple[str, pl.DataFrame]]:
    lists = [("gained", c.gained), ("lost", c.lost)]
    if c.significant_gains is not None and c.significant_losses is not None:
        lists = [
            ("significant-gains", c.significant_gains),
            ("significant-losses", c.significant_losses),
            *lists,
        ]
    return lists


def as_json(c: Comparison) -> str:
    def records(frame: pl.DataFrame) -> list[dict]:
        return frame.to_dicts()

    body = {
        "a": c.a.source.spec,
        "b": c.b.source.spec,
        "metric": c.metric,
        "data_key": c.data_key,
        "labels": len(c.a.frame),
        "bins": records(c.bins.drop("bin")),
        "groups": records(c.groups),
        **{name.replace("-", "_"): records(frame) for name, frame in _label_lists(c)},
        "min_support": c.min_support,
        "unlisted": c.unlisted,
        "testable": c.testable,
        "untested": c.untested or None,
    }
    return json.dumps(body, indent=2, allow_nan=False) + "\n"


def render(c: Comparison, fmt: str) -> str | bytes:
    if fmt == "md":
        return markdown(c)
    if fmt == "json":
        return as_json(c)
    if fmt == "csv":
        return long_frame(c).write_csv()
    if fmt == "parquet":
        import io

        buffer = io.BytesIO()
        long_frame(c).write_parquet(buffer, compression="zstd", statistics=False)
        return buffer.getvalue()
    raise TailkitError(f"compare: --format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def figure_path(root: Path, c: Comparison) -> Path:
    def safe(spec: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", spec)

    name = f"{safe(c.a.source.spec)}--{safe(c.b.source.spec)}.png"
    return Layout(root).compare_figures / name


def draw(c: Comparison, out: Path) -> Path:
    """Mean per-class ``metric`` per quarter octave of the training count for both sides
    (top) and their difference (bottom), log x, the many/medium/few boundaries marked."""
    from tailkit.reporting.figures import pyplot, save_figure
    from tailkit.storage.atomic import atomic_path

    plt = pyplot()
    seen = c.curves.filter(pl.col("train_count") > 0)  # count 0 has no place on a log axis
    x = seen["train_count"].to_numpy()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True, height_ratios=(2, 1))
    for column, spec, color in (
        ("a", c.a.source.spec, "tab:blue"),
        ("b", c.b.source.spec, "tab:orange"),
    ):
        top.plot(
            x, 100 * seen[column].to_numpy(), marker="o", markersize=3, label=spec, color=color
        )
    change = 100 * seen["change"].to_numpy()
    bottom.bar(x, change, width=x * 0.15, color=np.where(change >= 0, "tab:green", "tab:red"))
    bottom.axhline(0.0, color="grey", linewidth=0.8)
    if not c.untested:  # each octave's change with its 95 % interval, filled where q < 0.05
        _draw_bin_tests(bottom, c.bins.filter(pl.col("count_low") > 0))
    for ax in (top, bottom):
        for boundary in (c.a.thresholds.few_below, c.a.thresholds.many_above):
            ax.axvline(boundary, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3)
    top.set_xscale("log")
    top.set_ylabel(f"mean per-class {c.metric} (%)")
    top.legend(fontsize=8)
    bottom.set_ylabel(f"{c.b.source.spec} − {c.a.source.spec} (points)")
    bottom.set_xlabel("training rows of the class (log scale; bars: quarter-octave bins)")
    if not c.untested:
        bottom.legend(fontsize=7, loc="best")
    with atomic_path(out) as tmp:
        save_figure(fig, tmp)
    return out


def _draw_bin_tests(ax, bins: pl.DataFrame) -> None:
    """Each octave's change (B − A) at its geometric centre with its 95 % interval, a filled
    marker where its q-value is below :data:`Q_LEVEL`, a hollow one otherwise."""
    low, high = bins["count_low"].to_numpy(), bins["count_high"].to_numpy()
    x = np.sqrt(low * np.maximum(high - 1, low))
    change = 100 * bins["change"].to_numpy()
    lower = 100 * bins["change_low"].fill_null(np.nan).to_numpy()
    upper = 100 * bins["change_high"].fill_null(np.nan).to_numpy()
    errors = np.vstack([change - lower, upper - change])
    beyond = (bins["q"].fill_null(1.0) < Q_LEVEL).to_numpy()
    labels = ("octave, 95 % interval, q < 0.05", "octave, 95 % interval, q ≥ 0.05")
    for mask, face, label in zip((beyond, ~beyond), ("black", "white"), labels, strict=True):
        if mask.any():
            ax.errorbar(
                x[mask],
                change[mask],
                yerr=errors[:, mask],
                fmt="o",
                markersize=4,
                color="black",
                markerfacecolor=face,
                capsize=2,
                linewidth=0.8,
                label=label,
            )
