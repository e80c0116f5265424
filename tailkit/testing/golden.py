"""The golden pipeline: a few seconds of every kind of arithmetic the stages do, whose output
hashes are committed (tests/golden/hashes.json) so that any machine can check that it makes the
same bits as the one that made them.

A generated multi-label bag-of-words set (synthetic-xc) is featurized twice: sparse TF-IDF
(scipy) and its truncated SVD (scikit-learn, so LAPACK and the OpenBLAS behind it), and a label
tree is fitted on it (numba's compiled fit). Two experiments train and are evaluated: ZLPR on the
dense SVD features through an MLP (torch's GEMMs and ATen's element-wise kernels), and sampled
softmax on the sparse features with the tree's negatives and its log q correction (the
sparse-linear layer's kernels and the tree's draws). Every stage runs in this one process, under
the arithmetic the ``tailkit`` command would run under (:mod:`tailkit.native.restart`).

``python -m tailkit.testing.golden`` prints ``{output: sha256}`` as JSON; ``--write FILE``
writes it there (``make golden``), with the CPU that made it.
"""

from __future__ import annotations

if __name__ == "__main__":  # before numpy, torch or numba load: they read the pins once
    from tailkit.native.restart import restart_with_settled_environment

    restart_with_settled_environment()

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

PARAMS: dict[str, Any] = {
    "base": {"seed": 0, "device": "cpu", "extra_seeds": []},
    "dataset": {
        "name": "synthetic-xc",
        "num_labels": 60,
        "num_features": 400,
        "num_train": 1200,
        "num_test": 300,
        "labels_per_row": 2.0,
        "seed": 0,
    },
    "subsample": {"profile": "natural", "val_fraction": 0.1, "seed": 0},
    "featurize": {
        "bow": {"name": "tfidf"},
        "svd": {"name": "tfidf-svd", "dim": 16},
    },
    "samplers": {"tree": {"name": "tree", "k": 4}},
    "train": {"epochs": 2, "batch_size": 64, "eval_every": 10, "val_rows": 100},
    "evaluate": {"batch_size": 128, "label_chunk": 16, "top_k": 5},
    "experiments": {
        "dense": {
            "loss": {"name": "multilabel-ce"},
            "sampler": "none",
            "features": "svd",
            "model": {"name": "mlp", "hidden": [32], "dim": 16},
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        "sparse-tree": {
            "loss": {"name": "sampled-softmax", "weighting": "importance"},
            "sampler": "tree",
            "features": "bow",
            "negatives": 8,
            "model": {"name": "sparse-linear", "dim": 16},
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
    },
}


def run_pipeline(root: Path) -> dict[str, float]:
    """Every stage of the golden project, in order, in ``root``; the seconds of each."""
    import time

    import yaml

    from tailkit.params import load_params
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import download, evaluate, featurize, fit_sampler, subsample, train

    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    params = load_params(root / "params.yaml")
    layout, registry = Layout(root), make_registry()
    seconds: dict[str, float] = {}

    def timed(name: str, stage: Any, *args: Any) -> None:
        start = time.perf_counter()
        stage.run(params, layout, registry, *args)
        seconds[name] = time.perf_counter() - start

    timed("download", download)
    timed("subsample", subsample)
    for features in params.featurize:
        timed(f"featurize@{features}", featurize, features)
    timed("fit-sampler", fit_sampler)
    for experiment in params.experiments:
        timed(f"train@{experiment}", train, experiment)
        timed(f"evaluate@{experiment}", evaluate, experiment)
    return seconds


def output_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file the pipeline wrote that holds no time, by path. A model's
    ``model.json`` is hashed without its ``code`` (the hash of its loss, model and sampler
    source), which moves with any edit of that source and says nothing of the arithmetic."""
    from tailkit.paths import carries_time

    out = {}
    for folder in ("data", "metrics", "plots"):
        for path in sorted((root / folder).rglob("*")):
            name = path.relative_to(root).as_posix()
            if path.is_file() and not carries_time(name) and "/checkpoints/" not in f"/{name}":
                data = path.read_bytes()
                if path.name == "model.json":
                    info = {k: v for k, v in json.loads(data).items() if k != "code"}
                    data = json.dumps(info, sort_keys=True).encode()
                out[name] = hashlib.sha256(data).hexdigest()
    return out


def golden_hashes(seconds: dict[str, float] | None = None) -> dict[str, str]:
    """The outputs' hashes; each stage's seconds into ``seconds`` where given."""
    with tempfile.TemporaryDirectory(prefix="tailkit-golden-") as tmp:
        root = Path(tmp)
        timings = run_pipeline(root)
        if seconds is not None:
            seconds.update(timings)
        return output_hashes(root)


def record() -> dict[str, Any]:
    """The hashes with what made them: the arithmetic's mode and the CPU."""
    from tailkit.native.arithmetic import arithmetic_record, cpu_model, library_versions

    return {
        "arithmetic": arithmetic_record(),
        "made_on": cpu_model(),
        "libraries": library_versions(),
        "hashes": golden_hashes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailkit.testing.golden", description=__doc__)
    parser.add_argument("--write", type=Path, help="write the record here instead of stdout")
    parser.add_argument(
        "--seconds", action="store_true", help="print each stage's seconds instead (benchmarks)"
    )
    args = parser.parse_args(argv)
    if args.seconds:
        seconds: dict[str, float] = {}
        golden_hashes(seconds)
        sys.stdout.write(json.dumps(seconds) + "\n")
        return 0
    text = json.dumps(record(), indent=2, sort_keys=True) + "\n"
    if args.write is None:
        sys.stdout.write(text)
    else:
        from tailkit.storage.atomic import atomic_path

        args.write.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.write) as tmp:
            tmp.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
