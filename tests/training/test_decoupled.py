"""Decoupled two-stage training (Kang et al., ICLR 2020): cRT, τ-norm and LWS on a trained
experiment's frozen encoder, checked against the definitions and the first stage's files."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tailkit.errors import InvalidParameterError
from tailkit.output.output_layer import OutputLayer
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.pipeline import predict_new_rows as predicting
from tailkit.registry import make_registry
from tailkit.stages import download, evaluate, featurize, subsample, train, train_decoupled
from tailkit.storage import tensorfile
from tailkit.training.decoupled import TAU_GRID, tau_normalised

REGISTRY = make_registry()
ADAGRAD = {"name": "adagrad", "lr": 0.1}
MLP = {"name": "mlp", "hidden": [16], "dim": 8}

PARAMS = {
    "base": {"device": "cpu"},
    "dataset": {"name": "synthetic", "num_classes": 15, "num_examples": 2500, "dim": 4},
    "subsample": {"profile": "exp", "imbalance_ratio": 20, "val_fraction": 0.2},
    "featurize": {"rff": {"name": "rff", "dim": 32, "bandwidth": 1.0}},
    "train": {"epochs": 3, "batch_size": 64, "eval_every": 1000},
    "evaluate": {"batch_size": 100, "label_chunk": 6},
    "experiments": {
        "ce": {
            "loss": {"name": "softmax"},
            "model": MLP,
            "sampler": "none",
            "features": "rff",
            "optimizer": ADAGRAD,
        },
        "ldam": {
            "loss": {"name": "ldam"},
            "model": MLP,
            "sampler": "none",
            "features": "rff",
            "optimizer": ADAGRAD,
        },
    },
    "decoupled": {
        "crt": {"init_from": "ce", "classifier": "crt", "epochs": 2},
        "tau-zero": {"init_from": "ce", "classifier": "tau-norm", "tau": 0},
        "tau-auto": {"init_from": "ce", "classifier": "tau-norm"},
        "lws": {"init_from": "ce", "classifier": "lws", "epochs": 2},
        "crt-ldam": {"init_from": "ldam", "classifier": "crt", "epochs": 1},
    },
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    params = parse_params(PARAMS, "test-params")
    layout = Layout(tmp_path_factory.mktemp("decoupled"))
    download.run(params, layout, REGISTRY)
    subsample.run(params, layout, REGISTRY)
    featurize.run(params, layout, REGISTRY, "rff")
    metrics = {}
    for name in PARAMS["experiments"]:
        train.run(params, layout, REGISTRY, name)
        metrics[name] = evaluate.run(params, layout, REGISTRY, name)
    for name in PARAMS["decoupled"]:
        train_decoupled.run(params, layout, REGISTRY, name)
        metrics[name] = evaluate.run(params, layout, REGISTRY, name)
    return params, layout, metrics


def _weights(layout: Layout, name: str) -> dict:
    return tensorfile.load(layout.model(name) / "model.safetensors")


def _info(layout: Layout, name: str) -> dict:
    import json

    return json.loads((layout.model(name) / "model.json").read_text())


@pytest.mark.parametrize("run", ["crt", "tau-zero", "tau-auto", "lws"])
def test_the_second_stage_keeps_the_first_stage_s_encoder_bit_for_bit(trained, run) -> None:
    _, layout, _ = trained
    first, second = _weights(layout, "ce")["encoder"], _weights(layout, run)["encoder"]
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_crt_retrains_a_fresh_layer_with_class_balanced_rows(trained) -> None:
    _, layout, metrics = trained
    info = _info(layout, "crt")
    assert info["settings"]["row_sampling"] == "class-balanced"
    assert info["settings"]["loss"] == {"name": "softmax"}
    assert info["decoupled"] == {"init_from": "ce", "classifier": "crt"}
    assert not torch.equal(
        _weights(layout, "crt")["layer"]["weight"], _weights(layout, "ce")["layer"]["weight"]
    )
    # the step count of two epochs over the training rows, as the loop counts them
    assert info["steps"] > 0 and metrics["crt"]["train"]["steps"] == info["steps"]
    # rebalancing the classifier moves accuracy from head to tail classes, not away entirely
    assert metrics["crt"]["test"]["accuracy"] > 0.3


def test_crt_works_from_a_cosine_first_stage(trained) -> None:
    _, layout, metrics = trained
    assert _info(layout, "crt-ldam")["decoupled"]["init_from"] == "ldam"
    assert metrics["crt-ldam"]["test"]["accuracy"] > 0.3


def test_tau_norm_at_zero_is_the_first_stage_model(trained) -> None:
    _, layout, metrics = trained
    first, second = _weights(layout, "ce")["layer"], _weights(layout, "tau-zero")["layer"]
    assert torch.equal(first["weight"], second["weight"]) and torch.equal(
        first["bias"], second["bias"]
    )
    assert metrics["tau-zero"]["test"] == metrics["ce"]["test"]
    assert metrics["tau-zero"]["ranking"] == metrics["ce"]["ranking"]


def test_tau_norm_divides_each_row_by_its_norm_to_the_tau(trained) -> None:
    _, layout, _ = trained
    info = _info(layout, "tau-auto")["decoupled"]
    tau = info["tau"]
    tried = info["tau_search"]
    assert [t["tau"] for t in tried] == TAU_GRID.tolist()
    best = max(t["val_balanced_accuracy"] for t in tried)
    assert tau == min(t["tau"] for t in tried if t["val_balanced_accuracy"] == best)
    w = _weights(layout, "ce")["layer"]["weight"].double().numpy()
    got = _weights(layout, "tau-auto")["layer"]["weight"].double().numpy()
    expected = w / np.linalg.norm(w, axis=1, keepdims=True) ** tau
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    layer = OutputLayer(3, 2)
    layer.weight = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(
        tau_normalised(layer, 0.5).weight.numpy(), [[3 / 5**0.5, 4 / 5**0.5], [0, 0], [1, 0]]
    )


def test_lws_learns_one_scale_per_class_and_keeps_the_rows_directions(trained) -> None:
    _, layout, _ = trained
    first, second = _weights(layout, "ce")["layer"], _weights(layout, "lws")["layer"]
    assert torch.equal(first["bias"], second["bias"])
    w, v = first["weight"].double(), second["weight"].double()
    scales = (w * v).sum(1) / (w * w).sum(1)
    torch.testing.assert_close(v, scales[:, None] * w, rtol=1e-5, atol=1e-7)
    assert (scales - 1).abs().max() > 1e-3  # learned, not left at 1
    assert _info(layout, "lws")["settings"]["row_sampling"] == "class-balanced"


def test_a_decoupled_run_predicts_as_it_evaluates(trained) -> None:
    params, layout, metrics = trained
    table = predicting.run(params, layout, REGISTRY, "lws", split="test", k=5)
    from tailkit.storage.feature_cache import read_features

    y = read_features(layout.feature_set("rff") / "test.parquet").labels.numpy()
    top1 = np.array([row[0] for row in table.column("labels").to_pylist()])
    assert (top1 == y).mean() == metrics["lws"]["test"]["accuracy"]


def _params_with(**decoupled) -> dict:
    raw = copy.deepcopy(PARAMS)
    raw["decoupled"] = decoupled
    return raw


@pytest.mark.parametrize(
    ("decoupled", "message"),
    [
        ({"x": {"init_from": "nope", "classifier": "crt"}}, r"decoupled.x.init_from: got 'nope'"),
        (
            {"x": {"init_from": "ce", "classifier": "tau-norm", "loss": {"name": "softmax"}}},
            r"decoupled.x.loss: tau-norm keeps the first stage's loss",
        ),
        ({"ce": {"init_from": "ce", "classifier": "crt"}}, r"decoupled.ce: the name 'ce' is an"),
        ({"x": {"init_from": "ce", "classifier": "cRT"}}, r"decoupled.x.classifier: got 'cRT'"),
        ({"x": {"init_from": "ce", "classifier": "lws", "tau": -1}}, r"decoupled.x.tau: got -1"),
    ],
)
def test_bad_decoupled_params_are_one_line_errors(decoupled, message) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        parse_params(_params_with(**decoupled), "test-params")


def test_a_cosine_first_stage_is_refused_for_rescaling(trained) -> None:
    _, layout, _ = trained
    params = parse_params(_params_with(bad={"init_from": "ldam", "classifier": "lws"}), "p")
    with pytest.raises(InvalidParameterError, match=r"decoupled.bad.classifier: lws rescales"):
        train_decoupled.run(params, layout, REGISTRY, "bad")
    with pytest.raises(InvalidParameterError, match="is an experiment, not a run of decoupled"):
        train_decoupled.run(params, layout, REGISTRY, "ce")
