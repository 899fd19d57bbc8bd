"""trust.suite_signing and signed documents: what signing refuses, the signature file itself, signatures of
other documents, and the gate's trust check (gate_problems)."""

from __future__ import annotations

import base64
import json
import py_compile
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.config import load_settings
from pytest_cudagate.errors import FileError
from pytest_cudagate.session import SuiteTrust
from pytest_cudagate.trust import (SIGNATURE_FILENAME, SignatureError, canonical_bytes, gate_problems, key_id,
                                   load_signature_file, sign_document, verify_document)
from trust_project import clean_env, project, write_npy  # noqa: F401 (fixtures)


# --------------------------------------------------------------------------- signing refuses what it cannot vouch for


def test_sign_refuses_unexpected_and_missing_files(project):
    write_npy(project.suite_dir / "cases" / "correct_7x33" / "extra.npy")
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("unexpected file cases/correct_7x33/extra.npy" in p for p in info.value.problems)
    (project.suite_dir / "cases" / "correct_7x33" / "extra.npy").unlink()
    (project.suite_dir / "cases" / "correct_7x33" / "x.npy").unlink()
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("cases/correct_7x33/x.npy: missing" in p for p in info.value.problems)


def test_sign_refuses_case_data_that_does_not_fit_the_signature(project):
    np.save(project.suite_dir / "cases" / "correct_7x33" / "x.npy", np.zeros(5, dtype=np.float32))
    with pytest.raises(FileError) as info:
        project.sign()
    assert any("case correct_7x33" in p and "x.npy" in p for p in info.value.problems)


def test_resign_after_review_makes_it_trusted_again(project):
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-5))
    assert not project.verify().ok
    project.sign()
    assert project.verify().ok


# --------------------------------------------------------------------------- the signature file itself


def _sig(project) -> Path:
    return project.suite_dir / SIGNATURE_FILENAME


def _rewrite(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


BROKEN_SIGNATURE_FILES = [
    ("truncated", lambda path: path.write_text(path.read_text()[: len(path.read_text()) // 2]), "not valid JSON"),
    ("empty", lambda path: path.write_text(""), "not valid JSON"),
    ("not-an-object", lambda path: path.write_text("[1, 2]"), "expected an object"),
    ("missing-key-id", lambda path: _rewrite(path, lambda d: d["signature"].pop("key_id")), "'key_id' is a required property"),
    ("wrong-algorithm", lambda path: _rewrite(path, lambda d: d["signature"].update(algorithm="rsa")), "signature.algorithm"),
    ("bad-value", lambda path: _rewrite(path, lambda d: d["signature"].update(value="not base64!")), "signature.value"),
    ("manifest-not-object", lambda path: _rewrite(path, lambda d: d.update(manifest=[])), "manifest"),
    ("unknown-field", lambda path: _rewrite(path, lambda d: d.update(extra=1)), "extra"),
    ("bad-hash", lambda path: _rewrite(path, lambda d: d["manifest"]["cases"]["perf_256x1024"]["files"].update(
        {"cases/perf_256x1024/x.npy": "abc"})), "manifest.cases.perf_256x1024.files.cases/perf_256x1024/x.npy"),
]


@pytest.mark.parametrize("breaks, message", [b[1:] for b in BROKEN_SIGNATURE_FILES],
                         ids=[b[0] for b in BROKEN_SIGNATURE_FILES])
def test_broken_signature_file_is_a_clear_error(project, breaks, message):
    breaks(_sig(project))
    with pytest.raises(FileError) as info:
        load_signature_file(_sig(project))
    assert info.value.path.endswith(SIGNATURE_FILENAME)
    assert message in str(info.value), str(info.value)
    result = project.verify()
    assert not result.ok
    assert all(SIGNATURE_FILENAME in p for p in result.problems) and message in "\n".join(result.problems)


def test_missing_signature_file(project):
    _sig(project).unlink()
    result = project.verify()
    assert not result.ok and "cudagate.sig.json: missing: this suite has not been signed" in result.problems[0]


def test_manifest_edited_inside_the_signature_file_is_caught(project):
    # An attacker relaxes the tolerance in both the suite and the stored manifest.
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    _rewrite(_sig(project), lambda d: d["manifest"]["tolerance"]["y"].update(atol=0.5))
    result = project.verify()
    assert not result.ok
    assert any("does not match the signed content" in p and project.alice.key_id in p for p in result.problems)


@pytest.mark.parametrize("field, value", [("signer", "bob"), ("signed_at", "2020-01-01T00:00:00Z"),
                                          ("tool_version", "9.9.9")])
def test_signature_metadata_is_signed_too(project, field, value):
    _rewrite(_sig(project), lambda d: d["signature"].update({field: value}))
    result = project.verify()
    assert not result.ok and any("does not match the signed content" in p for p in result.problems)


def test_signature_value_bit_flip(project):
    def flip(d):
        raw = bytearray(base64.b64decode(d["signature"]["value"]))
        raw[0] ^= 1
        d["signature"]["value"] = base64.b64encode(bytes(raw)).decode()
    _rewrite(_sig(project), flip)
    assert not project.verify().ok


def test_bytecode_beside_python_reference_is_no_trust_problem(project):
    """The reference runs from its source text and bytecode is never read (tests/acceptance/test_attacks_python.py)."""
    source = project.suite_dir / "reference.py"
    cache = project.suite_dir / "__pycache__" / f"reference.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(source), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert project.verify().ok
    cache.unlink()
    py_compile.compile(str(source), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert project.verify().ok


# --------------------------------------------------------------------------- generic documents (approvals ledger)


def test_sign_and_verify_document(project):
    key = project.key()
    trusted = project.trusted()
    entry = {"kernel": "softmax_rows", "source_sha256": "ab" * 32, "baseline_ms": 0.125, "note": "ünïcode"}
    record = sign_document(entry, key, signer="alice", purpose="approval")
    assert record["algorithm"] == "ed25519" and record["key_id"] == project.alice.key_id
    assert record["signed_at"].endswith("Z")
    verify_document(dict(reversed(list(entry.items()))), record, trusted)  # key order is irrelevant
    verify_document(entry, record, trusted, purpose="approval")
    with pytest.raises(SignatureError) as info:
        verify_document({**entry, "baseline_ms": 0.5}, record, trusted)
    assert info.value.reason == "invalid" and info.value.key_id == project.alice.key_id
    with pytest.raises(SignatureError) as info:
        verify_document(entry, record, trusted, purpose="suite-manifest")
    assert info.value.reason == "purpose"
    with pytest.raises(SignatureError) as info:
        verify_document(entry, {**record, "signer": "bob"}, trusted)
    assert info.value.reason == "invalid"
    with pytest.raises(SignatureError) as info:
        verify_document(entry, record, {})
    assert info.value.reason == "untrusted" and project.alice.key_id in str(info.value)
    with pytest.raises(SignatureError) as info:
        verify_document(entry, {"algorithm": "ed25519"}, trusted)
    assert info.value.reason == "malformed"


def test_suite_signature_is_not_valid_for_another_purpose(project):
    doc = json.loads(_sig(project).read_text())
    with pytest.raises(SignatureError):
        verify_document(doc["manifest"], doc["signature"], project.trusted(), purpose="approval")
    verify_document(doc["manifest"], doc["signature"], project.trusted())


def test_canonical_bytes_refuse_nan():
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})
    assert canonical_bytes({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode("utf-8")


# --------------------------------------------------------------------------- the gate hook


def test_gate_problems(project):
    suite = project.load()
    assert gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False) == []
    assert gate_problems(suite, None, None, allow_unsigned=False) == []  # finds the root itself
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    suite = project.load()
    problems = gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False)
    assert "tolerance.y.atol: 1e-06 → 0.5" in problems
    assert problems[-1].startswith("fix: ") and "cudagate sign" in problems[-1]
    assert gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=True) == []
    _sig(project).unlink()
    problems = gate_problems(suite, project.root, load_settings(project.root), allow_unsigned=False)
    assert any(SIGNATURE_FILENAME in p and "not been signed" in p for p in problems)


def test_gate_problems_without_any_trusted_key(project):
    shutil.rmtree(project.root / ".cudagate")
    problems = gate_problems(project.load(), project.root, None, allow_unsigned=False)
    assert problems and "no trusted signing keys" in problems[0] and "cudagate keygen" in problems[-1]




@pytest.mark.parametrize("readable", [True, False])
def test_the_gate_reads_a_ledger_once_and_judges_with_the_copy_it_verified(project, monkeypatch, readable):
    """Trust and replay share one read of the ledger: no second read for a swapped file to slip into,
    and a ledger that could not be read is reported by both in the same words."""
    suite = project.load()
    real, reads = Ledger.for_suite.__func__, []

    def counted(cls, s):
        reads.append(s.path)
        if not readable:
            raise FileError(s.root / "cudagate.approvals.json", ["cannot read the approvals ledger (test)"])
        return real(cls, s)

    monkeypatch.setattr(Ledger, "for_suite", classmethod(counted))
    trust = SuiteTrust()
    problems = trust.problems(suite)
    if readable:
        assert problems == [] and trust.ledger(suite) is trust.ledger(suite)
    else:
        assert any("cannot read the approvals ledger (test)" in p for p in problems)
        with pytest.raises(FileError, match=r"cannot read the approvals ledger \(test\)"):
            trust.ledger(suite)
    assert len(reads) == 1
