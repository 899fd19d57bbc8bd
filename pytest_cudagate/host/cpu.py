"""What this host offers the gate's side-by-side work (compiles, sanitizer runs, output checks)."""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 10


def cores() -> int:
    """The CPUs this process may run on: its affinity where the OS says (a container or a CI job
    pinned to 2 of a host's 128 cores gets 2), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def yield_cpu() -> None:
    """Lower the calling thread's CPU priority (Linux gives each thread its own nice value), so
    that background work (fresh inputs drawn ahead, deletions) yields to the GPU worker's launches
    when the host runs short of cores. Best effort: elsewhere it does nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass
