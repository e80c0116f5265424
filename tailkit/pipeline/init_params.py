"""``tailkit init``: a commented params.yaml for a user's own table, from the table itself.

The table is read and checked exactly as the ``table`` dataset's download stage will read it
(so a bad row is refused now, on one line, not after the first ``dvc repro``), then described:
rows, labels, one or several labels a row, text or vectors and their width, how long the tail
is. The comparison it writes is the field's first question on such data: softmax against
logit adjustment (Menon et al.; for label lists, its pick-all-labels form) against sampled
softmax with unigram negatives, on head, torso and tail labels, on the one feature set that
suits the input (``text-tfidf`` for text, ``identity`` for vectors). Every value it writes is
validated by the same parser the stages use before the file is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import yaml

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets.table import Table


@dataclass(frozen=True)
class TableShape:
    """What ``init`` says about a table and sizes its settings by."""

    rows: int
    labels: int
    multilabel: bool
    labels_per_row: float
    modality: str  # "text" or "dense"
    width: int  # values a vector row holds (0 for text)
    few: int  # labels with fewer than 20 rows
    many: int  # labels with more than 100 rows


def describe(dataset: Table) -> TableShape:
    """Read ``dataset``'s file as its download stage will, and describe it."""
    with tempfile.TemporaryDirectory(prefix="tailkit-init-") as folder:
        dataset.fetch(Path(folder))
        raw = dataset.load(Path(folder))
    counts = _label_counts(raw)
    if np.count_nonzero(counts) < 2:  # refused here, not a stage later after a download
        only = [raw.label_names[int(j)] for j in np.flatnonzero(counts)] or ["none"]
        raise DataValidationError(
            f"{dataset.path}: every row has the label {only[0]!r}; a classification needs rows "
            "of at least two classes"
        )
    return TableShape(
        rows=raw.labels.shape[0],
        labels=raw.num_classes,
        multilabel=raw.multilabel,
        labels_per_row=float(counts.sum()) / max(raw.labels.shape[0], 1),
        modality=raw.modality,
        width=0 if raw.modality == "text" else int(raw.inputs.shape[1]),
        few=int(np.count_nonzero(counts < 20)),
        many=int(np.count_nonzero(counts > 100)),
    )


def _label_counts(raw: RawData) -> np.ndarray:
    if raw.multilabel:
        return np.diff(sp.csc_matrix(raw.labels).indptr)
    return np.bincount(raw.labels, minlength=raw.num_classes)


def render(dataset: Table, shape: TableShape) -> str:
    """The params.yaml text: YAML with a comment on every choice."""
    kind = (
        f"label lists, {shape.labels_per_row:.2f} a row" if shape.multilabel else "one label a row"
    )
    inputs = "text" if shape.modality == "text" else f"{shape.width}-value vectors"
    negatives = max(1, min(64, shape.labels // 4))
    dataset_lines = [
        "  name: table",
        f"  path: {_scalar(dataset.path)}",
        f"  input: {_scalar(dataset.input)}",
        f"  label: {_scalar(dataset.label)}",
    ]
    if dataset.split:
        dataset_lines.append(f"  split: {_scalar(dataset.split)}   # train / val / test per row")
    else:
        dataset_lines.append(
            "  # split: <column>    # train/val/test per row; else subsample draws"
        )
    if dataset.label_separator is not None:
        dataset_lines.append(f"  label_separator: {_scalar(dataset.label_separator)}")
    if shape.modality == "text":
        features = [
            "  words:                # TF-IDF of words and word pairs, fitted on the train rows",
            "    name: text-tfidf",
            "    word_ngrams: [1, 2]",
            "    min_df: 2           # a term in fewer training rows is dropped",
            "    # char_ngrams: [2, 5] # add character n-grams (typos, morphology)",
        ]
        feature_set, model = "words", "{name: sparse-linear, dim: 128}"
    else:
        features = [
            "  vectors:              # the vectors as they are",
            "    name: identity",
        ]
        feature_set, model = "vectors", "{name: linear}"
    adjusted = (
        "pick-all-labels softmax with each positive's logit adjusted by its prior"
        if shape.multilabel
        else "Menon et al. (ICLR 2021): logits + tau log prior in training"
    )
    text = f"""\
# tailkit params for {dataset.path}: {shape.rows:,} rows, {shape.labels:,} labels ({kind}),
# {inputs}; {shape.few:,} labels have fewer than 20 rows, {shape.many:,} more than 100.
# Written by `tailkit init`. Run `tailkit repro` (or `dvc repro`); `tailkit options <kind> <name>`
# lists what any component takes, and every value is checked before a stage runs.
base:
  seed: 0
  device: auto          # CUDA when present, else CPU
  extra_seeds: []       # e.g. [1, 2]: more training seeds, reported as mean ± std

dataset:
{chr(10).join(dataset_lines)}

subsample:
  profile: natural      # keep the table's own label distribution
  val_fraction: 0.1
  test_fraction: 0.1
  seed: 0

featurize:
{chr(10).join(features)}

samplers:
  unigram:              # negatives drawn by training frequency
    name: unigram

train:
  epochs: 5
  batch_size: 256
  eval_every: auto
  val_rows: 5000

evaluate:
  batch_size: 4096
  top_k: 5
  # many > 100, medium 20-100, few < 20 training rows: the head, torso and tail of the tables
  groups: {{many_above: 100, few_below: 20}}

experiments:
  softmax:              # the baseline: cross-entropy over all {shape.labels:,} labels
    loss: {{name: softmax}}
    sampler: none
    features: {feature_set}
    model: {model}
    optimizer: {{name: adagrad, lr: 0.1}}
  logit-adjusted:       # {adjusted}
    loss: {{name: logit-adjusted, tau: 1.0}}
    sampler: none
    features: {feature_set}
    model: {model}
    optimizer: {{name: adagrad, lr: 0.1}}
  sampled-unigram:      # sampled softmax: {negatives} unigram negatives a row, importance-weighted
    loss: {{name: sampled-softmax}}
    sampler: unigram
    negatives: {negatives}
    features: {feature_set}
    model: {model}
    optimizer: {{name: adagrad, lr: 0.1}}
"""
    return text


def _scalar(value: object) -> str:
    """``value`` as one line of YAML (quoted when it must be)."""
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10**6)
        .strip()
        .removesuffix("...")
        .strip()
    )


def write_params(dataset: Table, out: Path, force: bool) -> TableShape:
    """Describe the table, render its params, check them and write ``out``."""
    from tailkit.params import parse_params
    from tailkit.storage.atomic import atomic_path

    if out.exists() and not force:
        raise InvalidParameterError(
            f"{out}: exists; --force replaces it (git keeps the old one), or --out names "
            "another file"
        )
    shape = describe(dataset)
    text = render(dataset, shape)
    parse_params(yaml.safe_load(text), str(out))  # what the stages will read, checked now
    with atomic_path(out) as tmp:
        tmp.write_text(text)
    return shape
