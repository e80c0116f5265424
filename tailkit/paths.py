"""Where each stage reads and writes, relative to the project root (the DVC repo).

One place for the layout of docs/architecture.md, so stages, tests and dvc.yaml agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tailkit.errors import DataValidationError

TIMING_SUFFIX = "_seconds"  # a report key that holds a time belongs in a timing file
#: The outputs that hold wall-clock time (docs/reproducibility.md: "Which files carry time"):
#: a rerun may change them and nothing else.
TIMING_OUTPUTS = ("metrics/timings/", "plots/train/", "plots/report/curves.tsv", "reports/")
#: Folders that DVC tracks as a whole and that hold some of those files.
TIMING_FOLDERS = ("metrics", "plots/train", "plots/report", "reports/figures")


def carries_time(path: str) -> bool:
    """Whether the output at ``path`` (relative, POSIX) may differ between identical runs."""
    return path.startswith(TIMING_OUTPUTS) or path in TIMING_FOLDERS


def require(path: Path, producer: str) -> Path:
    """``path`` if it exists, else a one-line error naming the stage that writes it."""
    if not path.exists():
        raise DataValidationError(f"{path}: missing; run `dvc repro {producer}` first")
    return path


@dataclass(frozen=True)
class Layout:
    root: Path = Path()

    @property
    def fingerprints(self) -> Path:
        """The code fingerprints of the components params.yaml names (stages/fingerprint.py)."""
        return self.root / "fingerprints"

    @property
    def raw(self) -> Path:
        return self.root / "data" / "raw"

    def raw_data(self, dataset: str) -> Path:
        """What the dataset plugin fetched: the directory its ``load`` reads."""
        return self.raw / dataset

    @property
    def split(self) -> Path:
        return self.root / "data" / "split"

    @property
    def features(self) -> Path:
        """Every feature set (fit-sampler depends on the whole folder)."""
        return self.root / "data" / "features"

    def feature_set(self, key: str) -> Path:
        """One named feature set of ``params.featurize``: its split Parquet files and meta."""
        return self.features / key

    @property
    def samplers(self) -> Path:
        return self.root / "data" / "sampler"

    def sampler(self, key: str) -> Path:
        return self.samplers / key

    def model(self, experiment: str) -> Path:
        return self.root / "data" / "models" / experiment

    def decoupled_seed_model(self, name: str) -> Path:
        """A decoupled run's model with one of ``base.extra_seeds`` (``<run>+seed<s>``)."""
        return self.root / "data" / "decoupled-seeds" / name

    @property
    def checkpoints(self) -> Path:
        return self.root / "data" / "checkpoints"

    def checkpoint(self, experiment: str) -> Path:
        return self.checkpoints / experiment

    def metrics(self, experiment: str) -> Path:
        """The headline metrics, the DVC metrics file (``metrics_file.HEADLINE``)."""
        return self.root / "metrics" / f"{experiment}.json"

    def metrics_detail(self, experiment: str) -> Path:
        """Every metric of the experiment: a git-tracked output that ``dvc exp show`` and
        ``dvc metrics diff`` leave out, read by the report."""
        return self.root / "metrics" / "detail" / f"{experiment}.json"

    @property
    def seeds_metrics(self) -> Path:
        """Mean ± std of every metric over the training seeds (the ``seeds`` stage)."""
        return self.root / "metrics" / "seeds.json"

    def sampler_metrics(self, key: str) -> Path:
        """A fitted sampler's log-likelihoods and fit report (``fit-sampler@<key>``)."""
        return self.root / "metrics" / "sampler" / f"{key}.json"

    def timing(self, name: str) -> Path:
        """Wall-clock times of a stage (``fit-sampler/<key>``, ``train/<exp>``, ``evaluate/<exp>``):
        leaf files that only the report reads, apart from the quality metrics so that
        ``dvc metrics diff --targets`` shows either alone."""
        return self.root / "metrics" / "timings" / f"{name}.json"

    def curve(self, experiment: str) -> Path:
        return self.root / "plots" / "train" / f"{experiment}.tsv"

    def eval_plots(self, experiment: str) -> Path:
        """Per-experiment evaluation plots: the margin CDF of each many/medium/few group."""
        return self.root / "plots" / "eval" / experiment

    @property
    def evaluations(self) -> Path:
        """One folder per evaluated experiment."""
        return self.root / "data" / "evaluation"

    def outcomes(self, experiment: str) -> Path:
        """Each test row's labels, ranking and probabilities as evaluate scored them
        (:mod:`tailkit.evaluation.outcomes`): what a paired comparison resamples."""
        return self.evaluations / experiment / "rows.parquet"

    def per_class(self, experiment: str) -> Path:
        """One row per label: counts, group and what the evaluation measured (Parquet)."""
        return self.evaluations / experiment / "per_class.parquet"

    def class_plot(self, experiment: str) -> Path:
        """The per-class results aggregated per training-frequency bin (for ``dvc plots``)."""
        return self.root / "plots" / "classes" / f"{experiment}.tsv"

    @property
    def report(self) -> Path:
        return self.root / "reports" / "summary.md"

    @property
    def experiments_report(self) -> Path:
        """``tailkit report --exps``: the workspace and every DVC experiment, by study."""
        return self.root / "reports" / "experiments.md"

    @property
    def figures(self) -> Path:
        """The report's PNG figures, linked from summary.md."""
        return self.root / "reports" / "figures"

    @property
    def compare_figures(self) -> Path:
        """``tailkit compare``'s figures."""
        return self.root / "reports" / "compare"

    @property
    def report_plots(self) -> Path:
        """The report's cross-experiment plot data (learning curves, group accuracies)."""
        return self.root / "plots" / "report"


def cache_dir() -> Path:
    """Where tailkit keeps what it can rebuild between runs (the component catalog, data file
    hashes, compiled kernels, the OpenMP links): ``$XDG_CACHE_HOME/tailkit``, by default
    ``~/.cache/tailkit``, never in a project."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tailkit"
