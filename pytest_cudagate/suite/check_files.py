"""The files a suite names (kernel sources, a Python reference, a tuning template, the case data):
each inside the suite's folder, links followed, and a source a regular file of UTF-8 text."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, clipped, read_text
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.includes import IncludeError, local_headers


def real(path: Path) -> Path:
    """``path`` with every link followed; a loop of links is left as it is (Path.resolve raises
    RuntimeError there on Python 3.10 to 3.12), and the file checks that follow refuse it."""
    return Path(os.path.realpath(path))


def source(checker: Checker, value: str, parts: list) -> Path:
    """A file the suite names: inside the suite's folder, a regular file, UTF-8 text."""
    root = real(checker.path.parent)
    path = real(root / value)
    shown = clipped(repr(value))
    try:
        if not path.is_relative_to(root):
            checker.add(parts, f"{shown} lies outside the suite folder (it resolves to {clipped(str(path))}); a "
                               "suite's files, symlinks included, must stay inside its folder")
        elif (root / value).is_symlink() and not path.is_file():
            checker.add(parts, f"{shown} is a link that leads to no file (a loop of links, or a missing target); "
                               "replace it with the file itself")
        elif not path.is_file():
            checker.add(parts, f"file {shown} not found next to the suite (looked for {clipped(str(path))})")
        else:
            read_text(path, MAX_SOURCE_BYTES, "source file")
    except FileError as exc:
        checker.add(parts, f"{clipped(value)}: {exc.problems[0]}")
    except OSError as exc:  # a name too long for the file system
        checker.add(parts, f"{shown} cannot be looked up ({exc.strerror}); name a file of the suite folder")
    return path


def template(checker: Checker, value: str, parts: list, entry: str) -> Path:
    """``tuning_source``: a file like ``source`` that defines the kernel's entry (its candidates replace the kernel)."""
    problems = len(checker.problems)
    path = source(checker, value, parts)
    if len(checker.problems) == problems:
        text = read_text(path, MAX_SOURCE_BYTES, "source file")
        if not re.search(rf"\b{re.escape(entry)}\s*\(", text):
            checker.add(parts, f"{value} does not define the kernel's entry {entry!r}: autotune candidates built from "
                               f"it replace the kernel, so declare `extern \"C\" __global__ void {entry}(...)` with "
                               "the suite's signature there")
    return path


def data_dir(checker: Checker, value: str) -> Path:
    """``data:``, the folder of the case data: inside the suite's folder."""
    root = real(checker.path.parent)
    path = real(root / value)
    if not path.is_relative_to(root):
        checker.add(["data"], f"{value!r} is outside the suite's folder ({root}); keep the case data beside the suite")
    return path


def defined_names(source: Path, include: tuple[Path, ...]) -> str | None:
    """The kernel source and the headers it includes from the suite folder, as one text in which
    a step's entry must appear; None where they cannot be read (the source check says why)."""
    try:
        text = read_text(source, MAX_SOURCE_BYTES, "source file")
        return "\n".join([text, *local_headers(source, text, include).values()])
    except (OSError, FileError, IncludeError):
        return None
