"""A symbolic link among the outputs is refused before DVC follows it (it once made the
folder a link pointed to world-writable)."""

from __future__ import annotations

import copy
import stat

import pytest
from conftest import TINY_PARAMS, make_project, run

from tailkit.errors import DataValidationError
from tailkit.storage.linked_outputs import linked_outputs, refuse_linked_outputs


def test_links_are_found_but_dvc_cache_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "project"
    (root / "data" / "models").mkdir(parents=True)
    (root / "data" / "models" / "softmax").symlink_to(outside)
    (root / "plots" / "eval").mkdir(parents=True)
    (root / ".dvc" / "cache" / "files").mkdir(parents=True)
    (root / ".dvc" / "cache" / "files" / "ab").write_text("x")
    (root / "plots" / "eval" / "curve.tsv").symlink_to(root / ".dvc" / "cache" / "files" / "ab")
    assert linked_outputs(root) == [root / "data" / "models" / "softmax"]
    with pytest.raises(DataValidationError) as info:
        refuse_linked_outputs(root)
    assert str(info.value).startswith(f"data/models/softmax is a symbolic link (to {outside})")
    assert linked_outputs(tmp_path / "none") == []


@pytest.mark.slow
def test_dvc_repro_stops_before_it_follows_a_linked_output(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "keep.txt").write_text("mine")
    params = copy.deepcopy(TINY_PARAMS)
    params["experiments"] = {"softmax": params["experiments"]["softmax"]}
    project = make_project(tmp_path / "project", params)
    (project / "data" / "models").mkdir(parents=True)
    (project / "data" / "models" / "softmax").symlink_to(outside)
    result = run(["dvc", "repro"], project, check=False)
    assert result.returncode != 0
    assert "data/models/softmax is a symbolic link" in result.stdout + result.stderr
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755
    assert (outside / "keep.txt").read_text() == "mine"
