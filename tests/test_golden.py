"""The golden pipeline (tailkit/testing/golden.py) makes, under the pinned arithmetic, the very
bytes committed in tests/golden/hashes.json — on whatever x86-64 CPU runs the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tailkit.native.arithmetic import can_pin, cpu_flags, cpu_model, library_versions

GOLDEN = Path(__file__).parent / "golden" / "hashes.json"
#: The flags that tell CPU kinds apart, named when the bytes differ.
KIND_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


@pytest.mark.skipif(not can_pin(), reason="not an x86-64 CPU with AVX2 and FMA")
def test_the_golden_pipeline_makes_the_committed_bytes():
    golden = json.loads(GOLDEN.read_text())
    if golden["libraries"] != library_versions():
        pytest.skip(
            f"golden hashes made with {golden['libraries']}, this environment has "
            f"{library_versions()}: run `make golden` and commit it with the upgrade"
        )
    done = subprocess.run(
        [sys.executable, "-m", "tailkit.testing.golden"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    now = json.loads(done.stdout)
    assert now["arithmetic"]["mode"] == "portable", now["arithmetic"]
    differ = sorted(
        path
        for path in golden["hashes"].keys() | now["hashes"].keys()
        if golden["hashes"].get(path) != now["hashes"].get(path)
    )
    flags = " ".join(f for f in KIND_FLAGS if f in cpu_flags())
    assert not differ, (
        f"{len(differ)} golden output(s) differ on {cpu_model()} ({flags}) from those made on "
        f"{golden['made_on']}: {', '.join(differ)}"
    )
