"""evaluate and predict score only the model that train made for this experiment with these
settings: a swapped folder or a model trained before params.yaml changed is refused in one
line naming the command that fixes it, and nothing is written."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import BIN, TINY_PARAMS, run

from tailkit.errors import MismatchedArtifactError
from tailkit.params import parse_params
from tailkit.pipeline.artifacts import check_made_for

MODEL = Path("data/models/softmax")


CODE = "c0de" * 16  # the hash of the loss, model and sampler code the model was trained by


def _info(params, run_name: str) -> dict:
    settings = json.loads(json.dumps(params.resolved(run_name).as_dict()))
    return {"experiment": run_name, "settings": settings, "code": CODE}


def test_the_model_of_this_experiment_with_these_settings_passes():
    params = parse_params(copy.deepcopy(TINY_PARAMS))
    check_made_for(MODEL, _info(params, "softmax"), params, "softmax", CODE)


def test_another_experiments_model_is_refused():
    params = parse_params(copy.deepcopy(TINY_PARAMS))
    with pytest.raises(MismatchedArtifactError) as info:
        check_made_for(MODEL, _info(params, "sampled"), params, "softmax", CODE)
    assert str(info.value) == (
        "data/models/softmax: this model was trained for 'sampled', not 'softmax'; "
        "run `dvc repro train@softmax`"
    )


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        ({"loss": {"name": "logit-adjusted", "tau": 1.0, "mode": "post-hoc"}}, "loss"),
        ({"model": {"name": "mlp", "hidden": [16], "dim": 8}}, "model"),
        ({"optimizer": {"name": "adagrad", "lr": 0.3}}, "optimizer"),
        ({"epochs": 5}, "epochs"),
    ],
)
def test_a_model_trained_before_params_changed_is_refused(edit, key):
    raw = copy.deepcopy(TINY_PARAMS)
    before = parse_params(raw)
    raw["experiments"]["softmax"].update(edit)
    now = parse_params(raw)
    with pytest.raises(MismatchedArtifactError, match=rf"trained with {key} = .*now has"):
        check_made_for(MODEL, _info(before, "softmax"), now, "softmax", CODE)


def test_a_seed_runs_model_names_its_own_stage():
    raw = copy.deepcopy(TINY_PARAMS)
    raw["base"]["extra_seeds"] = [3]
    params, name = parse_params(raw).seed_run("softmax", 3)
    check_made_for(MODEL, _info(params, name), params, name, CODE)
    with pytest.raises(MismatchedArtifactError, match=r"dvc repro train-seed@softmax-3"):
        check_made_for(MODEL, _info(params, "softmax"), params, name, CODE)


def test_a_model_trained_by_other_code_is_refused():
    params = parse_params(copy.deepcopy(TINY_PARAMS))
    info = _info(params, "softmax")
    with pytest.raises(MismatchedArtifactError) as caught:
        check_made_for(MODEL, info, params, "softmax", "f" * 64)
    assert str(caught.value) == (
        "data/models/softmax: the code of the loss, model or sampler of 'softmax' changed since "
        "this model was trained; run `dvc repro train@softmax`"
    )
    del info["code"]  # a model from before the record
    with pytest.raises(MismatchedArtifactError, match="changed before tailkit recorded it"):
        check_made_for(MODEL, info, params, "softmax", CODE)


@pytest.mark.slow
def test_evaluate_and_predict_refuse_a_swapped_or_stale_model(tiny_project, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(tiny_project, project, symlinks=True)
    models = project / "data" / "models"
    written = {p: p.read_bytes() for p in (project / "metrics").rglob("*.json")}
    (models / "softmax").rename(models / "kept")
    shutil.copytree(models / "sampled", models / "softmax")
    for command in (["evaluate", "--experiment", "softmax"], ["predict", "--experiment",
                    "softmax", "--split", "test"]):  # fmt: skip
        result = run([str(BIN / "tailkit"), *command], project, check=False)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            (
                "Error: data/models/softmax: this model was trained for 'sampled', not "
                "'softmax'; run `dvc repro train@softmax`"
            )
        ]
    shutil.rmtree(models / "softmax")
    (models / "kept").rename(models / "softmax")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["experiments"]["softmax"]["model"] = {"name": "mlp", "hidden": [16], "dim": 8}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run([str(BIN / "tailkit"), "evaluate", "--experiment", "softmax"], project, False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "trained with model = " in result.stderr and "dvc repro train@softmax" in result.stderr
    assert {p: p.read_bytes() for p in (project / "metrics").rglob("*.json")} == written
