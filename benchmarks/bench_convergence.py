"""Bamler & Mandt's claim, measured: time to accuracy of adversarial negative sampling.

    python benchmarks/bench_convergence.py [--datasets synthetic geonames] [--budget 60]

Trains the linear model ξ_y(x) = x·w_y + b_y with the real training loop, one method after
another on the same data and the same wall-clock budget of training time:

- ``adversarial``: negative-sampling loss, 16 negatives per example from the fitted tree, bias
  removed at prediction (+ log p_n(y|x));
- ``uniform``, ``frequency``: the same loss with uniform or (count + 1) negatives, corrected at
  prediction as the reference does;
- ``nce``: NCE against the tree (the tree used in training only);
- ``softmax``: full softmax cross-entropy.

Every method gets the same wall-clock budget, and the tree methods spend part of it on the
tree fit (PCA + greedy fit): their clock starts at the fit time, as in the paper's plots. Reported: the wall-clock time to reach 90 % of the best validation accuracy that uniform
negative sampling reaches in the budget, decomposed as (steps ratio) × (step-time ratio) plus
the fit, and the validation accuracy of every method at equal wall-clock. The learning curves
go to ``docs/convergence-<dataset>.png`` and their numbers to ``docs/convergence-<dataset>.json``.

Datasets: ``synthetic`` (the hierarchical Gaussian mixture, C = 10^5 labels, dim 32, Zipf
tail); ``geonames`` reads the pipeline's RFF features (run ``dvc repro featurize@rff`` first).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.datasets.synthetic import generate
from tailkit.registry import make_registry
from tailkit.storage.feature_cache import read_features
from tailkit.training.loop import LoopConfig, train

ROOT = Path(__file__).parents[1]
METHODS = {
    "adversarial": ({"name": "negative-sampling", "reg": 1e-3}, {"name": "tree"}),
    "uniform": ({"name": "negative-sampling", "reg": 1e-3}, {"name": "uniform", "shared": False}),
    "frequency": (
        {"name": "negative-sampling", "reg": 1e-3},
        {"name": "unigram", "alpha": 1.0, "offset": 1.0, "shared": False},
    ),
    "nce": ({"name": "nce", "reg": 1e-3}, {"name": "tree"}),
    # NCE as the reference code is wired: + log p_n(y|x) at evaluation (see losses/nce.py).
    "nce-corrected": (
        {"name": "nce", "reg": 1e-3, "correct_at_prediction": True},
        {"name": "tree"},
    ),
    "softmax": ({"name": "softmax"}, None),
}
COLORS = {
    "adversarial": "tab:red",
    "uniform": "tab:blue",
    "frequency": "tab:green",
    "nce": "tab:orange",
    "nce-corrected": "tab:purple",
    "softmax": "black",
}


def synthetic(args) -> dict:
    data = generate(
        num_classes=args.classes,
        num_examples=args.examples,
        dim=32,
        branching=8,
        zipf_exponent=1.0,
        level_scale=0.5,
        noise=0.3,
        min_per_class=1,
        seed=0,
    )
    n = data.labels.size
    order = np.random.default_rng(1).permutation(n)
    n_val = min(args.val_rows, n // 10)
    val, tr = order[:n_val], order[n_val:]
    x = torch.from_numpy(data.inputs)
    y = torch.from_numpy(data.labels)
    return {
        "x_train": x[tr],
        "y_train": y[tr],
        "x_val": x[val],
        "y_val": y[val],
        "num_classes": args.classes,
    }


def geonames(args) -> dict:
    features = ROOT / "data" / "features" / "rff"
    if not (features / "train.parquet").exists():
        raise SystemExit("geonames: run `dvc repro featurize@rff` first (reads data/features/rff)")
    train_set = read_features(features / "train.parquet")
    val_set = read_features(features / "val.parquet")
    meta = json.loads((features / "meta.json").read_text())
    pick = torch.randperm(val_set.x.shape[0], generator=torch.Generator().manual_seed(0))
    pick = pick[: args.val_rows]
    return {
        "x_train": train_set.x,
        "y_train": train_set.labels,
        "x_val": val_set.x[pick],
        "y_val": val_set.labels[pick],
        "num_classes": meta["num_classes"],
    }


def run_method(registry, name: str, data: dict, args, fitted: dict) -> dict:
    loss_spec, sampler_spec = METHODS[name]
    torch.manual_seed(0)
    c = data["num_classes"]
    loss = registry.build("losses", loss_spec, f"bench.{name}.loss")
    sampler, fit_seconds = None, 0.0
    if sampler_spec is not None:
        key = str(sorted(sampler_spec.items()))
        if key not in fitted:  # the tree is fitted once and charged to every method using it
            sampler = registry.build("samplers", sampler_spec, f"bench.{name}.sampler")
            start = time.perf_counter()
            sampler.fit(data["x_train"], data["y_train"], c)
            fitted[key] = (sampler, time.perf_counter() - start)
        sampler, fit_seconds = fitted[key]
    encoder = registry.build("models", {"name": "linear"}, "bench.model", data["x_train"].shape[1])
    counts = np.bincount(data["y_train"].numpy(), minlength=c)

    def fresh_layer() -> OutputLayer:
        return OutputLayer(c, encoder.out_dim, generator=torch.Generator().manual_seed(0))

    # Probe the step time to spread ``--evals`` evaluations over the budget.
    probe_steps = 3 if name == "softmax" else 30
    probe = train(
        cfg=LoopConfig(name, epochs=1e9, batch_size=args.batch, negatives=args.negatives,
                       max_steps=probe_steps, eval_every=10**9, checkpoint_every=10**9),
        encoder=encoder, layer=fresh_layer(), loss=loss, sampler=sampler,
        optimizer=RowSparseAdagrad(lr=args.lr), x_train=data["x_train"],
        y_train=data["y_train"], x_val=data["x_val"][:10], y_val=data["y_val"][:10],
        class_counts=torch.as_tensor(counts, dtype=torch.float64),
    )  # fmt: skip
    step_seconds = probe.seconds / probe.steps
    budget = max(args.budget - (0.0 if args.fit_free else fit_seconds), step_seconds)
    steps = max(2, int(budget / step_seconds))
    result = train(
        cfg=LoopConfig(name, epochs=1e9, batch_size=args.batch, negatives=args.negatives,
                       max_steps=steps, eval_every=max(1, steps // args.evals), checkpoint_every=10**9),
        encoder=encoder, layer=fresh_layer(), loss=loss, sampler=sampler,
        optimizer=RowSparseAdagrad(lr=args.lr), x_train=data["x_train"],
        y_train=data["y_train"], x_val=data["x_val"], y_val=data["y_val"],
        class_counts=torch.as_tensor(counts, dtype=torch.float64),
    )  # fmt: skip
    return {
        "fit_seconds": fit_seconds,
        "steps": result.steps,
        "train_seconds": result.seconds,
        "step_seconds": result.seconds / result.steps,
        "curve": [
            {"step": p["step"], "seconds": p["seconds"] + fit_seconds, "acc": p["val_accuracy"]}
            for p in result.curve
        ],
    }


def first_reaching(curve: list[dict], target: float) -> dict | None:
    return next((p for p in curve if p["acc"] >= target), None)


def accuracy_at(curve: list[dict], seconds: float) -> float:
    seen = [p["acc"] for p in curve if p["seconds"] <= seconds]
    return seen[-1] if seen else float("nan")


def report(dataset: str, runs: dict, args) -> dict:
    best_uniform = max(p["acc"] for p in runs["uniform"]["curve"])
    target = 0.9 * best_uniform
    print(f"\n== {dataset}: target = 90 % of uniform NS's best ({best_uniform:.4f}) = {target:.4f}")
    print(
        f"   {'method':12s}{'fit s':>8s}{'step ms':>9s}{'steps':>8s}{'to target s':>13s}"
        f"{'steps to':>10s}{'best acc':>10s}"
    )
    reached = {}
    for name, run in runs.items():
        hit = first_reaching(run["curve"], target)
        reached[name] = hit
        best = max(p["acc"] for p in run["curve"])
        to_time = f"{hit['seconds']:.1f}" if hit else "never"
        to_steps = f"{hit['step']}" if hit else "-"
        print(
            f"   {name:12s}{run['fit_seconds']:8.1f}{1e3 * run['step_seconds']:9.2f}"
            f"{run['steps']:8d}{to_time:>13s}{to_steps:>10s}{best:10.4f}"
        )
    out = {"target": target, "best_uniform": best_uniform, "methods": runs, "ratios": {}}
    base = reached["uniform"]
    if base is not None:
        print("   speed-up over uniform NS to the target (time ratio = steps ratio × step-time "
              "ratio, fit included in time):")  # fmt: skip
        for name, hit in reached.items():
            if name == "uniform" or hit is None:
                continue
            steps_ratio = base["step"] / hit["step"]
            step_time_ratio = runs["uniform"]["step_seconds"] / runs[name]["step_seconds"]
            time_ratio = base["seconds"] / hit["seconds"]
            print(
                f"   {name:12s} time ×{time_ratio:6.2f} = steps ×{steps_ratio:6.2f} · step "
                f"time ×{step_time_ratio:5.2f}, less the fit ({runs[name]['fit_seconds']:.1f} s)"
            )
            out["ratios"][name] = {
                "time": time_ratio,
                "steps": steps_ratio,
                "step_time": step_time_ratio,
            }
    horizon = min(run["curve"][-1]["seconds"] for run in runs.values())
    checkpoints = [horizon / 4, horizon / 2, horizon]
    print("   validation accuracy at equal wall-clock (fit included):")
    print("   " + f"{'method':12s}" + "".join(f"{f'{t:.0f} s':>10s}" for t in checkpoints))
    out["equal_wall_clock"] = {}
    for name, run in runs.items():
        accs = [accuracy_at(run["curve"], t) for t in checkpoints]
        out["equal_wall_clock"][name] = dict(zip([round(t, 1) for t in checkpoints], accs,
                                                 strict=True))  # fmt: skip
        print("   " + f"{name:12s}" + "".join(f"{a:10.4f}" for a in accs))
    return out


def plot(dataset: str, runs: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, run in runs.items():
        t = [run["fit_seconds"]]
        acc = [0.0]
        t += [p["seconds"] for p in run["curve"]]
        acc += [p["acc"] for p in run["curve"]]
        ax.plot(t, acc, label=name, color=COLORS[name], marker=".", markersize=3)
    ax.axhline(target, color="gray", linestyle=":", label="90 % of best uniform NS")
    ax.set_xlabel("wall-clock seconds (tree fit included)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"{dataset}: validation accuracy against training time (2-core CPU)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["synthetic", "geonames"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument(
        "--budget", type=float, default=120.0, help="wall-clock seconds per method, fit included"
    )
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--val-rows", type=int, default=2000)
    parser.add_argument("--evals", type=int, default=40, help="points per learning curve")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--negatives", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument(
        "--fit-free",
        action="store_true",
        help="do not charge the tree fit against the budget (train every method for --budget)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    registry = make_registry()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; budget {args.budget} s")
    for dataset in args.datasets:
        data = synthetic(args) if dataset == "synthetic" else geonames(args)
        print(
            f"\n{dataset}: {data['x_train'].shape[0]} training rows, dim "
            f"{data['x_train'].shape[1]}, C = {data['num_classes']}"
        )
        runs, fitted = {}, {}
        for name in args.methods:
            runs[name] = run_method(registry, name, data, args, fitted)
            last = runs[name]["curve"][-1]
            print(
                f"  {name:12s} fit {runs[name]['fit_seconds']:6.1f} s, {runs[name]['steps']} "
                f"steps, val acc {last['acc']:.4f} at {last['seconds']:.1f} s",
                flush=True,
            )
        if "uniform" not in runs:
            continue
        summary = report(dataset, runs, args)
        args.out.mkdir(parents=True, exist_ok=True)
        plot(dataset, runs, summary["target"], args.out / f"convergence-{dataset}.png")
        (args.out / f"convergence-{dataset}.json").write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1)
        )
        print(f"   wrote {args.out / f'convergence-{dataset}.png'}")


if __name__ == "__main__":
    main()
