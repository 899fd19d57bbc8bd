"""Per-GPU exclusive lock, so two gate runs on one runner never time on the same card at once.

The lock is an OS file lock on ``<lock dir>/<gpu id>.lock``: the kernel drops it when the
holder dies, so a crashed run never leaves a stale lock behind. The holder writes who it
is into the file so that a waiter can say whom it is waiting for. The lock directory is
``$CUDAGATE_LOCK_DIR`` or ``<system temp>/cudagate-locks``; it must be writable by every
user that runs gates on the machine, so it is created mode 1777 (sticky, like /tmp: anyone may
add a lock file, nobody may remove or replace another user's). The lock file is opened with
``O_NOFOLLOW``: a symlink planted at its path is refused, never followed to truncate its target.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from pytest_cudagate.errors import GpuLockTimeout

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

log = logging.getLogger(__name__)

# msvcrt locks are mandatory byte-range locks: lock one byte far past the holder info so
# that waiters can still read it.
_WINDOWS_LOCK_OFFSET = 1 << 30


def default_lock_dir() -> Path:
    env = os.environ.get("CUDAGATE_LOCK_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "cudagate-locks"


def _make_lock_dir(folder: Path) -> None:
    """Create the shared lock folder sticky and world-writable; leave an existing one as it is."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return
    if sys.platform != "win32":
        os.chmod(folder, 0o1777)  # mkdir's mode is narrowed by the umask; make it exact


def _try_lock(fd: int) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):  # held elsewhere (EWOULDBLOCK / EACCES)
        return False
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def read_holder(path: Path) -> dict | None:
    """Holder info written by the current holder, or None if absent or half-written."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _describe_holder(holder: dict | None) -> str:
    if not holder:
        return "an unknown holder (no holder info in the lock file)"
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
        f" ({holder.get('command')})"
    )


class GpuLock:
    """Exclusive lock on one GPU, held as a context manager.

    ``gpu_id`` should be the GPU UUID, which names the card whatever CUDA_VISIBLE_DEVICES
    says; it is made safe for a file name.
    """

    def __init__(
        self,
        gpu_id: str,
        *,
        lock_dir: Path | None = None,
        timeout_s: float = 600,
        poll_s: float = 0.5,
    ):
        # Distinct ids that sanitise alike only share a lock: over-serialising is harmless.
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", gpu_id).lstrip(".") or "gpu"
        self.path = Path(lock_dir if lock_dir is not None else default_lock_dir()) / f"{safe}.lock"
        self.gpu_id = gpu_id
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this GpuLock")
        _make_lock_dir(self.path.parent)
        # Never unlinked: deleting a lock file lets a waiter lock the orphaned inode while
        # a newcomer locks a fresh file, and both would run.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        deadline = time.monotonic() + self.timeout_s
        logged = False
        try:
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    holder = read_holder(self.path)
                    raise GpuLockTimeout(
                        f"GPU {self.gpu_id} still locked after {self.timeout_s:g} s: lock file "
                        f"{self.path} is held by {_describe_holder(holder)}",
                        self.path,
                        holder,
                    )
                if not logged:
                    log.warning(
                        "waiting for GPU lock %s held by %s",
                        self.path,
                        _describe_holder(read_holder(self.path)),
                    )
                    logged = True
                time.sleep(max(0.0, min(self.poll_s, deadline - time.monotonic())))
        except BaseException:
            os.close(fd)
            raise
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "gpu_id": self.gpu_id,
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode())
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # a waiter reading now must not name us as holder
            _unlock(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> GpuLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
