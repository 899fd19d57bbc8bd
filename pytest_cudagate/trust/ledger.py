"""The approvals ledger as one signed document: a pull request can change a kernel, but not what it is
compared with, and cannot drop, swap or roll back what a maintainer approved.

One signature covers the whole ledger (suite name, sequence, every approval and every explicitly
pending kernel). What the signature alone cannot show is checked here: that the ledger is this
suite's, that every kernel of the suite is accounted for, that each entry is filed under its own
kernel, and (given the ledger at a trusted ref) that it is the trusted one or was signed over it.

A signed ledger is known by its state id (:func:`state_id`). Signing records the id of the ledger it
replaces in ``chain``, so a ledger says which signed states it extends. Under ``cudagate gate
--trusted-ref`` a ledger that differs from the base's must name the base's id in its chain: a
signature made on a branch the base has moved past, or over a ledger the base has since replaced
(re-created at a lower sequence, say), names another id and does not count against this base.

The chain cannot tell pull requests over the same base apart: a signature made over the base's ledger
in one pull request extends it in any other. So a signing may name its pull request (``pull_request``),
and ``cudagate gate --pull-request N`` takes a ledger other than the base's only when it was signed
for N: a state signed for a pull request that was closed unmerged does not count in the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import LEDGER_NAME, Ledger
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.cases import sign_command
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.canonical import canonical_bytes, sha256_bytes
from pytest_cudagate.trust.documents import SignatureError, sign_document, verify_document
from pytest_cudagate.trust.keys import find_project_root, load_trusted_keys

PURPOSE = "approvals-ledger"
SIGNATURE_NAME = "cudagate.sig.json"
# Links a ledger keeps: a pull request signs a few times over its base, so the base's id is among the
# last ones; older links only lengthen the file.
CHAIN_LENGTH = 64


@dataclass(frozen=True)
class BaseLedger:
    """A suite's ledger at the trusted ref: what the pull request's ledger must equal or extend."""

    ref: str  # the trusted commit
    sequence: int
    state: str | None  # its state id; None where it holds no signature record


def state_id(record) -> str | None:
    """The id of a signed ledger: the SHA-256 of its signature record's canonical JSON. The record's
    value is an Ed25519 signature over the whole document, so a record that verifies names one document;
    and it stays in the file when ``cudagate approve`` changes the entries unsigned, so the signing that
    follows still knows which signed state it replaces. None for no record."""
    if not isinstance(record, dict):
        return None
    try:
        return sha256_bytes(canonical_bytes(record))
    except (TypeError, ValueError):  # not plain JSON: no signed state
        return None


def oracle_digest(suite_root: Path) -> str | None:
    """SHA-256 of the signed manifest in the suite's ``cudagate.sig.json`` (None when it has none)."""
    try:
        document = boundary.load_json(suite_root / SIGNATURE_NAME, boundary.MAX_SIGNATURE_BYTES, "signature file")
    except (OSError, CudagateError):
        return None
    manifest = document.get("manifest") if isinstance(document, dict) else None
    return sha256_bytes(canonical_bytes(manifest)) if isinstance(manifest, dict) else None


def sign_ledger(ledger: Ledger, key, signer: str, pull_request: int | None = None) -> list[str]:
    """Sign ``ledger`` as a whole with ``key``: every kernel of the suite without an approval is
    recorded as pending, the suite's signed oracle is bound to it, the signed ledger it replaces is
    added to its chain, the pull request it is signed for is recorded (None: none, and an earlier
    signing's number is dropped), and the sequence grows by one. Returns the approved kernels; the
    caller saves."""
    ledger.pending = sorted(set(ledger.pending) | (set(ledger.kernels) - set(ledger.approvals)))
    ledger.pending = [k for k in ledger.pending if k not in ledger.approvals]
    ledger.oracle_sha256 = oracle_digest(ledger.root)
    replaced = state_id(ledger.signature)
    if replaced is not None:
        ledger.chain = [*ledger.chain, replaced][-CHAIN_LENGTH:]
    ledger.pull_request = pull_request
    ledger.sequence += 1
    ledger.signature = sign_document(ledger.signed_payload(), key, signer=signer, purpose=PURPOSE)
    return sorted(ledger.approvals)


def _fix(suite: Suite, pull_request: int | None = None) -> str:
    return f"fix: a maintainer reviews the approvals and runs `{sign_command(suite, pull_request)}`"


def _base_fix(suite: Suite, ledger: Path, base: BaseLedger, pull_request: int | None) -> str:
    # re-signing the pull request's ledger would extend it, not the base's
    checkout = command("git", "checkout", base.ref[:12], "--", ledger)
    return (f"fix: a maintainer starts from the trusted ref's ledger (`{checkout}`), "
            f"re-approves the kernels this change approves, and runs `{sign_command(suite, pull_request)}`")


def extends(ledger: Ledger, base: BaseLedger) -> bool:
    """Whether ``ledger`` is the base's signed ledger or was signed over it (its chain names it)."""
    return base.state is None or base.state == state_id(ledger.signature) or base.state in ledger.chain


def ledger_problems(ledger: Ledger, trusted_keys, suite: Suite, base: BaseLedger | None = None,
                    pull_request: int | None = None) -> list[str]:
    """What stops the gate from trusting the approved versions and baselines; [] when all verify.

    ``base``: the ledger at the trusted ref (None: no trusted ref, or no ledger there); the ledger must
    not be older (sequence) and must be that one or extend it (chain). ``pull_request``: the pull
    request being gated (None: a push or a local run); a ledger other than the base's signed one must
    have been signed for it, a suite new in the pull request included.
    Each problem is one line naming the file, and the kernel where one is concerned.
    """
    where = display_path(ledger.path)
    if not ledger.exists:
        if base is not None:
            return [f"{where}: deleted; the trusted ref has a signed ledger (sequence {base.sequence}) for suite "
                    f"{suite.name!r}", _fix(suite, pull_request)]
        if not ledger.kernels:
            return []
        return [f"{where}: missing; every kernel of suite {suite.name!r} needs a signed approval or a signed "
                f"'not yet approved' entry ({', '.join(ledger.kernels)})", _fix(suite, pull_request)]
    if ledger.format != 2:
        return [f"{where}: ledger format {ledger.format} (entries signed one by one) is no longer trusted; re-approve "
                f"to record runs: a maintainer runs `{sign_command(suite, pull_request)}`, which re-signs it as "
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
    off_base = base is not None and (ledger.sequence < base.sequence
                                     or (ledger.signature is not None and not extends(ledger, base)))
    if base is not None and ledger.sequence < base.sequence:
        problems.append(f"{where}: sequence {ledger.sequence} is lower than {base.sequence} at the trusted ref: an "
                        "older signed ledger (rollback)")
    elif off_base:
        problems.append(f"{where}: sequence {ledger.sequence} was not signed over the ledger at the trusted ref "
                        f"(sequence {base.sequence}): a signature made on another branch, or over a ledger the base "
                        "has since replaced, does not count against this base")
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
    if problems:  # the fix signs anew, for this pull request: that settles which one it was signed for too
        return problems + [_base_fix(suite, ledger.path, base, pull_request) if off_base else _fix(suite, pull_request)]
    unchanged = base is not None and base.state is not None and base.state == state_id(ledger.signature)
    if pull_request is not None and not unchanged and ledger.pull_request != pull_request:
        signed_for = "no pull request" if ledger.pull_request is None else f"pull request {ledger.pull_request}"
        return [f"{where}: signed for {signed_for}, not for this pull request ({pull_request}): a changed signed "
                "state counts only in the pull request it was signed for; fix: a maintainer reviews this pull request "
                f"and runs `{sign_command(suite, pull_request)}`"]
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
    """For :class:`pytest_cudagate.trust.release.ReleaseSource`: ``suite -> verify(raw, label)`` checking a
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
