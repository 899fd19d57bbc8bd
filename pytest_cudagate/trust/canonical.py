"""Deterministic bytes: canonical JSON and line-ending-independent file hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pytest_cudagate import boundary

# Files hashed as text: CRLF becomes LF first, so a Windows checkout signs to the same bytes.
TEXT_SUFFIXES = frozenset({".cu", ".cuh", ".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".inc", ".py", ".yaml", ".yml",
                           ".json", ".txt", ".toml"})


def canonical_bytes(document) -> bytes:
    """JSON with sorted keys, no optional whitespace, UTF-8; NaN/Infinity are refused (not JSON)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def normalize_newlines(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path, *, text: bool | None = None) -> str:
    """SHA-256 of a file; text files (by suffix, or ``text=True``) with CRLF normalised to LF.

    Binary files (``.npy``) are hashed exactly as stored.
    """
    if text is None:
        text = Path(path).suffix.lower() in TEXT_SUFFIXES
    # A pull request may put a link to /dev/zero where a signed file belongs: only a regular file of
    # bounded size is hashed (FileError otherwise).
    if text:
        return sha256_bytes(normalize_newlines(boundary.read_bytes(path, boundary.MAX_LEDGER_BYTES, "signed file")))
    digest = hashlib.sha256()
    with boundary.open_regular(path, boundary.MAX_NPY_BYTES, "signed file") as handle:  # case data: streamed
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
