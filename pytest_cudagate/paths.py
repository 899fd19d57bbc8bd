"""How paths are shown to people, and where a run keeps its transient arrays."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SCRATCH_ENV = "CUDAGATE_SCRATCH"
RAM_FOLDER = Path("/dev/shm")
RAM_FREE_BYTES = 4 << 30  # a run of the examples holds a few hundred MB there at most


def display_path(path: Path | str) -> str:
    """Relative to the working directory when inside it, so messages name familiar paths."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def scratch_dir() -> str | None:
    """The folder a gate run's outputs, fresh inputs and generated arrays go under: ``$CUDAGATE_SCRATCH``,
    else ``/dev/shm`` where it is a RAM file system with room, since writing, reading back and deleting
    hundreds of MB there touches no disk (a runner's disk may TRIM every deleted block), else the
    system's temporary folder (None, for :mod:`tempfile`)."""
    named = os.environ.get(SCRATCH_ENV)
    if named:
        return named
    try:
        ram = _is_tmpfs(RAM_FOLDER) and os.access(RAM_FOLDER, os.W_OK) and shutil.disk_usage(RAM_FOLDER).free >= RAM_FREE_BYTES
    except OSError:
        return None
    return str(RAM_FOLDER) if ram else None


def _is_tmpfs(folder: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(len(f := line.split()) > 2 and f[1] == str(folder) and f[2] == "tmpfs" for line in mounts)
