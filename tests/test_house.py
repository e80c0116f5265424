"""The house rules that a reader relies on: a package root of at most 16 modules, and reference
docs and code that state what holds today (dated measurements and machine names go to
docs/notes/)."""

from __future__ import annotations

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
