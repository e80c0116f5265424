"""A seeded synthetic multi-label set in the Extreme Classification Repository's legacy format.

    python benchmarks/synthetic_xc.py OUT_DIR [--train 60000] [--test 15000] [--seed 0]
        [--labels 10000] [--features 30000] [--labels-per-row 3.0]

Writes ``OUT_DIR/train.txt`` and ``OUT_DIR/test.txt`` (header ``N D L``, then per row
``l1,l2,... f:v f:v ...``, zero-based ids), which the ``xc`` dataset reads with ``path:
OUT_DIR``, and which napkinXC and omikuji read as they are (benchmarks/bench_peers.py). The
rows are those of the ``synthetic-xc`` dataset (its module,
tailkit/plugins/datasets/synthetic_xc.py, states the model), which a pipeline generates in its
download stage instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tailkit.plugins.datasets.synthetic_xc import generate
from tailkit.plugins.datasets.xc_decode import write_legacy


def write(
    out: Path,
    train: int = 60_000,
    test: int = 15_000,
    seed: int = 0,
    labels: int = 10_000,
    features: int = 30_000,
    labels_per_row: float = 3.0,
) -> Path:
    """Generate ``train + test`` rows and write the two files under ``out``; returns ``out``."""
    x, y = generate(train + test, seed, labels, features, labels_per_row)
    out.mkdir(parents=True, exist_ok=True)
    write_legacy(out / "train.txt", x[:train], y[:train])
    write_legacy(out / "test.txt", x[train:], y[train:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=60_000)
    parser.add_argument("--test", type=int, default=15_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labels", type=int, default=10_000)
    parser.add_argument("--features", type=int, default=30_000)
    parser.add_argument("--labels-per-row", type=float, default=3.0)
    args = parser.parse_args()
    write(
        args.out, args.train, args.test, args.seed, args.labels, args.features, args.labels_per_row
    )


if __name__ == "__main__":
    main()
