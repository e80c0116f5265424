"""tailkit/_moved.py: a module that moved out of the package root keeps its old name for one
release, as the very same module, with a DeprecationWarning; code fingerprints follow it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tailkit._moved import MOVED, MOVED_NAMES
from tailkit.pipeline.codehash import import_closure

PACKAGE = Path(__file__).parents[1] / "tailkit"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    assert not (PACKAGE / f"{old.removeprefix('tailkit.').replace('.', '/')}.py").exists()
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        assert importlib.import_module(old) is new


@pytest.mark.parametrize(
    ("module", "name"), sorted((m, n) for m, names in MOVED_NAMES.items() for n in names)
)
def test_every_moved_name_is_the_new_object_with_a_warning(module, name):
    new = getattr(importlib.import_module(MOVED_NAMES[module][name]), name)
    assert name not in vars(importlib.import_module(module))
    with pytest.warns(DeprecationWarning, match=f"{module}.{name} moved to"):
        assert getattr(importlib.import_module(module), name) is new


def test_a_name_that_never_moved_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        importlib.import_module("tailkit.components").NoSuchName  # noqa: B018


def test_a_plugin_on_the_old_names_runs_and_its_fingerprint_holds_the_moved_file(
    tmp_path, monkeypatch
):
    package = tmp_path / "old_style_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from tailkit.atomic import write_json\nfrom tailkit import tensorfile\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    closure = import_closure("old_style_plugin", tops=("tailkit", "old_style_plugin"))
    files = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in closure.values()
        if path.is_relative_to(PACKAGE.parent)
    }
    assert {"tailkit/storage/atomic.py", "tailkit/storage/tensorfile.py"} <= files
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", "import old_style_plugin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "tailkit.atomic moved to tailkit.storage.atomic" in done.stderr
