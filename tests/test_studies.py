"""The shipped study params files stay valid: every component and experiment builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailkit.experiment import build_objective, check_components, trains_itself
from tailkit.params import load_params
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
