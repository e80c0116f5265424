"""Typed, closed params: ``params.yaml`` is read once, here, and every value is checked.

Stages never open ``params.yaml`` themselves. Unknown keys, wrong types and out-of-range
values raise :class:`~tailkit.errors.InvalidParameterError` naming the file, the key, the value
and what is allowed. Component sections (dataset, featurize, samplers.*, experiments.*.loss,
...) are ``{name: ..., **options}`` mappings validated against the named plugin's signature
when the stage builds them, via :meth:`tailkit.registry.Registry.build`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from tailkit.errors import InvalidParameterError, did_you_mean
from tailkit.groups import DEFAULT_GROUPS, GroupThresholds
from tailkit.paths import Layout
from tailkit.storage.params_yaml import read_params_yaml, shortened
from tailkit.validation import SEED, Interval, Options, validate_options

NO_SAMPLER = "none"
# Which rows each epoch visits (tailkit/training/row_sampling.py): Kang et al.'s (ICLR 2020)
# instance-balanced, class-balanced, square-root and progressively-balanced samplers.
RowSampling = Literal["instance", "class-balanced", "square-root", "progressive"]
# What a second stage does to the classifier of its first (Kang et al., ICLR 2020; see
# tailkit/training/decoupled.py): re-train it, normalise its rows, or learn a scale per class.
Classifier = Literal["crt", "tau-norm", "lws"]
# The names DVC can run: they become stage addresses (train@<name>), file names and params
# keys, where DVC reads a '.' as nesting ("experiments.v1.0" is "missing"); matched whole, so
# no trailing newline slips through.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
#: Names whose outputs would be a fixed stage's (metrics/seeds.json is the seeds stage's).
RESERVED_NAMES = frozenset({"seeds"})


#: Joins an experiment and a further seed into the name of that run's outputs
#: (``softmax+seed1``); experiment names cannot hold it, so the two never collide.
SEED_RUN = "+seed"


@dataclass(frozen=True)
class BaseParams:
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Further training seeds: each experiment also runs once per seed listed, as the
    # train-seed@<experiment>-<seed> and evaluate-seed@... stages (dvc.yaml's matrix, which
    # needs the key in params.yaml, empty for one seed); the report shows mean ± std.
    extra_seeds: list[int] = field(default_factory=list)

    constraints: ClassVar = {"seed": SEED}


@dataclass(frozen=True)
class SubsampleParams:
    profile: Literal["natural", "exp", "step"] = "natural"
    imbalance_ratio: float = 100.0
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    balanced_test: bool = False
    test_per_class: int = 10
    min_class_count: int = 1
    seed: int = 0

    constraints: ClassVar = {
        "imbalance_ratio": Interval(1, None),
        # Both open at 0: an empty validation split leaves no learning curve, an empty test
        # split no metrics.
        "val_fraction": Interval(0, 0.5, closed="neither"),
        "test_fraction": Interval(0, 0.5, closed="neither"),
        "test_per_class": Interval(1, None),
        "min_class_count": Interval(1, None),
        "seed": SEED,
    }


@dataclass(frozen=True)
class DistributedParams:
    """``train.distributed`` (tailkit/distributed/launch.py): processes per host and hosts (1 and 1: one process, as ever)."""

    nproc_per_node: int = 1
    nnodes: int = 1

    constraints: ClassVar = {"nproc_per_node": Interval(1, None), "nnodes": Interval(1, None)}

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


@dataclass(frozen=True)
class TrainParams:
    """Defaults shared by every experiment; an experiment may override the starred ones."""

    epochs: float = 1.0  # *
    batch_size: int = 512  # *
    # the learning curve's schedule: "auto" spends at most val_budget of the training
    # multiply-adds on validation (tailkit/training/cadence.py), an integer
    # validates val_rows rows every eval_every steps
    eval_every: int | Literal["auto"] = "auto"
    val_rows: int = 5000
    val_budget: float = 0.1
    # "auto": a checkpoint costs at most checkpoint_budget of the training work (cadence.py)
    checkpoint_every: int | Literal["auto"] = "auto"
    checkpoint_budget: float = 0.05
    max_steps: int | None = None  # *
    row_sampling: RowSampling = "instance"  # *
    # a full-mode step scores its labels this many at a time without holding the (B, C)
    # logits (tailkit/distributed/chunked_logits.py); "auto": in chunks of 4,096 once the
    # logits would reach 2^27 numbers; null: never
    label_chunk: int | Literal["auto"] | None = "auto"
    # the output layer's GEMMs: fp32; tf32 (a GPU's tensor cores on fp32 storage); bf16 (bf16
    # inputs, fp32 accumulation, statistics and updates: chunked full steps only); auto: tf32
    # on a GPU, fp32 on a CPU
    matmul: Literal["auto", "fp32", "tf32", "bf16"] = "auto"
    # label-sharded training over processes (tailkit/distributed/launch.py DistributedParams):
    # {nproc_per_node: 1, nnodes: 1} is one process
    distributed: dict[str, int] = field(default_factory=lambda: {"nproc_per_node": 1, "nnodes": 1})

    @property
    def distributed_settings(self) -> DistributedParams:
        """``distributed`` as the launcher takes it (checked when the params were read)."""
        return DistributedParams(**self.distributed)

    constraints: ClassVar = {
        "epochs": Interval(0, None, closed="neither"),
        "batch_size": Interval(1, None),
        "eval_every": Interval(1, None),
        "val_rows": Interval(1, None),
        "val_budget": Interval(0, 1, closed="right"),
        "checkpoint_every": Interval(1, None),
        "checkpoint_budget": Interval(0, 1, closed="right"),
        "max_steps": Interval(1, None),
        "label_chunk": Interval(1, None),
    }


@dataclass(frozen=True)
class EvaluateParams:
    batch_size: int = 2048
    label_chunk: int = 65536
    top_k: int = 5
    # Test rows per class for the intra-class distance (pairwise, so O(rows²) per class).
    diameter_rows: int = 256
    # Many/medium/few by training rows: {many_above: 100, few_below: 20} (tailkit.groups).
    groups: dict[str, int] = field(default_factory=DEFAULT_GROUPS.as_dict)
    # A ranked label is predicted when its probability is at least this (Micro/Macro-F1).
    threshold: float = 0.5

    constraints: ClassVar = {
        "threshold": Interval(0, 1),
        "batch_size": Interval(1, None),
        "label_chunk": Interval(1, None),
        "top_k": Interval(5, None),  # top5_accuracy needs at least 5
        "diameter_rows": Interval(2, None),
    }

    @property
    def thresholds(self) -> GroupThresholds:
        """``groups`` as the evaluation code takes it (checked when the params were read)."""
        return GroupThresholds(**self.groups)


@dataclass(frozen=True)
class ExperimentParams:
    """One row of the comparison: the feature set it trains on, a loss, a sampler, an
    optimiser, and overrides.

    ``loss`` and ``optimizer`` are required unless the model trains itself (a wrapped tool
    such as ``napkinxc-plt`` or ``omikuji``, :class:`~tailkit.components.Learner`), which takes
    neither; which models do is known only to the registry, so the train stage checks it
    (:func:`tailkit.pipeline.experiment.check_components`).
    """

    # Both required (sampler even when "none"): dvc.yaml makes train@<experiment> depend on
    # exactly its own feature set's and sampler's directories.
    sampler: str
    features: str
    loss: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    model: dict[str, Any] = field(default_factory=lambda: {"name": "linear"})
    negatives: int = 0
    epochs: float | None = None
    batch_size: int | None = None
    max_steps: int | None = None
    row_sampling: RowSampling | None = None
    # Set for the second stage of a decoupled run only (params.decoupled, DecoupledParams):
    # {"init_from": <experiment>, "classifier": "crt" | "tau-norm" | "lws", "tau": ...}.
    decoupled: dict[str, Any] | None = None

    # Upper ends where torch's int64 sizes and indices would fail first with a traceback
    # (negatives: 10**20 was a 59-line TypeError from torch.randint).
    constraints: ClassVar = {
        "negatives": Interval(0, 2**31 - 1),
        "epochs": Interval(0, None, closed="neither"),
        "batch_size": Interval(1, 2**31 - 1),
        "max_steps": Interval(1, 2**62),
    }


@dataclass(frozen=True)
class ResolvedExperiment:
    """One experiment as its stages run it: :class:`ExperimentParams` with the train section's
    defaults filled in (``epochs``, ``batch_size``, ``max_steps``, ``row_sampling``), typed and
    frozen. ``model.json`` and the checkpoints record :meth:`as_dict`; the objective, model
    and provenance are built from it by :mod:`tailkit.pipeline.experiment` (methods here would
    make the settings import the registry, a layer above them)."""

    sampler: str
    features: str
    loss: dict[str, Any] | None
    optimizer: dict[str, Any] | None
    model: dict[str, Any]
    negatives: int
    epochs: float
    batch_size: int
    max_steps: int | None
    row_sampling: RowSampling
    decoupled: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON holds them (a one-stage experiment has no ``decoupled``)."""
        out = dataclasses.asdict(self)
        if out["decoupled"] is None:
            del out["decoupled"]
        return out


@dataclass(frozen=True)
class DecoupledParams:
    """A second stage (Kang et al., "Decoupling Representation and Classifier for Long-Tailed
    Recognition", ICLR 2020): the encoder of experiment ``init_from``, frozen, and its
    classifier re-learned or adjusted.

    ``classifier``: ``crt`` re-trains a freshly initialised output layer, ``lws`` learns one
    scale per class of the first stage's layer (both with class-balanced row sampling unless
    ``row_sampling`` says otherwise, and ``loss``, default softmax CE); ``tau-norm`` divides
    each class's weight vector by its norm to the power ``tau`` (``auto``: the τ of
    0, 0.05, …, 1 with the best validation balanced accuracy), keeping the first stage's loss
    and bias, so τ = 0 is the first stage's model. The features, model and, unless given, the
    optimizer come from ``init_from``.
    """

    init_from: str
    classifier: Classifier
    loss: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    epochs: float | None = None
    batch_size: int | None = None
    max_steps: int | None = None
    row_sampling: RowSampling | None = None
    tau: float | Literal["auto"] = "auto"

    constraints: ClassVar = {
        "epochs": Interval(0, None, closed="neither"),
        "batch_size": Interval(1, None),
        "max_steps": Interval(1, None),
        "tau": Interval(0, None),
    }


@dataclass(frozen=True)
class Params:
    base: BaseParams
    dataset: dict[str, Any]
    subsample: SubsampleParams
    # Named feature sets, each a featurizer spec; featurize@<set> writes data/features/<set>/.
    featurize: dict[str, dict[str, Any]]
    samplers: dict[str, dict[str, Any]]
    train: TrainParams
    evaluate: EvaluateParams
    experiments: dict[str, ExperimentParams]
    # The feature set each sampler is fitted on (its `features:` key; default the first set).
    sampler_features: dict[str, str] = field(default_factory=dict)
    source: str = "params.yaml"

    @property
    def seeds(self) -> list[int]:
        """Every training seed: ``base.seed`` first, then ``base.extra_seeds``."""
        return [self.base.seed, *self.base.extra_seeds]

    def seed_run(self, experiment: str, seed: int) -> tuple[Params, str]:
        """Params for ``experiment`` trained with ``seed`` (one of ``base.extra_seeds``) and
        the name its outputs go by (``<experiment>+seed<seed>``): the same settings under that
        name, ``base.seed`` set to ``seed``."""
        exp = self.experiment(experiment)
        if seed not in self.base.extra_seeds:
            raise InvalidParameterError(
                f"{self.source}: base.extra_seeds: no seed {seed}; listed: "
                + (", ".join(map(str, self.base.extra_seeds)) or "none")
            )
        name = f"{experiment}{SEED_RUN}{seed}"
        runs = {name: exp}
        if exp.decoupled:  # its second stage starts from its first stage's run with `seed`
            first = f"{exp.decoupled['init_from']}{SEED_RUN}{seed}"
            runs = {
                first: self.experiment(exp.decoupled["init_from"]),
                name: dataclasses.replace(exp, decoupled={**exp.decoupled, "init_from": first}),
            }
        return (
            dataclasses.replace(
                self,
                base=dataclasses.replace(self.base, seed=seed),
                experiments={**self.experiments, **runs},
            ),
            name,
        )

    def train_stage(self, name: str) -> str:
        """The DVC stage that trains run ``name`` (an experiment or one of its seed runs)."""
        base, sep, seed = name.rpartition(SEED_RUN)
        kind = "-decoupled" if self.experiment(name).decoupled else ""
        return f"train{kind}-seed@{base}-{seed}" if sep else f"train{kind}@{name}"

    def model_dir(self, layout: Layout, name: str) -> Path:
        """Where run ``name``'s model lives: ``data/models/<name>``, but for the seed runs of a
        decoupled run (``layout.decoupled_seed_model``), whose stage depends on data/models as
        a whole (it cannot name its first stage's seed run) and so cannot write inside it."""
        if self.experiment(name).decoupled and SEED_RUN in name:
            return layout.decoupled_seed_model(name)
        return layout.model(name)

    def experiment(self, name: str) -> ExperimentParams:
        if name not in self.experiments:
            raise InvalidParameterError(
                f"{self.source}: experiments: no experiment {name!r}; defined: "
                + ", ".join(self.experiments)
            )
        return self.experiments[name]

    def resolved(self, name: str) -> ResolvedExperiment:
        """An experiment's settings with the train defaults filled in."""
        out = dataclasses.asdict(self.experiment(name))
        for key in ("epochs", "batch_size", "max_steps", "row_sampling"):
            if out[key] is None:
                out[key] = getattr(self.train, key)
        return ResolvedExperiment(**out)


_SECTIONS = {
    "base": BaseParams,
    "dataset": None,
    "subsample": SubsampleParams,
    "featurize": None,
    "samplers": None,
    "train": TrainParams,
    "evaluate": EvaluateParams,
    "experiments": None,
    "decoupled": None,
}


def _component(source: str, key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise InvalidParameterError(
            f"{source}: {key}: got {value!r}; expected a mapping with a 'name' key"
        )
    return dict(value)


def _check_name(source: str, key: str, name: Any) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        where = key.encode("unicode_escape").decode()[:100]  # one line, whatever the name holds
        raise InvalidParameterError(
            f"{source}: {where}: name {shortened(name)} must start with a letter or digit and hold "
            "at most 100 letters, digits, '_' and '-' (it becomes a DVC stage and file name)"
        )
    if name in RESERVED_NAMES:
        raise InvalidParameterError(
            f"{source}: {key}: the name {name!r} is taken by a fixed stage's output; choose another"
        )


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    """Validate a loaded params mapping; ``source`` prefixes every error message."""
    if not isinstance(raw, Mapping):
        raise InvalidParameterError(f"{source}: expected a mapping at the top level")
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise InvalidParameterError(
            f"{source}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], _SECTIONS)}; "
            "allowed keys are " + ", ".join(_SECTIONS)
        )

    def section(name: str, cls: type) -> Any:
        values = raw.get(name) or {}
        return cls(**validate_options(f"{source}: {name}", cls, values))

    featurize = _feature_sets(source, raw.get("featurize"))
    samplers_raw = raw.get("samplers") or {}
    if not isinstance(samplers_raw, Mapping):
        raise InvalidParameterError(f"{source}: samplers: expected a mapping of named samplers")
    samplers, sampler_features = {}, {}
    for key, spec in samplers_raw.items():
        _check_name(source, f"samplers.{key}", key)
        if key == NO_SAMPLER:
            raise InvalidParameterError(
                f"{source}: samplers.{NO_SAMPLER}: the name {NO_SAMPLER!r} is reserved for "
                "experiments without negatives"
            )
        spec = _component(source, f"samplers.{key}", spec)
        # `features` says where the sampler is fitted; it is no option of the sampler plugin.
        sampler_features[key] = spec.pop("features", next(iter(featurize)))
        _check_feature_set(source, f"samplers.{key}.features", sampler_features[key], featurize)
        samplers[key] = spec

    experiments_raw = raw.get("experiments")
    if not isinstance(experiments_raw, Mapping) or not experiments_raw:
        raise InvalidParameterError(f"{source}: experiments: expected a non-empty mapping")
    experiments = {}
    for key, spec in experiments_raw.items():
        _check_name(source, f"experiments.{key}", key)
        where = f"{source}: experiments.{key}"
        exp = ExperimentParams(**validate_options(where, ExperimentParams, spec or {}))
        for comp in ("loss", "optimizer", "model"):
            if getattr(exp, comp) is not None:
                _component(source, f"experiments.{key}.{comp}", getattr(exp, comp))
        allowed = [NO_SAMPLER, *samplers]
        if exp.sampler not in allowed:
            raise InvalidParameterError(
                f"{where}.sampler: got {exp.sampler!r}; expected one of the keys of samplers: "
                + ", ".join(allowed)
            )
        _check_feature_set(source, f"experiments.{key}.features", exp.features, featurize)
        fitted_on = sampler_features.get(exp.sampler, exp.features)
        if fitted_on != exp.features:
            raise InvalidParameterError(
                f"{where}.sampler: sampler {exp.sampler!r} is fitted on feature set "
                f"{fitted_on!r} but the experiment trains on {exp.features!r}; define a "
                f"sampler with `features: {exp.features}` for it"
            )
        experiments[key] = exp
    for key, exp in _decoupled(source, raw.get("decoupled"), experiments).items():
        experiments[key] = exp

    base = section("base", BaseParams)
    _check_seeds(source, base)
    return Params(
        base=base,
        dataset=_component(source, "dataset", raw.get("dataset", "geonames")),
        subsample=section("subsample", SubsampleParams),
        featurize=featurize,
        samplers=samplers,
        train=_train(source, section("train", TrainParams)),
        evaluate=_evaluate(source, section("evaluate", EvaluateParams)),
        experiments=experiments,
        sampler_features=sampler_features,
        source=source,
    )


def _check_seeds(source: str, base: BaseParams) -> None:
    seen = {base.seed}
    for seed in base.extra_seeds:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed not in SEED:
            raise InvalidParameterError(
                f"{source}: base.extra_seeds: got {seed!r}; expected integers {SEED}"
            )
        if seed in seen:
            raise InvalidParameterError(
                f"{source}: base.extra_seeds: seed {seed} is listed twice or is base.seed"
            )
        seen.add(seed)


def _decoupled(
    source: str, raw: Any, experiments: dict[str, ExperimentParams]
) -> dict[str, ExperimentParams]:
    """The second stages of ``decoupled:`` as experiments: their own settings over those of the
    first stage they start from (:class:`DecoupledParams`)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidParameterError(f"{source}: decoupled: expected a mapping of named runs")
    out = {}
    for key, spec in raw.items():
        _check_name(source, f"decoupled.{key}", key)
        where = f"{source}: decoupled.{key}"
        if key in experiments:
            raise InvalidParameterError(
                f"{where}: the name {key!r} is an experiment's already; runs of decoupled and "
                "experiments share metrics/ and data/models/"
            )
        run = DecoupledParams(**validate_options(where, DecoupledParams, spec or {}))
        first = experiments.get(run.init_from)
        if first is None:
            raise InvalidParameterError(
                f"{where}.init_from: got {run.init_from!r}; expected one of the experiments: "
                + ", ".join(experiments)
            )
        if run.classifier == "tau-norm" and run.loss is not None:
            raise InvalidParameterError(
                f"{where}.loss: tau-norm keeps the first stage's loss ({run.init_from}'s); "
                "leave loss out"
            )
        for comp in ("loss", "optimizer"):
            if getattr(run, comp) is not None:
                _component(source, f"decoupled.{key}.{comp}", getattr(run, comp))
        trains = run.classifier != "tau-norm"
        out[key] = ExperimentParams(
            sampler=NO_SAMPLER,
            features=first.features,
            loss=run.loss or ({"name": "softmax"} if trains else first.loss),
            optimizer=run.optimizer or first.optimizer,
            model=first.model,
            epochs=run.epochs,
            batch_size=run.batch_size,
            max_steps=run.max_steps,
            row_sampling=run.row_sampling or ("class-balanced" if trains else None),
            decoupled={
                "init_from": run.init_from,
                "classifier": run.classifier,
                "tau": run.tau,
            },
        )
    return out


def _train(source: str, train: TrainParams) -> TrainParams:
    """``train`` with ``distributed`` checked, its missing keys filled in."""
    key = f"{source}: train.distributed"
    if not isinstance(train.distributed, Mapping):
        raise InvalidParameterError(f"{key}: expected {{nproc_per_node: N, nnodes: 1}}")
    settings = DistributedParams(**validate_options(key, DistributedParams, train.distributed))
    return dataclasses.replace(train, distributed=dataclasses.asdict(settings))


def _evaluate(source: str, evaluate: EvaluateParams) -> EvaluateParams:
    """``evaluate`` with ``groups`` checked: known keys, integers, a medium range that keeps
    many and few apart; the missing thresholds take their defaults."""
    key = f"{source}: evaluate.groups"
    groups = validate_options(key, GroupThresholds, evaluate.groups)
    try:
        thresholds = GroupThresholds(**groups)
    except ValueError as exc:
        raise InvalidParameterError(f"{key}: {exc}") from exc
    return dataclasses.replace(evaluate, groups=thresholds.as_dict())


def _feature_sets(source: str, raw: Any) -> dict[str, dict[str, Any]]:
    """``featurize``: a non-empty mapping of named feature sets, each a featurizer spec."""
    example = "featurize: {rff: {name: rff, dim: 512}} and `features: rff` in each experiment"
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
        raise InvalidParameterError(
            f"{source}: featurize: got one featurizer ({raw['name']!r}); featurize is a mapping "
            f"of named feature sets, e.g. {example}"
        )
    if not isinstance(raw, Mapping) or not raw:
        raise InvalidParameterError(
            f"{source}: featurize: expected a non-empty mapping of named feature sets, "
            f"e.g. {example}"
        )
    sets = {}
    for key, spec in raw.items():
        _check_name(source, f"featurize.{key}", key)
        sets[key] = _component(source, f"featurize.{key}", spec)
    return sets


def _check_feature_set(source: str, key: str, name: Any, featurize: Mapping[str, Any]) -> None:
    if name not in featurize:
        raise InvalidParameterError(
            f"{source}: {key}: got {name!r}; expected one of the feature sets of featurize: "
            + ", ".join(featurize)
        )


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``path``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise InvalidParameterError(f"{path}: params file not found") from exc
    except OSError as exc:
        raise InvalidParameterError(f"{path}: unreadable ({exc.strerror})") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidParameterError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); params must be YAML"
        ) from exc
    return parse_params(read_params_yaml(text, str(path)), str(path))


__all__ = ["NO_SAMPLER", "Interval", "Options", "Params", "load_params", "parse_params"]
