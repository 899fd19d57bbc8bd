"""Big temporary folders deleted off the gate's critical path.

Deleting a reference run's folder (its input sets and outputs: 240 MB for the matmul example's
2048³ case) takes the gate process tenths of a second that it could spend waiting for the GPU
worker instead. :func:`discard` renames the folder out of sight at once, so nothing can read a
half-deleted tree and its name is free again, and one background thread deletes it. The thread is
not a daemon: the interpreter waits for it at exit, so nothing is left behind.
"""

from __future__ import annotations

import collections
import os
import shutil
import threading
import time
from pathlib import Path

from pytest_cudagate.host.cpu import yield_cpu

_lock = threading.Lock()
_pending: collections.deque[Path] = collections.deque()
_thread: threading.Thread | None = None


def discard(folder: Path) -> None:
    """Delete ``folder`` in the background (at once, here, when it cannot be renamed)."""
    global _thread
    hidden = folder.with_name(f".trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(folder, hidden)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    with _lock:
        _pending.append(hidden)
        if _thread is None:
            _thread = threading.Thread(target=_drain, name="cudagate-trash")
            _thread.start()


def wait() -> None:
    """Return once every folder discarded so far is deleted."""
    with _lock:
        thread = _thread
    if thread is not None:
        thread.join()


def _drain() -> None:
    global _thread
    yield_cpu()
    while True:
        with _lock:
            if not _pending:
                _thread = None  # under the lock: a later discard starts a new thread
                return
            folder = _pending.popleft()
        shutil.rmtree(folder, ignore_errors=True)
