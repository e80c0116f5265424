"""Outputs are never symbolic links: DVC follows one when it clears an output before a stage.

With ``data/models/softmax`` a link to a folder elsewhere, ``dvc repro`` fails to remove the
link and its permission handler makes the folder it points to world-writable (0777). The
fingerprint stage, which every ``dvc repro`` and ``tailkit repro`` runs before any other,
refuses such a link in one line before DVC reaches the stage that owns it. (``dvc repro -s
<stage>`` skips the fingerprint stage, and DVC clears that stage's outputs before its command
runs: nothing inside the project can stop that case.)
"""

from __future__ import annotations

import os
from pathlib import Path

from tailkit.errors import DataValidationError

#: The folders that hold DVC outputs, and how deep an output lies in them
#: (data/models/<experiment>, plots/eval/<experiment>, metrics/timings/train/<x>.json).
OUTPUT_FOLDERS = {"data": 3, "metrics": 3, "plots": 2, "reports": 2, "fingerprints": 2}


def linked_outputs(root: Path) -> list[Path]:
    """Symbolic links among the output folders and their entries, down to each folder's
    depth, but those into DVC's own cache (``cache.type: symlink`` checks files out so);
    none is followed."""
    found: list[Path] = []
    for name, depth in OUTPUT_FOLDERS.items():
        top = root / name
        if top.is_symlink():
            found.append(top)
        elif top.is_dir():
            _walk(top, depth, found)
    cache = (root / ".dvc" / "cache").resolve()
    return [link for link in found if not link.resolve().is_relative_to(cache)]


def _walk(folder: Path, depth: int, found: list[Path]) -> None:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in sorted(entries, key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_symlink():
            found.append(path)
        elif depth > 1 and entry.is_dir(follow_symlinks=False):
            _walk(path, depth - 1, found)


def refuse_linked_outputs(root: Path) -> None:
    links = linked_outputs(root)
    if links:
        first = links[0]
        raise DataValidationError(
            f"{first.relative_to(root)} is a symbolic link (to {os.readlink(first)}): DVC would "
            "follow it when it clears the output and change what it points to; replace it "
            "with a folder or file of its own"
            + (f" ({len(links) - 1} more links)" if links[1:] else "")
        )
