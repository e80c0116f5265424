"""A temporary that a killed stage leaves beside its output (inside another stage's folder
dependency) changes no dependency hash: .dvcignore hides tailkit's temporaries from DVC."""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT, run


@pytest.mark.slow
def test_a_left_temporary_changes_no_dependency(tmp_path):
    shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    (tmp_path / "data" / "features" / "rff").mkdir(parents=True)
    (tmp_path / "data" / "features" / "rff" / "train.parquet").write_bytes(b"rows")
    run(["git", "init", "-q"], tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    run(["dvc", "stage", "add", "-q", "-n", "fit", "-d", "data/features", "-o", "out",
         "echo fitted > out"], tmp_path)  # fmt: skip
    run(["dvc", "repro", "-q"], tmp_path)
    left = tmp_path / "data" / "features" / ".rff.4242.1a2b3c4d.tmp"  # a kill -9's leftover
    left.mkdir()
    (left / "train.parquet").write_bytes(b"half a file")
    (tmp_path / "data" / "features" / ".meta.json.4242.9f8e7d6c.tmp").write_text("{")
    status = run(["dvc", "status"], tmp_path).stdout
    assert "up to date" in status, status
