"""The peers (napkinXC's PLT, omikuji) as models of the pipeline: trained by ``train@``, scored
by ``evaluate`` with the same metrics as tailkit's losses, listed without the extra installed.

The tools come with ``pip install 'tailkit[peers]'`` (``make test`` installs it); the tests that
run them are skipped, with that reason, where it is not installed.
"""

from __future__ import annotations

import itertools
import os
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from tailkit import hookimpl
from tailkit.components import RawData
from tailkit.errors import InvalidParameterError
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import LEARNER_FILES
from tailkit.pipeline.codehash import experiment_code
from tailkit.plugins.peers import tooling
from tailkit.registry import make_registry
from tailkit.sparse import SparseRows
from tailkit.stages import download, evaluate, featurize, report, subsample, train

HAVE_PEERS = tooling.available("napkinxc") and tooling.available("omikuji")
needs_peers = pytest.mark.skipif(
    not HAVE_PEERS, reason=f"napkinxc and omikuji are not installed ({tooling.INSTALL})"
)
PEERS = {"napkin": {"name": "napkinxc-plt"}, "forest": {"name": "omikuji"}}


class WordsPerClass:
    """Bag-of-words rows whose class has its own three words (plus Poisson noise over 300
    words); a long tail of 24 classes, the XC repository's trn/tst split; multi-label rows add
    a second label, the next class, to every third row."""

    def __init__(self, *, multilabel: bool = False) -> None:
        self.multilabel = multilabel

    def fetch(self, dest: Path) -> None:
        (dest / "marker.txt").write_text("generated from the options\n")

    def load(self, raw_dir: Path) -> RawData:
        rng = np.random.default_rng(3)
        classes, words = 24, 300
        prior = 1.0 / np.arange(1, classes + 1)
        labels = rng.choice(classes, size=1500, p=prior / prior.sum())
        labels = np.concatenate([labels, np.arange(classes)])  # every class seen
        n = labels.size
        counts = rng.poisson(0.05, size=(n, words)).astype(np.float32)
        for j in range(3):
            counts[np.arange(n), labels * 3 + j] += rng.integers(1, 3, size=n)
        test = np.arange(n) % 5 == 0
        test[-classes:] = False
        splits = {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)}
        names = [f"c{i}" for i in range(classes)]
        if not self.multilabel:
            return RawData(sp.csr_matrix(counts), labels.astype(np.int64), names, "sparse", splits)
        rows = np.concatenate([np.arange(n), np.arange(0, n, 3)])
        cols = np.concatenate([labels, (labels[::3] + 1) % classes])
        indicator = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, classes))
        indicator.sum_duplicates()
        indicator.data[:] = 1
        return RawData(sp.csr_matrix(counts), indicator, names, "sparse", splits)


def _plugin():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_datasets(register):
        register("words-per-class", WordsPerClass)

    mod.register_datasets = register_datasets
    return mod


REGISTRY = make_registry(extra_plugins=[("test-peers", _plugin())])


def _params(experiments: dict, multilabel: bool = False):
    return parse_params(
        {
            "dataset": {"name": "words-per-class", "multilabel": multilabel},
            "subsample": {"val_fraction": 0.1},
            "featurize": {"tfidf": {"name": "tfidf"}},
            "train": {"epochs": 3, "batch_size": 64, "eval_every": 1000},
            "experiments": experiments,
        },
        "test-params",
    )


def _prepare(root: Path, params) -> Layout:
    layout = Layout(root)
    download.run(params, layout, REGISTRY)
    subsample.run(params, layout, REGISTRY)
    featurize.run(params, layout, REGISTRY, "tfidf")
    return layout


def _peer_experiments() -> dict:
    return {
        key: {"sampler": "none", "features": "tfidf", "model": model}
        for key, model in PEERS.items()
    }


def _topk_by_hand(model_dir: Path, name: str, x: sp.csr_matrix, k: int) -> np.ndarray:
    """The tool's own top-k of the test rows, read back with the tool's own API (what a user of
    the tool would compute), as a −1-padded (N, k) array."""
    ranked = np.full((x.shape[0], k), -1, dtype=np.int64)
    if name == "napkinxc-plt":
        from napkinxc.models import PLT

        model = PLT(str(model_dir))
        model.load()
        rows = model.predict(x, top_k=k)
    else:
        import omikuji

        model = omikuji.Model.load(str(model_dir))
        rows = []
        for i in range(x.shape[0]):
            lo, hi = x.indptr[i], x.indptr[i + 1]
            pairs = list(zip(x.indices[lo:hi].tolist(), x.data[lo:hi].tolist(), strict=True))
            rows.append([label for label, _ in model.predict(pairs, top_k=k)])
    for i, row in enumerate(rows):
        ranked[i, : len(row)] = row
    return ranked


@needs_peers
def test_peers_train_and_evaluate_as_rows_of_the_table(tmp_path: Path) -> None:
    from tailkit.storage.feature_cache import read_features

    experiments = {  # a loop model first: the report's settings table starts from its keys
        "softmax": {
            "loss": {"name": "softmax"},
            "sampler": "none",
            "features": "tfidf",
            "model": {"name": "sparse-linear", "dim": 32},
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        **_peer_experiments(),
    }
    params = _params(experiments)
    layout = _prepare(tmp_path, params)
    test = read_features(layout.feature_set("tfidf") / "test.parquet")
    x, y = test.x.to_scipy(), test.labels.numpy()
    for key, spec in PEERS.items():
        timing = train.run(params, layout, REGISTRY, key)
        assert timing["steps"] is None and timing["seconds"] > 0
        files = layout.model(key) / LEARNER_FILES
        # the tool's own files, never a pickle (protocol 2+ starts with 0x80)
        assert sorted(p.name for p in files.iterdir())
        assert not any(p.read_bytes()[:1] == b"\x80" for p in files.rglob("*") if p.is_file())
        metrics = evaluate.run(params, layout, REGISTRY, key)
        ranked = _topk_by_hand(files, spec["name"], x, 5)
        # the metrics are those of the tool's own predictions
        assert metrics["test"]["accuracy"] == pytest.approx(float((ranked[:, 0] == y).mean()))
        top5 = float((ranked == y[:, None]).any(axis=1).mean())
        assert metrics["test"]["top5_accuracy"] == pytest.approx(top5)
        assert metrics["test"]["accuracy"] > 0.8  # each class has its own words
        assert metrics["test"]["log_likelihood"] is None and metrics["margins"] is None
        assert 0 <= metrics["test"]["ece"] <= 1  # the tools' scores are probabilities
        assert metrics["ranking"]["P@1"] == pytest.approx(metrics["test"]["accuracy"])
        tool = "napkinxc" if spec["name"] == "napkinxc-plt" else "omikuji"
        assert metrics["plugins"][tool].startswith(f"{tool} ")
        assert "loss" not in metrics["plugins"]
        curve = layout.curve(key).read_text().splitlines()
        assert curve[0].split("\t")[3] == "val_accuracy" and len(curve) == 2
    train.run(params, layout, REGISTRY, "softmax")
    evaluate.run(params, layout, REGISTRY, "softmax")
    summary = report.run(params, layout).text
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line[:2] == "| "}
    assert {"napkin", "forest", "softmax"} <= set(rows)
    assert "napkinxc-plt" in rows["napkin"] and "omikuji" in rows["forest"]


@needs_peers
def test_peers_take_multi_label_rows(tmp_path: Path) -> None:
    from tailkit.storage.feature_cache import read_features

    params = _params(_peer_experiments(), multilabel=True)
    layout = _prepare(tmp_path, params)
    test = read_features(layout.feature_set("tfidf") / "test.parquet")
    indptr, indices = test.labels.csr_pair()
    truth = [set(indices[a:b].tolist()) for a, b in itertools.pairwise(indptr.tolist())]
    for key, spec in PEERS.items():
        train.run(params, layout, REGISTRY, key)
        metrics = evaluate.run(params, layout, REGISTRY, key)
        ranked = _topk_by_hand(
            layout.model(key) / LEARNER_FILES, spec["name"], test.x.to_scipy(), 5
        )
        p1 = np.mean([r[0] in t for r, t in zip(ranked.tolist(), truth, strict=True)])
        p3 = np.mean([len(set(r[:3]) & t) / 3 for r, t in zip(ranked.tolist(), truth, strict=True)])
        assert metrics["test"]["P@1"] == pytest.approx(p1)
        assert metrics["test"]["P@3"] == pytest.approx(p3)
        assert metrics["test"]["P@1"] > 0.8


def test_a_peer_experiment_takes_no_loss_and_a_loop_model_needs_one(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    with_loss = _params(
        {"p": {"sampler": "none", "features": "tfidf", "model": PEERS["forest"], **_objective()}}
    )
    with pytest.raises(InvalidParameterError) as err:
        train.run(with_loss, layout, REGISTRY, "p")
    message = str(err.value)
    assert message.startswith("experiments.p.loss: model 'omikuji' trains itself")
    assert "remove loss, optimizer" in message and "\n" not in message
    bare = _params(
        {"s": {"sampler": "none", "features": "tfidf", "model": {"name": "sparse-linear"}}}
    )
    with pytest.raises(InvalidParameterError, match=r"^experiments.s.loss: missing; model "):
        train.run(bare, layout, REGISTRY, "s")
    assert not (tmp_path / "data" / "models").exists()  # nothing partial


def _objective() -> dict:
    return {"loss": {"name": "softmax"}, "optimizer": {"name": "adagrad", "lr": 0.1}}


def test_without_the_tools_the_peers_are_listed_as_unavailable(monkeypatch) -> None:
    real = tooling.available
    monkeypatch.setattr(tooling, "available", lambda m: False if m == "omikuji" else real(m))
    registry = make_registry()
    component = registry.get("models", "omikuji", "model")
    assert component.description.startswith(f"(unavailable: {tooling.INSTALL})")
    with pytest.raises(InvalidParameterError) as err:
        registry.build("models", {"name": "omikuji"}, "experiments.f.model", 10)
    assert str(err.value) == (
        f"experiments.f.model: model 'omikuji' needs the 'omikuji' package: {tooling.INSTALL}"
    )


def test_a_peer_fingerprint_holds_the_tool_version_and_no_loss() -> None:
    params = _params(_peer_experiments())
    record = experiment_code(params, REGISTRY, "forest")
    assert set(record) == {"model", "sha256"}
    assert set(record["model"]["requires"]) == {"omikuji"}
    files = record["model"]["files"]
    assert "tailkit/plugins/peers/omikuji_forest.py" in files
    assert "tailkit/plugins/peers/napkinxc_plt.py" not in files


def test_the_tools_console_output_is_kept_out_and_shown_on_failure(capfd) -> None:
    with tooling.quiet_console():
        os.write(1, b"progress 1/2\n")
        os.write(2, b"progress 2/2\n")
    with pytest.raises(RuntimeError) as err, tooling.quiet_console():
        os.write(2, b"reading line 7: bad label\n")
        raise RuntimeError("Failed to load data")
    assert err.value.__notes__ == ["last output of the tool: reading line 7: bad label"]
    out, errs = capfd.readouterr()
    assert "progress" not in out + errs and "bad label" not in out + errs


@needs_peers
def test_napkinxc_fits_are_reproducible_on_one_thread_and_omikuji_says_it_is_not(
    tmp_path: Path,
) -> None:
    """napkinXC's liblinear nodes draw from the C library's rand(), which the plugin seeds: two
    fits in one process (the second one continuing the first one's stream, were it not
    reseeded) write the same bytes. omikuji seeds its clustering from the operating system."""
    from tailkit.plugins.peers.napkinxc_plt import NapkinXCPLT
    from tailkit.plugins.peers.omikuji_forest import Omikuji

    raw = WordsPerClass().load(tmp_path)
    x, y = raw.inputs.astype(np.float32), raw.labels
    rows = SparseRows.from_scipy(x)
    contents = []
    for run in range(2):
        model = NapkinXCPLT(x.shape[1])
        model.fit(rows, torch.from_numpy(y), 24, tmp_path / f"plt{run}", seed=3)
        contents.append({p.name: p.read_bytes() for p in (tmp_path / f"plt{run}").iterdir()})
    assert contents[0] == contents[1] and model.deterministic
    assert not NapkinXCPLT(x.shape[1], threads=2).deterministic
    assert not Omikuji.deterministic


@needs_peers
def test_omikuji_leaves_out_rows_without_features_or_labels(tmp_path: Path) -> None:
    """omikuji's reader refuses a row without features; such a row (a place alone in every grid
    cell once rare cells are cut) and a row without labels are left out of its training file,
    and the rest still trains a forest that ranks the training classes."""
    from tailkit.labels import LabelSets
    from tailkit.plugins.peers.omikuji_forest import Omikuji

    raw = WordsPerClass().load(tmp_path)
    x = sp.csr_matrix(raw.inputs.astype(np.float32))
    x = sp.vstack([sp.csr_matrix((1, x.shape[1]), dtype=np.float32), x]).tocsr()  # empty row 0
    lists = [[0]] + [[int(label)] for label in raw.labels]
    lists[1] = []  # and a label-less row 1
    labels = LabelSets.from_lists(lists, 24)
    model = Omikuji(x.shape[1])
    model.fit(SparseRows.from_scipy(x), labels, 24, tmp_path / "forest", seed=0)
    ranked, _ = model.predict_topk(SparseRows.from_scipy(x[2:]), 1)
    assert np.mean(ranked[:, 0] == raw.labels[1:]) >= 0.9
