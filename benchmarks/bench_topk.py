"""Exact top-k over 10^5–10^6 labels: tailkit's chunked top-k against faiss, in one run.

    pip install -e '.[bench]'      # faiss-cpu
    python benchmarks/bench_topk.py [--queries 2048] [--dim 128] [--k 5] [--repeats 5]

For C = 10^5 and 10^6 random label vectors and N query vectors (d = 128), times
:func:`tailkit.evaluation.topk.chunked_topk` and faiss ``IndexFlatIP.search`` (exact inner
product) on the same data, interleaved, median of ``--repeats``; checks that both return the
same labels; prints the ratio tailkit / faiss (goal ≤ 1.5) and the achieved GFLOP/s (2·N·C·d per
search) against the machine's measured FP32 GEMM of one block × chunk.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tailkit.evaluation.topk import chunked_topk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--labels", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--label-chunk", type=int, default=4096)
    parser.add_argument("--query-block", type=int, default=512)
    args = parser.parse_args()
    try:
        import faiss
    except ImportError:
        raise SystemExit("bench_topk needs faiss: pip install -e '.[bench]'") from None

    g = torch.Generator().manual_seed(0)
    n, d, k = args.queries, args.dim, args.k
    queries = torch.randn(n, d, generator=g)
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), faiss "
        f"{faiss.__version__} ({faiss.omp_get_max_threads()} threads); N={n}, d={d}, k={k}, "
        f"median of {args.repeats}, interleaved"
    )
    print(
        f"{'C':>9}{'tailkit s':>11}{'faiss s':>10}{'ratio':>8}{'tailkit GF/s':>14}"
        f"{'faiss GF/s':>12}{'GEMM GF/s':>11}{'same ids':>10}"
    )
    for c in args.labels:
        labels = torch.randn(c, d, generator=g)
        index = faiss.IndexFlatIP(d)
        index.add(labels.numpy())
        chunk = labels[: args.label_chunk]
        block = queries[: args.query_block]
        ours, theirs, gemm = [], [], []
        out = {}
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            t = time.perf_counter()
            out["ours"] = chunked_topk(
                queries, labels, k, label_chunk=args.label_chunk, query_block=args.query_block
            )
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            out["faiss"] = index.search(queries.numpy(), k)
            theirs.append(time.perf_counter() - t)
            t = time.perf_counter()
            block @ chunk.T
            gemm.append(time.perf_counter() - t)
        ours, theirs, gemm = ours[1:], theirs[1:], gemm[1:]
        same = (out["ours"][1].numpy() == out["faiss"][1]).mean()
        flops = 2.0 * n * c * d
        t_ours, t_faiss = statistics.median(ours), statistics.median(theirs)
        gemm_rate = 2.0 * len(block) * len(chunk) * d / statistics.median(gemm) / 1e9
        print(
            f"{c:>9}{t_ours:>11.3f}{t_faiss:>10.3f}{t_ours / t_faiss:>8.2f}"
            f"{flops / t_ours / 1e9:>14.1f}{flops / t_faiss / 1e9:>12.1f}{gemm_rate:>11.1f}"
            f"{same:>10.4f}"
        )


if __name__ == "__main__":
    main()
