"""Errors a user can act on: each names the file, the place in it, what is wrong and the fix."""

from __future__ import annotations


class CudagateError(Exception):
    """Base of the errors cudagate reports to users without a traceback."""


class FileError(CudagateError):
    """Something wrong in a file a user wrote or the tool emitted."""

    def __init__(self, path, problems: list[str]):
        self.path = str(path)
        self.problems = list(problems)
        super().__init__(self.path + ":\n" + "\n".join(f"  - {p}" for p in self.problems))
