"""Code as a dependency at the granularity of a component (tailkit/pipeline/codehash.py, dvc.yaml)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tailkit.pipeline import codehash
from tailkit.registry import make_registry

ROOT = Path(__file__).parents[2]
STAGE_MODULES = {
    "download": "download",
    "subsample": "subsample",
    "featurize": "featurize",
    "fit-sampler": "fit_sampler",
    "no-sampler": "fit_sampler",
    "train": "train",
    "evaluate": "evaluate",
    "train-decoupled": "train_decoupled",
    "train-decoupled-seed": "train_decoupled",
    "evaluate-decoupled-seed": "evaluate",
    "evaluate-decoupled": "evaluate",
    "train-seed": "train",
    "evaluate-seed": "evaluate",
    "seeds": "seeds",
    "report": "report",
}


def _core_closure(stage_module: str) -> set[str]:
    """The closure's module files, and the files of an ``assets/`` folder beside one of them
    (the page scripts the report reads)."""
    closure = codehash.import_closure(f"tailkit.stages.{stage_module}")
    files = set()
    for name in closure:
        if not name.startswith("tailkit.plugins."):
            base = name.replace(".", "/")
            package = ROOT / base / "__init__.py"
            files.add(f"{base}/__init__.py" if package.is_file() else f"{base}.py")
    folders = {(ROOT / f).parent / "assets" for f in files}
    assets = {p.relative_to(ROOT).as_posix() for d in folders if d.is_dir() for p in d.iterdir()}
    return files | assets


@pytest.mark.parametrize("stage", sorted(STAGE_MODULES))
def test_each_stage_depends_on_exactly_the_core_modules_it_imports(stage):
    """Neither too broad (a folder, another stage's module) nor too narrow (a module the stage
    imports but does not declare): the stage depends on its module's fingerprint file, which
    holds exactly the stage's import closure outside the plugins, and on no code directly."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]
    deps = (spec.get("do") or spec)["deps"]
    assert not any(d.startswith("tailkit") for d in deps)
    module = STAGE_MODULES[stage]
    assert f"fingerprints/stages/{module}.json" in deps
    record = codehash.stage_code(module)
    assert set(record["files"]) == _core_closure(module)
    if stage == "report":  # the page's scripts shape reports/index.html: editing one re-runs it
        assert "tailkit/reporting/html/assets/study.js" in record["files"]
    assert record["module"] == f"tailkit.stages.{module}"
    # built-in components come in through their fingerprints, like third-party ones
    assert not any(f.startswith("tailkit/plugins") for f in record["files"])


def test_the_fingerprint_stage_writes_every_stage_modules_closure(tmp_path):
    """Every stage module gets its file (a new stage module gets one without a list to edit),
    holding its closure's hashes and the arithmetic's mode."""
    from tailkit.native.arithmetic import arithmetic_record
    from tailkit.params import load_params
    from tailkit.paths import Layout
    from tailkit.stages import fingerprint

    assert set(fingerprint.stage_modules()) == set(STAGE_MODULES.values())
    fingerprint.run(load_params(ROOT / "params.yaml"), Layout(tmp_path), make_registry())
    for module in fingerprint.stage_modules():
        written = json.loads((tmp_path / "fingerprints" / "stages" / f"{module}.json").read_text())
        assert written == {**codehash.stage_code(module), "arithmetic": arithmetic_record()}
        assert written["sha256"] == codehash.digest(written["files"])


@pytest.mark.parametrize("stage", sorted(STAGE_MODULES))
def test_no_stage_imports_another_stage(stage):
    stages = {n for n in codehash.import_closure(f"tailkit.stages.{STAGE_MODULES[stage]}")}
    assert {n for n in stages if n.startswith("tailkit.stages.")} == {
        f"tailkit.stages.{STAGE_MODULES[stage]}"
    }


def _package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_import_closure_follows_names_not_folders(tmp_path, monkeypatch):
    """a imports b (relative), b imports c lazily; d is a sibling nobody imports; the package
    __init__ (which would name every module) counts only when imported as a module."""
    _package(
        tmp_path,
        {
            "pkgx/__init__.py": "from pkgx import a, d\n",
            "pkgx/a.py": "from .b import thing\nimport numpy\n",
            "pkgx/b.py": "def thing():\n    from pkgx.sub import c\n    return c\n",
            "pkgx/sub/__init__.py": "",
            "pkgx/sub/c.py": "X = 1\n",
            "pkgx/d.py": "Y = 2\n",
            "pkgx/e.py": "from pkgx import VALUE\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(codehash.import_closure("pkgx.a", tops=("pkgx",))) == {
        "pkgx.a",
        "pkgx.b",
        "pkgx.sub.c",
    }
    # `from pkgx import VALUE` reads the package's __init__, and so what it imports
    assert set(codehash.import_closure("pkgx.e", tops=("pkgx",))) == {
        "pkgx.e",
        "pkgx",
        "pkgx.a",
        "pkgx.b",
        "pkgx.d",
        "pkgx.sub.c",
    }


class _Component:
    def __init__(self, factory, name="thing"):
        self.name, self.origin = name, f"{factory.__module__}:{factory.__qualname__}"
        self.distribution, self.version, self.requires = "pkgy", "1.0", ()


def test_component_fingerprint_moves_with_its_own_code_only(tmp_path, monkeypatch):
    _package(
        tmp_path,
        {
            "pkgy/__init__.py": "",
            "pkgy/loss.py": "from pkgy.helper import h\nclass Loss:\n    pass\n",
            "pkgy/helper.py": "def h():\n    return 1\n",
            "pkgy/other.py": "class Other:\n    pass\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import pkgy.loss

    def fingerprint():
        return codehash.component_fingerprint(_Component(pkgy.loss.Loss))

    before = fingerprint()
    assert set(before["files"]) == {"pkgy/loss.py", "pkgy/helper.py"}
    assert before["factory"] == "pkgy.loss:Loss"
    (tmp_path / "pkgy" / "other.py").write_text("class Other:\n    '''edited'''\n")
    assert fingerprint() == before
    (tmp_path / "pkgy" / "helper.py").write_text("def h():\n    return 2\n")
    after = fingerprint()
    assert after["sha256"] != before["sha256"]
    assert after["files"]["pkgy/loss.py"] == before["files"]["pkgy/loss.py"]
    sys.modules.pop("pkgy.loss", None)
    sys.modules.pop("pkgy", None)


def test_builtin_losses_do_not_share_each_others_source():
    """Editing one built-in loss must not re-run another's experiments: no loss's closure
    holds another loss's module unless it imports it (ELM builds on logit adjustment)."""
    registry = make_registry()
    closures = {
        c.name: set(codehash.component_fingerprint(c)["files"])
        for c in registry.components("losses")
    }
    softmax_file = "tailkit/plugins/losses/softmax.py"
    assert softmax_file in closures["softmax"]
    assert softmax_file not in closures["negative-sampling"]
    assert "tailkit/plugins/losses/__init__.py" not in closures["softmax"]
    assert "tailkit/plugins/losses/logit_adjusted.py" in closures["elm"]
