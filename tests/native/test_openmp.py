"""tailkit/native/openmp.py: the ``tailkit`` command's restart makes numba's OpenMP layer use the
runtime torch ships, so one thread pool serves both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailkit.native.openmp import ALIASES, OPT_OUT, shared_openmp_environment, torch_libgomp

BUNDLED = torch_libgomp()
needs_bundled = pytest.mark.skipif(
    BUNDLED is None, reason="torch has no bundled GNU OpenMP runtime here"
)

# After the restart: a numba prange kernel run after a torch op; which libgomp files are mapped.
PROBE = """
import json, os
from tailkit.native.restart import restart_with_settled_environment
restart_with_settled_environment()
import numba, numpy as np, torch

torch.ones(1000) @ torch.ones(1000)

@numba.njit(parallel=True)
def total(a):
    s = 0.0
    for i in numba.prange(a.shape[0]):
        s += a[i]
    return s

total(np.ones(100))
with open("/proc/self/maps") as maps:
    files = {line.split()[-1] for line in maps if "libgomp" in line.split()[-1]}
print(json.dumps({"files": sorted(os.path.realpath(f) for f in files),
                  "layer": numba.threading_layer()}))
"""


def _probe(tmp_path: Path, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", OPT_OUT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, "XDG_CACHE_HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@needs_bundled
def test_numba_and_torch_share_torch_s_openmp_runtime(tmp_path) -> None:
    seen = _probe(tmp_path)
    assert seen["layer"] == "omp"
    assert seen["files"] == [os.path.realpath(str(BUNDLED))]


@needs_bundled
def test_opting_out_leaves_numba_its_own_runtime(tmp_path) -> None:
    seen = _probe(tmp_path, **{OPT_OUT: "separate"})
    assert os.path.realpath(str(BUNDLED)) in seen["files"]
    if seen["layer"] == "omp":  # numba found a libgomp of its own (the system's): two runtimes
        assert len(seen["files"]) == 2


@needs_bundled
def test_the_directory_is_added_once_before_what_the_user_set(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = shared_openmp_environment({"LD_LIBRARY_PATH": "/opt/lib", "HOME": "/h"})
    assert env is not None and env["HOME"] == "/h"
    first, rest = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert rest == "/opt/lib" and Path(first).parent == tmp_path / "tailkit"
    assert BUNDLED is not None
    for name in ALIASES:
        assert (Path(first) / name).resolve() == BUNDLED.resolve()
    assert shared_openmp_environment(env) is None  # the restarted process does not restart
    assert shared_openmp_environment({OPT_OUT: "separate"}) is None
