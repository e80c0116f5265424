"""Chunked prediction against a dense computation, and the metrics against independent ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from tailkit.components import Loss, PredictionContext
from tailkit.evaluation.metrics import classification_metrics, shot_groups
from tailkit.evaluation.predict import predict
from tailkit.plugins.models.linear import Linear
from tailkit.training.output_layer import OutputLayer


class _Plain(Loss):
    pass


class _Shifted(Loss):
    """Adds a fixed per-label offset, to check that adjustments are applied chunk by chunk."""

    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def adjust_scores(self, scores, x, label_ids, ctx):
        return scores + self.offset[label_ids]


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_predict_equals_dense(chunk):
    g = torch.Generator().manual_seed(0)
    c, d, n = 64, 6, 50
    layer = OutputLayer(c, d, generator=g)
    layer.bias.normal_(generator=g)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(c, (n,), generator=g)
    offset = torch.randn(c, generator=g)
    ctx = PredictionContext(log_prior=torch.zeros(c))
    adjusted, raw = predict(
        Linear(d), layer, _Shifted(offset), ctx, x, y, k=5, batch_size=16, label_chunk=chunk
    )
    for preds, extra in ((raw, 0.0), (adjusted, offset)):
        scores = x @ layer.weight.T + layer.bias + extra
        torch.testing.assert_close(preds.topk, scores.topk(5, dim=1).indices)
        expected_ll = torch.log_softmax(scores, 1).gather(1, y[:, None]).squeeze(1)
        torch.testing.assert_close(preds.log_likelihood, expected_ll, rtol=1e-5, atol=1e-5)
    _, none = predict(Linear(d), layer, _Plain(), ctx, x, y, label_chunk=chunk)
    assert none is None


# sklearn warns that a predicted class (6) has no true rows; it ignores it, as we do.
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_metrics_against_sklearn_and_hand_counts():
    rng = np.random.default_rng(0)
    train_counts = np.array([500, 150, 60, 20, 19, 3, 0, 101])
    labels = rng.integers(0, 8, size=400)
    labels = labels[labels != 6]  # class 6 never evaluated
    topk = rng.integers(0, 8, size=(labels.size, 5))
    topk[: labels.size // 2, 0] = labels[: labels.size // 2]
    ll = rng.normal(size=labels.size)
    m = classification_metrics(labels, topk, ll, train_counts)
    assert m["accuracy"] == pytest.approx((topk[:, 0] == labels).mean())
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, topk[:, 0]))
    assert m["top5_accuracy"] == pytest.approx((topk == labels[:, None]).any(1).mean())
    assert m["log_likelihood"] == pytest.approx(ll.mean())

    def recall(c):
        sel = labels == c
        return (topk[sel, 0] == c).mean()

    assert m["many"] == pytest.approx(np.mean([recall(c) for c in (0, 1, 7)]))
    assert m["medium"] == pytest.approx(np.mean([recall(c) for c in (2, 3)]))
    assert m["few"] == pytest.approx(np.mean([recall(c) for c in (4, 5)]))  # 6: no test rows
    assert (m["many_classes"], m["medium_classes"], m["few_classes"]) == (3, 2, 2)


def test_empty_group_is_null():
    m = classification_metrics(
        np.array([0, 1]), np.array([[0], [0]]), np.zeros(2), np.array([200, 150])
    )
    assert m["medium"] is None and m["few"] is None and m["many"] == pytest.approx(0.5)


def test_group_boundaries_follow_classifier_balancing():
    groups = shot_groups(np.array([101, 100, 20, 19]))
    assert groups["many"].tolist() == [True, False, False, False]
    assert groups["medium"].tolist() == [False, True, True, False]
    assert groups["few"].tolist() == [False, False, False, True]
