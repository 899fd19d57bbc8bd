from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so tests can `import helpers`

from helpers import write_suite  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_compile_cache(tmp_path_factory, monkeypatch):
    """Keep NVRTC's on-disk cache out of the user's home; shared across tests for speed."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nvrtc-cache"))


@pytest.fixture
def suite_path(tmp_path) -> Path:
    """A valid ``scale`` suite with generated case data, in its own folder."""
    return write_suite(tmp_path / "scale")
