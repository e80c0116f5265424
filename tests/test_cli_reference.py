"""docs/cli.md is the commands' own --help (tailkit/testing/cli_reference.py): regenerate it
with `make cli-docs` when a command changes."""

from __future__ import annotations

from pathlib import Path

from tailkit.cli import cli
from tailkit.testing.cli_reference import built_in_commands, render

DOC = Path(__file__).parents[1] / "docs" / "cli.md"


def test_the_reference_is_what_the_commands_say():
    assert DOC.read_text() == render(), "docs/cli.md is stale: run `make cli-docs`"


def test_every_built_in_command_has_a_section():
    text = DOC.read_text()
    names = built_in_commands(cli)
    assert {"train", "evaluate", "verify", "compare", "repro"} <= set(names)
    for name in names:
        assert f"\n## tailkit {name}\n" in text
        assert f"Usage: tailkit {name} [OPTIONS]" in text
