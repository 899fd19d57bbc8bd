"""The measurements the README quotes are kept under benchmarks/evidence/; each must still match the
schema of the script that wrote it, so `--merge` and readers of the files can rely on their shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_cudagate.boundary import schema

EVIDENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "evidence"
SCHEMA_OF = {"gate-power-": "gate-power", "timing-fidelity-": "timing-fidelity", "vs-library-": "vs-library",
             "optimize-summary-": "optimize-summary", "digest-cost-": "digest-cost", "bisect-power": "bisect-power",
             "card-floor-": "card-floor", "card-floor-derived-": "card-floor-derived", "gate-speed-": "gate-speed",
             "release-drift-": "release-drift", "run-level-rounds-": "run-level-rounds", "history-speed-": "history-speed",
             "hang-cost-": "hang-cost", "report-equality-": "report-equality",
             "hostile-kernels-": "hostile-kernels", "public-kernels-": "public-kernels",
             "compile-speed-": "compile-speed"}


def kept() -> list[Path]:
    return sorted(EVIDENCE.rglob("*.json"))  # a folder of its own keeps a later run's files apart


def schema_of(path: Path) -> str | None:
    """The schema of the longest prefix the file's name starts with (card-floor-derived- before card-floor-)."""
    found = [prefix for prefix in SCHEMA_OF if path.name.startswith(prefix)]
    return SCHEMA_OF[max(found, key=len)] if found else None


def test_every_kept_file_has_a_schema():
    assert kept(), EVIDENCE
    assert [p.name for p in kept() if schema_of(p) is None] == []


@pytest.mark.parametrize("path", kept(), ids=lambda p: p.name)
def test_a_kept_file_matches_its_schema(path):
    assert schema.problems(json.loads(path.read_text()), schema_of(path)) == []


def test_the_longest_prefix_names_the_schema():
    assert schema_of(Path("card-floor-derived-h200.json")) == "card-floor-derived"
    assert schema_of(Path("card-floor-h200-1.json")) == "card-floor"
    assert schema_of(Path("notes.json")) is None
