"""Which source files shape a component or a stage, and one hash of them.

DVC re-runs a stage when a declared dependency changes, so the code behind an output must be a
dependency at the granularity that shapes it: editing one loss must re-run the experiments that
use that loss and no others, and a third-party plugin's source (which lives in site-packages,
outside the repository) must count like a built-in's. The unit is a module's *import closure*:
the module itself and every module it imports by name, transitively, read statically from the
source (``ast``, nothing is executed), followed only inside the packages that ship the code
being fingerprinted (tailkit itself and the plugin's own top-level package; torch, numpy and
other libraries are versions of the environment, not code of the experiment).

A package's ``__init__`` counts only when it is imported as a module (``from tailkit import
Loss``), not merely because a submodule lives in it: the built-in plugin packages' ``__init__``
registers every loss by name, and counting it would tie every loss to all the others.
Bytecode and caches are never read: only ``.py`` files.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tailkit._moved import MOVED

CORE = "tailkit"


def _module_file(root: Path, name: str) -> Path | None:
    """The file of module ``name`` under ``root``; a moved module's old name gives the file
    it moved to (tailkit/_moved.py)."""
    name = MOVED.get(name, name)
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(module, names)`` of every import in ``path`` (lazy ones inside functions too):
    ``import a.b`` gives ``("a.b", ())``, ``from a import b, c`` gives ``("a", ("b", "c"))``."""
    return _parsed_imports(path.read_bytes(), str(path), module, path.name == "__init__.py")


# Keyed on the source bytes: the fingerprint stage follows ~30 closures that share most files,
# and parsing them again for each took 1.8 s; an edited file is parsed afresh.
@functools.lru_cache(maxsize=4096)
def _parsed_imports(
    source: bytes, filename: str, module: str, is_package: bool
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            found.append((base, tuple(alias.name for alias in node.names)))
    return tuple(found)


def _root(top: str) -> Path | None:
    """The directory that holds top-level package or module ``top`` (its sys.path entry)."""
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent
    return Path(spec.origin).parent if spec.origin and spec.origin.endswith(".py") else None


def import_closure(module: str, tops: Iterable[str] = (CORE,)) -> dict[str, Path]:
    """``{module name: file}`` of ``module`` and what it imports, within packages ``tops``."""
    roots = {top: _root(top) for top in {*tops, module.split(".")[0]}}

    def locate(name: str) -> Path | None:
        root = roots.get(name.split(".")[0])
        return None if root is None else _module_file(root, name)

    found: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in found or (path := locate(name)) is None:
            continue
        found[name] = path
        for base, names in _imports(path, name):
            submodules = [f"{base}.{n}" for n in names if locate(f"{base}.{n}") is not None]
            pending.extend(submodules)
            if len(submodules) < len(names) or not names:  # names from the package itself
                pending.append(base)
    return dict(sorted(found.items()))


def _relative(path: Path) -> str:
    """The path from the sys.path entry: the same on every machine and in every clone."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        parent = Path(*parts[:i])
        if not (parent / "__init__.py").is_file():
            return Path(*parts[i:]).as_posix()
    return path.as_posix()


def file_hashes(files: Iterable[Path]) -> dict[str, str]:
    return {
        _relative(f): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(files, key=_relative)
    }


def digest(hashes: dict[str, Any]) -> str:
    """One sha256 over a mapping of names to hashes (order-independent)."""
    h = hashlib.sha256()
    for key in sorted(hashes):
        h.update(f"{key}\0{hashes[key]}\n".encode())
    return h.hexdigest()


def asset_hashes(modules: Iterable[Path]) -> dict[str, str]:
    """The files of an ``assets/`` folder beside a module (the scripts and styles a page
    builder reads, not imports): code that shapes an output like the module itself."""
    out = {}
    for folder in sorted({m.parent / "assets" for m in modules}):
        if folder.is_dir():
            base = _relative(folder.parent / "__init__.py").rpartition("/")[0]
            for f in sorted(p for p in folder.iterdir() if p.is_file()):
                out[f"{base}/assets/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def module_fingerprint(module: str, *, plugins: bool = True) -> dict[str, Any]:
    """The files of ``module``'s closure in tailkit and their hashes (a stage's own code,
    with :func:`asset_hashes`); without ``plugins``, the closure leaves tailkit's plugin
    modules out."""
    closure = import_closure(module)
    paths = [
        path for name, path in closure.items() if plugins or not name.startswith(f"{CORE}.plugins.")
    ]
    files = file_hashes(paths) | asset_hashes(paths)
    return {"module": module, "files": dict(sorted(files.items())), "sha256": digest(files)}


def stage_code(stage: str) -> dict[str, Any]:
    """The core files that stage module ``tailkit.stages.<stage>`` imports, transitively, with
    their hashes: what ``fingerprints/stages/<stage>.json`` holds and the stage depends on.
    Plugin modules are left out: a component's code enters through its own fingerprint."""
    return module_fingerprint(f"{CORE}.stages.{stage}", plugins=False)


def tool_versions(requires: Iterable[str]) -> dict[str, str | None]:
    """``{distribution: version}`` of what a component declares in ``requires`` (the tool a
    wrapped model runs: its code shapes the result but lives outside any package we hash);
    None for one not installed."""
    out: dict[str, str | None] = {}
    for distribution in requires:
        try:
            out[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            out[distribution] = None
    return out


def component_fingerprint(component: Any) -> dict[str, Any]:
    """Name, distribution, version, factory and the hashes of the source files that define a
    registered component (:class:`tailkit.registry.Component`): its module's import closure
    within tailkit and within the plugin's own top-level package. Read from the record, so the
    component's module is not imported (the fingerprint stage runs without torch)."""
    module = component.origin.partition(":")[0]
    files = file_hashes(import_closure(module, tops=(CORE, module.split(".")[0])).values())
    record = {
        "name": component.name,
        "distribution": component.distribution,
        "version": component.version,
        "factory": component.origin,
        "files": files,
    }
    if tools := tool_versions(component.requires):
        record["requires"] = tools
    record["sha256"] = digest({k: v for k, v in record.items() if k != "files"} | files)
    return record


def experiment_code(params: Any, registry: Any, experiment: str) -> dict[str, Any]:
    """The fingerprints of an experiment's loss, model and sampler components, and one hash
    of all three: what ``train@<experiment>`` and ``evaluate@<experiment>`` depend on."""
    settings = params.resolved(experiment)
    specs = {"loss": ("losses", settings.loss), "model": ("models", settings.model)}
    if settings.loss is None:  # a model that trains itself has none
        del specs["loss"]
    if settings.sampler in params.samplers:
        specs["sampler"] = ("samplers", params.samplers[settings.sampler])
    out: dict[str, Any] = {}
    for role, (kind, spec) in specs.items():
        name = spec if isinstance(spec, str) else spec.get("name")
        out[role] = component_fingerprint(
            registry.get(kind, name, f"experiments.{experiment}.{role}")
        )
    out["sha256"] = digest({role: record["sha256"] for role, record in out.items()})
    return out
