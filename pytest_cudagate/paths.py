"""How paths are shown to people."""

from __future__ import annotations

import os
from pathlib import Path


def display_path(path: Path | str) -> str:
    """Relative to the working directory when inside it, so messages name familiar paths."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative
