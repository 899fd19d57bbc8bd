"""The tests mirror the package (tests/README.md, "Where a test goes"): every test file sits in the folder of
a package of the source tree or in one of the few folders for whole runs, none directly in tests/, and no two
share a basename (pytest's default import mode imports a test file by its basename)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest_cudagate

TESTS = Path(__file__).resolve().parents[1]
PACKAGES = {p.name for p in Path(pytest_cudagate.__file__).parent.iterdir() if (p / "__init__.py").is_file()}
WHOLE = {"harness", "plugin", "cli", "acceptance", "benchmarks", "project", "gpu"}


def _test_files() -> list[Path]:
    return [p for p in TESTS.rglob("test_*.py") if "public" not in p.relative_to(TESTS).parts]


def test_every_test_file_sits_in_the_folder_of_its_package():
    stray = sorted(str(p.relative_to(TESTS)) for p in _test_files()
                   if p.parent.parent != TESTS or p.parent.name not in PACKAGES | WHOLE)
    assert not stray, (f"test files outside the layout: {stray}; move each to tests/PKG/test_MODULE.py for the module "
                       "it tests (tests/README.md)")


def test_no_two_test_files_share_a_basename():
    counts = Counter(p.name for p in _test_files())
    assert not [name for name, n in counts.items() if n > 1], counts.most_common(3)
