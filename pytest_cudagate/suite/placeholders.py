"""What a suite skeleton (``cudagate init``) leaves to fill in, and how every command finds it.

A skeleton marks each value it cannot know with a string that starts with ``TODO`` (a size, a case's
scalar, a tolerance, a type the signature cannot name), and its Python reference raises
:data:`STUB_RAISE` until written. No valid suite holds such a string where one is written (names,
dtypes and expressions cannot start with ``TODO:``; ``description`` is free text and not looked at),
so a suite that still does is refused before anything else, one line per value, each with its hint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.errors import FileError

TODO = "TODO"
STUB_RAISE = 'raise NotImplementedError("TODO: '
_STUB = re.compile(r"^[ \t]*" + re.escape(STUB_RAISE), re.MULTILINE)
_FREE_TEXT = ("description",)


def todo(hint: str) -> str:
    """A placeholder value saying what to write there."""
    return f"{TODO}: {hint}"


def unfilled(raw) -> list[tuple[list, str]]:
    """Each placeholder of a parsed suite file: its YAML path and its hint."""
    found = []

    def visit(node, parts: list) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if not (parts == [] and key in _FREE_TEXT):
                    visit(value, parts + [key])
        elif isinstance(node, list):
            for number, value in enumerate(node):
                visit(value, parts + [number])
        elif isinstance(node, str) and (node == TODO or node.startswith(f"{TODO}:")):
            found.append((parts, node[len(TODO) + 1:].strip() or "a value"))

    visit(raw, [])
    return found


def stub_line(suite_file: Path, reference) -> int | None:
    """The line of a Python reference (``reference.python`` of the suite file) that is still the stub
    ``cudagate init`` wrote; None when written, or not readable here (the loader says why later)."""
    if not isinstance(reference, dict) or not isinstance(reference.get("python"), str):
        return None
    folder = Path(os.path.realpath(suite_file.parent))
    path = Path(os.path.realpath(folder / reference["python"].rsplit(":", 1)[0]))
    try:
        if not path.is_relative_to(folder) or not path.is_file():
            return None
        text = read_text(path, MAX_SOURCE_BYTES, "reference")
    except (OSError, FileError, ValueError):
        return None
    match = _STUB.search(text)
    return None if match is None else text.count("\n", 0, match.start()) + 1
