"""Stages ``fit-sampler@<key>``: fit one named sampler of ``params.samplers`` on the training
split of its feature set (the sampler's ``features:`` key; default the first set of
``params.featurize``); and ``no-sampler``, which writes ``data/sampler/none/``.

Each lands in ``data/sampler/<key>/`` (its config and fitted state); ``data/sampler/none/``
stands for experiments without negatives, so every ``train@<experiment>`` can depend on exactly
its own sampler directory. One stage per sampler, so that an experiment waits only for its own
sampler (the tree's PCA and fit take a minute on the default, and hours at 10^6 labels, while
the experiments without negatives need none) and editing one sampler's code re-fits that one.
``metrics/sampler/<key>.json`` records the mean log q(y|x) of the true labels on the training
and validation splits (log-likelihood per example), plus whatever the sampler's
``fit_report()`` adds (the tree: depth, k, split rule, discrete rounds and Newton steps). Times
(the fit, and the report's ``*_seconds`` keys: the tree's PCA and tree-fit seconds) go to
``metrics/timings/fit-sampler/<key>.json`` only, so the quality metrics and the sampler state
are the same bytes on every run.

Multi-label rows are fitted as their (row, label) pairs, the pick-all-labels reduction training
uses (:mod:`tailkit.labels`): a label's unigram count is the rows carrying it, and a conditional
sampler sees a row's features once per label (an unconditional one gets no features at all).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tailkit.components import Sampler
from tailkit.csr import is_label_sets
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import TIMING_SUFFIX, Layout
from tailkit.progress import each
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, write_json
from tailkit.storage.feature_cache import read_features
from tailkit.storage.metrics_file import write_metrics
from tailkit.storage.splits import read_meta

if TYPE_CHECKING:  # a fit imports them; `no-sampler`, which writes a config only, does not
    import torch

    from tailkit.labels import LabelSets


def _pairs(labels: torch.Tensor | LabelSets) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The row of each (row, label) pair (None for single-label data) and the labels (P,)."""
    if is_label_sets(labels):
        return labels.pairs()
    return None, cast("torch.Tensor", labels)


def mean_log_prob(
    sampler: Sampler, x: torch.Tensor, labels: torch.Tensor | LabelSets, chunk: int = 65536
) -> tuple[float | None, int]:
    """Mean log q of the true labels, per example (per (row, label) pair for multi-label), and
    how many of them the proposal cannot draw at all (q = 0: a label unseen in training under
    a proposal without smoothing); the mean is then −∞, reported as None."""
    rows, y = _pairs(labels)
    total, impossible = 0.0, 0
    for lo in range(0, y.shape[0], chunk):
        part = slice(lo, lo + chunk)
        xs = x[part] if rows is None else x.index_select(0, rows[part])
        lp = sampler.log_prob(xs, y[part].unsqueeze(1)).double().cpu().numpy()
        impossible += int(np.isneginf(lp).sum())
        # numpy's sum, not torch's: torch splits a long sum between its threads, and the
        # metric's last digits then changed with the thread count
        total += float(lp[~np.isneginf(lp)].sum())
    return (None if impossible else total / max(y.shape[0], 1)), impossible


def fit(sampler: Sampler, x: torch.Tensor, labels: torch.Tensor | LabelSets, num_classes: int):
    """``sampler.fit`` on the training split, multi-label rows as pairs (module docstring)."""
    rows, y = _pairs(labels)
    features: torch.Tensor | None = x
    if rows is not None:
        features = x.index_select(0, rows) if sampler.conditional else None
    sampler.fit(features, y, num_classes)


def run(
    params: Params, layout: Layout, registry: Registry, keys: list[str] | None = None
) -> dict[str, Any]:
    """Fit the samplers ``keys`` (every one of ``params.samplers`` and ``none`` if None);
    returns each fitted sampler's timings."""
    if keys is None:
        keys = [*params.samplers, NO_SAMPLER]
    if unknown := [k for k in keys if k != NO_SAMPLER and k not in params.samplers]:
        raise InvalidParameterError(
            f"fit-sampler: no sampler {unknown[0]!r} in params.samplers "
            f"(known: {', '.join([*params.samplers, NO_SAMPLER])})"
        )
    loaded: dict[str, tuple[dict[str, Any], Any, Any]] = {}

    def feature_set(key: str) -> tuple[dict[str, Any], Any, Any]:
        """(meta, train, val) of feature set ``key``, read once however many samplers use it."""
        if key not in loaded:
            directory = layout.feature_set(key)
            loaded[key] = (
                read_meta(directory),
                read_features(directory / "train.parquet"),
                read_features(directory / "val.parquet"),
            )
        return loaded[key]

    timings: dict[str, Any] = {}
    for key in each(keys, "fit-sampler", unit="sampler"):
        if key == NO_SAMPLER:
            with atomic_dir(layout.sampler(NO_SAMPLER)) as tmp:
                _write_config(tmp, {"name": NO_SAMPLER})
            continue
        from tailkit.pipeline.artifacts import save_sampler  # torch, for a fit only

        sampler = registry.build("samplers", params.samplers[key], f"samplers.{key}")
        meta, train, val = feature_set(params.sampler_features[key])
        start = time.perf_counter()
        try:
            fit(sampler, train.x, train.labels, meta["num_classes"])
        except (ValueError, TypeError) as exc:
            raise DataValidationError(f"samplers.{key}: fit failed: {exc}") from exc
        fit_seconds = time.perf_counter() - start
        # saved before it is scored (as its state was fitted), published only after: a failure
        # leaves no sampler behind
        with atomic_dir(layout.sampler(key)) as tmp:
            _write_config(tmp, {**params.samplers[key], "features": params.sampler_features[key]})
            save_sampler(tmp, sampler)
            # A model-based proposal is the model itself: nothing to score before training.
            scored = sampler.conditions_on == "input"
            fitted = sampler.fit_report()
            report = {f"{split}_log_likelihood": None for split in ("train", "val")} | {
                k: v for k, v in fitted.items() if not k.endswith(TIMING_SUFFIX)
            }
            for split, table in (("train", train), ("val", val)):
                if scored:
                    mean, impossible = mean_log_prob(sampler, table.x, table.labels)
                    report[f"{split}_log_likelihood"] = mean
                    if impossible:
                        report[f"{split}_rows_with_q_zero"] = impossible
        timings[key] = {
            "fit_seconds": round(fit_seconds, 4),
            **{k: v for k, v in fitted.items() if k.endswith(TIMING_SUFFIX)},
        }
        write_metrics(layout.sampler_metrics(key), report)
        write_json(layout.timing(f"fit-sampler/{key}"), timings[key])
    return timings


def _write_config(directory: Path, spec: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", spec)
