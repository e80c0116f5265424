"""docs/cli.md, generated from the commands' own ``--help``: the reference cannot drift from
the code, because tests/test_cli_reference.py compares the file with :func:`render`.

``python -m tailkit.testing.cli_reference --write docs/cli.md`` (``make cli-docs``) rewrites it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

WIDTH = 96
HEADER = """# Command reference

Every `tailkit` command with its `--help`, generated from the code
(`make cli-docs`; `tests/test_cli_reference.py` fails when this file and the code disagree).
Plugins may add commands of their own (`register_commands`); they run by name.
"""


def built_in_commands(group: click.Group) -> list[str]:
    """The commands tailkit itself defines (not those a plugin registered), sorted."""
    return sorted(
        name
        for name, command in group.commands.items()
        if (getattr(command.callback, "__module__", "") or "").startswith("tailkit.")
    )


def render() -> str:
    from tailkit.cli import cli

    root = click.Context(cli, info_name="tailkit", terminal_width=WIDTH, max_content_width=WIDTH)
    parts = [HEADER, "| command | what it does |", "|---|---|"]
    parts += [
        f"| [`{name}`](#tailkit-{name}) | {cli.commands[name].get_short_help_str(limit=200)} |"
        for name in built_in_commands(cli)
    ]
    for name in built_in_commands(cli):
        command = cli.commands[name]
        ctx = click.Context(
            command, info_name=name, parent=root, terminal_width=WIDTH, max_content_width=WIDTH
        )
        parts += ["", f"## tailkit {name}", "", "```", command.get_help(ctx), "```"]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailkit.testing.cli_reference")
    parser.add_argument("--write", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    text = render()
    if args.write is None:
        sys.stdout.write(text)
    else:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
