"""tailkit against the tools users pick instead (napkinXC, omikuji) on the same rows and features.

    python benchmarks/bench_peers.py [--features geocells] [--dims 128,256] [--epochs 2]

GeoNames through tailkit's own stages (download, subsample, featurize) into a temporary
directory, so every system sees the pipeline's split and the very feature cache it writes
(``geocells``: sparse multi-resolution grid cells). Then, each in its own process so its peak
RSS is its own:

* tailkit: ``train`` and ``evaluate`` stages with ``sparse-linear`` of each ``--dims`` and the
  softmax and logit-adjusted (τ = 1) losses, Adagrad lr 0.1, batch 512;
* napkinXC ``PLT`` (hierarchical k-means tree, arity 2, 100 leaves per node cap, liblinear
  logistic nodes: the library's defaults) on the same CSR rows;
* omikuji (Parabel-like: balanced 2-means tree, 100 labels per leaf, liblinear hinge nodes;
  the library's defaults), trained from the same rows written in the XC text format.

One table: accuracy, balanced accuracy, many/medium/few (training counts > 100, 20–100, < 20),
P@1, P@5, PSP@5, train and predict seconds and peak RSS, all metrics computed by tailkit's own
functions from each system's top-5. Needs ``pip install 'tailkit[peers]'``. Times are from one
run on whatever machine runs it (±40 % on shared ones); read the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tailkit.evaluation.metrics import (
    classification_metrics,
    inverse_propensity,
    propensity_constants,
    ranking_metrics,
)


def _params(featurize: dict[str, Any], experiments: dict[str, Any]):
    from tailkit.params import parse_params

    return parse_params(
        {
            "dataset": {"name": "geonames"},
            "featurize": featurize,
            "experiments": experiments,
            "train": {"epochs": 2, "batch_size": 512, "eval_every": 100000, "val_rows": 1000},
        },
        "bench-peers",
    )


def prepare(root: Path, featurize: dict[str, Any]) -> dict[str, Any]:
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import download, subsample
    from tailkit.stages import featurize as featurize_stage

    # the data stages read no experiment, but params need one
    none = {"x": {"loss": {"name": "softmax"}, "sampler": "none", "optimizer": {"name": "sgd"}}}
    params, layout, registry = _params(featurize, none), Layout(root), make_registry()
    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    return featurize_stage.run(params, layout, registry)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _scores(topk: np.ndarray, labels: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    m = classification_metrics(labels, topk, np.zeros(len(labels)), counts)
    a, b = propensity_constants("geonames")
    q = inverse_propensity(counts, int(counts.sum()), a, b)
    r = ranking_metrics(topk, (np.arange(len(labels) + 1), labels), len(counts), (1, 5), q)
    return {
        "accuracy": m["accuracy"],
        "balanced": m["balanced_accuracy"],
        "many": m["many"],
        "medium": m["medium"],
        "few": m["few"],
        "P@1": r["P@1"],
        "P@5": r["P@5"],
        "PSP@5": r["PSP@5"],
    }


def run_tailkit(root: Path, name: str, exp: dict[str, Any], featurize: dict[str, Any]) -> dict:
    """Train through the train stage; predict the test rows' top-5 as evaluate does."""
    import torch

    from tailkit.cache import read_features
    from tailkit.evaluation.predict import predict
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import evaluate, train

    params, layout, registry = _params(featurize, {name: exp}), Layout(root), make_registry()
    timing = train.run(params, layout, registry, name)
    start = time.perf_counter()
    encoder, layer, loss, ctx, _, _ = evaluate.restore(
        params, layout, registry, name, torch.device("cpu")
    )
    test = read_features(layout.features / "test.parquet")
    adjusted, _ = predict(encoder, layer, loss, ctx, test.x, test.labels, k=5)
    predict_s = time.perf_counter() - start
    return {"train_s": timing["seconds"], "predict_s": predict_s, "topk": adjusted.topk.numpy()}


def _split(root: Path, split: str):
    from tailkit.cache import read_features

    table = read_features(root / "data" / "features" / f"{split}.parquet")
    return table.x.to_scipy(), table.labels.numpy()


def run_napkinxc(root: Path, workdir: Path) -> dict:
    from napkinxc.models import PLT

    x, y = _split(root, "train")
    start = time.perf_counter()
    model = PLT(str(workdir / "napkinxc-plt"), seed=0, threads=0)
    model.fit(x, [[int(label)] for label in y])
    train_s = time.perf_counter() - start
    xt, _ = _split(root, "test")
    start = time.perf_counter()
    ranked = model.predict(xt, top_k=5)
    predict_s = time.perf_counter() - start
    topk = np.full((xt.shape[0], 5), -1, dtype=np.int64)
    for i, row in enumerate(ranked):
        topk[i, : len(row)] = row
    return {"train_s": train_s, "predict_s": predict_s, "topk": topk}


def _write_xc(path: Path, x, y: np.ndarray) -> None:
    """The XC repository's text format: a header line, then "labels feature:value ..."."""
    with path.open("w") as f:
        f.write(f"{x.shape[0]} {x.shape[1]} {int(y.max()) + 1}\n")
        for i in range(x.shape[0]):
            lo, hi = x.indptr[i], x.indptr[i + 1]
            pairs = " ".join(
                f"{j}:{v:.6g}" for j, v in zip(x.indices[lo:hi], x.data[lo:hi], strict=True)
            )
            f.write(f"{y[i]} {pairs}\n")


def run_omikuji(root: Path, workdir: Path) -> dict:
    import omikuji

    x, y = _split(root, "train")
    data = workdir / "omikuji-train.txt"
    _write_xc(data, x, y)
    start = time.perf_counter()
    model = omikuji.Model.train_on_data(str(data), omikuji.Model.default_hyper_param())
    train_s = time.perf_counter() - start
    xt, _ = _split(root, "test")
    start = time.perf_counter()
    topk = np.full((xt.shape[0], 5), -1, dtype=np.int64)
    for i in range(xt.shape[0]):
        lo, hi = xt.indptr[i], xt.indptr[i + 1]
        pairs = list(zip(xt.indices[lo:hi].tolist(), xt.data[lo:hi].tolist(), strict=True))
        row = [label for label, _ in model.predict(pairs, top_k=5)]
        topk[i, : len(row)] = row
    predict_s = time.perf_counter() - start
    return {"train_s": train_s, "predict_s": predict_s, "topk": topk}


def _child(queue, fn, args) -> None:
    # the peers draw progress bars on stderr for every few rows; the table is on stdout
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    out = fn(*args)
    out["rss_mb"] = _peak_rss_mb()
    queue.put(out)


def isolated(fn, *args) -> dict:
    ctx = mp.get_context("spawn")  # a fork after torch started its thread pool can hang
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, fn, args))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", default="geocells")
    parser.add_argument("--dims", default="256")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--json", type=Path, help="also write the table's numbers here")
    args = parser.parse_args()
    featurize = {"name": args.features}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        meta = prepare(root, featurize)
        counts = np.asarray(meta["train_counts"])
        _, test_labels = _split(root, "test")
        print(
            f"GeoNames: {meta['train_rows'] if 'train_rows' in meta else counts.sum():,} train "
            f"rows, {len(test_labels):,} test rows, {len(counts):,} labels; features "
            f"{args.features}: {meta['dim']:,} columns"
        )
        systems: dict[str, dict] = {}
        for dim in (int(d) for d in args.dims.split(",")):
            for loss in ({"name": "softmax"}, {"name": "logit-adjusted", "tau": 1.0}):
                name = f"{loss['name']}-d{dim}"
                exp = {
                    "loss": loss,
                    "sampler": "none",
                    "model": {"name": "sparse-linear", "dim": dim},
                    "optimizer": {"name": "adagrad", "lr": 0.1},
                    "epochs": args.epochs,
                }
                systems[f"tailkit {name}"] = isolated(run_tailkit, root, name, exp, featurize)
        for label, fn in (("napkinXC PLT", run_napkinxc), ("omikuji", run_omikuji)):
            try:
                systems[label] = isolated(fn, root, root)
            except ImportError as exc:
                print(f"{label}: skipped ({exc}); pip install 'tailkit[peers]'")
        header = (
            "| system | acc. | bal. acc. | many | medium | few | P@1 | P@5 | PSP@5 | "
            "train s | predict s | peak RSS MB |"
        )
        print(header)
        print("|" + "---|" * 12)
        table = {}
        for label, out in systems.items():
            s = _scores(out["topk"], test_labels, counts)
            table[label] = {**s, **{k: out[k] for k in ("train_s", "predict_s", "rss_mb")}}
            print(
                f"| {label} | "
                + " | ".join(f"{100 * s[k]:.2f}" for k in s)
                + f" | {out['train_s']:.1f} | {out['predict_s']:.1f} | {out['rss_mb']:,.0f} |"
            )
        if args.json:
            args.json.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
