from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "gpu")]  # so tests can `import helpers` and `import gpu_support`

from gpu_support import has_gpu  # noqa: E402
from helpers import write_suite  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip cleanly on a machine without a CUDA device."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not has_gpu():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))


@pytest.fixture(autouse=True)
def _isolated_compile_cache(tmp_path_factory, monkeypatch):
    """Keep NVRTC's on-disk cache out of the user's home; shared across tests for speed."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nvrtc-cache"))


@pytest.fixture
def suite_path(tmp_path) -> Path:
    """A valid ``scale`` suite with generated case data, in its own folder."""
    return write_suite(tmp_path / "scale")
