"""The fingerprint stage runs before every repro: it reads the catalog's records and hashes
source files, and imports no component (nor torch) for a single-label study."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

PROBE = (
    "import sys; from tailkit.cli import cli; "
    "cli(['fingerprint', '--quiet'], standalone_mode=False); "
    "print('torch' in sys.modules, sorted(m for m in sys.modules "
    "if m.startswith('tailkit.plugins.') and m.count('.') == 3))"
)


def test_the_fingerprint_of_a_single_label_study_imports_no_torch(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "params.yaml", project / "params.yaml")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", PROBE],
            cwd=project,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    # the first run builds the catalog (every plugin imported), the second reads it back and
    # imports only the dataset it asks whether its rows are multi-label
    assert runs[0].startswith("True")
    assert runs[1] == "False ['tailkit.plugins.datasets.geonames']"
    written = sorted(p.relative_to(project).as_posix() for p in project.rglob("*.json"))
    assert "fingerprints/experiments/softmax.json" in written
