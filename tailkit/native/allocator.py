"""glibc's malloc set up so that the large blocks torch frees are reused, not faulted in anew.

torch's CPU tensors come from ``posix_memalign``. glibc serves a block above its mmap threshold
(at most 32 MiB) by a fresh mmap and unmaps it on free, so a full-softmax step at C = 10^5 (a
512 × 10^5 logit matrix is 205 MB, and a step makes several) faults every page of every such
tensor in anew: a fresh 51 MB tensor took 16 ms to fill on this machine where an in-place pass
over an existing one took 2 ms. Three settings stop it: no mmap (``mmap_max=0``, every block on
the heap), no trimming of the heap's free top (``trim_threshold``), and no tcache and fastbins
(``tcache_count=0``, ``mxfast=0``): without the last two the small remainder that an aligned
allocation frees lands in a cache that never merges with its neighbours, so the next block of
the same size cannot reuse the freed one and the heap grows by a block a step. With the three,
the same block comes back, page faults and all: plain CE's step at C = 10^5 went from 520 to
314 ms (benchmarks/bench_losses.py, a 2-core AVX2 machine). A fourth asks for transparent huge
pages: the default GeoNames train stages ran 5–15 % faster with it (sampled-uniform 11.7–11.9 s
against 12.4–13.7 s, softmax 34.0 against 37.0 s, same peak RSS; a 2-core AVX2 machine). The
process keeps its peak footprint until it exits, which suits a stage. Nothing numeric changes.

glibc reads its tunables once, at process start, so the ``tailkit`` command's restart
(:mod:`tailkit.native.restart`, its first act) starts the same command again with
``GLIBC_TUNABLES`` set. ``TAILKIT_MALLOC=system`` leaves malloc as it is; so does a libc other than glibc, and a process
that preloads another allocator (``LD_PRELOAD``: jemalloc or tcmalloc, which need none of this).
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = (
    "glibc.malloc.mmap_max=0",
    "glibc.malloc.trim_threshold=4611686018427387904",  # 2^62 bytes: never trim
    "glibc.malloc.tcache_count=0",
    "glibc.malloc.mxfast=0",
    # Transparent huge pages for the heap (glibc ≥ 2.35; older ones ignore it): where the
    # kernel gives them on request only (``madvise``, the common default), the input table
    # of GeoNames' sparse model (830,909 × 128, and its Adagrad accumulator) is touched at
    # ~9,000 scattered rows a step, and 4 KiB pages make each a TLB miss.
    "glibc.malloc.hugetlb=1",
)
OPT_OUT = "TAILKIT_MALLOC"


def tuned_environment(environ: dict[str, str] | os._Environ[str]) -> dict[str, str] | None:
    """``environ`` with the tunables added to ``GLIBC_TUNABLES``; None where malloc is to be
    left alone or already has them (so a re-executed process does not start itself again)."""
    if environ.get(OPT_OUT, "").lower() == "system" or "LD_PRELOAD" in environ:
        return None
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if all(t in current.split(":") for t in TUNABLES):
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [current, *TUNABLES]))}
