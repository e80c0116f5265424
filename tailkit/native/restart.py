"""The ``tailkit`` command's first act: start again with the environment its libraries read
once, at load time.

glibc reads its malloc tunables at process start (:mod:`tailkit.native.allocator`), the
dynamic loader its library path (:mod:`tailkit.native.openmp`), and MKL, ATen, oneDNN, numba,
OpenBLAS and numpy their kernel choices when they load (:mod:`tailkit.native.arithmetic`). So
the command computes the environment they need and, where it differs from the one it was
started with, replaces itself by the same command under it: what ran so far runs again, which
is why this comes before the CLI's imports.
"""

from __future__ import annotations

import os
import sys

from tailkit.native.allocator import tuned_environment
from tailkit.native.arithmetic import pinned_environment
from tailkit.native.openmp import shared_openmp_environment


def settled_environment(environ: dict[str, str] | os._Environ[str]) -> dict[str, str] | None:
    """``environ`` with malloc tuned, one OpenMP runtime and the arithmetic pinned; None where
    it already has all three (or each is to be left alone)."""
    changed = False
    current: dict[str, str] | os._Environ[str] = environ
    for settle in (tuned_environment, shared_openmp_environment, pinned_environment):
        settled = settle(current)
        if settled is not None:
            current, changed = settled, True
    return dict(current) if changed else None


def restart_with_settled_environment() -> None:
    """Replace this process by the same command under :func:`settled_environment`, unless it
    already runs under it. A bad ``TAILKIT_ISA`` ends the command with one line."""
    try:
        env = settled_environment(os.environ)
    except ValueError as error:
        sys.exit(f"Error: {error}")
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
