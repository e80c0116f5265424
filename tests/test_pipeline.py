"""End to end: `dvc repro` in a scratch git repo, re-runs, and metrics diffs across commits."""

from __future__ import annotations

import copy
import json
import subprocess

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import BIN, TINY_DECOUPLED, TINY_PARAMS, make_project, run

from tailkit.evaluation.intervals import Metrics, Resampler
from tailkit.evaluation.outcomes import read_outcomes
from tailkit.reporting.figures import read_class_bins
from tailkit.storage import tensorfile
from tailkit.storage.metrics_file import headline

pytestmark = pytest.mark.slow
TINY_EXPERIMENTS = (*TINY_PARAMS["experiments"], *TINY_DECOUPLED)


def metrics_loss(experiment: str) -> str:
    return TINY_PARAMS["experiments"][experiment]["loss"]["name"]


def test_repro_writes_metrics_curves_and_report(tiny_project):
    for name in ("softmax", "sampled"):
        metrics = json.loads((tiny_project / "metrics" / "detail" / f"{name}.json").read_text())
        # the DVC metrics file holds the headline of the detail, nothing else
        shown = json.loads((tiny_project / "metrics" / f"{name}.json").read_text())
        assert shown == headline(metrics) and set(shown) == {"test"}
        assert len(shown["test"]) == 8 and shown["test"]["accuracy"] == metrics["test"]["accuracy"]
        # the many/medium/few thresholds are recorded beside the groups (OLTR's defaults)
        assert metrics["groups"] == {"many_above": 100, "few_below": 20}
        test = metrics["test"]
        assert 0.0 <= test["balanced_accuracy"] <= 1.0
        assert test["accuracy"] > 3 / 30  # far above chance on 30 separable classes
        assert metrics["train"]["steps"] > 0
        curve = (tiny_project / "plots" / "train" / f"{name}.tsv").read_text().splitlines()
        assert curve[0].split("\t") == [
            "step",
            "seconds",
            "loss",
            "val_accuracy",
            "val_balanced_accuracy",
        ]
        assert len(curve) > 2
        # which plugin distribution supplied each component, for `dvc metrics diff`
        assert metrics["plugins"]["loss"].startswith(f"{metrics_loss(name)} (tailkit ")
        # per-class recalls, weighted by each class's test rows, give the test accuracy
        table = pl.read_parquet(tiny_project / "data" / "evaluation" / name / "per_class.parquet")
        assert table["label"].to_list() == list(range(30))
        weighted = (table["support"] * table["recall@1"]).sum() / table["support"].sum()
        assert weighted == pytest.approx(test["accuracy"], abs=1e-12)
        # the plot file's bin means, weighted by their labels, give the balanced accuracy
        bins = read_class_bins(tiny_project / "plots" / "classes" / f"{name}.tsv")
        balanced = (bins["labels"] * bins["accuracy"]).sum() / bins["labels"].sum()
        assert balanced == pytest.approx(test["balanced_accuracy"], abs=1e-5)
        # each test row's outcome, from which the paired tests rebuild every metric
        evaluated = tiny_project / "data" / "evaluation" / name
        outcomes = read_outcomes(evaluated / "rows.parquet", "")
        key = pq.read_metadata(evaluated / "per_class.parquet").metadata[b"tailkit.data_key"]
        assert outcomes.experiment == name and outcomes.data_key == key.decode()
        assert (outcomes.ranked[:, 0] == outcomes.truth[1]).mean() == pytest.approx(
            test["accuracy"], abs=1e-12
        )
    summary = (tiny_project / "reports" / "summary.md").read_text()
    assert "| softmax |" in summary and "| sampled |" in summary and "| crt |" in summary
    assert "Holm's correction" in summary  # the paired tests ran behind the ≈ marks
    # the frame the summary's table is rendered from, exported: the metrics files' numbers
    export = tiny_project / "runs.json"
    run([str(BIN / "tailkit"), "report", "--no-figures", "--export", str(export)], tiny_project)
    frame = pl.read_json(export)
    assert frame["experiment"].to_list() == list(TINY_EXPERIMENTS)
    for row in frame.iter_rows(named=True):
        detail = tiny_project / "metrics" / "detail" / f"{row['experiment']}.json"
        metrics = json.loads(detail.read_text())
        for block in ("test", "ranking"):
            for key, value in metrics[block].items():
                if isinstance(value, float):
                    assert row[f"{block}.{key}"] == value, (row["experiment"], block, key)
    export.unlink()
    assert "### Settings" in summary and "Plugins: tailkit " in summary
    for figure in ("learning-curves", "groups", "per-class"):
        assert f"(figures/{figure}.png)" in summary
        png = (tiny_project / "reports" / "figures" / f"{figure}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
    curves = (tiny_project / "plots" / "report" / "curves.tsv").read_text().splitlines()
    assert curves[0].startswith("experiment\tstep\tseconds")
    assert {line.split("\t")[0] for line in curves[1:]} == set(TINY_EXPERIMENTS)
    sampler = {
        key: json.loads((tiny_project / "metrics" / "sampler" / f"{key}.json").read_text())
        for key in ("uniform", "tree")
    }
    assert sampler["uniform"]["train_log_likelihood"] == pytest.approx(-3.4012, abs=1e-3)
    # The tree: 30 labels need depth 5; it models p(y|x) far better than uniform does.
    tree = sampler["tree"]
    assert (tree["depth"], tree["k"], tree["split_rule"]) == (5, 4, "paper")
    assert tree["val_log_likelihood"] > sampler["uniform"]["val_log_likelihood"] + 0.5
    # Negative sampling from it: bias-corrected scores, and the uncorrected ones beside them.
    for name in ("ldam", "dro-lt"):  # mlp encoders: cosine layer, learned ε, prototypes
        metrics = json.loads((tiny_project / "metrics" / "detail" / f"{name}.json").read_text())
        assert metrics["test"]["accuracy"] > 3 / 30
        assert 0.0 <= metrics["test"]["ece"] <= 1.0
        groups = [g for g in ("many", "medium", "few") if metrics["margins"][g] is not None]
        assert groups and all(0 <= metrics["margins"][g]["negative_fraction"] <= 1 for g in groups)
        assert any(metrics["intra_class_distance"][g] for g in groups)
        ranking = metrics["ranking"]
        assert ranking["P@1"] == pytest.approx(metrics["test"]["accuracy"])
        assert ranking["R@5"] == pytest.approx(metrics["test"]["top5_accuracy"])
        assert 0 < ranking["PSP@5"] <= 1 and 0 < ranking["coverage@5"] <= 1
        cdf = (tiny_project / "plots" / "eval" / name / f"margins-{groups[0]}.tsv").read_text()
        assert cdf.splitlines()[0] == "margin\tcdf" and len(cdf.splitlines()) == 102
    adversarial = json.loads((tiny_project / "metrics" / "detail" / "adversarial.json").read_text())
    assert adversarial["test"]["accuracy"] > 3 / 30
    assert adversarial["uncorrected"]["log_likelihood"] != adversarial["test"]["log_likelihood"]
    # up to date but for the code fingerprint, which always runs (and here changed nothing)
    assert set(json.loads(run(["dvc", "status", "--json"], tiny_project).stdout)) == {"fingerprint"}


def test_changing_one_experiment_reruns_only_it_and_metrics_diff_in_a_fresh_clone(
    tiny_project, tmp_path
):
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    params["experiments"]["sampled"]["optimizer"]["lr"] = 0.3
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run(["dvc", "status", "--json"], tiny_project).stdout
    changed = set(json.loads(status))
    # the report lists every experiment's settings, so it is rebuilt too (and the seeds'
    # aggregate, which has a row per experiment)
    expected = {"fingerprint", "train@sampled", "evaluate@sampled", "seeds", "report"}
    assert changed == expected, changed
    out = run(["dvc", "repro"], tiny_project).stdout
    assert "Running stage 'train@sampled'" in out
    assert "Running stage 'train@softmax'" not in out
    run(["git", "add", "-A"], tiny_project)
    run(["git", "commit", "-qm", "lr 0.3"], tiny_project)
    # Which labels the change helped: the old per-class table (a DVC output, not in git) comes
    # from the cache through dvc.api; its label-averaged recall is the old balanced accuracy.
    compared = run(
        [str(BIN / "tailkit"), "compare", "sampled@HEAD~1", "sampled", "--format", "json"],
        tiny_project,
    )
    body = json.loads(compared.stdout)
    before = json.loads(run(["git", "show", "HEAD~1:metrics/sampled.json"], tiny_project).stdout)
    after = json.loads((tiny_project / "metrics" / "sampled.json").read_text())
    overall = body["groups"][-1]
    assert overall["group"] == "all" and overall["labels"] == 30
    assert overall["a"] == pytest.approx(before["test"]["balanced_accuracy"], abs=1e-12)
    assert overall["b"] == pytest.approx(after["test"]["balanced_accuracy"], abs=1e-12)
    assert (tiny_project / "reports" / "compare" / "sampled_HEAD_1--sampled.png").exists()

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(tiny_project), str(clone)], check=True)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json"], clone).stdout)
    assert "metrics/sampled.json" in diff
    assert "metrics/softmax.json" not in diff  # unchanged experiment: no diff rows
    acc = diff["metrics/sampled.json"]["test.accuracy"]
    assert acc["old"] != acc["new"]


def test_experiment_workflow_exp_run_show_report_plots_and_metrics_diff(tiny_project):
    """The README's loop: try a value with `dvc exp run -S`, see it in `dvc exp show` and in
    `tailkit report --exps` beside the baseline, overlay it with `dvc plots diff`, keep it as
    a commit and compare with `dvc metrics diff HEAD~1`."""
    out = run(
        ["dvc", "exp", "run", "-S", "experiments.softmax.optimizer.lr=0.02", "-n", "slow-lr"],
        tiny_project,
    ).stdout
    assert "Running stage 'train@softmax'" in out
    assert "Running stage 'train@sampled'" not in out  # only the changed experiment re-runs
    # ... and the second stage that starts from its model (a DVC dependency)
    assert "Running stage 'train-decoupled@crt'" in out

    show = json.loads(run(["dvc", "exp", "show", "--json"], tiny_project).stdout)
    baseline = next(e for e in show if e["rev"] != "workspace")
    exps = {r["name"]: r for g in baseline["experiments"] for r in g["revs"]}
    assert "slow-lr" in exps
    exp_metrics = exps["slow-lr"]["data"]["metrics"]["metrics/softmax.json"]["data"]
    base_metrics = baseline["data"]["metrics"]["metrics/softmax.json"]["data"]
    assert exp_metrics["test"]["accuracy"] != base_metrics["test"]["accuracy"]

    result = run([str(BIN / "tailkit"), "report", "--exps"], tiny_project)
    table = (tiny_project / "reports" / "experiments.md").read_text()
    assert result.stdout.strip() == table.strip()
    assert "(with slow-lr)" in table
    rows = {line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if "| " in line}
    assert {"softmax", "slow-lr:softmax", "sampled"} <= rows
    assert "slow-lr:sampled" not in rows  # unchanged experiments are not repeated
    acc = f"{100 * exp_metrics['test']['accuracy']:.2f}"
    assert any(line.startswith("| slow-lr:softmax |") and acc in line for line in table.split("\n"))

    # `tailkit exps`: the same runs in a dozen columns, each row saying what it changed
    lines = run([str(BIN / "tailkit"), "exps"], tiny_project).stdout.splitlines()
    assert 3 + 9 == len(lines[0].strip("|").split("|")) <= 40  # dvc exp show: one per param
    row = next(line for line in lines if line.startswith("| slow-lr | softmax |"))
    assert "| optimizer.lr=0.02 |" in row and f"| {acc} |" in row
    assert not any(line.startswith("| slow-lr | sampled |") for line in lines)
    assert any(line.startswith("| baseline | sampled | – |") for line in lines)

    # The experiment's per-class table by its name, against the committed one.
    compared = run(
        [str(BIN / "tailkit"), "compare", "softmax@HEAD", "slow-lr:softmax", "--format", "json"],
        tiny_project,
    )
    overall = json.loads(compared.stdout)["groups"][-1]
    assert overall["a"] == pytest.approx(base_metrics["test"]["balanced_accuracy"], abs=1e-12)
    assert overall["b"] == pytest.approx(exp_metrics["test"]["balanced_accuracy"], abs=1e-12)

    # HEAD against the workspace, which `dvc exp run` left holding the experiment's results.
    plots = json.loads(run(["dvc", "plots", "diff", "HEAD", "--json"], tiny_project).stdout)
    assert not plots.get("errors"), plots.get("errors")
    curve = plots["data"]["validation-accuracy-vs-step"][0]
    assert set(curve["revisions"]) == {"HEAD", "workspace"}
    values = curve["content"]["data"]["values"]
    assert {v["experiment"] for v in values} == set(TINY_EXPERIMENTS)
    assert {v["rev"] for v in values} == {"HEAD", "workspace"}
    assert curve["content"]["encoding"]["color"]["field"] == "experiment"
    assert any(p["type"] == "image" for p in plots["data"]["reports/figures/per-class.png"])

    run(["git", "add", "-A"], tiny_project)
    run(["git", "commit", "-qm", "softmax lr 0.02"], tiny_project)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--json"], tiny_project).stdout)
    # quality and time apart: the experiment's quality file (and that of crt, which starts
    # from its model), and their timing files
    quality = {k for k in diff if not k.startswith("metrics/timings/")}
    assert quality == {"metrics/softmax.json", "metrics/crt.json"}
    assert {k for k in diff if k.startswith("metrics/timings/")} <= {
        f"metrics/timings/{stage}/{name}.json"
        for stage in ("train", "evaluate")
        for name in ("softmax", "crt")
    }
    change = diff["metrics/softmax.json"]["test.accuracy"]
    assert change["new"] == pytest.approx(exp_metrics["test"]["accuracy"])
    # a one-experiment change reads on one screen: the headlines and the timing files
    text = run(["dvc", "metrics", "diff", "HEAD~1"], tiny_project).stdout.strip().splitlines()
    assert len(text) < 30, "\n".join(text)


def test_extra_seeds_run_as_their_own_stages_and_aggregate_to_mean_and_std(tmp_path):
    """base.extra_seeds: one train-seed/evaluate-seed stage per experiment and seed, seeds that
    give different models, metrics/seeds.json equal to numpy's mean and sample std of the
    per-seed metrics, and the report's mean ± std."""
    params = copy.deepcopy(TINY_PARAMS)
    params["base"]["extra_seeds"] = [1, 2]
    params["experiments"] = {"softmax": params["experiments"]["softmax"]}
    params["samplers"] = {}
    params["decoupled"] = TINY_DECOUPLED  # crt on softmax: its seed runs start from softmax's
    project = make_project(tmp_path / "seeds", params)
    out = run(["dvc", "repro"], project).stdout
    for stage in (
        "train-seed@softmax-1",
        "train-seed@softmax-2",
        "evaluate-seed@softmax-2",
        "train-decoupled-seed@crt-1",
        "evaluate-decoupled-seed@crt-2",
    ):
        assert f"Running stage '{stage}'" in out
    details = [
        json.loads((project / "metrics" / "detail" / f"{name}.json").read_text())
        for name in ("softmax", "softmax+seed1", "softmax+seed2")
    ]
    assert [d["train"]["seed"] for d in details] == [0, 1, 2]
    assert {d["train"]["split_seed"] for d in details} == {0}  # the split is the same
    weights = [
        (project / "data" / "models" / name / "model.safetensors").read_bytes()
        for name in ("softmax", "softmax+seed1", "softmax+seed2")
    ]
    assert len(set(weights)) == 3  # the seeds give different models
    aggregate = json.loads((project / "metrics" / "seeds.json").read_text())["softmax"]
    assert aggregate["seeds"] == [0, 1, 2] and aggregate["split_seed"] == 0
    for key in ("accuracy", "balanced_accuracy", "macro_f1_tuned"):
        values = np.array([d["test"][key] for d in details])
        entry = aggregate[f"test.{key}"]
        assert entry["values"] == values.tolist()
        assert entry["mean"] == pytest.approx(np.mean(values), rel=1e-12)
        assert entry["std"] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
    # each seed run of crt re-trains the classifier of softmax's run with the same seed
    crt_aggregate = json.loads((project / "metrics" / "seeds.json").read_text())["crt"]
    assert crt_aggregate["seeds"] == [0, 1, 2]
    for seed, first in ((1, "softmax+seed1"), (2, "softmax+seed2")):
        model = project / "data" / "decoupled-seeds" / f"crt+seed{seed}"
        crt = tensorfile.load(model / "model.safetensors")["encoder"]
        stage1 = tensorfile.load(project / "data" / "models" / first / "model.safetensors")
        assert crt.keys() == stage1["encoder"].keys()
        assert all(torch.equal(crt[k], stage1["encoder"][k]) for k in crt)
        info = json.loads((model / "model.json").read_text())
        assert info["decoupled"]["init_from"] == first
        detail = json.loads((project / "metrics" / "detail" / f"crt+seed{seed}.json").read_text())
        assert detail["train"]["seed"] == seed
        assert crt_aggregate["test.accuracy"]["values"][seed] == detail["test"]["accuracy"]
    summary = (project / "reports" / "summary.md").read_text()
    row = next(line for line in summary.splitlines() if line.startswith("| softmax |"))
    mean = aggregate["test.accuracy"]["mean"]
    # ± of several seeds: the interval of their mean when the rows are resampled — of each
    # row's correctness averaged over the seeds, by the bootstrap of a plain mean
    seeds = [
        read_outcomes(project / "data" / "evaluation" / name / "rows.parquet", "")
        for name in ("softmax", "softmax+seed1", "softmax+seed2")
    ]
    correct = np.mean([o.ranked[:, 0] == o.truth[1] for o in seeds], axis=0)
    resampled = Metrics(len(correct))
    resampled.named["accuracy"] = resampled.mean(correct)
    low, high = Resampler(len(correct)).intervals(resampled)["accuracy"]
    assert f"| {100 * mean:.2f} ±{100 * (high - low) / 2:.2f} |" in row
    assert "for several seeds, of their mean" in summary
    assert set(json.loads(run(["dvc", "status", "--json"], project).stdout)) == {"fingerprint"}
