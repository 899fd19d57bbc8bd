"""Where the CUDA toolkit's pieces are on this machine (headers, compute-sanitizer, ncu)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def roots() -> list[Path]:
    """Toolkit folders to look in, in order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda."""
    named = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    return [Path(r) for r in [*named, "/usr/local/cuda"] if r]


def find_tool(name: str, override_env: str) -> str | None:
    """A toolkit binary: ``$override_env`` when set (None if it names no file), the PATH, the roots."""
    explicit = os.environ.get(override_env)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which(name)
    if found:
        return found
    for root in roots():
        candidate = root / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return None
