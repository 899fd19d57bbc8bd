"""Signed approvals: an entry that is unsigned, signed by an untrusted key, edited after signing,
or whose pinned source copy was altered is refused; a correctly signed ledger is trusted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_cudagate.approvals import Baseline, Ledger, approval_for
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair, load_private_key, load_trusted_keys
from pytest_cudagate.trust.ledger import ledger_problems, sign_ledger

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "softmax"


@pytest.fixture()
def signed(tmp_path):
    root = tmp_path / "proj"
    suite_dir = root / "softmax"
    shutil.copytree(EXAMPLE, suite_dir, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved", "*.sig.json"))
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    generate_key_pair("alice", private_path=tmp_path / "alice.key", public_path=root / ".cudagate/trusted_keys/alice.pub")
    generate_key_pair("mallory", private_path=tmp_path / "mallory.key", public_path=tmp_path / "mallory.pub")
    suite = load_suite(suite_dir / "cudagate.yaml")
    ledger = Ledger.for_suite(suite)
    approval = approval_for(ledger, suite.kernels[0], approved_by="alice", approved_at="2026-11-29T00:00:00+00:00",
                            git={"commit": None, "dirty": None}, tool_version="test")
    approval.baselines["0123456789abcdef"] = Baseline({"gpu_name": "X"}, "2026-11-29", {
        "perf_256x1024": {"summary": {"median": 0.006}, "samples_ms": [0.006, 0.0061], "cache": "cold"}})
    ledger.approvals[approval.kernel] = approval
    sign_ledger(ledger, load_private_key(tmp_path / "alice.key"), "alice")
    ledger.save()
    return suite, load_trusted_keys(root)


def problems(suite, trusted):
    return ledger_problems(Ledger.for_suite(suite), trusted, suite.path)


def test_a_signed_ledger_is_trusted(signed):
    assert problems(*signed) == []


def test_an_unsigned_entry_is_refused(signed):
    suite, trusted = signed
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["approvals"]["softmax_rows"]["signature"] = None
    path.write_text(json.dumps(raw))
    found = problems(suite, trusted)
    assert "approval of 'softmax_rows' is not signed" in found[0]
    assert found[-1].startswith("fix: a maintainer reviews the approvals and runs `cudagate sign")


@pytest.mark.parametrize("edit", [
    lambda a: a["baselines"]["0123456789abcdef"]["cases"]["perf_256x1024"]["samples_ms"].__setitem__(0, 0.001),
    lambda a: a.update(source_sha256="0" * 64),
    lambda a: a["launch"].update(block=[128]),
    lambda a: a.update(options=["-DBLOCK=128"]),
    lambda a: a.update(approved_by="mallory"),
], ids=["baseline sample", "source hash", "launch", "options", "approver"])
def test_an_entry_edited_after_signing_is_refused(signed, edit):
    suite, trusted = signed
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    edit(raw["approvals"]["softmax_rows"])
    path.write_text(json.dumps(raw))
    found = problems(suite, trusted)
    assert found and "approval of 'softmax_rows'" in found[0] and "signature" in found[0].lower(), found


def test_an_altered_pinned_source_is_refused(signed):
    suite, trusted = signed
    (blob,) = (suite.root / "approved").glob("*.cu")
    blob.write_text(blob.read_text() + "\n// sneaky\n")
    found = problems(suite, trusted)
    assert "content does not match its hash" in found[0], found


def test_a_ledger_signed_by_an_untrusted_key_is_refused(signed, tmp_path):
    suite, trusted = signed
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, load_private_key(tmp_path / "mallory.key"), "mallory")
    ledger.save()
    found = problems(suite, trusted)
    assert "not trusted" in found[0] or "untrusted" in found[0].lower(), found
