"""The measurements the README quotes are kept under benchmarks/evidence/; each must still match the
schema of the script that wrote it, so `--merge` and readers of the files can rely on their shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_cudagate import schema

EVIDENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "evidence"
SCHEMA_OF = {"gate-power-": "gate-power", "timing-fidelity-": "timing-fidelity", "vs-library-": "vs-library",
             "optimize-summary-": "optimize-summary", "digest-cost-": "digest-cost"}


def kept() -> list[Path]:
    return sorted(EVIDENCE.rglob("*.json"))  # a folder of its own keeps a later run's files apart


def test_every_kept_file_has_a_schema():
    assert kept(), EVIDENCE
    assert all(any(p.name.startswith(prefix) for prefix in SCHEMA_OF) for p in kept()), [p.name for p in kept()]


@pytest.mark.parametrize("path", kept(), ids=lambda p: p.name)
def test_a_kept_file_matches_its_schema(path):
    name = next(s for prefix, s in SCHEMA_OF.items() if path.name.startswith(prefix))
    assert schema.problems(json.loads(path.read_text()), name) == []
