"""The approvals ledger as one signed document: a pull request can change a kernel, but not what it is
compared with, and cannot drop, swap or roll back what a maintainer approved.

One signature covers the whole ledger (suite name, sequence, every approval and every explicitly
pending kernel). What the signature alone cannot show is checked here: that the ledger is this
suite's, that every kernel of the suite is accounted for, that each entry is filed under its own
kernel, and (given the sequence at a trusted ref) that it is not older than the trusted one.
"""

from __future__ import annotations

from pathlib import Path

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.approvals.ledger import LEDGER_NAME, Ledger
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.canonical import canonical_bytes, sha256_bytes
from pytest_cudagate.trust.documents import SignatureError, sign_document, verify_document
from pytest_cudagate.trust.keys import find_project_root, load_trusted_keys

PURPOSE = "approvals-ledger"


SIGNATURE_NAME = "cudagate.sig.json"


def oracle_digest(suite_root: Path) -> str | None:
    """SHA-256 of the signed manifest in the suite's ``cudagate.sig.json`` (None when it has none)."""
    try:
        document = boundary.load_json(suite_root / SIGNATURE_NAME, boundary.MAX_SIGNATURE_BYTES, "signature file")
    except (OSError, CudagateError):
        return None
    manifest = document.get("manifest") if isinstance(document, dict) else None
    return sha256_bytes(canonical_bytes(manifest)) if isinstance(manifest, dict) else None


def sign_ledger(ledger: Ledger, key, signer: str) -> list[str]:
    """Sign ``ledger`` as a whole with ``key``: every kernel of the suite without an approval is
    recorded as pending, the suite's signed oracle is bound to it, and the sequence grows by one.
    Returns the approved kernels; the caller saves."""
    ledger.pending = sorted(set(ledger.pending) | (set(ledger.kernels) - set(ledger.approvals)))
    ledger.pending = [k for k in ledger.pending if k not in ledger.approvals]
    ledger.oracle_sha256 = oracle_digest(ledger.root)
    ledger.sequence += 1
    ledger.signature = sign_document(ledger.signed_payload(), key, signer=signer, purpose=PURPOSE)
    return sorted(ledger.approvals)


def _fix(suite: Suite) -> str:
    return f"fix: a maintainer reviews the approvals and runs `cudagate sign {display_path(suite.path)}`"


def ledger_problems(ledger: Ledger, trusted_keys, suite: Suite, base_sequence: int | None = None) -> list[str]:
    """What stops the gate from trusting the approved versions and baselines; [] when all verify.

    ``base_sequence``: the ledger's sequence at the trusted ref (None: not known, or no ledger there).
    Each problem is one line naming the file, and the kernel where one is concerned.
    """
    where = display_path(ledger.path)
    if not ledger.exists:
        if base_sequence is not None:
            return [f"{where}: deleted; the trusted ref has a signed ledger (sequence {base_sequence}) for suite "
                    f"{suite.name!r}", _fix(suite)]
        if not ledger.kernels:
            return []
        return [f"{where}: missing; every kernel of suite {suite.name!r} needs a signed approval or a signed "
                f"'not yet approved' entry ({', '.join(ledger.kernels)})", _fix(suite)]
    if ledger.format != 2:
        return [f"{where}: ledger format {ledger.format} (entries signed one by one) is no longer trusted; re-approve "
                f"to record runs: a maintainer runs `cudagate sign {display_path(suite.path)}`, which re-signs it as "
                "one document and keeps its approvals and baselines"]
    problems = []
    if ledger.suite != suite.name:
        problems.append(f"{where}: belongs to suite {ledger.suite!r}, not {suite.name!r}")
    for name, approval in sorted(ledger.approvals.items()):
        if approval.kernel != name:
            problems.append(f"{where}: the entry of kernel {name!r} holds the approval of kernel {approval.kernel!r} "
                            "(entries swapped)")
    for name in ledger.kernels:
        if name not in ledger.approvals and name not in ledger.pending:
            problems.append(f"{where}: kernel {name!r} has no entry (neither approved nor pending); was its entry "
                            "deleted?")
    if ledger.oracle_sha256 != oracle_digest(suite.root):
        problems.append(f"{where}: signed for another version of the suite's signed oracle ({SIGNATURE_NAME}): its "
                        "cases, tolerances or reference were rolled back, or re-signed without this ledger")
    if base_sequence is not None and ledger.sequence < base_sequence:
        problems.append(f"{where}: sequence {ledger.sequence} is lower than {base_sequence} at the trusted ref: an "
                        "older signed ledger (rollback)")
    if ledger.signature is None:
        problems.append(f"{where}: not signed")
    else:
        try:
            verify_document(ledger.signed_payload(), ledger.signature, trusted_keys, purpose=PURPOSE)
        except SignatureError as exc:
            problems.append(f"{where}: {exc}")
    for name, approval in sorted(ledger.approvals.items()):
        try:
            ledger.pinned_texts(approval)  # the pinned copies must still match their hashes
        except CudagateError as exc:
            problems.append(f"{where}: approval of {name!r}: {exc}")
    if problems:
        problems.append(_fix(suite))
    return problems



def verify_released_ledger(raw: dict, label: str, *, ledger_path: str, suite: Suite, trusted_keys) -> None:
    """Raise a :class:`CudagateError` naming ``ledger_path`` at ``label`` unless the ledger read from
    that release is this suite's, well-formed and signed as a whole by one of ``trusted_keys``
    (today's keys: a key revoked since then does not vouch for an old release)."""
    where = f"{ledger_path} at {label}"
    unusable = "; the release cannot be used as a reference"
    found = schema.problems(raw, "approvals")
    if found:
        raise CudagateError(f"{where}: not a valid approvals ledger ({found[0]}){unusable}")
    if raw["format"] != 2:
        raise CudagateError(f"{where}: ledger format {raw['format']} (entries signed one by one) is no longer "
                            f"trusted{unusable}; pass an older or newer release with --cuda-gate-release=REF")
    if raw["suite"] != suite.name:
        raise CudagateError(f"{where}: belongs to suite {raw['suite']!r}, not {suite.name!r}{unusable}")
    ledger = Ledger.from_json(Path(ledger_path), raw)
    swapped = sorted(name for name, approval in ledger.approvals.items() if approval.kernel != name)
    if swapped:
        raise CudagateError(f"{where}: the entry of kernel {swapped[0]!r} holds another kernel's approval{unusable}")
    if ledger.signature is None:
        raise CudagateError(f"{where}: not signed{unusable}")
    try:
        verify_document(ledger.signed_payload(), ledger.signature, trusted_keys, purpose=PURPOSE)
    except SignatureError as exc:
        raise CudagateError(f"{where}: {exc}{unusable}") from None


def release_verifier(trust_root=None, allow_unsigned: bool = False):
    """For :class:`pytest_cudagate.approvals.release.ReleaseSource`: ``suite -> verify(raw, label)`` checking a
    ledger read at a release against today's trusted keys (the trust root's under ``cudagate gate
    --trusted-ref``, else the project's). ``allow_unsigned`` (local experiments) checks nothing."""

    def for_suite(suite: Suite):
        where = display_path(suite.root / LEDGER_NAME)

        def verify(raw: dict, label: str) -> None:
            if allow_unsigned and trust_root is None:
                return
            keys = (trust_root.keys if trust_root is not None
                    else load_trusted_keys(find_project_root(suite.root) or suite.root))
            verify_released_ledger(raw, label, ledger_path=where, suite=suite, trusted_keys=keys)

        return verify

    return for_suite
