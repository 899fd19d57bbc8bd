"""Which files a kernel's ``#include`` directives may bring along: files inside its suite folder, and
inside the project's include folders (``[tool.cudagate] include``).

A quoted name is looked up as the compiler will look it up in the request's header tree, where the
include folders' headers lie beside the kernel's source (a header's name is its path from the source's
folder, or from its include folder): from the including file's folder, then from the source's folder;
at each, in the suite first, then in each include folder in order. A name that climbs out of the
source's folder (``../common/x.cuh``) is looked up in the suite only.

The host reads a kernel's quoted includes to send them with the request (the compiler child sees
only what is sent, plus the CUDA headers; see ``cudagate_harness.confine``). Each name is resolved
here, symlinks followed, and refused when it leaves the suite folder, so the host never reads a file
on a kernel's behalf that the suite does not hold. Directives are found after the translation steps
a preprocessor applies before it looks for them (trigraphs, line splices), with lines ended by
newline alone: ``\\f``, ``\\v`` and ``\\r`` are white space inside a directive, not line breaks.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, clipped, read_text
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import display_path, visible

SUITE_FILENAME = "cudagate.yaml"
# The headers one kernel build carries (in every request, and into the compile cache key): a real
# kernel's few dozen fit many times over; N links to one 4 MiB header cannot take N times its size.
MAX_HEADERS = 256
MAX_HEADER_BYTES = 8 * 1024 * 1024
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


def resolve_quoted(spelled: str, folder: Path, root: Path, where: str, what: str = "the suite folder") -> Path | None:
    """The file ``#include "spelled"`` in ``folder`` names, when it lies inside ``root``; None when there
    is no such file (a toolkit header, left to the confined compiler). :class:`IncludeError` when the
    name, or a symlink on its way, leads out of ``root``, or when it cannot be looked up (a name too
    long, a link to no file)."""
    shown = f'{where}: #include "{clipped(visible(spelled))}"'
    if Path(spelled).is_absolute() or spelled.startswith("\\"):
        raise IncludeError(f"{shown}: an absolute path; include headers from the suite folder by relative path")
    candidate = folder / spelled
    real_root = Path(os.path.realpath(root))
    try:
        # realpath, not Path.resolve: Python 3.10 to 3.12 raise RuntimeError on a loop of links
        resolved = Path(os.path.realpath(candidate))
        inside = resolved == real_root or real_root in resolved.parents
        if not inside and (candidate.exists() or candidate.is_symlink()):
            raise IncludeError(f"{shown} leads to {clipped(visible(str(resolved)))}, outside {what} "
                               f"{visible(str(root))}; a kernel may include files of its suite and of the include "
                               "folders that [tool.cudagate] include names only")
        if candidate.is_symlink() and not candidate.exists():
            raise IncludeError(f"{shown}: a link that leads to no file (a loop of links, or a missing target); "
                               "replace it with the header itself")
        # The name as the compiler opens it ("sub/../ok.h" needs the folder sub, as on any file system);
        # a FIFO or a device is the reader's to refuse.
        return resolved if inside and candidate.exists() and not candidate.is_dir() else None
    except OSError as exc:
        raise IncludeError(f"{shown}: cannot be looked up ({exc.strerror}); name a header of the suite folder "
                           "that the file system can open") from None


def local_headers(source: Path, text: str | None = None, include: tuple[Path, ...] = ()) -> dict[str, str]:
    """:func:`header_files`' texts, by name."""
    return {name: body for name, (_, body) in header_files(source, text, include).items()}


def header_files(source: Path, text: str | None = None, include: tuple[Path, ...] = ()) -> dict[str, tuple[Path, str]]:
    """Headers ``source`` pulls in with ``#include "..."``, recursively, keyed by path from the source's
    folder (an include folder's by its path from that folder, ``include``: the project's include folders,
    in order): they travel inline so a request replays anywhere and the compile cache key sees them.
    At most :data:`MAX_HEADERS` of them and :data:`MAX_HEADER_BYTES` in all, counted as carried: a
    file reached under several names (links to it) counts once per name. A header the host cannot
    read as text (over the source cap, not UTF-8, not a regular file) is an :class:`IncludeError`.
    Each name comes with the file it was read from."""
    root = suite_folder(source)
    headers: dict[str, str] = {}
    files: dict[str, Path] = {}
    passages: dict[str, tuple[str, str]] = {}  # a spelling that enters a folder and leaves it -> (name, shown)
    carried = 0  # bytes

    def carry(name: str, header: str, shown: str) -> None:
        nonlocal carried
        if len(headers) == MAX_HEADERS:
            raise IncludeError(f"{shown}: more than {MAX_HEADERS} headers for one kernel build (each name a file is "
                               "included under counts, links included); include fewer headers")
        carried += len(header.encode())
        if carried > MAX_HEADER_BYTES:
            raise IncludeError(f"{shown}: the kernel's headers pass {MAX_HEADER_BYTES} bytes in all (each name a file "
                               "is included under counts, links included); include less")
        headers[name] = header

    todo = [(source.parent, text if text is not None else read_text(source, MAX_SOURCE_BYTES, "CUDA source"), source.name)]
    while todo:
        folder, body, where = todo.pop()
        for directive in directives(body):
            if directive.quoted is None:
                continue
            at = f"{where}:{directive.line}"
            shown = f'{at}: #include "{clipped(visible(directive.quoted))}"'
            try:
                path = resolve_quoted(directive.quoted, folder, root, at)
            except IncludeError as exc:
                raise IncludeError(f"{exc}{_include_hint(folder / directive.quoted, include)}") from None
            if path is None:
                found = _from_include_folders(directive.quoted, folder, source.parent, root, include, at)
                if found is not None:
                    name, path = found
                    if name not in headers:
                        carry(name, _read_header(path, shown), shown)
                        files[name] = path
                        todo.append((source.parent / PurePosixPath(name).parent, headers[name], name))
                continue
            # Keyed by path from the source's folder, not by spelling: one file reached as
            # "inc/math.cuh" and as "math.cuh" stays one header, so #pragma once holds.
            spelled = (Path(os.path.relpath(folder, source.parent)) / directive.quoted).as_posix()
            name = Path(os.path.normpath(spelled)).as_posix()
            if ".." in Path(spelled).parts[1:]:
                passages.setdefault(spelled, (name, shown))
            if name in headers:
                continue
            header = _read_header(path, shown)
            carry(name, header, shown)
            files[name] = path
            todo.append(((folder / directive.quoted).parent, header, name))
    # A spelling such as "sub/../ok.h" whose folder (sub) no carried header lies in travels under that
    # spelling too, so that the compiler's header tree holds the folder the file system needs to open
    # it. Only such spellings: the others' names stay as they were (they are the kernel's identity).
    present = {str(parent) for name in headers for parent in PurePosixPath(name).parents}
    for spelled, (name, shown) in sorted(passages.items()):
        parts = PurePosixPath(spelled).parts
        entered = {posixpath.normpath("/".join(parts[:n])) for n in range(1, len(parts)) if parts[n - 1] != ".."}
        if not entered <= present:
            carry(spelled, headers[name], shown)
            files[spelled] = files[name]
    return {name: (files[name], body) for name, body in headers.items()}


def _read_header(path: Path, shown: str) -> str:
    try:
        return read_text(path, MAX_SOURCE_BYTES, "CUDA header")
    except FileError as exc:
        raise IncludeError(f"{shown}: {exc.problems[0]}") from None
    except OSError as exc:
        raise IncludeError(f"{shown}: cannot be read ({exc.strerror})") from None


def _from_include_folders(spelled: str, folder: Path, source_dir: Path, root: Path, include: tuple[Path, ...],
                          at: str) -> tuple[str, Path] | None:
    """(name, file) of ``#include "spelled"`` (in ``folder``, a place of the source's view) that no file of
    the suite answers: looked up from ``folder``, then from the source's folder (the compiler's include
    path), in the suite and in each include folder in order, as the header tree will hold them."""
    if not include or Path(spelled).is_absolute():
        return None
    here = Path(os.path.relpath(folder, source_dir)) / spelled
    for name in dict.fromkeys(Path(os.path.normpath(n)).as_posix() for n in (here, Path(spelled))):
        if name == ".." or name.startswith("../"):
            continue
        own = resolve_quoted(name, source_dir, root, at) if name != Path(os.path.normpath(here)).as_posix() else None
        if own is not None:
            return name, own  # the suite's file at the source's folder comes before the include folders
        for folder_in in include:
            found = resolve_quoted(name, folder_in, folder_in, at, "the include folder")
            if found is not None:
                return name, found
    return None


def _include_hint(candidate: Path, include: tuple[Path, ...]) -> str:
    """How to include a file that an include folder holds, where its spelling climbs out of the suite."""
    real = Path(os.path.realpath(candidate))
    for folder in include:
        inside = Path(os.path.realpath(folder))
        if inside in real.parents:
            return (f" (it lies in the include folder {display_path(folder)}: include it as "
                    f'"{real.relative_to(inside).as_posix()}")')
    return ""
