"""The component catalog ``tailkit list``, ``plugins`` and ``options`` read: every component's
info record (:class:`tailkit.registry.Component`) as JSON, kept between runs.

Building the registry imports every component, and with them torch and scikit-learn: about
three seconds on a 2-core machine before a name is printed. The records change only when the
installed code does, so the first run writes them to ``$XDG_CACHE_HOME/tailkit/`` (default
``~/.cache/tailkit/``, never inside a project) under a key made of what can change them without
importing anything: every installed distribution and version, the entry points of the
``tailkit`` group, the size and modification time of every ``.py`` file of the packages those
entry points live in (tailkit's own, for its built-ins and their base classes), the Python
version and ``TAILKIT_LOAD_PLUGINS``. A later run with the same key reads the JSON instead.

The cache is skipped, and the registry built, when a plugin fails to load (its warning must
show on every run), when a component's code lies outside the packages the key follows (it
could move unseen), and under ``TAILKIT_TRACE_PLUGINS=1``. :func:`tailkit.registry.get_registry`
builds the registry from these records when they are current: a record names where its factory
is (``reference``, "module:qualname"), which is imported when the component is built.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tailkit import hookspecs
from tailkit.paths import cache_dir

#: Bumped when the cached JSON's layout changes, so an old file is never misread.
FORMAT = 2


@dataclass(frozen=True)
class Catalog:
    """The plugins (``Registry.report()``) and components (``Component.info()``) of a registry."""

    plugins: list[dict[str, Any]]
    components: list[dict[str, Any]]


def _package_files(module: str) -> Iterator[Path]:
    """The ``.py`` files of the top-level package (or module) ``module`` belongs to, found
    without importing it."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None:
        return
    if spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            for root, dirs, files in os.walk(location):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                yield from (Path(root, f) for f in sorted(files) if f.endswith(".py"))
    elif spec.origin:
        yield Path(spec.origin)


def catalog_key() -> str:
    """A digest of everything that can change an info record (module docstring)."""
    digest = hashlib.sha256(f"{FORMAT} {sys.version}".encode())
    digest.update(os.environ.get("TAILKIT_LOAD_PLUGINS", "\0").encode())
    dists = sorted(
        (d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()
    )
    digest.update(json.dumps(dists).encode())
    from tailkit import registry  # through the module: a test's patched entry points count

    points = sorted((ep.name, ep.value) for ep in registry._entry_points(hookspecs.PROJECT))
    digest.update(json.dumps(points).encode())
    for top in sorted(_keyed_packages(points)):
        for path in _package_files(top):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def _keyed_packages(points: list[tuple[str, str]]) -> set[str]:
    """The top-level packages whose files the key follows: tailkit's and the entry points'."""
    return {value.split(":")[0].split(".")[0] for _, value in points} | {"tailkit"}


def _from_registry() -> tuple[Catalog, bool]:
    """The catalog of the process-wide registry, and whether it may be cached: every plugin
    loaded, and every component's code lies in a package the key follows (a plugin that
    registers a class of another package, edited in place, would otherwise keep a stale
    record of where that class is)."""
    from tailkit import registry as registry_module
    from tailkit.registry import KINDS, full_registry

    registry = full_registry()
    components = [c for kind in KINDS for c in registry.components(kind)]
    catalog = Catalog(plugins=registry.report(), components=[c.info() for c in components])
    points = [(ep.name, ep.value) for ep in registry_module._entry_points(hookspecs.PROJECT)]
    keyed = _keyed_packages(points)
    followed = all(c.origin.partition(":")[0].split(".")[0] in keyed for c in components)
    return catalog, followed and not any(r.error for r in registry.plugins.values())


def read_or_build() -> tuple[Catalog, bool]:
    """The catalog, and whether it was read back: from the cache when its key matches, else
    built and (when it may be) cached. Under ``TAILKIT_TRACE_PLUGINS`` it is always built and
    never cached: the trace must see every hook called."""
    if os.environ.get("TAILKIT_TRACE_PLUGINS"):
        return _from_registry()[0], False
    # the key once, of the code before any build: a file saved while the build imports gives
    # another key, and these records are not filed under it
    path = cache_dir() / f"catalog-{catalog_key()}.json"
    try:
        data = json.loads(path.read_text())
        return Catalog(plugins=data["plugins"], components=data["components"]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or from another layout: rebuild
    catalog, clean = _from_registry()
    if clean:
        _write(path, {"plugins": catalog.plugins, "components": catalog.components})
    return catalog, False


def load_catalog() -> Catalog:
    """The catalog, from the cache when its key matches, else built (:func:`read_or_build`)."""
    return read_or_build()[0]


#: Catalogs kept beside the newest: one per environment or project copy in use (two
#: virtual environments, a test's copy of the package), so that they do not evict each other.
KEEP = 8


def _write(path: Path, data: dict[str, Any]) -> None:
    """Best effort: a read-only home only costs the next run its speed. Written by rename, so
    a stage reading it meanwhile sees the whole file or none; the oldest others are removed."""
    from tailkit.storage.atomic import write_json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, data)
        others = [p for p in path.parent.glob("catalog-*.json") if p != path]
        for old in sorted(others, key=_modified)[: max(len(others) - KEEP, 0)]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def records(catalog: Catalog, kind: str) -> dict[str, MappingProxyType[str, Any]]:
    """Name and alias → record, for one kind ("losses", ...), read-only."""
    from tailkit.registry import SINGULAR

    out: dict[str, MappingProxyType[str, Any]] = {}
    for info in catalog.components:
        if info["kind"] == SINGULAR[kind]:
            for key in (info["name"], *info["aliases"]):
                out[key] = MappingProxyType(info)
    return out
