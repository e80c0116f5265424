"""tailkit/native/allocator.py: the ``tailkit`` command restarts itself with glibc's malloc set up so
that a freed large tensor's block is reused, without faulting its pages in again."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from tailkit.native.allocator import TUNABLES, tuned_environment

# A fresh 100 MB tensor, filled, freed, three times: the page faults of the last two.
PROBE = """
import json, resource, sys
from tailkit.native.restart import restart_with_settled_environment
restart_with_settled_environment()
import torch

def faults_of_a_fresh_tensor():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(25_000_000)
    x.fill_(1.0)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults_of_a_fresh_tensor()
print(json.dumps([faults_of_a_fresh_tensor(), faults_of_a_fresh_tensor()]))
"""
PAGES = 100e6 / 4096

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's tunables",
)


def _faults(**env: str) -> list[int]:
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc
def test_the_restarted_process_reuses_a_freed_large_block() -> None:
    assert all(f < 0.01 * PAGES for f in _faults())  # the same block, its pages mapped


@glibc
def test_tailkit_malloc_system_leaves_glibc_s_defaults() -> None:
    # glibc unmaps a block this large on free: every page is faulted in again each time
    assert all(f > 0.9 * PAGES for f in _faults(TAILKIT_MALLOC="system"))


@glibc
def test_the_tunables_are_added_once_to_what_the_user_set() -> None:
    env = tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert env is not None and env["HOME"] == "/h"
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.arena_max=2", *TUNABLES]
    assert tuned_environment(env) is None  # the restarted process does not restart again
    assert tuned_environment({"LD_PRELOAD": "libjemalloc.so.2"}) is None
    assert tuned_environment({"TAILKIT_MALLOC": "system"}) is None
