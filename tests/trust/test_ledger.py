"""The signed approvals ledger (format 2, one signature over the document): unsigned, signed by an
untrusted key, edited after signing, a pinned source copy altered, a kernel's entry deleted or
swapped, another suite's ledger, an old format, an older sequence than the trusted one, or one signed over
another ledger than the trusted one are all refused; a correctly signed ledger is trusted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_cudagate.trust.approvals import Baseline, Ledger, approval_for
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair, load_private_key, load_trusted_keys
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.trust.ledger import CHAIN_LENGTH, BaseLedger, ledger_problems, sign_ledger, state_id

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "softmax"


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
    return ledger_problems(Ledger.for_suite(suite), trusted, suite)


def test_a_signed_ledger_is_trusted(signed):
    assert problems(*signed) == []


def test_an_unsigned_ledger_is_refused(signed):
    suite, trusted = signed
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["signature"] = None
    path.write_text(json.dumps(raw))
    found = problems(suite, trusted)
    assert found[0].endswith("cudagate.approvals.json: not signed"), found
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
    assert found and "cudagate.approvals.json" in found[0] and "signature" in found[0].lower(), found


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


def test_every_write_of_the_signature_bumps_the_sequence(signed, tmp_path):
    suite, _ = signed
    before = Ledger.for_suite(suite).sequence
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, load_private_key(tmp_path / "alice.key"), "alice")
    ledger.save()
    assert Ledger.for_suite(suite).sequence == before + 1


def _drop_entry(raw):
    del raw["approvals"]["softmax_rows"]


def _swap_entry(raw):
    raw["approvals"]["softmax_rows"]["kernel"] = "other"


def _other_suite(raw):
    raw["suite"] = "matmul"


@pytest.mark.parametrize("edit, expected", [
    (_drop_entry, "kernel 'softmax_rows' has no entry"),
    (_swap_entry, "the entry of kernel 'softmax_rows' holds the approval of kernel 'other'"),
    (_other_suite, "belongs to suite 'matmul', not 'softmax'"),
], ids=["deleted entry", "swapped entry", "another suite's ledger"])
def test_an_edited_ledger_is_refused_naming_what_changed(signed, edit, expected):
    suite, trusted = signed
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))
    found = problems(suite, trusted)
    assert expected in found[0], found


def test_a_rollback_below_the_trusted_sequence_is_refused(signed):
    suite, trusted = signed
    ledger = Ledger.for_suite(suite)
    base = BaseLedger("f" * 40, ledger.sequence + 1, "0" * 64)
    found = ledger_problems(ledger, trusted, suite, base)
    assert f"sequence {ledger.sequence} is lower than {ledger.sequence + 1} at the trusted ref" in found[0], found
    assert found[-1] == ("fix: a maintainer starts from the trusted ref's ledger (`git checkout ffffffffffff -- "
                         f"{display_path(ledger.path)}`), re-approves the kernels this change approves, and runs "
                         f"`cudagate sign {display_path(suite.path)}`")
    same = BaseLedger("f" * 40, ledger.sequence, state_id(ledger.signature))
    assert ledger_problems(ledger, trusted, suite, same) == []


def test_each_signing_chains_onto_the_signed_ledger_it_replaces(signed, tmp_path):
    """Signed twice over the base, and once more after an unsigned change (what `cudagate approve`
    without a key leaves): the base's id stays in the chain, so the gate takes the ledger."""
    suite, trusted = signed
    key = load_private_key(tmp_path / "alice.key")
    ledger = Ledger.for_suite(suite)
    base = BaseLedger("f" * 40, ledger.sequence, state_id(ledger.signature))
    sign_ledger(ledger, key, "alice")
    ledger.save()
    ledger = Ledger.for_suite(suite)
    ledger.history.append({"kernel": "softmax_rows", "note": "an unsigned change"})
    ledger.save()  # the stale signature record stays: it names the state this one comes from
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, key, "alice")
    ledger.save()
    ledger = Ledger.for_suite(suite)
    assert ledger.chain[0] == base.state and len(ledger.chain) == 2
    assert ledger_problems(ledger, trusted, suite, base) == []


def test_a_ledger_signed_over_another_base_is_refused(signed, tmp_path):
    suite, trusted = signed
    ledger = Ledger.for_suite(suite)
    elsewhere = BaseLedger("f" * 40, ledger.sequence, "0" * 64)  # the base re-signed, or re-created its ledger
    found = ledger_problems(ledger, trusted, suite, elsewhere)
    assert found[0] == (f"{display_path(ledger.path)}: sequence {ledger.sequence} was not signed over the ledger at "
                        f"the trusted ref (sequence {ledger.sequence}): a signature made on another branch, or over "
                        "a ledger the base has since replaced, does not count against this base"), found
    assert found[-1].startswith("fix: a maintainer starts from the trusted ref's ledger (`git checkout ffffffffffff")


def test_the_pull_request_a_ledger_is_signed_for_is_signed(signed, tmp_path):
    """The number is under the signature (edited, the ledger no longer verifies); a ledger signed
    without one has no such field, so ledgers signed before it existed keep their signatures."""
    suite, trusted = signed
    assert "pull_request" not in Ledger.for_suite(suite).signed_payload()
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, load_private_key(tmp_path / "alice.key"), "alice", pull_request=1)
    ledger.save()
    assert Ledger.for_suite(suite).pull_request == 1 and problems(suite, trusted) == []
    path = suite.root / "cudagate.approvals.json"
    path.write_text(path.read_text().replace('"pull_request": 1', '"pull_request": 2'))
    found = problems(suite, trusted)
    assert found[0].endswith("does not match the signed content: it was altered after signing"), found


def test_a_chain_of_more_than_64_links_keeps_the_last_ones(signed, tmp_path):
    suite, _ = signed
    key = load_private_key(tmp_path / "alice.key")
    for _ in range(CHAIN_LENGTH + 2):
        ledger = Ledger.for_suite(suite)
        sign_ledger(ledger, key, "alice")
        ledger.save()
    assert len(Ledger.for_suite(suite).chain) == CHAIN_LENGTH  # the schema's maxItems


def test_a_missing_ledger_is_refused_and_signing_creates_one_with_every_kernel_pending(signed, tmp_path):
    suite, trusted = signed
    (suite.root / "cudagate.approvals.json").unlink()
    assert "cudagate.approvals.json: missing" in problems(suite, trusted)[0]
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, load_private_key(tmp_path / "alice.key"), "alice")
    ledger.save()
    assert Ledger.for_suite(suite).pending == ["softmax_rows"]
    assert problems(suite, trusted) == []


def test_a_format_1_ledger_gets_one_message_naming_the_command(signed):
    suite, trusted = signed
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw = {"format": 1, "suite": raw["suite"], "approvals": raw["approvals"], "history": []}
    path.write_text(json.dumps(raw))
    (found,) = problems(suite, trusted)
    assert "ledger format 1" in found and "re-approve to record runs" in found and "cudagate sign" in found


def test_build_info_and_run_medians_are_signed(signed, tmp_path):
    suite, trusted = signed
    ledger = Ledger.for_suite(suite)
    approval = ledger.approvals["softmax_rows"]
    approval.build = {"nvrtc_version": "13.0", "options": ["-O3"], "cubin_sha256": {"sm_90": "a" * 64}}
    approval.baselines["0123456789abcdef"].cases["perf_256x1024"]["run_p10_ms"] = [0.006, 0.0061]
    sign_ledger(ledger, load_private_key(tmp_path / "alice.key"), "alice")
    ledger.save()
    assert problems(suite, trusted) == []
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["approvals"]["softmax_rows"]["build"]["cubin_sha256"]["sm_90"] = "b" * 64
    path.write_text(json.dumps(raw))
    assert "signature" in problems(suite, trusted)[0].lower()
