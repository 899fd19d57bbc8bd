"""sha256 of the case data a verdict was reached on, so a reader can tell which inputs were used."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pytest_cudagate.boundary import walk
from pytest_cudagate.errors import FileError


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def case_hashes(files: list[Path], root: Path | None) -> dict[str, str]:
    """``{path: sha256}`` for each existing file, keyed relative to ``root`` where possible."""
    hashes = {}
    for path in sorted(set(files)):
        if path.is_file():
            hashes[relative(path, root)] = file_sha256(path)
    return hashes


def case_files(case_dir: Path) -> list[Path]:
    """Every file of a case folder (inputs and ``expected/``); none where the folder is too deep or too
    large to walk (the trust check refuses such a folder itself: trust/manifest.py)."""
    try:
        return [p for p in walk(case_dir, "case folder") if p.is_file()] if case_dir.is_dir() else []
    except FileError:
        return []


def relative(path: Path | str, root: Path | None) -> str:
    """POSIX path relative to ``root`` when inside it (portable between runners), else absolute."""
    path = Path(path)
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()
