"""A plugin's import cannot silence tailkit: `--help` imports no plugin, and a plugin whose
import outlasts TAILKIT_SLOW_IMPORT_SECONDS is named on stderr while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import pathlib, time
pathlib.Path({marker!r}).write_text("imported")
time.sleep({sleep})
"""


def installed_probe(tmp_path: Path, sleep: float) -> tuple[dict[str, str], Path]:
    """A plugin distribution found through its dist-info on PYTHONPATH (no pip): importing it
    writes a marker file, then sleeps."""
    site, marker = tmp_path / "site", tmp_path / "imported"
    info = site / "slow_probe-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slow-probe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tailkit]\nslow-probe = slow_probe\n")
    (site / "slow_probe.py").write_text(PROBE.format(marker=str(marker), sleep=sleep))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # no catalog cached from another run
    }
    return env, marker


def tailkit(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tailkit", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_help_imports_no_plugin(tmp_path):
    env, marker = installed_probe(tmp_path, sleep=0)
    done = tailkit("--help", env=env)
    assert done.returncode == 0, done.stderr
    assert "verify" in done.stdout and "run by name" in done.stdout
    assert not marker.exists()


def test_a_slow_plugin_import_is_named_while_it_runs(tmp_path):
    env, marker = installed_probe(tmp_path, sleep=2)
    done = tailkit("plugins", env={**env, "TAILKIT_SLOW_IMPORT_SECONDS": "0.5"})
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    assert (
        "tailkit: still importing plugin 'slow-probe' (slow-probe 0.1, entry point "
        "slow-probe = slow_probe) after 0.5 s" in done.stderr
    )
    assert "slow-probe" in done.stdout


def test_a_quick_plugin_import_says_nothing(tmp_path):
    env, _ = installed_probe(tmp_path, sleep=0)
    done = tailkit("plugins", env=env)
    assert done.returncode == 0, done.stderr
    assert "still importing" not in done.stderr
