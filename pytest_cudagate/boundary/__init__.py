"""The input boundary: every file cudagate reads from a repository passes the same rules here.

A pull request controls the suite, its case data, the signature and ledger files, the project
settings and request files, and all of them are read before any signature is checked, on a shared
GPU runner. So each read is bounded before anything is parsed: a size cap checked on a regular file
(never a device, FIFO or a symlink to one), a depth limit checked without recursion, no YAML
aliases (billion laughs) or duplicate keys (a second block a reviewer does not see), integers with
a bounded number of digits (before anything formats them), and every number finite.
Each refusal is a :class:`FileError` naming the file, the place and the fix. Folders of a checkout
are walked by :func:`walk` alone: with a stack (Python 3.10 and 3.11 recurse in ``Path.rglob`` and
``os.walk``, so a tree 1,000 folders deep raised ``RecursionError``), bounded in depth and entries.

This module reads bytes, text and JSON with the standard library alone (the plugin's settings pass
through it before anything heavy is imported); :mod:`.yaml_rules` holds the YAML rules and
:mod:`.npy` the ``.npy`` header check.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pytest_cudagate.errors import FileError
from pytest_cudagate.host.paths import display_path

# Size caps per kind of file; generous for anything written by hand or by the tool.
MAX_SUITE_BYTES = 256 * 1024
MAX_SIGNATURE_BYTES = 4 * 1024 * 1024
MAX_LEDGER_BYTES = 32 * 1024 * 1024
MAX_SETTINGS_BYTES = 1024 * 1024
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_ANSWER_BYTES = 1024 * 1024
MAX_NPY_BYTES = 8 * 1024**3  # one case buffer on disk
MAX_DEPTH = 32  # nesting of mappings and lists; the deepest valid file nests about 7
MAX_INT_DIGITS = 24  # any 64-bit integer has at most 20
# Walking folders: pytest's own collection recurses, and fails near 1,000 levels; a real tree nests
# about 20 (node_modules included), and a large monorepo holds a few hundred thousand entries.
MAX_WALK_DEPTH = 64
MAX_WALK_ENTRIES = 1_000_000
_MAX_SHOWN = 160  # characters of a folder's name in a refusal: a too-deep one can be thousands long

# A JSON string or, unclosed, the rest of the text: the match never fails, so the scan stays linear on
# any input (unrolled: one C loop per run of plain characters).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def refuse(path, message: str) -> FileError:
    return FileError(path, [message])


@contextmanager
def open_regular(path: str | Path, limit: int, what: str) -> Iterator[BinaryIO]:
    """A regular file of at most ``limit`` bytes, open for reading.

    A missing file raises :class:`FileNotFoundError` (callers word "missing" themselves); a device,
    FIFO or socket (also behind a symlink: /dev/zero reads for ever), or a file over the cap, a
    :class:`FileError`.
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise refuse(path, f"cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise refuse(path, f"the {what} is not a regular file (a device, FIFO or folder, or a link to one); "
                            "replace it with the file itself")
    if info.st_size > limit:
        raise refuse(path, f"the {what} is {info.st_size} bytes, over the {limit}-byte limit; "
                            "is it the right file?")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait on it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise refuse(path, f"cannot read the {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise refuse(path, f"the {what} is not a regular file")
        yield handle


def read_bytes(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (:func:`open_regular`)."""
    with open_regular(path, limit, what) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise refuse(path, f"cannot read the {what}: {exc.strerror}") from None
    if len(data) > limit:
        raise refuse(path, f"the {what} is over the {limit}-byte limit")
    return data


def read_text(path: str | Path, limit: int, what: str) -> str:
    """:func:`read_bytes` decoded as UTF-8; a bad byte is named by its line and offset."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise refuse(path, f"line {line} (byte {exc.start}): not UTF-8 text; save the {what} as UTF-8") from None


# -- folders --------------------------------------------------------------------------------------


def walk(root: str | Path, what: str, *, skip: Collection[str] = (), max_depth: int = MAX_WALK_DEPTH,
         max_entries: int = MAX_WALK_ENTRIES) -> list[Path]:
    """Every entry below the folder ``root`` that is not a folder (files, and links, to folders too),
    sorted; a link is never followed and folders named in ``skip`` are not entered. A folder that
    cannot be listed is passed over, as pathlib's glob does. A folder more than ``max_depth`` below
    ``root``, or more than ``max_entries`` entries in all, is a :class:`FileError` naming it; ``what``
    says what the folder is (``"checkout"``, ``"case folder"``)."""
    return walk_tree(root, what, skip=skip, max_depth=max_depth, max_entries=max_entries)[0]


def walk_tree(root: str | Path, what: str, *, skip: Collection[str] = (), enter: Callable[[Path], bool] | None = None,
              max_depth: int = MAX_WALK_DEPTH, max_entries: int = MAX_WALK_ENTRIES) -> tuple[list[Path], list[Path]]:
    """:func:`walk`'s entries, and among them the links to folders (each sorted: the one stat of its
    target each link costs, never a step into it); a folder ``enter`` returns False for is not entered."""
    root = Path(root)
    found: list[Path] = []
    linked: list[Path] = []
    entries = 0
    todo = [(os.fspath(root), 0)]
    while todo:
        folder, depth = todo.pop()
        try:
            listing = os.scandir(folder)
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries > max_entries:
                    raise refuse(display_path(root), f"the {what} holds more than {max_entries} files and folders; "
                                                     "cudagate reads no more of it: remove what it does not need")
                try:
                    is_folder = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_folder = False
                if not is_folder:
                    found.append(Path(entry.path))
                    if entry.is_symlink() and os.path.isdir(entry.path):
                        linked.append(found[-1])
                elif entry.name in skip or (enter is not None and not enter(Path(entry.path))):
                    continue
                elif depth == max_depth:
                    raise refuse(clipped(display_path(entry.path)), f"more than {max_depth} folders deep in the "
                                                                     f"{what}; cudagate reads no deeper: flatten the "
                                                                     "tree, or remove it")
                else:
                    todo.append((entry.path, depth + 1))
    return sorted(found), sorted(linked)


def clipped(name: str) -> str:
    """``name`` cut in its middle to at most 161 characters, for a one-line message."""
    half = _MAX_SHOWN // 2
    return name if len(name) <= _MAX_SHOWN else f"{name[:half]}…{name[-half:]}"


# -- JSON -----------------------------------------------------------------------------------------


class _Unbounded(ValueError):
    """A JSON number outside the boundary's rules (raised from json's number hooks)."""


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Unbounded(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unbounded(f"{text[:40]} is out of range for a number")
    return value


def _json_constant(text: str):
    raise _Unbounded(f"{text} is not a finite number")


def json_depth(text: str) -> int:
    """The deepest nesting of ``text``'s objects and arrays, counted without recursion."""
    # Strings and scalars go in C first: a 230 KiB report keeps ~1,000 brackets (3 ms → 1 ms).
    depth = deepest = 0
    for mark in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if mark in "[{" else -1
        if depth > deepest:
            deepest = depth
    return deepest


def parse_json(text: str, path: str | Path, what: str, max_depth: int = MAX_DEPTH, pairs_hook=None):
    """``json.loads`` within the boundary's rules; raises :class:`ValueError` for text that is not JSON
    (callers word that) and :class:`FileError` for JSON that breaks a rule. ``pairs_hook``: json's
    ``object_pairs_hook`` (a ValueError from it counts as not JSON)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise refuse(path, f"the {what} nests {depth} levels deep (at most {max_depth}); is it the right file?")
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant,
                          object_pairs_hook=pairs_hook)
    except _Unbounded as exc:
        raise refuse(path, f"{exc}: every number in the {what} must be finite and fit 64 bits") from None


def load_json(path: str | Path, limit: int, what: str, max_depth: int = MAX_DEPTH, pairs_hook=None):
    """Read and parse a JSON file within the boundary's rules; every problem is a :class:`FileError`."""
    text = read_text(path, limit, what)
    try:
        return parse_json(text, path, what, max_depth, pairs_hook)
    except ValueError as exc:
        raise refuse(path, f"cannot read the {what}: not valid JSON: {exc}") from None


# -- numbers --------------------------------------------------------------------------------------


def non_finite(document) -> list[tuple[list, object]]:
    """``(path, value)`` of every NaN or infinite float in ``document``, walked without recursion."""
    found, todo = [], [([], document)]
    while todo:
        parts, value = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            found.append((parts, value))
        elif isinstance(value, dict):
            todo.extend((parts + [k], v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((parts + [i], v) for i, v in enumerate(value))
    return sorted(found, key=lambda item: list(map(str, item[0])))
