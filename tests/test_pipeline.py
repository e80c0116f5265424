"""End to end: `dvc repro` in a scratch git repo, re-runs, and metrics diffs across commits."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import run

pytestmark = pytest.mark.slow


def test_repro_writes_metrics_curves_and_report(tiny_project):
    for name in ("softmax", "sampled"):
        metrics = json.loads((tiny_project / "metrics" / f"{name}.json").read_text())
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
        plugins = json.loads((tiny_project / "data" / "models" / name / "plugins.json").read_text())
        assert any(p["name"] == "tailkit.losses" for p in plugins)
    summary = (tiny_project / "reports" / "summary.md").read_text()
    assert "| softmax |" in summary and "| sampled |" in summary
    sampler = json.loads((tiny_project / "metrics" / "sampler.json").read_text())
    assert sampler["uniform"]["train_log_likelihood"] == pytest.approx(-3.4012, abs=1e-3)
    # The tree: 30 labels need depth 5; it models p(y|x) far better than uniform does.
    tree = sampler["tree"]
    assert (tree["depth"], tree["k"], tree["split_rule"]) == (5, 4, "paper")
    assert tree["val_log_likelihood"] > sampler["uniform"]["val_log_likelihood"] + 0.5
    # Negative sampling from it: bias-corrected scores, and the uncorrected ones beside them.
    for name in ("ldam", "dro-lt"):  # mlp encoders: cosine layer, learned ε, prototypes
        metrics = json.loads((tiny_project / "metrics" / f"{name}.json").read_text())
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
    adversarial = json.loads((tiny_project / "metrics" / "adversarial.json").read_text())
    assert adversarial["test"]["accuracy"] > 3 / 30
    assert adversarial["uncorrected"]["log_likelihood"] != adversarial["test"]["log_likelihood"]
    assert "up to date" in run(["dvc", "status"], tiny_project).stdout


def test_changing_one_experiment_reruns_only_it_and_metrics_diff_in_a_fresh_clone(
    tiny_project, tmp_path
):
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    params["experiments"]["sampled"]["optimizer"]["lr"] = 0.3
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run(["dvc", "status", "--json"], tiny_project).stdout
    changed = set(json.loads(status))
    # the report lists every experiment's settings, so it is rebuilt too
    assert changed == {"train@sampled", "evaluate@sampled", "report"}, changed
    out = run(["dvc", "repro"], tiny_project).stdout
    assert "Running stage 'train@sampled'" in out
    assert "Running stage 'train@softmax'" not in out
    run(["git", "add", "-A"], tiny_project)
    run(["git", "commit", "-qm", "lr 0.3"], tiny_project)

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(tiny_project), str(clone)], check=True)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json"], clone).stdout)
    assert "metrics/sampled.json" in diff
    assert "metrics/softmax.json" not in diff  # unchanged experiment: no diff rows
    acc = diff["metrics/sampled.json"]["test.accuracy"]
    assert acc["old"] != acc["new"]
