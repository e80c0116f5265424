"""params.yaml read the way DVC reads it, with limits: no duplicate key, bounded aliases.

PyYAML keeps the last of two equal keys without a word, where DVC refuses the file: tailkit
would train one definition while DVC's `params:` tracking saw another. A key given twice is
refused here, naming both lines.

Anchors and aliases are fine (a study shares one optimiser block between experiments), but
nine levels of ``&aN [*aN-1 ×9]`` make a 1 KB file stand for 9^9 values: every walk over the
settings (validation, a message that prints a value, DVC's own rendering) expands it. The
composed graph is measured with each shared node counted once per use before anything else
reads it, and refused above :data:`MAX_VALUES`.
"""

from __future__ import annotations

from typing import Any

import yaml

from tailkit.errors import InvalidParameterError

#: The most values (scalars, lists and mappings) a params file may stand for once its aliases
#: are expanded: the largest study holds about a thousand.
MAX_VALUES = 100_000


def read_params_yaml(text: str, source: str) -> Any:
    """The Python value of a params file's ``text``; ``source`` names it in every error."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded_size(node, {})
        if values > MAX_VALUES:
            raise InvalidParameterError(
                f"{source}: its YAML aliases expand to {_at_least(values)} values (at most "
                f"{MAX_VALUES:,}); write the repeated settings out or share fewer levels"
            )
        loader.source = source
        return loader.construct_document(node)
    except RecursionError as exc:
        raise InvalidParameterError(f"{source}: YAML nested too deeply to read") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InvalidParameterError(f"{where}: invalid YAML: {problem}") from exc
    finally:
        loader.dispose()


class _Loader(yaml.SafeLoader):
    source = "params.yaml"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise InvalidParameterError(
                    f"{self.source}:{line}: key {shortened(key)} is given twice (lines "
                    f"{seen[key]} and {line}); DVC refuses such a file: keep one"
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias expanded, stopping early once
    past the limit; each shared node is measured once (``memo``), so the cost is the file's."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = MAX_VALUES + 1  # a cycle (a node inside itself) is over any limit
    size = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    for child in children:
        size += _expanded_size(child, memo)
        if size > MAX_VALUES:
            break
    memo[id(node)] = size
    return size


def _at_least(values: int) -> str:
    return f"more than {MAX_VALUES:,}" if values > MAX_VALUES else f"{values:,}"


def shortened(value: Any) -> str:
    """``repr(value)``, cut at 100 characters: a value pasted into a message stays short."""
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "…"
