"""The file behind a dataset's ``path`` is a dependency: editing it shows in ``dvc status``
after the fingerprint stage (which every repro runs first) and re-runs download."""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
from conftest import TINY_PARAMS, make_project, run

from tailkit.errors import InvalidParameterError
from tailkit.storage.file_hash import data_fingerprint


def test_a_files_hash_follows_its_content_and_is_cached_by_stat(tmp_path):
    data, cache = tmp_path / "rows.csv", tmp_path / "cache.json"
    data.write_text("a,b\n1,2\n")
    first = data_fingerprint({"name": "table", "path": str(data)}, cache)
    assert set(first) == {"path"} and len(json.loads(cache.read_text())) == 1
    assert data_fingerprint({"name": "table", "path": str(data)}, cache) == first
    data.write_text("a,b\n1,3\n")  # same size, new content
    second = data_fingerprint({"name": "table", "path": str(data)}, cache)
    assert second != first
    os.utime(data, ns=(1, 1))  # a touched file hashes again, to the same value
    assert data_fingerprint({"name": "table", "path": str(data)}, cache) == second


def test_a_folder_hashes_every_file_by_relative_path(tmp_path):
    folder = tmp_path / "xc"
    (folder / "sub").mkdir(parents=True)
    (folder / "train.txt").write_text("1 2 3\n")
    (folder / "sub" / "test.txt").write_text("4\n")
    first = data_fingerprint({"path": str(folder)}, None)["path"]
    (folder / "sub" / "test.txt").rename(folder / "test.txt")  # same bytes, other place
    assert data_fingerprint({"path": str(folder)}, None)["path"] != first
    assert data_fingerprint({"name": "synthetic"}, None) == {}
    with pytest.raises(InvalidParameterError, match=r"dataset.path: .*no such file"):
        data_fingerprint({"path": str(tmp_path / "missing.zip")}, None)


@pytest.mark.slow
def test_editing_the_data_file_reruns_download(tmp_path, monkeypatch):
    from test_studies import _eurlex_archive

    archive = _eurlex_archive(tmp_path)
    params = copy.deepcopy(TINY_PARAMS)
    params["dataset"] = {  # one label a row: the tiny project has single-label losses
        "name": "eurlex-4k",
        "path": str(archive),
        "check_stats": False,
        "single_label": True,
    }
    project = make_project(tmp_path / "project", params)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    run(["dvc", "repro", "download"], project, **env)
    assert json.loads(run(["dvc", "status", "--json", "download"], project, **env).stdout) == {}
    archive.write_bytes(archive.read_bytes() + b"\n")  # regenerated: other bytes, same path
    run([sys.executable, "-m", "tailkit", "fingerprint", "--quiet"], project, **env)
    status = json.loads(run(["dvc", "status", "--json", "download"], project, **env).stdout)
    assert "download" in status, status
