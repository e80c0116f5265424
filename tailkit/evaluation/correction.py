"""Prediction-time score corrections: the context a loss's ``adjust_scores`` receives, and
the optional interface through which a conditional sampler hands it log q(·|x) cheaply.

Prediction scores a block of rows label chunk by label chunk. A sampler whose correction
depends on the row (the Bamler–Mandt tree's log p_n(y|x)) would cost a pass over its model per
chunk if asked naively; :class:`PredictionContext` asks once per block, and a sampler that
subclasses :class:`OrderedCorrection` also tells prediction which column order and chunk
bounds make that pass cheapest (the tree's: labels by leaf, bounds between subtrees).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tailkit.components import Sampler, ScoreContext


def label_chunks(num_classes: int, label_chunk: int) -> list[int]:
    """Bounds of prediction's label chunks, ``label_chunk`` apart: 0 first and C last."""
    return [*range(0, num_classes, label_chunk), num_classes]


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """position[label] = j where ``order[j] == label``: where each label sits in a column order."""
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    return position


class CorrectionColumns:
    """log q(·|x) of a block of rows, by column range (see
    :meth:`OrderedCorrection.correction_columns`)."""

    def columns(self, start: int, stop: int) -> torch.Tensor:
        """(B, stop − start) values of columns ``start`` … ``stop`` − 1."""
        raise NotImplementedError

    def added_to(self, scores: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """``scores`` + :meth:`columns` as a new tensor (a sampler may fuse the two)."""
        return scores + self.columns(start, stop).to(scores)


class TableColumns(CorrectionColumns):
    """Columns sliced from a table computed whole."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def columns(self, start: int, stop: int) -> torch.Tensor:
        return self.table[:, start:stop]


class OrderedCorrection:
    """Optional interface of a conditional sampler whose log q of every label is cheapest in a
    column order of its own. Subclass it before :class:`~tailkit.components.Sampler`; the core
    checks ``isinstance`` and treats any other sampler as a plain ``log_prob`` table in
    label-id order. Only :meth:`label_order` is required."""

    def label_order(self) -> torch.Tensor:
        """The column order of :meth:`log_prob_all_ordered` (the tree's: labels by leaf).
        Prediction scores labels in this order so that every label chunk reads a contiguous
        slice of the table."""
        raise NotImplementedError

    def correction_work_per_label(self) -> float:
        """Multiply-adds per label of :meth:`log_prob_all_ordered`, for prediction's cost (the
        validation schedule weighs it)."""
        return 0.0

    def log_prob_all_ordered(self, x: torch.Tensor) -> torch.Tensor:
        """log q of every label for each row of ``x``, (B, C), columns in :meth:`label_order`."""
        log_prob = getattr(self, "log_prob")  # noqa: B009 - the Sampler it is mixed into
        return log_prob(x, self.label_order())

    def correction_columns(self, x: torch.Tensor) -> CorrectionColumns:
        """Prediction's view of :meth:`log_prob_all_ordered` for the rows ``x``, asked column
        range by column range (a sampler may compute each range as it is asked)."""
        return TableColumns(self.log_prob_all_ordered(x))

    def correction_floats_per_row(self, num_classes: int) -> int:
        """Floats per row that :meth:`correction_columns` holds: prediction sizes its row
        blocks by it (the whole table by default)."""
        return num_classes

    def chunk_bounds(self, num_classes: int, label_chunk: int) -> list[int]:
        """Column bounds, 0 first and C last, of the label chunks prediction should ask
        :meth:`correction_columns` for: ``label_chunk`` apart unless the sampler prefers
        others (the tree's fall between subtrees)."""
        return label_chunks(num_classes, label_chunk)


def correction_work_per_label(sampler: Sampler | None) -> float:
    """Multiply-adds per label of a sampler's prediction-time correction: 0 for a table lookup."""
    return sampler.correction_work_per_label() if isinstance(sampler, OrderedCorrection) else 0.0


@dataclass
class PredictionContext:
    """What a loss may use to adjust scores at prediction time (it implements
    :class:`tailkit.components.ScoreContext`).

    Prediction scores a block of rows label chunk by label chunk; inside :meth:`rows` the
    sampler's log q of every label is computed once for the block (at the first chunk that asks)
    and each later chunk reads its columns, so a conditional sampler's correction costs one
    pass per row whatever the number of chunks.
    """

    log_prior: torch.Tensor
    sampler: Sampler | None = None
    _block: torch.Tensor | None = field(default=None, repr=False)
    _source: CorrectionColumns | None = field(default=None, repr=False)
    _table: torch.Tensor | None = field(default=None, repr=False)
    _num_classes: int = field(default=0, repr=False)
    _order: torch.Tensor | None = field(default=None, repr=False)
    _position: torch.Tensor | None = field(default=None, repr=False)
    _chunk: tuple[torch.Tensor, int, int] | None = field(default=None, repr=False)

    @property
    def per_row_correction(self) -> bool:
        """Whether :meth:`add_log_q` depends on the row (a conditional sampler's log q(y|x)):
        prediction then sizes its row blocks by the floats the correction holds per row."""
        return self._per_row_sampler is not None

    @property
    def _per_row_sampler(self) -> Sampler | None:
        """The sampler when its correction depends on the row, else None."""
        sampler = self.sampler
        if sampler is not None and sampler.conditional and sampler.conditions_on != "scores":
            return sampler
        return None

    @property
    def _ordered(self) -> OrderedCorrection | None:
        """The per-row sampler when it names its own column order, else None."""
        sampler = self._per_row_sampler
        return sampler if isinstance(sampler, OrderedCorrection) else None

    def label_order(self) -> torch.Tensor | None:
        """The column order prediction should score labels in (the sampler's table order), or
        None for label-id order."""
        ordered = self._ordered
        return ordered.label_order() if ordered is not None else None

    def chunk_bounds(self, num_classes: int, label_chunk: int) -> list[int]:
        """Prediction's label chunks: the sampler's preferred bounds when it names an order."""
        ordered = self._ordered
        if ordered is not None:
            return ordered.chunk_bounds(num_classes, label_chunk)
        return label_chunks(num_classes, label_chunk)

    def block_rows(self, batch_size: int, num_classes: int, budget: int) -> int:
        """Rows per prediction block so the correction held per block stays within ``budget``
        floats."""
        if self._per_row_sampler is None:
            return batch_size
        ordered = self._ordered
        per_row = ordered.correction_floats_per_row(num_classes) if ordered else num_classes
        return max(1, min(batch_size, budget // max(1, per_row)))

    @contextmanager
    def rows(self, x: torch.Tensor, num_classes: int) -> Iterator[None]:
        """Within the block, log q(·|x) of each label is computed at most once."""
        self._block, self._source, self._table = x, None, None
        self._num_classes = num_classes
        self._order = self.label_order()
        try:
            yield
        finally:
            self._block, self._source, self._table, self._chunk = None, None, None, None

    def chunk_ids(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """The label ids of prediction's columns ``start`` … ``stop`` − 1 of the current block:
        a slice of :meth:`label_order`, else ``arange``. Passed on to :meth:`add_log_q`, they
        let it ask the sampler for that column range instead of gathering from a table."""
        ids = (
            self._order[start:stop].to(device)
            if self._block is not None and self._order is not None
            else torch.arange(start, stop, device=device)
        )
        self._chunk = (ids, start, stop)
        return ids

    def add_log_q(
        self, scores: torch.Tensor, x: torch.Tensor, label_ids: torch.Tensor
    ) -> torch.Tensor:
        """scores + log q(label | x) from the sampler (Bamler–Mandt's bias removal); the scores
        unchanged when there is no sampler.

        A model-based sampler's log q(y|x) = f_y(x) − log Z(x) is a per-row monotone map of the
        scores themselves: adding it changes no ranking, so the scores are returned as they are.
        """
        if self.sampler is None or self.sampler.conditions_on == "scores":
            return scores
        if x is self._block and self.sampler.conditional and label_ids.dim() == 1:
            if self._source is None:
                ordered = self._ordered
                if self._order is not None and ordered is not None:
                    self._source = ordered.correction_columns(x)
                else:
                    every = torch.arange(self._num_classes, device=label_ids.device)
                    self._source = TableColumns(self.sampler.log_prob(x, every))
            if self._chunk is not None and label_ids is self._chunk[0]:
                return self._source.added_to(scores, self._chunk[1], self._chunk[2])
            # ids the context did not hand out: every column once, then gather
            if self._table is None:
                self._table = self._source.columns(0, self._num_classes)
            log_q = self._table.index_select(1, self._columns(self._table, label_ids))
            return scores + log_q.to(scores)
        return scores + self.sampler.log_prob(x, label_ids).to(scores)

    def _columns(self, table: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        label_ids = label_ids.to(table.device)
        if self._order is None:
            return label_ids
        if self._position is None or self._position.device != label_ids.device:
            self._position = inverse_order(self._order.to(label_ids.device))
        return self._position.index_select(0, label_ids)


class CorrectsAtPrediction:
    """Mixin for a sampled loss with a ``correct_at_prediction`` option: when it is true,
    prediction adds log q(y|x) from the sampler (the Bayes-optimal undoing of a constant-weight
    sampling bias, Bamler & Mandt's + log p_n); otherwise scores are used as they are.

    List it before :class:`Loss` in the bases so its ``adjust_scores`` wins.
    """

    correct_at_prediction: bool = False

    def adjust_scores(
        self,
        scores: torch.Tensor,
        x: torch.Tensor,
        label_ids: torch.Tensor,
        ctx: ScoreContext,
    ) -> torch.Tensor:
        return ctx.add_log_q(scores, x, label_ids) if self.correct_at_prediction else scores

    @property
    def adjusts_scores(self) -> bool:
        return self.correct_at_prediction
