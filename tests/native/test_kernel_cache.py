"""numba's cache keyed by source content (tailkit/native/kernel_cache.py): a second clone of the same
code loads the first one's machine code; changed code, or a changed module it imports from,
is compiled again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tailkit.native.kernel_cache import source_stamp

KERNEL = """import numba

from tailkit.native import kernel_cache  # noqa: F401


@numba.njit(cache=True)
def double(x):
    return x * 2.0
"""

# Loads kmod.py from the package folder argv[1] (as if it were tailkit's), calls the kernel
# and prints its cache hits and misses.
LOAD = """
import importlib.util, pathlib, sys
import numpy as np
import tailkit.native.kernel_cache as kc
kc.PACKAGE = pathlib.Path(sys.argv[1]).resolve()
spec = importlib.util.spec_from_file_location("kmod", kc.PACKAGE / "kmod.py")
module = sys.modules["kmod"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.double(np.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
stats = module.double.stats
print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
"""


def _load(package: Path, cache_dir: Path) -> tuple[int, int]:
    env = os.environ | {"NUMBA_CACHE_DIR": str(cache_dir)}
    result = subprocess.run(
        [sys.executable, "-c", LOAD, str(package)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    hits, misses = result.stdout.split()
    return int(hits), int(misses)


def test_a_second_clone_of_the_same_code_loads_the_first_ones_kernels(tmp_path: Path) -> None:
    first = tmp_path / "clone-a" / "pkg"
    first.mkdir(parents=True)
    (first / "kmod.py").write_text(KERNEL)
    cache_dir = tmp_path / "cache"
    assert _load(first, cache_dir) == (0, 1)  # compiled
    assert _load(first, cache_dir) == (1, 0)  # numba's own behaviour: the same file hits

    second = tmp_path / "clone-b" / "pkg"
    shutil.copytree(first, second)
    os.utime(second / "kmod.py", (1, 1))  # another path, another mtime: numba's key misses
    assert _load(second, cache_dir) == (1, 0)

    (second / "kmod.py").write_text(KERNEL.replace("2.0", "2.0 + 0.0"))
    assert _load(second, cache_dir) == (0, 1)  # other code: compiled again


def test_the_stamp_covers_the_package_modules_a_kernel_imports_from(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    kernel = package / "kernels.py"
    kernel.write_text("from pkg.helpers import K\nimport numpy\n")
    (package / "helpers.py").write_text("K = 1\n")
    (package / "other.py").write_text("J = 1\n")
    before = source_stamp(kernel, package)
    source_stamp.cache_clear()
    (package / "other.py").write_text("J = 2\n")
    assert source_stamp(kernel, package) == before
    source_stamp.cache_clear()
    (package / "helpers.py").write_text("K = 2\n")
    assert source_stamp(kernel, package) != before


def test_kernels_use_the_content_cache_when_numba_was_imported_first(tmp_path: Path) -> None:
    """numba reads NUMBA_CACHE_DIR once, when it is imported; tailkit sets it at its own import.
    A script that imports numba first still gets the content-keyed cache under tailkit's
    directory, never numba's in-tree one (keyed on the file's mtime only, so stale after an
    edit to fastmath.py, and written into the package)."""
    script = (
        "import numba\n"
        "import tailkit.plugins.losses.pull_kernels as P\n"
        "print(type(P.pull_forward._cache._impl.locator).__name__, P.pull_forward._cache._cache_path)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    kind, path = result.stdout.split()
    assert kind == "ContentLocator"
    assert Path(path).is_relative_to(tmp_path / "tailkit")
