"""The house rules that a reader relies on: a package root of at most 16 modules, imports that
run only downward through the layers, and reference docs and code that state what holds today
(dated measurements and machine names go to docs/notes/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
#: A session number, or a CPU model where a reader would take it for the current state.
DATED = re.compile(r"session [0-9]|xeon|epyc|emerald rapids|sapphire rapids", re.IGNORECASE)


def test_the_package_root_holds_the_face_the_seam_and_the_settings():
    modules = sorted(p.name for p in (ROOT / "tailkit").glob("*.py"))
    assert len(modules) <= 16, modules


def test_reference_docs_and_code_name_no_session_or_cpu_model():
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tailkit").rglob("*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DATED.search(line)
    ]
    assert not found, "\n".join(found)


#: tailkit's layers, lowest first: a module may import from its own layer and those below,
#: never from one above (docs/architecture.md, "Layers"). A prefix names a package or a module.
LAYERS = (
    (
        "tailkit.errors",
        "tailkit.progress",
        "tailkit.labels",
        "tailkit.sparse",
        "tailkit.csr",
        "tailkit.groups",
        "tailkit.validation",
        "tailkit.hookspecs",
        "tailkit.paths",
        "tailkit._moved",
    ),
    ("tailkit.storage", "tailkit.native"),
    ("tailkit.params",),
    ("tailkit.distributed",),
    ("tailkit.components", "tailkit.registry", "tailkit.catalog"),
    ("tailkit.output",),
    ("tailkit.evaluation",),
    ("tailkit.training",),
    ("tailkit.plugins",),
    ("tailkit.pipeline",),
    ("tailkit.reporting",),
    ("tailkit.stages",),
    # the contract kit's CLI reference reads the commands, so it sits beside the face
    ("tailkit.cli", "tailkit.__main__", "tailkit.testing", "tailkit"),
)


def _layer(module: str) -> int:
    """The layer of ``module``: that of the longest prefix naming it."""
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found is not None, f"{module} is in no layer of LAYERS"
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every tailkit import in ``path``, inside functions too: a deferred
    import is still a dependency."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "tailkit":
                # `from tailkit import hookspecs` imports the module, not the facade
                for alias in node.names:
                    named = f"{node.module}.{alias.name}"
                    where = ROOT.joinpath(*named.split("."))
                    is_module = where.is_dir() or where.with_suffix(".py").is_file()
                    out.append((node.lineno, named if is_module else node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("tailkit.")]
    return out


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = []
    for path in sorted((ROOT / "tailkit").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mine = _layer(module)
        for line, target in _imports(path):
            if _layer(target) > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert not upward, "\n".join(upward)


def test_the_layer_check_sees_an_upward_import():
    assert _layer("tailkit.output.optim") > _layer("tailkit.distributed.world")
    assert _layer("tailkit.pipeline.train_run") > _layer("tailkit.training.loop")
    assert _layer("tailkit.cli") == len(LAYERS) - 1 and _layer("tailkit.errors") == 0


def test_the_stages_that_read_and_write_tables_import_no_torch():
    """torch's import is a second of every process: the stages that fingerprint code, fetch,
    deal and featurize rows, and write the report import none of it (the lazy registry, the
    seam's torch modules apart in components/nn.py, scipy CSR checks in csr.py)."""
    import subprocess
    import sys

    stages = ("fingerprint", "download", "subsample", "featurize", "fit_sampler", "seeds", "report")
    probe = "; ".join(
        [
            "import sys",
            *(f"import tailkit.stages.{s}" for s in stages),
            "import tailkit.registry, tailkit.catalog, tailkit.components",
            "import tailkit.plugins.datasets.table, tailkit.plugins.datasets.xc",
            "print(sorted(m for m in ('torch', 'sympy', 'scipy.stats') if m in sys.modules))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "[]"
