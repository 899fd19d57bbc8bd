"""Signatures on approvals-ledger entries: a pull request can change a kernel, but not what it is
compared with. Each entry (pinned source hash, launch, baselines) is signed on its own, so
approving one kernel never silently re-vouches for another."""

from __future__ import annotations

from pytest_cudagate.approvals import Ledger
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.paths import display_path
from pytest_cudagate.trust.documents import SignatureError, sign_document, verify_document

PURPOSE = "approval"


def sign_ledger(ledger: Ledger, key, signer: str) -> list[str]:
    """Sign every entry of ``ledger`` with ``key``; returns the kernels signed. The caller saves."""
    for approval in ledger.approvals.values():
        approval.signature = sign_document(approval.signed_payload(), key, signer=signer, purpose=PURPOSE)
    return sorted(ledger.approvals)


def ledger_problems(ledger: Ledger, trusted_keys, suite_path) -> list[str]:
    """What stops the gate from trusting the approved versions and baselines; [] when all verify."""
    problems = []
    where = display_path(ledger.path)
    for name, approval in sorted(ledger.approvals.items()):
        if approval.signature is None:
            problems.append(f"{where}: approval of {name!r} is not signed")
            continue
        try:
            verify_document(approval.signed_payload(), approval.signature, trusted_keys, purpose=PURPOSE)
        except SignatureError as exc:
            problems.append(f"{where}: approval of {name!r}: {exc}")
            continue
        try:
            ledger.approved_spec(approval)  # the pinned copies must still match their hashes
        except CudagateError as exc:
            problems.append(f"{where}: approval of {name!r}: {exc}")
    if problems:
        problems.append(f"fix: a maintainer reviews the approvals and runs `cudagate sign {display_path(suite_path)}`")
    return problems
