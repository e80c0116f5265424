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
    assert params.resolved("softmax").epochs == params.train.epochs


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
        (
            "train.bacth_size",
            3,
            r"train: unknown key 'bacth_size' \(did you mean 'batch_size'\?\); allowed keys are ",
        ),
        ("experiments.softmax.negatives", -1, r"experiments\.softmax\.negatives: got -1"),
        ("experiments.softmax.sampler", "hsm", r"experiments\.softmax\.sampler: got 'hsm'"),
        ("experiments.softmax.loss", 3, r"experiments\.softmax\.loss: got 3"),
        ("base.device", "tpu", r"base\.device: got 'tpu'"),
        # YAML's .inf and .nan, and seeds that numpy's RandomState or torch would refuse
        ("train.epochs", float("inf"), r"train\.epochs: got inf; expected a finite number"),
        ("train.val_budget", float("nan"), r"train\.val_budget: got nan; expected a finite"),
        ("base.seed", 18500000000000, r"base\.seed: got 18500000000000; .*\[0, 4294967295\]"),
        ("subsample.seed", 2**32, r"subsample\.seed: got 4294967296; .*\[0, 4294967295\]"),
        ("samplers.none", {"name": "uniform"}, r"samplers\.none: the name 'none' is reserved"),
        ("experiments.bad name", {}, r"experiments\.bad name: name 'bad name'"),
        ("bogus", 1, r"unknown key 'bogus'; allowed keys are base, dataset"),
        (
            "experiments.softmax.features",
            "tfidf",
            (
                r"experiments\.softmax\.features: got 'tfidf'; expected one of the feature sets of "
                r"featurize: geocells, rff"
            ),
        ),
        (
            "samplers.tree.features",
            "pixels",
            r"samplers\.tree\.features: got 'pixels'; expected one of the feature sets",
        ),
        ("featurize.bad set", {"name": "rff"}, r"featurize\.bad set: name 'bad set'"),
        ("featurize.rff", 3, r"featurize\.rff: got 3; expected a mapping with a 'name' key"),
        ("featurize", {}, r"featurize: expected a non-empty mapping of named feature sets"),
        (
            "featurize",
            {"name": "rff", "dim": 512},
            (
                r"featurize: got one featurizer \('rff'\); featurize is a mapping of named feature "
                r"sets, e\.g\. featurize: \{rff: \{name: rff, dim: 512\}\} and `features: rff`"
            ),
        ),
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


def test_experiment_must_name_its_feature_set():
    raw = copy.deepcopy(DEFAULT)
    del raw["experiments"]["softmax"]["features"]
    with pytest.raises(InvalidParameterError, match="softmax: missing required key 'features'"):
        parse_params(raw)


def test_samplers_are_fitted_on_the_first_feature_set_unless_they_name_one():
    params = parse_params(DEFAULT)
    assert list(params.featurize) == ["geocells", "rff"]
    assert set(params.sampler_features.values()) == {"geocells"}
    assert all("features" not in spec for spec in params.samplers.values())  # no plugin option
    raw = _with("samplers.tree.features", "rff")
    # every experiment on the tree now trains on features the tree was not fitted on
    with pytest.raises(InvalidParameterError) as info:
        parse_params(raw)
    assert str(info.value) == (
        "params.yaml: experiments.ns-adversarial.sampler: sampler 'tree' is fitted on feature "
        "set 'rff' but the experiment trains on 'geocells'; define a sampler with "
        "`features: geocells` for it"
    )
    raw["samplers"]["tree-rff"] = raw["samplers"].pop("tree")
    raw["experiments"]["ns-adversarial"]["features"] = "rff"
    raw["experiments"]["ns-adversarial"]["sampler"] = "tree-rff"
    assert parse_params(raw).sampler_features["tree-rff"] == "rff"


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("base:\n  seed: [1,\n")
    with pytest.raises(InvalidParameterError, match=r"params\.yaml:\d+: invalid YAML"):
        load_params(path)


def test_a_binary_params_file_is_one_line_naming_the_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"base:\n  seed: 0\n\xff\xfe\x00binary\n")
    with pytest.raises(
        InvalidParameterError, match=r"params\.yaml:3: not UTF-8 text \(byte 0xff\)"
    ):
        load_params(path)


def test_the_largest_accepted_seed_works_where_seeds_are_used():
    """2**32 - 1 is accepted, and every generator the stages seed takes it."""
    import numpy as np
    import torch

    from tailkit.training.row_sampling import RowSampler

    seed = 2**32 - 1
    assert parse_params(_with("base.seed", seed)).base.seed == seed
    np.random.RandomState(seed)  # scikit-learn's random_state
    torch.Generator().manual_seed(seed + 2)  # the loop's augmentation stream
    labels = torch.arange(10) % 3
    for mode in ("instance", "class-balanced"):  # each epoch's row order
        assert len(RowSampler(mode, labels, 3, 4).epoch_rows(seed, 3)) == 10


def test_the_default_experiments_spell_out_the_knobs_people_change():
    """`dvc exp run -S experiments.<e>.<key>=...` needs a `+` for a key params.yaml lacks, so
    every trained experiment names epochs, batch_size, optimizer.lr and, where its sampler
    draws a number of negatives, negatives (issue 15 item 8)."""

    from tailkit.pipeline.experiment import trains_itself
    from tailkit.registry import make_registry

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params, registry = load_params(ROOT / "params.yaml"), make_registry()
    for name, spec in raw["experiments"].items():
        if trains_itself(params, name, registry):
            continue
        missing = [k for k in ("epochs", "batch_size") if k not in spec]
        missing += [] if "lr" in spec["optimizer"] else ["optimizer.lr"]
        if spec["sampler"] != "none":
            sampler = registry.get("samplers", raw["samplers"][spec["sampler"]]["name"], "")
            if getattr(sampler.factory, "uses_negatives", True) and "negatives" not in spec:
                missing.append("negatives")
        assert not missing, f"experiments.{name} lacks {missing}"


def test_misspelt_keys_and_names_get_a_suggestion():
    """Issue 15 item 7: difflib's closest match, in the one-line error."""
    from tailkit.plugins.losses.softmax import SoftmaxCE
    from tailkit.registry import make_registry
    from tailkit.validation import validate_options

    with pytest.raises(InvalidParameterError) as info:
        parse_params({"trian": {}})
    assert str(info.value).startswith(
        "params.yaml: unknown key 'trian' (did you mean 'train'?); allowed keys are base, "
    )
    with pytest.raises(InvalidParameterError, match=r"'reductin' \(did you mean 'reduction'\?\)"):
        validate_options("experiments.a.loss", SoftmaxCE, {"reductin": "sum"})
    with pytest.raises(KeyError) as missing:
        make_registry().get("losses", "softmx", "experiments.a.loss.name")
    assert "unknown loss 'softmx' (did you mean 'softmax'?); available: " in str(missing.value)
    with pytest.raises(KeyError) as far:  # nothing close: no guess
        make_registry().get("losses", "zzz", "experiments.a.loss.name")
    assert "did you mean" not in str(far.value)


def _with_groups(groups: object) -> dict:
    raw = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
    raw["evaluate"] = {**raw.get("evaluate", {}), "groups": groups}
    return raw


def test_group_thresholds_default_to_oltr_and_are_checked():
    """evaluate.groups (issue 17 item 2): OLTR's > 100, 20–100, < 20 unless set; a partial
    mapping keeps the other default; bad values are one line naming the key."""
    raw = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())
    assert parse_params(raw).evaluate.groups == {"many_above": 100, "few_below": 20}
    assert parse_params(_with_groups({"few_below": 5})).evaluate.thresholds.many_above == 100
    for groups, message in (
        ({"many_abov": 50}, r"evaluate\.groups: unknown key 'many_abov' \(did you mean"),
        ({"many_above": "x"}, r"evaluate\.groups\.many_above: got 'x'"),
        ({"few_below": -1}, r"evaluate\.groups\.few_below: got -1; expected a value in"),
        ({"many_above": 10, "few_below": 50}, r"evaluate\.groups: few_below \(50\) is more than"),
    ):
        with pytest.raises(InvalidParameterError, match=message) as err:
            parse_params(_with_groups(groups))
        assert "\n" not in str(err.value)
