"""The per-user cache of generated cases' drawn inputs.

Drawing a large generated case's inputs from its seed costs more than anything else in rebuilding
it (for the matmul example's 2048³ case, 2 × 4M float32 values, then their digests); on a warm
machine they come from here instead. The expected outputs are never cached: only a small sample of
them is signed, so an entry that held them could serve a wrong oracle to anyone able to write here
as this user, which the signed digests cannot catch for inputs. The cache lies beside the compile
cache (``~/.cache/cudagate/generated``, or ``$CUDAGATE_CACHE_DIR/generated``) and, like it, is used
only while it and its parent belong to this user alone.

This module only stores and fetches: the caller (suite/generated.py) names an entry by a key that
covers everything its inputs follow from, and checks what it gets back against the signed digests,
exactly as it checks a fresh draw. Entries are written into a temporary folder and renamed into
place; hits refresh an entry's record, and once the cache holds more than :data:`MAX_BYTES` the
least recently used entries are deleted. Deleting the whole folder is always safe.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from cudagate_harness.compiler import cache_dir, private_dir

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.errors import FileError

MAX_BYTES = 4 << 30  # about 120 entries of the matmul example's 2048³ case (32 MB of inputs each)
RECORD = "entry.json"
MAX_RECORD_BYTES = 64 * 1024
STALE_S = 3600  # a temporary folder this old was left by a process that died while writing


def cache_root() -> Path | None:
    """The cache folder, created mode 0700; None (no cache) when it or its parent is not this
    user's alone, as for the compile cache: a folder others can write is one they can poison."""
    return private_dir(cache_dir().parent / "generated")


def _place(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (no copy; a later replacement of either name leaves
    the other intact), or a copy across file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _arrays(folder: Path) -> list[Path]:
    """The input ``.npy`` files of a case folder, relative to it (its ``expected/`` outputs are not cached)."""
    return sorted(p.relative_to(folder) for p in folder.glob("*.npy") if p.is_file())


def _remove(folder: Path) -> None:
    """Take ``folder`` out of view at once (a rename), then delete it."""
    try:
        hidden = folder.with_name(f".trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(folder, hidden)
    except OSError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


class GeneratedCache:
    def __init__(self, root: Path):
        self.root = root

    def entry(self, key: str) -> Path:
        return self.root / key

    def fetch(self, key: str, target: Path) -> dict | None:
        """Place the inputs of entry ``key`` into the case folder ``target`` (emptied first) and
        return its record (what :meth:`store` was given); None when there is no usable entry. An
        entry whose record cannot be read is deleted (entries appear only whole, by a rename)."""
        folder = self.entry(key)
        if not folder.is_dir():
            return None
        try:
            record = boundary.load_json(folder / RECORD, MAX_RECORD_BYTES, "generated-case cache record")
            if schema.problems(record, "generated-cache-entry") or record["key"] != key:
                raise FileError(folder / RECORD, ["not a record of this entry"])
            arrays = _arrays(folder)
            shutil.rmtree(target, ignore_errors=True)
            for relative in arrays:
                _place(folder / relative, target / relative)
            os.utime(folder / RECORD)  # recently used
        except (OSError, FileError):
            self.discard(key)
            return None
        return record["record"]

    def store(self, key: str, source: Path, record: dict) -> None:
        """Enter the inputs of the verified case folder ``source`` under ``key`` with ``record``;
        a cache that cannot be written costs speed, never correctness."""
        document = {"format": 2, "key": key, "record": record}
        schema.validate(document, "generated-cache-entry", self.root / key / RECORD)
        try:
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        except OSError:
            return
        try:
            for relative in _arrays(source):
                _place(source / relative, staging / relative)
            (staging / RECORD).write_text(json.dumps(document, sort_keys=True), encoding="utf-8")
            os.rename(staging, self.entry(key))  # atomic; fails when another process entered it first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return
        self._evict(keep=key)

    def discard(self, key: str) -> None:
        _remove(self.entry(key))

    def _evict(self, keep: str) -> None:
        """Delete the least recently used entries while the cache holds more than :data:`MAX_BYTES`,
        and temporary folders left by processes that died."""
        entries, total, now = [], 0, time.time()
        for folder in self.root.iterdir():
            try:
                if folder.name.startswith("."):
                    if now - folder.stat().st_mtime > STALE_S:
                        shutil.rmtree(folder, ignore_errors=True)
                    continue
                size = sum(p.stat().st_size for p in boundary.walk(folder, "generated-case cache entry") if p.is_file())
                entries.append(((folder / RECORD).stat().st_mtime, size, folder))
            except (OSError, FileError):
                continue
            total += size
        for _, size, folder in sorted(entries, key=lambda e: e[0]):
            if total <= MAX_BYTES:
                break
            if folder.name != keep:
                _remove(folder)
                total -= size
