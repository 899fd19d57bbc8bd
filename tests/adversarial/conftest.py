"""Planted-kernel GPU tests: marked ``gpu`` and skipped cleanly on machines without a CUDA device."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))  # gpu_support

from gpu_support import has_gpu  # noqa: E402

HAS_GPU = has_gpu()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)
