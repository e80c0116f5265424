"""Outputs get the user's umask, not a temporary's private 0600/0700 (a shared project's
other members must read the metrics and reports)."""

from __future__ import annotations

import os
import stat

import pytest

from tailkit.storage import atomic
from tailkit.storage.atomic import atomic_dir, atomic_path, write_json


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_files_and_folders_follow_the_umask(tmp_path, monkeypatch, mask):
    monkeypatch.setattr(atomic, "_UMASK", None)
    old = os.umask(mask)
    try:
        write_json(tmp_path / "metrics.json", {"a": 1})
        with atomic_path(tmp_path / "curve.tsv") as tmp:
            tmp.write_text("step\n")
        with atomic_dir(tmp_path / "model") as tmp:
            (tmp / "model.json").write_text("{}")
    finally:
        os.umask(old)
    for name in ("metrics.json", "curve.tsv", "model/model.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o777 & ~mask
