"""How paths, names, logs and a command's refusal are shown to people, and where a run keeps its transient
arrays."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from pytest_cudagate.errors import EXIT_INPUT, EXIT_NO_GPU, CudagateError, GpuLockTimeout, WorkerUnavailable

SCRATCH_ENV = "CUDAGATE_SCRATCH"
RAM_FOLDER = Path("/dev/shm")
RAM_FREE_BYTES = 4 << 30  # a run of the examples holds a few hundred MB there at most
RUN_PREFIX = "cudagate-run-"  # + the pid of the run that owns the folder, so a later run can tell it is gone
STALE_S = 3600.0  # a folder of a run that is gone, untouched this long, is deleted by the next run
_OWNED = re.compile(r"^(?:\.trash-)?" + re.escape(RUN_PREFIX) + r"(\d+)-")


# A line GitHub's runner reads as a workflow command: ``::`` after leading white space (and a BOM, which
# JavaScript's trimStart also strips). Its legacy form, ``##[`` anywhere in a line, is left to the
# stop token (reports/github.py): text cannot be quoted out of it.
_COMMAND_LIKE = re.compile(r"[\s\ufeff]*::")


_shown_from: str | None = None  # the folder paths are shown from; None: the working directory


def show_paths_from(folder: str) -> None:
    """Show paths relative to ``folder`` from now on: a child process that works in another folder
    names files as the command that started it does."""
    global _shown_from
    _shown_from = folder


def display_path(path: Path | str) -> str:
    """Relative to the working directory (or the folder :func:`show_paths_from` names) when inside
    it, so messages name familiar paths; shown by :func:`visible`, since a pull request names its own
    files."""
    return visible(_familiar(path))


def _familiar(path: Path | str) -> str:
    try:
        relative = os.path.relpath(path, _shown_from)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def command(*words: str | int | os.PathLike) -> str:
    """A command for a person to paste (``cudagate sign PATH``), whose paths and names a pull request may
    have chosen: each word quoted as a POSIX shell reads it, so pasting runs that command with each word one
    argument, nothing of the name's. A path is relative to the working directory when inside it, as
    :func:`display_path` shows it (``./`` before one that starts with ``-``, which would read as an option); a
    plain word prints as it is. A word with a character that does not print, or a backtick (which would end a
    Markdown code span and let the rest of the name read as another command), is written as ``$'...'`` with
    those characters escaped (bash, zsh, ksh): visible, and exact when pasted."""
    return " ".join(_quoted(_path_word(w) if isinstance(w, os.PathLike) else str(w)) for w in words)


def _path_word(path: os.PathLike) -> str:
    shown = _familiar(path)
    return f"./{shown}" if shown.startswith("-") else shown


def _quoted(word: str) -> str:
    if word.isprintable() and "`" not in word:
        return shlex.quote(word)
    return "$'" + "".join(map(_escaped, word)) + "'"


def _escaped(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if c.isprintable() and c not in "'`":  # a quote by its code: bash's history expansion reads \' as one
        return c
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # a byte of a file name that is not UTF-8 (os.fsdecode's surrogateescape)
        n -= 0xDC00
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def visible(name: str) -> str:
    """``name`` as it is when every character of it prints, else its repr: a newline or escape in a file
    or other name from a pull request is shown, never obeyed (by a terminal, or by a CI runner that
    reads a line starting with ``::`` as a command)."""
    return name if name.isprintable() else repr(name)


def log_lines(text: str) -> str:
    """Text that quotes the checkout over several lines (a compiler's log echoes source lines, a message
    names files), safe to print: characters that do not print (an escape, a bidi override) shown as
    escapes, tabs kept, and a line that would start with ``::`` once its leading blanks are stripped
    (a workflow command, to GitHub's runner) prefixed with ``| ``."""
    lines = []
    for line in text.splitlines():  # every line break a runner splits on (CR included), and more
        if not line.isprintable():
            line = "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line)
        lines.append(f"| {line}" if _COMMAND_LIKE.match(line) else line)
    return "\n".join(lines)


def scratch_dir() -> str | None:
    """The folder a gate run's outputs, fresh inputs and generated arrays go under: ``$CUDAGATE_SCRATCH``,
    else ``/dev/shm`` where it is a RAM file system with room, since writing, reading back and deleting
    hundreds of MB there touches no disk (a runner's disk may TRIM every deleted block), else the
    system's temporary folder (None, for :mod:`tempfile`)."""
    named = os.environ.get(SCRATCH_ENV)
    if named:
        return named
    try:
        ram = (_is_tmpfs(RAM_FOLDER) and os.access(RAM_FOLDER, os.W_OK)
               and min(shutil.disk_usage(RAM_FOLDER).free, memory_available()) >= RAM_FREE_BYTES)
    except OSError:
        return None
    if not ram:
        return None
    sweep_stale(RAM_FOLDER)
    return str(RAM_FOLDER)


def memory_available() -> int:
    """Bytes of memory this process may still take: the kernel's MemAvailable, and less where its
    cgroup (v2) caps it; tmpfs pages count against both. Unknown: 0 (RAM is not used)."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        found = int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M).group(1)) * 1024
    except (OSError, AttributeError, ValueError):
        return 0
    try:
        group = Path("/proc/self/cgroup").read_text().strip().splitlines()[0].split("::", 1)[1]
        folder = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit != "max":
            found = min(found, int(limit) - int((folder / "memory.current").read_text()))
    except (OSError, IndexError, ValueError):
        pass  # no cgroup v2 here: MemAvailable is the bound
    return found


def sweep_stale(root: Path) -> None:
    """Delete, in the background, this user's run folders under ``root`` whose run has exited and
    that nobody touched for :data:`STALE_S` (a run killed before its end leaves its arrays in RAM)."""
    from pytest_cudagate.host import trash  # light; only where a RAM folder is used

    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        owned = _OWNED.match(entry.name)
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (not owned or not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid()
                or time.time() - info.st_mtime < STALE_S or _alive(int(owned.group(1)))):
            continue
        trash.discard(Path(entry.path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _is_tmpfs(folder: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(len(f := line.split()) > 2 and f[1] == str(folder) and f[2] == "tmpfs" for line in mounts)


def run_command(func, args) -> int:
    """Run one ``cudagate`` command; a user's error becomes one line on stderr and its exit code."""
    try:
        return func(args)
    except WorkerUnavailable as exc:
        print(f"cudagate: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except GpuLockTimeout as exc:  # the card is busy, not broken: as without one, nothing can run here now
        # log_lines: the holder's command line is another process's argv
        print(log_lines(f"cudagate: {exc}; let that run finish, or wait longer with --lock-timeout S"), file=sys.stderr)
        return EXIT_NO_GPU
    except (CudagateError, KeyError) as exc:
        # log_lines: a refusal may quote the checkout (its names), and the job's log is read for commands
        print(log_lines(f"cudagate: {exc if not isinstance(exc, KeyError) else exc.args[0]}"), file=sys.stderr)
        return EXIT_INPUT
