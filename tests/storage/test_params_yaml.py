"""params.yaml is read with limits: a key given twice and an alias bomb are one-line errors."""

from __future__ import annotations

import copy

import pytest
import yaml
from click.testing import CliRunner
from conftest import TINY_PARAMS

from tailkit.cli import MESSAGE_CHARS, cli
from tailkit.errors import InvalidParameterError
from tailkit.storage.params_yaml import MAX_VALUES, read_params_yaml


def _bomb(levels: int) -> str:
    """The hostile probe's 1 KB file: each level a list of nine aliases of the one below."""
    lines = ["a0: &a0 [x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join([*lines, f"loss: *a{levels}"]) + "\n"


def test_anchors_and_aliases_still_share_settings():
    text = "optim: &sgd {name: sgd, lr: 0.1}\nexperiments:\n  a: {optimizer: *sgd}\n"
    assert read_params_yaml(text, "p.yaml")["experiments"]["a"]["optimizer"]["lr"] == 0.1


@pytest.mark.parametrize("levels", [7, 9])
def test_an_alias_bomb_is_refused_before_it_expands(levels):
    assert len(_bomb(levels)) < 1100
    with pytest.raises(InvalidParameterError) as info:
        read_params_yaml(_bomb(levels), "params.yaml")
    assert str(info.value).startswith(
        f"params.yaml: its YAML aliases expand to more than {MAX_VALUES:,} values"
    )


def test_a_small_expansion_passes():
    assert len(read_params_yaml(_bomb(3), "p")["loss"]) == 9  # 9^3 leaves: far below the limit


def test_a_key_given_twice_is_refused_naming_both_lines():
    text = "experiments:\n  softmax: {loss: softmax}\n  other: {loss: ldam}\n  softmax: {}\n"
    with pytest.raises(InvalidParameterError) as info:
        read_params_yaml(text, "params.yaml")
    assert str(info.value) == (
        "params.yaml:4: key 'softmax' is given twice (lines 2 and 4); DVC refuses such a file: "
        "keep one"
    )


def test_deep_nesting_is_one_line():
    with pytest.raises(InvalidParameterError, match="nested too deeply"):
        read_params_yaml("[" * 20_000 + "]" * 20_000, "p")


def test_a_huge_value_does_not_flood_the_terminal(tmp_path):
    raw = copy.deepcopy(TINY_PARAMS)
    raw["base"]["device"] = "x" * 200_000
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(cli, ["subsample", "--params", str(path)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert (
        line.startswith("Error: ")
        and "base.device" in line
        and "\n" not in line
        and len(line) < MESSAGE_CHARS + 100
        and "more characters" in line
    )
