"""A component that misbehaves while training runs is named on one line, with its plugin's
distribution: a sampler whose ids fall outside [0, C) (an IndexError deep in index_select, or
a device-side assert on a GPU, otherwise) and a model whose forward raises; no model is saved."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from conftest import prepare_stages

from tailkit.components import Encoder
from tailkit.errors import ComponentFault, PluginError
from tailkit.hookspecs import hookimpl
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.registry import make_registry
from tailkit.stages import train
from tailkit.training.step_batch import check_sampled_ids


class PastTheEnd(UniformSampler):
    """Uniform, but every draw's last id is C (one past the last label)."""

    def sample(self, x, y, m, generator):
        ids, log_q = super().sample(x, y, m, generator)
        ids[..., -1] = self.num_classes
        return ids, log_q


class Broken(Encoder):
    """A model whose forward raises."""

    def __init__(self, in_dim: int, /) -> None:
        super().__init__()
        self.out_dim = in_dim
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(3, 3)  # the wrong shape: a RuntimeError from torch


def _plugin() -> types.ModuleType:
    mod = types.ModuleType("probe_plugin")

    @hookimpl
    def register_samplers(register):
        register("past-the-end", PastTheEnd)

    @hookimpl
    def register_models(register):
        register("broken", Broken)

    mod.register_samplers = register_samplers
    mod.register_models = register_models
    return mod


REGISTRY = make_registry(extra_plugins=[("probe", _plugin())])
OPTIMIZER = {"name": "adagrad", "lr": 0.1}
PARAMS = {
    "base": {"device": "cpu"},
    "dataset": {"name": "synthetic", "num_classes": 12, "num_examples": 400, "dim": 4},
    "featurize": {"rff": {"name": "rff", "dim": 8}},
    "samplers": {"past-the-end": {"name": "past-the-end"}},
    "train": {"epochs": 1, "batch_size": 32, "eval_every": 5, "val_rows": 40},
    "experiments": {
        "sampled": {
            "loss": {"name": "sampled-softmax"},
            "sampler": "past-the-end",
            "negatives": 4,
            "features": "rff",
            "optimizer": OPTIMIZER,
        },
        "broken": {
            "loss": {"name": "softmax"},
            "sampler": "none",
            "model": {"name": "broken"},
            "features": "rff",
            "optimizer": OPTIMIZER,
        },
    },
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    params = parse_params(PARAMS, "test-params")
    layout = Layout(tmp_path_factory.mktemp("faults"))
    prepare_stages(params, layout, REGISTRY, "rff")
    return params, layout


@pytest.mark.parametrize(
    ("experiment", "message"),
    [
        (
            "sampled",
            (
                r"^experiments\.sampled: sampler past-the-end \(probe [^)]*\): sample returned label "
                r"id 12, outside \[0, 12\)$"
            ),
        ),
        (
            "broken",
            (
                r"^experiments\.broken: model broken \(probe [^)]*\): forward raised RuntimeError: "
                r"mat1 and mat2 shapes cannot be multiplied"
            ),
        ),
    ],
)
def test_the_faulty_component_is_named_and_nothing_is_saved(prepared, experiment, message):
    params, layout = prepared
    with pytest.raises(PluginError, match=message) as caught:
        train.run(params, layout, REGISTRY, experiment)
    assert "\n" not in str(caught.value)
    assert not Path(layout.model(experiment)).exists()


def test_the_id_check_refuses_what_cannot_be_scored():
    ok = torch.tensor([0, 3, 11])
    check_sampled_ids(ok, torch.zeros(3), 12)
    with pytest.raises(ComponentFault, match=r"label id -1, outside \[0, 12\)"):
        check_sampled_ids(torch.tensor([[0, -1]]), torch.zeros(1, 2), 12)
    with pytest.raises(ComponentFault, match="expected integer ids"):
        check_sampled_ids(torch.tensor([0.0, 1.0]), torch.zeros(2), 12)
    with pytest.raises(ComponentFault, match="log q of the same shape"):
        check_sampled_ids(ok, torch.zeros(2), 12)
