"""Label-sharded training (train(..., world=...)) at W = 2 and 3 gloo processes equals one
process: same layer rows, encoder weights and learning curve after a few epochs, in float64."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from conftest import TINY_PARAMS, make_project, run
from spawn_world import run_world

from tailkit.distributed.launch import joined_world
from tailkit.distributed.world import World
from tailkit.errors import InvalidParameterError
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.output.shards import shard_layer, whole_layer
from tailkit.params import DistributedParams
from tailkit.registry import make_registry
from tailkit.storage import tensorfile
from tailkit.training.loop import LoopConfig, train

C, BLOCK, N, D = 13, 4, 96, 6


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = (x[:, :2].abs().sum(dim=1) * 4).long() % C
    return x, y, torch.bincount(y, minlength=C).double()


def _run(world: World, spec: dict, shard: bool, block: int = BLOCK):
    registry = make_registry()
    x, y, counts = _data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
    loss = registry.build("losses", spec, "test")
    encoder, loss = encoder.double(), loss.double()
    gen = torch.Generator().manual_seed(1)
    layer = OutputLayer.for_loss(loss, C, encoder.out_dim, generator=gen)
    layer.weight, layer.bias = layer.weight.double(), layer.bias.double()
    if shard:
        layer = shard_layer(layer, world, block)
    result = train(
        cfg=LoopConfig("test", epochs=2, batch_size=24, eval_every=4, checkpoint_every=10**9),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=None,
        optimizer=RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=x[:40],
        y_val=y[:40],
        class_counts=counts,
        world=world if shard else World(),
    )
    return whole_layer(layer, world) if shard else layer, encoder, result.curve


def _equal_to_one_process(world: World) -> None:
    cases = [({"name": "softmax"}, BLOCK), ({"name": "logit-adjusted"}, BLOCK),
             ({"name": "elm"}, BLOCK), ({"name": "ldam", "drw_epoch": 1}, BLOCK),
             ({"name": "softmax"}, 16)]  # fmt: skip  # 16: one rank owns every label, the rest none
    for spec, block in cases:
        layer, encoder, curve = _run(world, spec, shard=True, block=block)
        ref_layer, ref_encoder, ref_curve = _run(world, spec, shard=False)
        where = f"{spec['name']}, rank {world.rank} of {world.size}"
        close = {"rtol": 1e-9, "atol": 1e-11, "msg": lambda m, where=where: f"{where}: {m}"}
        torch.testing.assert_close(layer.weight, ref_layer.weight, **close)
        torch.testing.assert_close(layer.bias, ref_layer.bias, **close)
        ref_state = ref_encoder.state_dict()
        for key, value in encoder.state_dict().items():
            torch.testing.assert_close(value, ref_state[key], **close)
        assert [c["step"] for c in curve] == [c["step"] for c in ref_curve]
        for c, r in zip(curve, ref_curve, strict=True):
            assert c["loss"] == pytest.approx(r["loss"], rel=1e-9), where
            assert (c["val_accuracy"], c["val_balanced_accuracy"]) == (
                r["val_accuracy"], r["val_balanced_accuracy"]), where  # fmt: skip


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_training_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _equal_to_one_process, size)


def _one_rank_fails(world: World) -> None:
    os.environ.update(WORLD_SIZE=str(world.size), RANK=str(world.rank))  # as torchrun sets
    with joined_world(DistributedParams(nproc_per_node=world.size), torch.device("cpu")):
        if world.rank == 1:
            raise ValueError("rank 1 failed in its step")
        # rank 0 meanwhile waits in a collective rank 1 never joins, as a training step would;
        # bounded, so that a hang shows as this wait's timeout, not as a stuck test
        dist.all_reduce(torch.ones(1), async_op=True).wait(timeout=timedelta(seconds=60))


_FAILING_WORLD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
from spawn_world import run_world
from test_distributed_training import _one_rank_fails
run_world(__import__("pathlib").Path({tmp!r}), _one_rank_fails, 2)
"""


def test_a_rank_that_fails_ends_the_run_instead_of_waiting_at_the_barrier(tmp_path) -> None:
    """Leaving the world waits for every rank at a barrier, but not after an error: the other
    rank is inside a collective the failed one never joins, so that barrier hung the job (in
    its own process here, so that a hang fails the test at the timeout)."""
    here = Path(__file__)
    script = _FAILING_WORLD.format(
        tests=str(here.parent), root=str(here.parents[1]), tmp=str(tmp_path)
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group holds the spawned ranks too: killed together
    )
    try:
        _, stderr = run.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail("a rank's error left the other waiting: the run hung")
    # the error reported is rank 1's, or rank 0's collective failing as its peer went away
    assert run.returncode != 0 and "Traceback" in stderr


def _refusals(world: World) -> None:
    registry = make_registry()
    x, y, counts = _data()
    for spec, match in (
        ({"name": "cb-focal", "loss_type": "focal"}, "CBFocal|cannot reduce over a label shard"),
    ):
        loss = registry.build("losses", spec, "test")
        encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
        layer = shard_layer(OutputLayer.for_loss(loss, C, 4), world, BLOCK)
        with pytest.raises(InvalidParameterError, match=match):
            train(
                cfg=LoopConfig("test", epochs=1, batch_size=24),
                encoder=encoder,
                layer=layer,
                loss=loss,
                sampler=None,
                optimizer=RowSparseAdagrad(lr=0.1),
                x_train=x.float(),
                y_train=y,
                x_val=x[:8].float(),
                y_val=y[:8],
                class_counts=counts,
                world=world,
            )


def test_a_loss_that_cannot_shard_is_refused(tmp_path) -> None:
    run_world(tmp_path, _refusals, 2)


@pytest.mark.slow
def test_tailkit_train_under_torchrun_writes_what_one_process_writes(tmp_path) -> None:
    """`train.distributed.nproc_per_node: 2` in a DVC project: `dvc repro` trains under
    torchrun (two gloo processes), rank 0 writes the model files one process writes, with the
    same tensors up to float rounding, and evaluation, sharded as well, sees the same
    accuracy."""
    names = ("softmax", "ldam", "adversarial")  # adversarial: sampled, the tree's correction
    params = copy.deepcopy(TINY_PARAMS)
    params["experiments"] = {k: params["experiments"][k] for k in names}
    params["samplers"] = {"tree": params["samplers"]["tree"]}
    project = make_project(tmp_path / "project", params)
    targets = ["dvc", "repro", *(f"evaluate@{name}" for name in names)]
    run(targets, project)

    def outputs() -> dict:
        return {
            name: (
                tensorfile.load(project / "data" / "models" / name / "model.safetensors"),
                json.loads((project / "metrics" / "detail" / f"{name}.json").read_text()),
                json.loads(
                    (project / "metrics" / "timings" / "train" / f"{name}.json").read_text()
                ),
            )
            for name in names
        }

    one = outputs()
    params["train"]["distributed"] = {"nproc_per_node": 2}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(targets, project)
    # A sampled step through a parameter-free encoder is one process's bit for bit (each logit
    # is its owner's, plus zeros), so DVC finds the model unchanged and keeps its evaluation:
    # run that again, sharded (by rows: the tree's per-row correction).
    w_two = tensorfile.load(project / "data" / "models" / "adversarial" / "model.safetensors")
    assert torch.equal(one["adversarial"][0]["layer"]["weight"], w_two["layer"]["weight"])
    run(["dvc", "repro", "--force", "--single-item", "evaluate@adversarial"], project)
    two = outputs()
    assert two["adversarial"][1]["test"] == one["adversarial"][1]["test"]  # exact
    for name in names:
        (w1, m1, t1), (w2, m2, t2) = one[name], two[name]
        assert (t1["world_size"], t2["world_size"]) == (1, 2)
        timing = project / "metrics" / "timings" / "evaluate" / f"{name}.json"
        assert json.loads(timing.read_text())["world_size"] == 2  # evaluated sharded too
        for part in ("layer", "encoder"):
            assert w1[part].keys() == w2[part].keys()
            for key in w1[part]:
                # GEMMs blocked differently on a shard round differently, and an epoch of
                # steps carries that on: up to ~1e-3 of the tensor's scale (LDAM's layer)
                scale = float(w1[part][key].abs().max())
                torch.testing.assert_close(
                    w2[part][key], w1[part][key], rtol=1e-3, atol=max(1e-4, 1e-3 * scale)
                )
        assert abs(m2["test"]["accuracy"] - m1["test"]["accuracy"]) <= 0.01, name


@pytest.mark.slow
def test_kill_9_of_one_rank_ends_the_job_and_dvc_repro_resumes_to_the_same_model(tmp_path):
    """Two processes train a sampled experiment (the tree's negatives) with frequent
    checkpoints; SIGKILL of rank 1 alone makes torchrun end the whole job with a non-zero
    exit, the per-block checkpoint stays, and `dvc repro` resumes from it to the model bytes of
    an uninterrupted two-process run."""
    import os
    import signal
    import subprocess
    import time

    import psutil
    from conftest import tool_env

    params = copy.deepcopy(TINY_PARAMS)
    slow = {**params["experiments"]["adversarial"], "loss": {"name": "sampled-softmax"}}
    params["experiments"] = {"slow": {**slow, "epochs": 40}}
    params["samplers"] = {"tree": params["samplers"]["tree"]}
    params["train"]["checkpoint_every"] = 40
    params["train"]["distributed"] = {"nproc_per_node": 2}
    project = make_project(tmp_path / "project", params)
    run(["dvc", "repro", "train@slow"], project)
    model = project / "data" / "models" / "slow"
    reference = {p.name: p.read_bytes() for p in model.iterdir()}

    checkpoint = project / "data" / "checkpoints" / "slow" / "state.pt"
    proc = subprocess.Popen(
        ["dvc", "repro", "--force", "train@slow"],
        cwd=project,
        env=tool_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), "no checkpoint appeared before the run ended"
    ranks = [
        child
        for child in psutil.Process(proc.pid).children(recursive=True)
        if child.environ().get("RANK") == "1" and "tailkit" in " ".join(child.cmdline())
    ]
    assert len(ranks) == 1, ranks
    os.kill(ranks[0].pid, signal.SIGKILL)
    try:
        assert proc.wait(timeout=180) not in (0, None)  # the job ends, and says it failed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert checkpoint.exists()
    assert list((checkpoint.parent).glob("rows-*/rows-*.pt"))

    done = run(["dvc", "repro", "train@slow"], project)
    assert "resuming from" in done.stderr + done.stdout
    assert {p.name: p.read_bytes() for p in model.iterdir()} == reference
    assert not checkpoint.parent.exists()  # a finished run clears its checkpoint


def _predictions(world: World) -> None:
    from tailkit.evaluation.correction import PredictionContext
    from tailkit.evaluation.predict import predict
    from tailkit.evaluation.predict_sharded import predict_sharded
    from tailkit.training.loop import log_prior_from_counts

    registry = make_registry()
    x, y, counts = _data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "t", D).double()
    for spec in ({"name": "softmax"}, {"name": "logit-adjusted", "adjustment": "posthoc"}):
        loss = registry.build("losses", spec, "t").double()
        loss.setup(counts)
        layer = OutputLayer.for_loss(loss, C, 4, generator=torch.Generator().manual_seed(2))
        layer.weight, layer.bias = layer.weight.double(), layer.bias.double()
        layer.weight[9], layer.bias[9] = layer.weight[5], layer.bias[5]  # a tie across shards
        ctx = PredictionContext(log_prior=log_prior_from_counts(counts))
        ref, ref_raw = predict(encoder, layer, loss, ctx, x, y, k=7, label_chunk=3)
        for block in (BLOCK, 16):  # 16: one rank owns every label, the others none
            shard = shard_layer(layer, world, block)
            got, got_raw = predict_sharded(
                encoder, shard, loss, ctx, x, y, world, k=7, label_chunk=3
            )
            where = f"{spec}, block {block}, rank {world.rank} of {world.size}"
            for a, b in ((got, ref), (got_raw, ref_raw)):
                if b is None:
                    assert a is None, where
                    continue
                assert torch.equal(a.topk, b.topk), where
                torch.testing.assert_close(a.top_scores, b.top_scores, rtol=1e-12, atol=0)
                torch.testing.assert_close(a.true_score, b.true_score, rtol=1e-12, atol=0)
                torch.testing.assert_close(a.log_partition, b.log_partition, rtol=1e-12, atol=0)


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_prediction_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _predictions, size)
