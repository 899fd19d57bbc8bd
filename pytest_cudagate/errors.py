"""Errors a user can act on: each names the file, the place in it, what is wrong and the fix."""

from __future__ import annotations

import sys

from pytest_cudagate.host.paths import log_lines
from pytest_cudagate.worker.gpulock import GpuLockTimeout

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


class WorkerUnavailable(RuntimeError):
    """No worker can run on this machine (no driver, no device); the message says why."""


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
