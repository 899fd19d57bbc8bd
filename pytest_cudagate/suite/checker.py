"""The problems found in a suite file, each located: ``line N: YAML.PATH: what is wrong and the fix``.

Every check of the loader (suite/check_*.py, suite/step_checks.py) adds to one :class:`Checker`, so
all the problems of a file are reported together (a suite author fixes them in one edit). The checks
every part shares live here too: an expression over the scalars, a launch, names used once.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary.yaml_rules import compose_yaml
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite import device
from pytest_cudagate.suite.expr import ExprError, parse
from pytest_cudagate.suite.model import Launch


def locator(text: str):
    """``locate(parts)``: the line of the YAML node at the path ``parts`` of ``text`` (None where there is none)."""
    root = compose_yaml(text)

    def locate(parts):
        node = root
        for part in parts:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == part), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
            else:
                break
            if node is None:
                return None
        return node.start_mark.line + 1 if node is not None else None

    return locate


class Checker:
    def __init__(self, path: Path, locate):
        self.path = path
        self.locate = locate
        self.problems: list[str] = []

    def add(self, parts: list, message: str) -> None:
        line = self.locate(parts)
        where = schema.format_path(parts)
        self.problems.append(f"line {line}: {where}: {message}" if line else f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.problems:
            raise FileError(self.path, self.problems)

    def expr(self, value, parts: list, scalars: set[str]) -> str:
        text = str(value)
        try:
            names = parse(text).names
        except ExprError as exc:
            self.add(parts, str(exc))
            return text
        unknown = sorted(names - scalars)
        if unknown:
            self.add(parts, f"{text!r} uses {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
                            f"a scalar parameter (scalars: {', '.join(sorted(scalars)) or 'none'})")
        return text

    def launch(self, raw: dict, parts: list, scalars: set[str]) -> Launch:
        """A launch: its expressions may also read the device facts (suite/device.py)."""
        scalars = scalars | set(device.FACTS)
        return Launch(
            grid=tuple(self.expr(v, parts + ["grid", i], scalars) for i, v in enumerate(raw["grid"])),
            block=tuple(self.expr(v, parts + ["block", i], scalars) for i, v in enumerate(raw["block"])),
            shared_bytes=self.expr(raw.get("shared_bytes", 0), parts + ["shared_bytes"], scalars),
        )

    def unique(self, names: list[str], parts: list, what: str) -> None:
        seen = set()
        for i, name in enumerate(names):
            if name in seen:
                self.add(parts + [i, "name"], f"{what} name {name!r} is used twice")
            seen.add(name)
