"""The input boundary: every file cudagate reads from a repository passes the same rules here.

A pull request controls the suite, its case data, the signature and ledger files, the project
settings and request files, and all of them are read before any signature is checked, on a shared
GPU runner. So each read is bounded before anything is parsed: a size cap checked on a regular file
(never a device, FIFO or a symlink to one), a depth limit checked without recursion, no YAML
aliases (billion laughs) or duplicate keys (a second block a reviewer does not see), integers with
a bounded number of digits (before anything formats them), and every number finite.
Each refusal is a :class:`FileError` naming the file, the place and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

import numpy as np
import yaml
from numpy.lib import format as npy_format

from pytest_cudagate.errors import FileError

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

_JSON_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _refuse(path, message: str) -> FileError:
    return FileError(path, [message])


def read_bytes(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    A missing file raises :class:`FileNotFoundError` (callers word "missing" themselves); a device,
    FIFO or socket (also behind a symlink), or a file over the cap, a :class:`FileError`.
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _refuse(path, f"cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, f"the {what} is not a regular file (a device, FIFO or folder, or a link to one); "
                            "replace it with the file itself")
    if info.st_size > limit:
        raise _refuse(path, f"the {what} is {info.st_size} bytes, over the {limit}-byte limit; "
                            "is it the right file?")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait on it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise _refuse(path, f"the {what} is not a regular file")
            data = handle.read(limit + 1)
    except OSError as exc:
        raise _refuse(path, f"cannot read the {what}: {exc.strerror}") from None
    if len(data) > limit:
        raise _refuse(path, f"the {what} is over the {limit}-byte limit")
    return data


def read_text(path: str | Path, limit: int, what: str) -> str:
    """:func:`read_bytes` decoded as UTF-8; a bad byte is named by its line and offset."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _refuse(path, f"line {line} (byte {exc.start}): not UTF-8 text; save the {what} as UTF-8") from None


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
    skeleton = np.frombuffer(_JSON_STRINGS.sub("", text).encode("utf-8"), dtype=np.uint8)
    steps = np.zeros(skeleton.shape, dtype=np.int64)
    steps[(skeleton == ord("[")) | (skeleton == ord("{"))] = 1
    steps[(skeleton == ord("]")) | (skeleton == ord("}"))] = -1
    return int(np.cumsum(steps).max(initial=0))


def parse_json(text: str, path: str | Path, what: str, max_depth: int = MAX_DEPTH):
    """``json.loads`` within the boundary's rules; raises :class:`ValueError` for text that is not JSON
    (callers word that) and :class:`FileError` for JSON that breaks a rule."""
    depth = json_depth(text)
    if depth > max_depth:
        raise _refuse(path, f"the {what} nests {depth} levels deep (at most {max_depth}); is it the right file?")
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except _Unbounded as exc:
        raise _refuse(path, f"{exc}: every number in the {what} must be finite and fit 64 bits") from None


def load_json(path: str | Path, limit: int, what: str, max_depth: int = MAX_DEPTH):
    """Read and parse a JSON file within the boundary's rules; every problem is a :class:`FileError`."""
    text = read_text(path, limit, what)
    try:
        return parse_json(text, path, what, max_depth)
    except ValueError as exc:
        raise _refuse(path, f"cannot read the {what}: not valid JSON: {exc}") from None


# -- YAML -----------------------------------------------------------------------------------------


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
        return _refuse(path, f"{where}{problem} (in the {what})")
    return _refuse(path, f"{where}not valid YAML: {problem}")


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


# -- .npy -----------------------------------------------------------------------------------------


def npy_header(path: str | Path, limit: int = MAX_NPY_BYTES) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file, read from its header before anything is allocated.

    Refused: not a regular file, not a .npy, object/string/structured dtypes, a byte size that
    overflows or exceeds ``limit``, and a file whose length does not match its header.
    """
    path = Path(path)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, "not a regular file (a device, FIFO or folder, or a link to one)")
    try:
        with open(path, "rb") as handle:
            version = npy_format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(handle, max_header_size=10000)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npy_format.read_array_header_2_0(handle, max_header_size=10000)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = handle.tell()
    except (OSError, ValueError, SyntaxError, TypeError, OverflowError, EOFError) as exc:
        raise _refuse(path, f"not a readable .npy file ({str(exc)[:200]}); regenerate it") from None
    if dtype.hasobject or dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise _refuse(path, f"holds {str(dtype)[:60]}, not plain numbers; regenerate it")
    if any(not isinstance(d, int) or d < 0 for d in shape) or len(shape) > MAX_DEPTH:
        raise _refuse(path, f"has an invalid shape {str(shape)[:80]}; regenerate it")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > limit:
        raise _refuse(path, f"its header declares {str(shape)[:80]} of {dtype}, over the {limit}-byte limit")
    if info.st_size != offset + nbytes:
        raise _refuse(path, f"is {info.st_size} bytes but its header declares {offset + nbytes} "
                            "(truncated or padded); regenerate it")
    return tuple(shape), dtype
