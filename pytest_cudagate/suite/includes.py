"""Which files a kernel's ``#include`` directives may bring along: files inside its suite folder only.

The host reads a kernel's quoted includes to send them with the request (the compiler child sees
only what is sent, plus the CUDA headers; see ``cudagate_harness.confine``). Each name is resolved
here, symlinks followed, and refused when it leaves the suite folder, so the host never reads a file
on a kernel's behalf that the suite does not hold. Directives are found after the translation steps
a preprocessor applies before it looks for them (trigraphs, line splices), with lines ended by
newline alone: ``\\f``, ``\\v`` and ``\\r`` are white space inside a directive, not line breaks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.errors import CudagateError

SUITE_FILENAME = "cudagate.yaml"
_TRIGRAPHS = {"??=": "#", "??/": "\\", "??'": "^", "??(": "[", "??)": "]", "??!": "|", "??<": "{", "??>": "}",
              "??-": "~"}
# A comment's body cannot hold its own end, so a run of comments parses one way only: a lazy `.*?`
# there let `/**/` repeated backtrack exponentially (40 of them on a line: hours).
_SPACE = r"(?:[ \t\f\v\r]|/\*(?:[^*\n]|\*+[^*/\n])*\*+/)*"
# A directive that makes the preprocessor read a file: #include, #include_next, #import, #embed,
# spelled with # or the %: digraph.
_DIRECTIVE = re.compile(rf"^{_SPACE}(?:#|%:){_SPACE}(include_next|include|import|embed)\b(.*)$", re.MULTILINE)
_HEADER = re.compile(r'^[ \t\f\v\r]*(?:<([^<>"\n]+)>|"([^"\n]+)")[ \t\f\v\r]*(?://.*|/\*.*)?$')


class IncludeError(CudagateError):
    """A quoted include that names a file outside the suite folder."""


@dataclass(frozen=True)
class Directive:
    line: int  # 1-based, in the text after line splices are joined
    directive: str  # include / include_next / import / embed
    rest: str  # what follows the directive name
    system: str | None  # <name>, when the operand is one literal
    quoted: str | None  # "name", when the operand is one literal


def translated(text: str) -> str:
    """``text`` after trigraph replacement and line splicing (translation phases 1-2)."""
    text = re.sub(r"\?\?[=/'()!<>\-]", lambda m: _TRIGRAPHS[m.group(0)], text)
    return re.sub(r"\\[ \t]*\r?\n", "", text)


def directives(text: str) -> list[Directive]:
    """Every file-reading directive of ``text`` as the preprocessor would see it."""
    found = []
    body = translated(text)
    for match in _DIRECTIVE.finditer(body):
        line = body.count("\n", 0, match.start()) + 1
        header = _HEADER.match(match.group(2))
        found.append(Directive(line, match.group(1), match.group(2),
                               header.group(1) if header else None, header.group(2) if header else None))
    return found


def suite_folder(source: Path) -> Path:
    """The folder of the nearest ``cudagate.yaml`` at or above ``source``; else the source's folder."""
    source = Path(os.path.abspath(source))
    for folder in source.parents:
        if (folder / SUITE_FILENAME).is_file():
            return folder
    return source.parent


def resolve_quoted(spelled: str, folder: Path, root: Path, where: str) -> Path | None:
    """The file ``#include "spelled"`` in ``folder`` names, when it lies inside ``root``; None when there
    is no such file (a toolkit header, left to the confined compiler). :class:`IncludeError` when the
    name, or a symlink on its way, leads out of ``root``."""
    if Path(spelled).is_absolute() or spelled.startswith("\\"):
        raise IncludeError(f'{where}: #include "{spelled}": an absolute path; include headers from the suite '
                           "folder by relative path")
    candidate = folder / spelled
    resolved = candidate.resolve()
    inside = resolved == root.resolve() or root.resolve() in resolved.parents
    if not inside and (candidate.exists() or candidate.is_symlink()):
        raise IncludeError(f'{where}: #include "{spelled}" leads to {resolved}, outside the suite folder '
                           f"{root}; a kernel may include files of its suite only")
    return resolved if inside and resolved.is_file() else None


def local_headers(source: Path, text: str | None = None) -> dict[str, str]:
    """Headers ``source`` pulls in with ``#include "..."``, recursively, keyed by path from the source's
    folder: they travel inline so a request replays anywhere and the compile cache key sees them."""
    root = suite_folder(source)
    headers: dict[str, str] = {}
    todo = [(source.parent, text if text is not None else read_text(source, MAX_SOURCE_BYTES, "CUDA source"), source.name)]
    while todo:
        folder, body, where = todo.pop()
        for directive in directives(body):
            if directive.quoted is None:
                continue
            path = resolve_quoted(directive.quoted, folder, root, f"{where}:{directive.line}")
            if path is None:
                continue
            # Keyed by path from the source's folder, not by spelling: one file reached as
            # "inc/math.cuh" and as "math.cuh" stays one header, so #pragma once holds.
            name = Path(os.path.relpath(folder / directive.quoted, source.parent)).as_posix()
            name = Path(os.path.normpath(name)).as_posix()
            if name in headers:
                continue
            headers[name] = read_text(path, MAX_SOURCE_BYTES, "CUDA header")
            todo.append(((folder / directive.quoted).parent, headers[name], name))
    return headers
