"""numba's compiled-kernel cache keyed by source content, not by file path and modification time.

numba names a cached kernel after its file's absolute path and checks it against the file's
modification time, so every clone of the repository (another path, fresh times) and every
branch switch compiles every kernel again: about 50 s of a fresh clone's ``make repro`` on the
2-core machine (the tree fit 17 s, the tree's scoring kernels 14 s), and as much again in each
CI run. Here a tailkit kernel's entry is named after its module's place inside the package and
stamped with a hash of that module's source and of the tailkit modules it imports names from
(``multilabel_kernels`` calls ``softmax_kernels``' helpers); ``fastmath.py``, whose helpers
every kernel inlines, already names the whole cache directory (``tailkit/__init__.py``). The
same code finds its machine code from any clone; changed code has another stamp and is
compiled again, as before.

Every module that defines ``cache=True`` kernels imports this one first: numba picks a
kernel's cache locator when the decorator runs. The locator goes first in
``CacheImpl._locator_classes``, the list numba tries its own locators from (user-provided
directory, in-tree, user-wide, IPython); a file outside the package falls through to them.
"""

from __future__ import annotations

import ast
import hashlib
import os
from functools import cache
from pathlib import Path

from numba.core import caching, config
from numba.core.caching import _CacheLocator

PACKAGE = Path(__file__).resolve().parents[1]  # tailkit/


def _imported_modules(source: bytes, package: Path) -> list[Path]:
    """Files of the tailkit modules that ``from tailkit.x import ...`` lines name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        top, *parts = node.module.split(".")
        if top != package.name:
            continue
        base = package.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                found.add(candidate)
                break
    return sorted(found)


@cache
def source_stamp(py_file: Path, package: Path = PACKAGE) -> str:
    """Hash of a kernel module's source and of the tailkit modules it imports from."""
    source = py_file.read_bytes()
    digest = hashlib.sha256(source)
    for dependency in _imported_modules(source, package):
        digest.update(dependency.relative_to(package).as_posix().encode())
        digest.update(dependency.read_bytes())
    return digest.hexdigest()


def _cache_dir() -> str:
    """``NUMBA_CACHE_DIR`` as numba read it, or as tailkit/__init__.py set it after numba had
    read the environment: a script that imports numba before tailkit must not fall back to
    numba's in-tree cache, which is keyed on a kernel file's path and modification time
    alone, so an edit to the helpers it inlines (fastmath.py) served stale machine code, and
    which writes into the package. "" when neither is set."""
    return getattr(config, "CACHE_DIR", "") or os.environ.get("NUMBA_CACHE_DIR", "")


class ContentLocator(_CacheLocator):
    """Cache entries under ``$NUMBA_CACHE_DIR/by-content/<module's folder in the package>``,
    valid while the module's source stamp is unchanged."""

    def __init__(self, py_func, py_file: Path, package: Path) -> None:
        self._lineno = py_func.__code__.co_firstlineno
        folder = py_file.parent.relative_to(package)
        self._cache_path = os.path.join(_cache_dir(), "by-content", *folder.parts)
        self._stamp = source_stamp(py_file, package)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        return self._stamp

    def get_disambiguator(self) -> str:
        return str(self._lineno)  # as numba's own: two kernels of one name in one module

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _cache_dir():
            return None
        path = Path(py_file).resolve()
        if not path.is_relative_to(PACKAGE):
            return None
        return cls(py_func, path, PACKAGE)


# numba 0.68 calls the class CacheImpl, earlier releases _CacheImpl
_locators = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")  # noqa: B009
if ContentLocator not in _locators._locator_classes:
    _locators._locator_classes.insert(0, ContentLocator)
