"""Files a command was asked to write, and nothing else.

A path given for output may already be something other than a file: a device (run as root,
``--out /dev/full`` once had a text file renamed over the host's ``/dev/full``), a FIFO, a folder,
or a symbolic link a pull request committed into the checkout so that writing ``report/report.html``
writes into whatever it points at. So a file is written whole into a temporary file created here
(exclusively, in the same folder), and that file is renamed over the path only where the path is
absent or a regular file; anything else there, a link included, is refused before anything is
written. A folder to write into is created where it is missing, and refused where the name is
taken by something else (a folder cudagate names inside the output, ``requests/``, also where it is
a link). Each refusal or failure is one line naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import display_path

_SHOWN = 160  # characters of a path in a message: one given on purpose can be thousands long
_FIXES = {errno.ENAMETOOLONG: "name a shorter path", errno.ENOSPC: "free some space, or name another disk",
          errno.EDQUOT: "free some space, or name another disk"}


def shown(path: Path | str) -> str:
    """``path`` for a message: as :func:`display_path` shows it, its middle cut where it is very long."""
    name = display_path(path)
    return name if len(name) <= _SHOWN else f"{name[:_SHOWN // 2]}…{name[-_SHOWN // 2:]}"


def _failed(path: Path | str, what: str, exc: OSError) -> CudagateError:
    fix = _FIXES.get(exc.errno, "name a folder this user may write in")
    return CudagateError(f"{shown(path)}: cannot write the {what}: {exc.strerror or exc}; {fix}")


def _existing(path: Path, what: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _failed(path, what, exc) from None


def check_file(path: Path, what: str) -> None:
    """Refuse, before anything is written, a ``path`` that is taken by anything but a regular file."""
    info = _existing(path, what)
    if info is None or stat.S_ISREG(info.st_mode):
        return
    if stat.S_ISLNK(info.st_mode):
        raise CudagateError(f"{shown(path)}: is a symbolic link; cudagate writes the {what} only to a file of its "
                            "own: remove the link, or name another path")
    if stat.S_ISDIR(info.st_mode):
        raise CudagateError(f"{shown(path)}: is a folder; name the file to write the {what} to")
    raise CudagateError(f"{shown(path)}: is not a regular file (a device, FIFO or socket); cudagate writes the "
                        f"{what} only to a file of its own: name another path")


def check_folder(path: Path, what: str, *, inside: bool = False) -> None:
    """Refuse, before anything is written, a ``path`` to write into that is not a folder. ``inside``:
    a folder cudagate names within the output (``requests/``), refused as a link too; the folder a
    user names may be a link to one (``/tmp`` is, on macOS)."""
    info = _existing(path, what)
    if info is not None and stat.S_ISLNK(info.st_mode):
        if inside:
            raise CudagateError(f"{shown(path)}: is a symbolic link; cudagate writes the {what} only into a folder "
                                "of its own: remove the link, or name another folder")
        info = os.stat(path) if os.path.exists(path) else None  # a dangling link: mkdir says why
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise CudagateError(f"{shown(path)}: is not a folder; name a folder to write the {what} into")


def folder(path: Path, what: str, *, inside: bool = False) -> Path:
    """``path`` as a folder to write the ``what`` into: created (with its parents) where missing;
    refused where it is anything but a folder (:func:`check_folder`)."""
    check_folder(path, what, inside=inside)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a parent is a file, or the path a dangling link
        raise CudagateError(f"{shown(path)}: a part of this path is not a folder; name a folder to write the "
                            f"{what} into") from None
    except OSError as exc:
        raise _failed(path, what, exc) from None
    return path


def write_text(path: Path, text: str, what: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole: an earlier file there is replaced only once the new
    one is complete, and kept on any error."""
    path = Path(path)
    check_file(path, what)
    folder(path.parent, what)
    try:
        fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise _failed(path, what, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            handle.write(text)
        check_file(path, what)  # again: the rename must not land on what was put there meanwhile
        os.replace(staged, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        if isinstance(exc, OSError):
            raise _failed(path, what, exc) from None
        raise


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask
