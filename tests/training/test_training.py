"""The training loop: it learns, it resumes exactly after an interruption, it stops on NaN."""

from __future__ import annotations

import pytest
import torch

from tailkit.components import FullBatch, Loss
from tailkit.errors import InvalidParameterError, TrainingDivergedError
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.params import Params, parse_params
from tailkit.pipeline.experiment import batch_mode, build_objective
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.linear import Linear
from tailkit.plugins.models.mlp import MLP
from tailkit.plugins.samplers.model_based import ModelBasedSampler
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.registry import batch_modes, get_registry, make_registry
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, train

C, D = 12, 10


CENTRES = torch.randn(C, D, generator=torch.Generator().manual_seed(42)) * 3


def _data(n=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = CENTRES
    y = torch.randint(C, (n,), generator=g)
    return centres[y] + torch.randn(n, D, generator=g), y


def _run(
    loss,
    sampler=None,
    checkpoint=None,
    negatives=0,
    steps=None,
    optimizer=None,
    encoder=None,
    progress=None,
    device="cpu",
):
    """Three epochs of the loop on the separable problem; the features stay on the CPU and
    the loop moves each batch to ``device``, where the encoder, layer and sampler live."""
    x, y = _data()
    xv, yv = _data(200, seed=1)
    if sampler is not None:
        sampler.fit(None, y, C)
        sampler = sampler.to(torch.device(device))
    encoder = (Linear(D) if encoder is None else encoder).to(device)
    layer = OutputLayer.for_loss(
        loss, C, encoder.out_dim, device=device, generator=torch.Generator().manual_seed(0)
    )
    result = train(
        cfg=LoopConfig(
            "t",
            epochs=3,
            batch_size=64,
            negatives=negatives,
            eval_every=5,
            checkpoint_every=7,
            max_steps=steps,
        ),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=optimizer or RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=xv,
        y_val=yv,
        class_counts=torch.bincount(y, minlength=C).double(),
        checkpoint=checkpoint,
        progress=progress,
    )
    return result, layer


@pytest.mark.parametrize("sampled", [False, True])
def test_training_learns_a_separable_problem(sampled):
    if sampled:
        result, _ = _run(SampledSoftmax(), UniformSampler(), negatives=6)
    else:
        result, _ = _run(SoftmaxCE())
    assert result.steps == 3 * 10  # ceil(600 / 64) steps per epoch
    assert result.curve[-1]["val_accuracy"] > 0.9
    assert result.curve[-1]["loss"] < result.curve[0]["loss"]


class _Interrupt(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_same_result(tmp_path):
    reference, ref_layer = _run(SampledSoftmax(), UniformSampler(), negatives=6)

    class Crashing(RowSparseAdagrad):
        def step(self, rows, step):
            if step == 17:
                raise _Interrupt
            super().step(rows, step)

    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    with pytest.raises(_Interrupt):
        _run(SampledSoftmax(), UniformSampler(), checkpoint, 6, optimizer=Crashing(lr=0.1))
    assert checkpoint.load()["step"] == 14  # the last multiple of checkpoint_every
    resumed, layer = _run(SampledSoftmax(), UniformSampler(), checkpoint, 6)
    torch.testing.assert_close(layer.weight, ref_layer.weight, rtol=0, atol=0)
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in reference.curve]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in resumed.curve] == strip
    # a checkpoint with another fingerprint is ignored, never resumed
    assert Checkpointer(tmp_path / "ckpt", key="other").load() is None


class _Exploding(Loss):
    def forward(self, batch: FullBatch) -> torch.Tensor:
        return batch.logits.sum() * float("nan")


def test_a_nan_loss_stops_with_the_step_and_experiment():
    with pytest.raises(TrainingDivergedError, match=r"experiments\.t: loss became nan at step 1"):
        _run(_Exploding())


def test_the_model_based_sampler_gets_the_scores_and_learns():
    result, _ = _run(SampledSoftmax(), ModelBasedSampler(), negatives=4)
    assert result.curve[-1]["val_accuracy"] > 0.9


LONG_TAIL_LOSSES = {
    "logit-adjusted": {"name": "logit-adjusted"},
    "logit-adjusted-posthoc": {"name": "logit-adjusted", "adjustment": "posthoc"},
    "balanced-softmax": {"name": "balanced-softmax"},
    "ldam-drw": {"name": "ldam", "drw_epoch": 1},
    "cb-focal": {"name": "cb-focal"},
    "elm": {"name": "elm", "lam": 0.1, "alpha_power": 0.5},
    "elm-memory": {"name": "elm", "positives": "memory", "memory_size": 4},
    "dro-lt": {"name": "dro-lt"},
    "decoupled": {"name": "decoupled"},
    "multilabel-ce": {"name": "multilabel-ce"},
    "nway-mclass": {"name": "nway-mclass"},
}


@pytest.mark.parametrize("name", LONG_TAIL_LOSSES)
def test_every_long_tail_loss_trains_an_mlp(name):
    """Through the real loop: setup with the counts, the layer the loss asks for (cosine for
    LDAM, −log(C−1) biases for sigmoid losses), embeddings for ELM/DRO-LT, epochs for DRW."""
    registry = make_registry()
    torch.manual_seed(0)
    loss = registry.build("losses", LONG_TAIL_LOSSES[name], "test")
    result, _ = _run(loss, encoder=MLP(D, hidden=[32], dim=16))
    assert result.curve[-1]["val_accuracy"] > 0.9, result.curve[-1]


@pytest.mark.parametrize("name", ["dro-lt", "elm-memory"])
def test_losses_with_state_resume_exactly(tmp_path, name):
    """ε, prototypes and the embedding memory are checkpointed with the loss."""
    registry = make_registry()

    def fresh():
        torch.manual_seed(0)
        return registry.build("losses", LONG_TAIL_LOSSES[name], "test"), MLP(D, hidden=[8], dim=4)

    loss, encoder = fresh()
    reference, ref_layer = _run(loss, encoder=encoder)

    class Crashing(RowSparseAdagrad):
        def step(self, rows, step):
            if step == 17:
                raise _Interrupt
            super().step(rows, step)

    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    loss, encoder = fresh()
    with pytest.raises(_Interrupt):
        _run(loss, checkpoint=checkpoint, optimizer=Crashing(lr=0.1), encoder=encoder)
    loss, encoder = fresh()
    resumed, layer = _run(loss, checkpoint=checkpoint, encoder=encoder)
    torch.testing.assert_close(layer.weight, ref_layer.weight, rtol=0, atol=0)
    assert resumed.curve[-1]["loss"] == reference.curve[-1]["loss"]


def test_the_progress_callback_shows_the_running_loss_and_examples_per_second(monkeypatch):
    """Issue 15 item 10: the bar moved only at validations and showed no loss. It is told about
    once a second (a clock that advances 0.6 s per read makes that every other step here) and
    at each validation, with the mean loss and examples/s since the last call."""
    from tailkit.training import loop

    ticks = iter(range(10**6))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: 0.6 * next(ticks))
    calls = []
    result, _ = _run(SoftmaxCE(), progress=lambda *a: calls.append(a))
    steps = [c[0] for c in calls]
    assert steps == sorted(steps) and steps[-1] == result.steps == 30
    assert all(total == 30 for _, total, _ in calls)
    assert {5, 10, 15, 20, 25, 30} <= set(steps)  # every validation
    assert len(set(steps)) > 6  # and in between
    shown = [postfix for _, _, postfix in calls if postfix]
    assert shown and all(set(p) == {"loss", "ex/s"} and p["ex/s"] > 0 for p in shown)
    # the losses shown are the step losses' means: the last is about the curve's last value
    assert shown[-1]["loss"] == pytest.approx(result.curve[-1]["loss"], rel=0.5)


def _experiment_params(experiment: dict) -> Params:
    return parse_params(
        {
            "dataset": {"name": "synthetic", "num_classes": 10, "num_examples": 200},
            "featurize": {"raw": {"name": "identity"}},
            "samplers": {"uniform": {"name": "uniform"}},
            "experiments": {"e": {"features": "raw", **experiment}},
        },
        "test-params",
    )


def test_a_loss_meets_only_the_batch_type_it_declares():
    """The experiment's sampler picks the batch mode; a loss that does not take that batch type
    is refused at config validation, in one line, before anything is built or read."""
    objective = {"optimizer": {"name": "adagrad", "lr": 0.1}}
    registry = get_registry()
    full = _experiment_params({"loss": {"name": "softmax"}, "sampler": "uniform", **objective})
    with pytest.raises(InvalidParameterError) as err:
        build_objective(full, "e", registry)
    assert str(err.value).startswith("experiments.e.sampler: got 'uniform', but loss 'softmax'")
    assert "FullBatch" in str(err.value) and "\n" not in str(err.value)
    sampled = _experiment_params(
        {"loss": {"name": "sampled-softmax"}, "sampler": "none", **objective}
    )
    with pytest.raises(InvalidParameterError, match=r"^experiments\.e\.sampler: .*SampledBatch"):
        build_objective(sampled, "e", registry)
    ok = _experiment_params(
        {"loss": {"name": "sampled-softmax"}, "sampler": "uniform", "negatives": 4, **objective}
    )
    assert batch_mode(ok, "e") == "sampled"
    loss, _ = build_objective(ok, "e", registry)
    assert batch_modes(loss) == ("sampled",)


def test_examples_are_the_rows_seen_not_steps_times_batch():
    """Three epochs of 600 rows in batches of 64 (the last one 24 rows short) saw 1,800 rows,
    not 30 × 64 = 1,920; the timing file's examples/s divides these."""
    result, _ = _run(SoftmaxCE())
    assert result.steps == 30 and result.examples == 1800
    assert result.examples_per_second == round(1800 / result.seconds)


def test_a_batch_larger_than_the_rows_counts_the_rows_it_saw():
    """batch_size 4,096 over 600 rows: one step an epoch, each seeing the 600 rows, so three
    epochs saw 1,800 rows (the timing file once claimed ~10^21 examples/s)."""
    x, y = _data()
    result = train(
        cfg=LoopConfig("t", epochs=3, batch_size=4096, eval_every=100),
        encoder=Linear(D), layer=OutputLayer(C, D), loss=SoftmaxCE(), sampler=None,
        optimizer=RowSparseAdagrad(lr=0.1), x_train=x, y_train=y, x_val=x[:50], y_val=y[:50],
        class_counts=torch.bincount(y, minlength=C).double(),
    )  # fmt: skip
    assert result.steps == 3 and result.examples == 1800
    assert result.examples_per_second == round(1800 / result.seconds) < 10**9
