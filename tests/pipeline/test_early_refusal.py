"""A loss that cannot take a multi-label dataset's label sets is refused by the fingerprint
stage, which every repro runs first: before download, featurize and other experiments'
training, not at its own train@ stage."""

from __future__ import annotations

import copy

import pytest
from conftest import TINY_PARAMS

from tailkit.errors import InvalidParameterError
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.registry import make_registry
from tailkit.stages import fingerprint


def _params(tmp_path, loss: str, **dataset) -> tuple:
    archive = tmp_path / "Eurlex.zip"
    archive.write_bytes(b"an archive")  # fingerprint hashes it; nothing reads it here
    raw = copy.deepcopy(TINY_PARAMS)
    raw["dataset"] = {"name": "eurlex-4k", "path": str(archive), **dataset}
    raw["experiments"] = {
        "pal": {**raw["experiments"]["softmax"]},
        "tail": {**raw["experiments"]["softmax"], "loss": {"name": loss}},
    }
    return parse_params(raw), Layout(tmp_path / "project"), make_registry()


def test_a_single_label_loss_on_label_sets_is_refused_before_any_stage(tmp_path):
    params, layout, registry = _params(tmp_path, "ldam")
    with pytest.raises(InvalidParameterError) as info:
        fingerprint.run(params, layout, registry)
    message = str(info.value)
    assert message.startswith(
        "experiments.tail.loss: loss 'ldam' takes one label per row, but dataset "
        "'eurlex-4k' is multi-label"
    )
    assert "logit-adjusted" in message and not layout.fingerprints.exists()


@pytest.mark.parametrize(("loss", "dataset"), [("logit-adjusted", {}), ("cb-focal", {}),
    ("distribution-balanced", {}), ("ldam", {"single_label": True})])  # fmt: skip
def test_losses_that_fit_pass(tmp_path, loss, dataset):
    params, layout, registry = _params(tmp_path, loss, **dataset)
    fingerprint.run(params, layout, registry)
    assert (layout.fingerprints / "experiments" / "tail.json").exists()
