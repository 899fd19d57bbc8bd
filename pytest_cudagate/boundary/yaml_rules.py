"""The boundary's rules for YAML (suite files): no aliases or anchors, no duplicate keys, bounded
nesting and integer digits; every problem a :class:`FileError` with the line."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pytest_cudagate.boundary import MAX_DEPTH, MAX_INT_DIGITS, refuse
from pytest_cudagate.errors import FileError

# libyaml when present: the pure-Python parser needs seconds for a large file.
_FastLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(yaml.constructor.ConstructorError):
    """Well-formed YAML that breaks one of the boundary's rules."""


class StrictLoader(_FastLoader):
    """SafeLoader that refuses duplicate keys and integers with too many digits (before int() runs)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            if key in seen:
                raise _Refused(
                    "while loading a mapping", node.start_mark,
                    f"key {str(key)[:60]!r} appears twice (first on line {seen[key] + 1}); "
                    "the second would silently win: keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        digits = re.sub(r"[^0-9a-fA-F]", "", str(node.value))
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(
                None, None, f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


def _screen_events(text: str) -> None:
    """Refuse aliases, anchors and deep nesting from the event stream, before the (recursive)
    composer builds anything: a billion-laughs file never expands, a deep one never recurses."""
    depth = 0
    for event in yaml.parse(text, Loader=_FastLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                None, None, "anchors and aliases (&name, *name) are not allowed: write each value out",
                event.start_mark)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _yaml_error(exc: yaml.YAMLError, path, what: str) -> FileError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, _Refused):
        return refuse(path, f"{where}{problem} (in the {what})")
    return refuse(path, f"{where}not valid YAML: {problem}")


def parse_yaml(text: str, path: str | Path, what: str):
    """YAML text within the boundary's rules; every problem is a :class:`FileError` with the line."""
    try:
        _screen_events(text)
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, path, what) from None


def compose_yaml(text: str):
    """The node tree of text that :func:`parse_yaml` accepted (for line numbers); None if unparsable."""
    try:
        return yaml.compose(text, Loader=_FastLoader)
    except yaml.YAMLError:
        return None


