"""The protocols a plugin's components implement, and the records the core hands them.

``Loss`` and ``Encoder``, the two that are torch modules, live in :mod:`tailkit.components.nn`
and are importable from here too.

A plugin registers *factories* (usually classes). Their keyword arguments are the component's
options in ``params.yaml``; their type annotations and a ``constraints`` mapping (see
:mod:`tailkit.validation`) are how bad values are rejected before anything runs.

Shapes used below: ``B`` batch size, ``C`` number of labels, ``D`` input feature dimension,
``d`` embedding dimension, ``m`` negatives per draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from tailkit.distributed.world import ONE_PROCESS, World

if TYPE_CHECKING:
    import torch

    from tailkit.components.nn import Encoder as Encoder
    from tailkit.components.nn import Loss as Loss

Modality = Literal["dense", "sparse", "image", "text"]
MODALITIES: tuple[str, ...] = get_args(Modality)


@dataclass
class RawData:
    """What a dataset's ``load`` returns: every row of the raw data, before any split.

    ``inputs`` by modality:

    * ``dense``: an (N, D) float32 array;
    * ``sparse``: an (N, D) ``scipy.sparse.csr_matrix`` of float32 with sorted, unique column
      indices per row (bag-of-words counts or TF-IDF values, as the source stores them);
    * ``image``: an (N, H, W, 3) uint8 array (channels last, as decoded), or, for datasets too
      large to hold decoded, an (N,) object array of image file paths under the dataset root;
    * ``text``: an (N,) object array of str (a featurizer such as ``text-tfidf`` turns it into
      features).

    ``labels`` is either one int64 label id per row in ``[0, len(label_names))``
    (single-label), or an (N, C) ``scipy.sparse.csr_matrix`` 0/1 indicator with sorted
    indices (multi-label; a row may have no label at all, as in the XC repository).

    ``values`` says what sparse values are, when the source documents it (see the field).

    ``splits`` optionally fixes the dataset's own partition, e.g. CIFAR's 50,000/10,000 or an
    XC dataset's trn/tst files: split name (``"train"``, ``"val"``, ``"test"``) → sorted
    int64 row ids. ``subsample`` keeps such a test split as it is and applies the long-tail
    profile to the given training rows only.
    """

    inputs: Any
    labels: Any
    label_names: list[str]
    modality: Modality = "dense"
    splits: dict[str, np.ndarray] | None = None
    #: What sparse inputs' values are, when the dataset knows: ``"counts"`` (integer term
    #: counts, what ``tfidf`` weights) or ``"weights"`` (already weighted, as the Extreme
    #: Classification Repository's TF-IDF files are: weighting them again distorts them).
    values: Literal["counts", "weights"] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def multilabel(self) -> bool:
        return not isinstance(self.labels, np.ndarray)


@runtime_checkable
class Dataset(Protocol):
    """A source of labelled rows.

    ``fetch(dest)`` materialises the raw data under the empty directory ``dest``: a verified
    download, a copy out of an installed package, or a generation from a seed. It must verify
    what it fetched (checksum) and may leave files only under ``dest``. ``load(raw_dir)``
    decodes what ``fetch`` wrote.

    Optional attribute ``propensity``: (A, B) of Jain et al.'s propensity model for this
    dataset's PSP@k (the Extreme Classification Repository's per-dataset constants, e.g.
    (0.5, 0.4) for Wikipedia); (0.55, 1.5) when absent
    (:func:`tailkit.registry.dataset_propensity`).

    Optional method ``decode_rows(table: pyarrow.Table)``: the inputs of new rows, as ``load``
    makes them, from a table a user hands ``tailkit predict`` (GeoNames: latitude and
    longitude in degrees). Without it, ``predict`` reads dense inputs from the table's numeric
    columns and sparse ones from a ``features`` column of ``id:value`` tokens
    (:mod:`tailkit.pipeline.predict_new_rows`).
    """

    def fetch(self, dest: Path) -> None: ...

    def load(self, raw_dir: Path) -> RawData: ...


@runtime_checkable
class Featurizer(Protocol):
    """Maps raw inputs to features; fitted on the training split only.

    Optional class attributes: ``accepts``, the RawData modalities it takes, and ``output``,
    the kind it returns (``"dense"`` float32, ``"sparse"`` CSR, ``"image"`` uint8); both
    default to dense (:func:`tailkit.registry.featurizer_accepts` and ``featurizer_output``).
    """

    def fit(self, inputs: np.ndarray) -> Featurizer: ...

    def transform(self, inputs: np.ndarray) -> np.ndarray: ...


class Sampler:
    """A proposal distribution q over labels for negative sampling.

    ``shared = True``: ``sample`` returns one set of ``m`` ids for the whole batch (shape
    ``(m,)``), which turns the sampled logits into one GEMM. Otherwise it returns ``(B, m)``.
    ``conditional = True`` means q depends on the input (q(y|x)), as the Bamler–Mandt tree does.

    ``log_q`` returned by ``sample`` is the log-probability of each drawn id under one draw of
    the proposal (so ``m`` i.i.d. draws have expected count ``m * exp(log_q)``), unless the
    sampler documents otherwise (in-batch: the probability that a batch row has that label).
    """

    shared: bool = True  # a class default; uniform and unigram set it per instance
    conditional: ClassVar[bool] = False
    #: False for samplers that bring their own negatives (in-batch) and ignore ``m``.
    uses_negatives: ClassVar[bool] = True
    #: What ``sample`` and ``log_prob`` receive as ``x``: ``"input"``, the batch's features, or
    #: ``"scores"``, the model's current scores of all C labels (B, C), computed by the core
    #: without gradient (the model-based proposal q ∝ exp(f) of Rawat et al.). A sampler never
    #: sees the model's parameters, only what the core hands it.
    conditions_on: ClassVar[Literal["input", "scores"]] = "input"

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        """Fit on the training split. ``labels`` is (N,) int64; features (N, D) or None."""

    def fit_report(self) -> dict[str, Any]:
        """Facts about the fit for ``metrics/sampler/<key>.json`` (JSON values); none by
        default. Keys ending in ``_seconds`` are times: they go to
        ``metrics/timings/fit-sampler/<key>.json``
        and must stay out of ``state_dict()``, whose bytes must not change between runs."""
        return {}

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw negatives for a batch: ids (int64) and their log q, shapes (m,) or (B, m)."""
        raise NotImplementedError

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        """log q of given labels. ``labels`` (k,) gives (k,) [or (B, k) when conditional];
        ``labels`` (B, k) gives (B, k)."""
        raise NotImplementedError

    def to(self, device: torch.device) -> Sampler:
        """Move fitted tables to ``device`` (training runs there); returns self."""
        return self

    def state_dict(self) -> dict[str, Any]:
        """Everything ``fit`` learned, as tensors and plain values (saved by fit-sampler)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass(frozen=True, kw_only=True)
class Batch:
    """What every loss batch carries, whatever its mode.

    ``labels``: the rows' label ids, int64 and global (in ``[0, num_classes)`` whatever part of
    the labels the logits cover). ``log_prior``: log π (C,) of the training counts, over all
    labels. ``embeddings``: Φ(x) (B, d), the rows the logits were computed from (ELM's pull
    term reads them). ``epoch`` and ``step``: 0-based position in training (schedules such as
    LDAM's deferred re-weighting read them).
    """

    labels: torch.Tensor
    log_prior: torch.Tensor
    embeddings: torch.Tensor
    epoch: int = 0
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class FullBatch(Batch):
    """A full-mode batch: the logits of every label of a contiguous label range.

    ``logits`` (B, L) are the scores of labels ``label_start`` … ``label_start + L − 1``, out of
    ``num_classes`` labels in all: a tensor, or for a loss that says ``Loss.chunkable`` and a
    layer wider than ``train.label_chunk``, a
    :class:`~tailkit.distributed.chunked_logits.ChunkedLogits` that scores them chunk by chunk. Training in one process hands the whole range (``label_start
    = 0``, L = C; :attr:`whole`); a label-sharded run hands each of its processes (``world``,
    :class:`tailkit.distributed.world.World`) its own range and the embeddings of the whole
    global batch. A loss that can reduce over a shard sets ``Loss.shardable`` and combines its
    per-rank parts with :mod:`tailkit.distributed.ops`. ``labels`` is (B,) int64 ids, or (B, k)
    ids padded with −1 when the loss takes multi-label rows (``Loss.multilabel``; a row may have
    none).
    """

    logits: torch.Tensor
    num_classes: int
    label_start: int = 0
    world: World = ONE_PROCESS

    @property
    def label_stop(self) -> int:
        """One past the last label the logits cover."""
        return self.label_start + self.logits.shape[-1]

    @property
    def whole(self) -> bool:
        """Whether this process holds every label (one process): in a sharded run even a rank
        that owns them all reduces with the others, which run the same collectives."""
        return (
            not self.world.sharded and self.label_start == 0 and self.label_stop == self.num_classes
        )


@dataclass(frozen=True, kw_only=True)
class SampledBatch(Batch):
    """A sampled-mode batch: each row's positive logit and its drawn negatives' logits.

    ``labels`` (B,) int64 are the positives (a multi-label row arrives as one batch row per
    (row, positive) pair, every label of the row marked as a hit). ``pos_logits`` (B,) and
    ``neg_logits`` (B, m) are the scores; ``neg_ids`` the drawn label ids, (m,) when the
    sampler shares one draw across the batch, else (B, m). ``pos_log_q`` (B,) and ``neg_log_q``
    ((m,) or (B, m), broadcastable to (B, m)) are log q of the positive and of each draw under
    one draw of the proposal (``Sampler.sample``). ``hits`` (B, m) bool is True where a negative
    equals one of the row's labels: an accidental hit the loss must mask.
    ``sampler_conditional`` says whether q depends on the input (``Sampler.conditional``).
    """

    pos_logits: torch.Tensor
    neg_logits: torch.Tensor
    neg_ids: torch.Tensor
    pos_log_q: torch.Tensor
    neg_log_q: torch.Tensor
    hits: torch.Tensor
    sampler_conditional: bool = False

    @property
    def num_negatives(self) -> int:
        """m, the negatives drawn per row."""
        return int(self.neg_ids.shape[-1])


#: The batch type of each mode, the names ``params.yaml``, errors and info records use.
BATCH_TYPES: dict[str, type[Batch]] = {"full": FullBatch, "sampled": SampledBatch}


class ScoreContext(Protocol):
    """What :meth:`Loss.adjust_scores` may read at prediction time (evaluation hands it a
    :class:`tailkit.evaluation.correction.PredictionContext`)."""

    #: log π (C,) of the training counts.
    log_prior: torch.Tensor

    def add_log_q(
        self, scores: torch.Tensor, x: torch.Tensor, label_ids: torch.Tensor
    ) -> torch.Tensor:
        """``scores`` (B, k) plus the sampler's log q(label | x) of the labels ``label_ids``
        (k,); the scores unchanged when the experiment has no sampler."""
        ...


class Learner:
    """A model that trains itself: a wrapped tool (napkinXC, omikuji) with its own objective and
    solver, run inside ``train@<experiment>`` on the same split and features as tailkit's losses
    and scored by the same ``evaluate`` stage, so that it is one more row of the table.

    An experiment whose model is a Learner names no loss, optimizer or sampler. ``fit`` gets the
    training split (``x``: :class:`~tailkit.sparse.SparseRows` or an (N, D) float32 tensor, as
    ``input_kind`` says; ``labels``: (N,) int64 ids or :class:`~tailkit.labels.LabelSets`) and
    an empty ``directory`` in which it leaves its model in the tool's own format (never a
    pickle); ``load`` reads that directory back; ``predict_topk`` returns, per row, the ids
    (N, k) int64 of the k best labels by descending score, −1 where the tool returned fewer,
    and their scores (N, k) float32, which are probabilities when ``scores_are_probabilities``
    (the calibration error is then computed from the top one).

    ``requires`` names the distributions that do the work: their versions go into the
    component's fingerprint (an upgraded tool re-runs its experiments) and into every metrics
    file. ``deterministic = False`` says that the tool draws randomness it does not let a
    caller seed, so two runs give different models.
    """

    input_kind: ClassVar[str] = "sparse"
    requires: ClassVar[tuple[str, ...]] = ()
    scores_are_probabilities: ClassVar[bool] = True
    deterministic: bool = True  # a class default; napkinxc-plt sets it per instance

    def fit(
        self, x: Any, labels: Any, num_classes: int, directory: Path, seed: int
    ) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def load(self, directory: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_topk(
        self, x: Any, k: int
    ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError


#: The two torch modules of the seam, imported on first use (PEP 562): a dataset, a featurizer
#: and the stages that only read tables then never import torch (a second of every process).
_TORCH_MODULES = ("Encoder", "Loss")


def __getattr__(name: str) -> Any:
    """:class:`Loss` and :class:`Encoder` from :mod:`tailkit.components.nn`; the names that
    moved to evaluation/ and registry, for one release (tailkit._moved)."""
    if name in _TORCH_MODULES:
        from tailkit.components import nn

        return getattr(nn, name)
    from tailkit._moved import moved_attribute

    return moved_attribute(__name__, name)
