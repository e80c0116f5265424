"""Stage ``fingerprint``: the code behind each component that params.yaml names, as files that
the other stages depend on.

DVC hashes only files inside the repository, and a third-party plugin's source lives in
site-packages; depending on whole folders of built-ins ties every experiment to every loss. So
this stage (``always_changed``: it is cheap and must see an edited or upgraded plugin) writes,
per component, its distribution, version, factory and the hashes of the source files of its
import closure (:mod:`tailkit.pipeline.codehash`):

* ``fingerprints/dataset.json``: what download, subsample and every featurize@ depend on,
  with the SHA-256 of the user's files behind the dataset's ``path`` (:mod:`tailkit.storage.file_hash`);
* ``fingerprints/featurizers/<set>.json``: the featurizer of each feature set (featurize@<set>);
* ``fingerprints/samplers/<key>.json``: each sampler of ``params.samplers`` (fit-sampler@<key>);
* ``fingerprints/experiments/<experiment>.json``: the experiment's loss, model and sampler
  (train@ and evaluate@ of that experiment);
* ``fingerprints/stages/<module>.json``: the core files each stage module imports (its import
  closure outside the plugins), which that stage's every instance depends on, and the mode of
  the arithmetic (:mod:`tailkit.native.arithmetic`): switching to native re-runs every stage.

The last could be dvc.yaml dependencies themselves, one per file, as they once were: but DVC
re-reads and rewrites the whole of ``dvc.lock`` (ruamel, pure Python) after every stage, and
~40 files × 24 stages made it 167 KB and cost 3–5 s a stage, a sixth of ``make repro``. One
file per stage keeps the lock small and the granularity the same.

A file changes only when the code it describes changes, so DVC re-runs exactly the stages
whose components changed; installing an unrelated plugin changes none of them. The files are
git-tracked, so ``git diff`` shows which component's code a result moved with.
"""

from __future__ import annotations

import pkgutil
from typing import Any

import tailkit.stages
from tailkit.native.arithmetic import arithmetic_record
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.codehash import component_fingerprint, experiment_code, stage_code
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, write_json
from tailkit.storage.file_hash import data_fingerprint, default_cache
from tailkit.storage.linked_outputs import refuse_linked_outputs


def run(params: Params, layout: Layout, registry: Registry) -> dict[str, Any]:
    def named(kind: str, spec: dict[str, Any], key: str) -> dict[str, Any]:
        return component_fingerprint(registry.get(kind, spec.get("name"), f"{key}.name"))

    refuse_linked_outputs(layout.root)  # before DVC reaches the stage that owns one
    refuse_unfit_losses(params, registry)
    dataset = named("datasets", params.dataset, "dataset")
    data = data_fingerprint(params.dataset, default_cache())
    if (
        data
    ):  # the user's files behind `path` (tailkit/storage/file_hash.py): their edits re-run all
        dataset = {**dataset, "data": data}
    # one file per entry, under the group's folder
    groups: dict[str, dict[str, Any]] = {
        "featurizers": {
            key: named("featurizers", spec, f"featurize.{key}")
            for key, spec in params.featurize.items()
        },
        "samplers": {
            key: named("samplers", spec, f"samplers.{key}") for key, spec in params.samplers.items()
        },
        "experiments": {
            name: experiment_code(params, registry, name) for name in params.experiments
        },
        # the arithmetic's mode is every stage's input too (tailkit/native/arithmetic.py)
        "stages": {
            name: {**stage_code(name), "arithmetic": arithmetic_record()}
            for name in stage_modules()
        },
    }
    with atomic_dir(layout.fingerprints) as tmp:
        write_json(tmp / "dataset.json", dataset)
        for group, records in groups.items():
            for key, record in records.items():
                write_json(tmp / group / f"{key}.json", record)
    return {"dataset": dataset, **groups}


def refuse_unfit_losses(params: Params, registry: Registry) -> None:
    """A loss or row sampling that cannot take the dataset's label sets, refused here, before
    download, featurize and other experiments' training run, when the dataset says before
    loading that its rows are multi-label (``multilabel``, as the XC datasets do); train
    checks the same on the data itself. Only then are the losses built (and torch imported):
    a single-label study's fingerprint imports neither."""
    dataset = registry.build("datasets", params.dataset, "dataset")
    if getattr(dataset, "multilabel", None) is not True:
        return
    from tailkit.pipeline.experiment import (
        build_objective,
        check_labels,
        check_row_sampling,
        trains_itself,
    )

    label_sets = {"multilabel": True}
    for name in params.experiments:
        if trains_itself(params, name, registry):
            continue
        loss, _ = build_objective(params, name, registry)
        check_labels(loss, params, name, label_sets, registry)
        check_row_sampling(params, name, label_sets)


def stage_modules() -> list[str]:
    """The stage modules of ``tailkit.stages`` but this one (which always runs)."""
    names = (m.name for m in pkgutil.iter_modules(tailkit.stages.__path__))
    return sorted(n for n in names if n != "fingerprint")
