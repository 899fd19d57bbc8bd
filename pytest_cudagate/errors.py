"""Errors a user can act on: each names the file, the place in it, what is wrong and the fix."""

from __future__ import annotations

from pathlib import Path

# Exit codes of every ``cudagate`` command: 0 all good, 1 a check failed, 2 bad input, 3 no CUDA device.
EXIT_FAILED, EXIT_INPUT, EXIT_NO_GPU = 1, 2, 3


class CudagateError(Exception):
    """Base of the errors cudagate reports to users without a traceback."""


class FileError(CudagateError):
    """Something wrong in a file a user wrote or the tool emitted."""

    def __init__(self, path, problems: list[str]):
        self.path = str(path)
        self.problems = list(problems)
        super().__init__(self.path + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class GpuLockTimeout(TimeoutError):
    """The GPU stayed locked by another run for longer than the timeout (worker/gpulock.py)."""

    def __init__(self, message: str, path: Path, holder: dict | None):
        super().__init__(message)
        self.path = path
        self.holder = holder


class WorkerUnavailable(RuntimeError):
    """No worker can run on this machine (no driver, no device); the message says why."""
