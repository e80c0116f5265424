"""One OpenMP runtime for torch and numba, not two competing for the same cores.

torch's wheel ships its own GNU OpenMP runtime (``torch/lib/libgomp.so.1``); numba's OpenMP
threading layer (``numba/np/ufunc/omppool``) asks the dynamic loader for ``libgomp.so.1.0.0``
by file name, which that library's soname (``libgomp.so.1``) does not answer, so the system's
libgomp is loaded beside torch's: two thread pools, each as wide as the machine. A compiled
loss kernel that follows a torch GEMM then starts while torch's workers still spin-wait for
their next region, and the reverse: on the 2-core machine the default GeoNames softmax's
training loop (GEMMs and the compiled cross-entropy, one after the other every step) took a
median 37.7 s with two runtimes and 33.7 s with one over seven alternating pairs (one runtime
faster in six; the model bytes identical). sampled-uniform (four pairs) and logit-adjusted
(three) did not separate from the shared machine's noise.

The loader reads ``LD_LIBRARY_PATH`` once, at process start, and a directory on it that holds
``libgomp.so.1.0.0`` (and ``libgomp.so.1``) as symbolic links to torch's library makes numba's
request resolve to the very file torch loaded (the loader recognises a file it already mapped),
so :func:`shared_openmp_environment` gives the environment for that, and the ``tailkit``
command's restart (:mod:`tailkit.native.restart`) starts with it. The
links live in tailkit's cache directory, outside the package. ``TAILKIT_OPENMP=separate``
leaves the runtimes apart; a torch without a bundled libgomp (another platform, another
OpenMP) is left alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from tailkit.paths import cache_dir

OPT_OUT = "TAILKIT_OPENMP"
#: The names under which a library may ask for GNU OpenMP: numba's omppool the first.
ALIASES = ("libgomp.so.1.0.0", "libgomp.so.1")


def torch_libgomp() -> Path | None:
    """torch's bundled GNU OpenMP runtime, found without importing torch; None if it has
    none."""
    if not sys.platform.startswith("linux"):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "lib" / "libgomp.so.1"
    return path if path.is_file() else None


def _alias_directory(target: Path) -> Path | None:
    """A directory whose :data:`ALIASES` link to ``target``, made if missing; None if it cannot
    be (a read-only cache directory)."""
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:12]
    directory = cache_dir() / f"openmp-{digest}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name in ALIASES:
            link = directory / name
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            staged = directory / f".{name}.{os.getpid()}"
            staged.unlink(missing_ok=True)
            staged.symlink_to(target)
            os.replace(staged, link)  # atomic: a concurrent stage sees the old or the new link
    except OSError:
        return None
    return directory


def shared_openmp_environment(environ: dict[str, str] | os._Environ[str]) -> dict[str, str] | None:
    """``environ`` with the alias directory first on ``LD_LIBRARY_PATH``; None where it is
    already there, the user opted out, or torch has no libgomp of its own."""
    if environ.get(OPT_OUT, "").lower() == "separate":
        return None
    target = torch_libgomp()
    if target is None:
        return None
    directory = _alias_directory(target)
    if directory is None:
        return None
    current = environ.get("LD_LIBRARY_PATH", "")
    if str(directory) in current.split(os.pathsep):
        return None
    return {**environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(directory), current]))}
