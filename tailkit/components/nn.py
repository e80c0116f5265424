"""The seam's two torch modules, :class:`Loss` and :class:`Encoder`: apart from the other
protocols (:mod:`tailkit.components`, which names them too) so that datasets, featurizers and
the stages that only read and write tables run without importing torch."""

from __future__ import annotations

from typing import ClassVar

import torch

from tailkit.components import ScoreContext


class Loss(torch.nn.Module):
    """A training objective over the output layer's logits.

    A loss declares the modes it takes by the batch type its ``forward`` annotates:
    ``forward(self, batch: FullBatch)`` receives the logits of all labels, ``forward(self,
    batch: SampledBatch)`` the positive and sampled negative logits (and needs a sampler), and
    ``FullBatch | SampledBatch`` takes either (the experiment's sampler decides). The registry
    reads the annotation once (:func:`tailkit.registry.batch_modes`) and refuses a loss that
    names neither; an experiment whose sampler does not fit the loss's modes is refused before
    any data is read.
    A loss never touches the weight matrix.
    """

    #: True for a full-mode loss that takes multi-label rows: ``batch.labels`` is then (B, k)
    #: label ids padded with −1 (a row may have none). A sampled loss needs no such flag: the
    #: core hands it a multi-label batch as its (row, positive) pairs, every label of a row
    #: masked as an accidental hit (:mod:`tailkit.labels`). The core reads the instance's
    #: value (cb-focal takes label lists in its sigmoid and focal forms only); listings read
    #: the class's.
    multilabel: bool = False
    #: s of cosine logits s·cos(Φ(x), w_y) from a row-normalised output layer without bias
    #: (LDAM); None for the usual dot products plus bias. The core reads it (on the instance)
    #: when it builds the output layer, for training and for evaluation alike.
    cosine_scale: float | None = None
    #: Whether a full-mode loss reduces over the labels only through tailkit.distributed.ops
    #: (so it gives one process's value and gradients on a label shard, FullBatch.world) and
    #: scales the gradient of any term it computes from the replicated embeddings by 1/W. A
    #: label-sharded run refuses a full-mode loss without it. The core reads the instance's
    #: value (a loss may say so for some of its settings only).
    shardable: bool = False
    #: Whether a full-mode loss reaches the logits only through
    #: :func:`~tailkit.plugins.losses.fused_softmax.batch_cross_entropy` and
    #: :func:`~tailkit.plugins.losses.softmax.pick_all_labels`, once per step: the core may
    #: then hand it chunked logits (``FullBatch.logits`` a
    #: :class:`~tailkit.distributed.chunked_logits.ChunkedLogits`) that never hold B × C
    #: numbers (``train.label_chunk``). The core reads the instance's value.
    chunkable: bool = False
    #: N, the training rows: the core sets it before :meth:`setup` when it trains (None at
    #: evaluation), for a loss whose tables need it besides the counts (a label's share of
    #: the rows, n_y / N, in multi-label data, where the counts sum to more than N).
    train_rows: int | None = None

    def setup(self, class_counts: torch.Tensor) -> None:
        """Called by the core once before training and before evaluation, after ``.to(device)``
        and before ``load_state_dict``, with the training counts n_y (C,) float64 on the loss's
        device. Build per-class tables here (margins, class-balanced weights, learnable per-class
        parameters, memories) so a step does no per-class work it could have done once.
        """

    def initial_bias(self, num_classes: int) -> float:
        """Initial value of every output bias; 0 by default. Sigmoid losses use −log(C − 1) so
        that σ(b) = 1/C at the start (Cui et al.), instead of C − 1 confident false positives."""
        return 0.0

    def confidence(
        self, top_scores: torch.Tensor, log_partition: torch.Tensor
    ) -> torch.Tensor | None:
        """The loss's calibrated probability of a predicted label, for calibration error (ECE).

        ``top_scores`` (N,) are the (prediction-adjusted) scores of the predicted labels and
        ``log_partition`` (N,) is log Σ_j exp(score_j) over all labels. The default is the
        softmax probability; a sigmoid loss returns σ(s), Su's multilabel CE σ(2s), and a loss
        with no probability model (hinge) returns None.
        """
        return torch.exp(top_scores - log_partition)

    def adjust_scores(
        self,
        scores: torch.Tensor,
        x: torch.Tensor,
        label_ids: torch.Tensor,
        ctx: ScoreContext,
    ) -> torch.Tensor:
        """Prediction-time correction of scores (B, k) for the labels ``label_ids`` (k,).

        The default is none. Bamler–Mandt negative sampling adds log p_n(y|x); post-hoc logit
        adjustment subtracts τ log π. Evaluation applies it chunk by chunk.
        """
        return scores

    @property
    def adjusts_scores(self) -> bool:
        return type(self).adjust_scores is not Loss.adjust_scores

    @property
    def uses_log_q(self) -> bool:
        """Whether the loss weights its negatives or corrects its scores by the sampler's
        log q (importance weights, NCE's noise log-odds, Bamler–Mandt's + log q at
        prediction). Such an estimate assumes q > 0 for every label, so training refuses a
        fitted unconditional proposal that gives some label probability 0. False by default."""
        return False


class Encoder(torch.nn.Module):
    """Φ: maps input features (B, D) to embeddings (B, d); ``out_dim`` is d.

    The output layer (C × d, row-sparse) belongs to the core, not to the model. ``input_kind``
    says which cached features it reads: ``"dense"`` (B, D) float32 rows, ``"image"`` (B, H, W,
    3) uint8 pixels, or ``"sparse"`` :class:`~tailkit.sparse.SparseRows`
    (:func:`tailkit.registry.model_input_kind`).
    """

    out_dim: int
    input_kind: ClassVar[str] = "dense"
