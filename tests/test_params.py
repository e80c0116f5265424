"""params.yaml validation: every bad value gets one line naming the key, value and rule."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tailkit.errors import InvalidParameterError
from tailkit.params import load_params, parse_params

ROOT = Path(__file__).parents[1]
DEFAULT = yaml.safe_load((ROOT / "params.yaml").read_text())


def test_committed_params_are_valid():
    params = load_params(ROOT / "params.yaml")
    assert len(params.experiments) >= 4
    assert params.resolved("softmax")["epochs"] == params.train.epochs


def _with(path: str, value):
    raw = copy.deepcopy(DEFAULT)
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[last] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("subsample.imbalance_ratio", 0.5, r"subsample\.imbalance_ratio: got 0\.5; .*\[1, inf\)"),
        ("subsample.profile", "zipf", r"subsample\.profile: got 'zipf'.*'natural', 'exp', 'step'"),
        ("train.batch_size", "big", r"train\.batch_size: got 'big' \(str\); expected an integer"),
        ("train.batch_size", 0, r"train\.batch_size: got 0"),
        ("train.bacth_size", 3, r"train: unknown key 'bacth_size'; allowed keys are .*batch_size"),
        ("experiments.softmax.negatives", -1, r"experiments\.softmax\.negatives: got -1"),
        ("experiments.softmax.sampler", "hsm", r"experiments\.softmax\.sampler: got 'hsm'"),
        ("experiments.softmax.loss", 3, r"experiments\.softmax\.loss: got 3"),
        ("base.device", "tpu", r"base\.device: got 'tpu'"),
        ("samplers.none", {"name": "uniform"}, r"samplers\.none: the name 'none' is reserved"),
        ("experiments.bad name", {}, r"experiments\.bad name: name 'bad name'"),
        ("bogus", 1, r"unknown key 'bogus'; allowed keys are base, dataset"),
    ],
)
def test_bad_values_are_reported_on_one_line(path, value, expected):
    with pytest.raises(InvalidParameterError, match=expected) as info:
        parse_params(_with(path, value))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("params.yaml: ")


def test_experiment_must_name_its_sampler():
    raw = copy.deepcopy(DEFAULT)
    del raw["experiments"]["softmax"]["sampler"]
    with pytest.raises(InvalidParameterError, match="missing required key 'sampler'"):
        parse_params(raw)


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("base:\n  seed: [1,\n")
    with pytest.raises(InvalidParameterError, match=r"params\.yaml:\d+: invalid YAML"):
        load_params(path)
