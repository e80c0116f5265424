"""The shipped study params files stay valid: every component and experiment builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailkit.experiment import build_objective
from tailkit.params import load_params
from tailkit.registry import make_registry

STUDIES = sorted((Path(__file__).parents[1] / "examples" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_params_are_valid(path: Path) -> None:
    params = load_params(path)
    registry = make_registry()
    registry.build("datasets", params.dataset, "dataset")
    registry.build("featurizers", params.featurize, "featurize")
    for key, spec in params.samplers.items():
        registry.build("samplers", spec, f"samplers.{key}")
    for name in params.experiments:
        build_objective(params, name, registry)


def test_there_is_a_study() -> None:
    assert STUDIES
