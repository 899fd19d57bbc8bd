"""Sign and verify any JSON document (a suite manifest, an approvals-ledger entry) with Ed25519.

The signed message is a domain tag followed by the canonical JSON of the document together with
the record's metadata (algorithm, key id, signer, time, tool version, purpose), so none of those
can be swapped after signing, and a signature made for one purpose is refused for another.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime, timezone

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pytest_cudagate import __version__
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.trust.canonical import canonical_bytes
from pytest_cudagate.trust.keys import key_id

ALGORITHM = "ed25519"
DOMAIN = b"cudagate-signature-v1\x00"
RECORD_FIELDS = ("algorithm", "key_id", "signer", "signed_at", "tool_version", "purpose", "value")


class SignatureError(CudagateError):
    """A signature that does not verify. ``reason``: malformed / untrusted / invalid / purpose."""

    def __init__(self, message: str, *, reason: str, key_id: str | None = None, signer: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.key_id = key_id
        self.signer = signer


def _message(doc: dict, record: dict) -> bytes:
    meta = {k: record[k] for k in RECORD_FIELDS if k != "value"}
    try:
        return DOMAIN + canonical_bytes({"document": doc, "record": meta})
    except (TypeError, ValueError) as exc:
        raise CudagateError(f"cannot sign or verify a document that is not plain JSON: {exc}") from None


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def sign_document(doc: dict, private_key: Ed25519PrivateKey, *, signer: str = "", purpose: str = "document",
                  signed_at: str | None = None) -> dict:
    """A signature record for ``doc``: ``{algorithm, key_id, signer, signed_at, tool_version, purpose, value}``.

    ``value`` is the base64 Ed25519 signature. ``doc`` must be plain JSON (no NaN); it is not modified.
    """
    if not isinstance(private_key, Ed25519PrivateKey):
        raise CudagateError("sign_document needs an Ed25519 private key (see load_private_key)")
    record = {
        "algorithm": ALGORITHM,
        "key_id": key_id(private_key),
        "signer": signer or "",
        "signed_at": signed_at or utc_now(),
        "tool_version": __version__,
        "purpose": purpose,
    }
    record["value"] = base64.b64encode(private_key.sign(_message(doc, record))).decode("ascii")
    return record


def verify_document(doc: dict, signature_record: dict, trusted_keys: dict, *, purpose: str | None = None) -> None:
    """Return if ``signature_record`` is a valid signature of ``doc`` by a key in ``trusted_keys``
    (``key_id -> Ed25519PublicKey``, e.g. from :func:`load_trusted_keys`); raise :class:`SignatureError`
    saying which key id signed and why it is refused otherwise. ``purpose``, when given, must match."""
    fields = signature_record if isinstance(signature_record, dict) else {}
    missing = [k for k in RECORD_FIELDS if not isinstance(fields.get(k), str)]
    if missing:
        raise SignatureError(f"the signature record is malformed: missing or non-text field(s) {', '.join(missing)}",
                             reason="malformed")
    kid, signer = signature_record["key_id"], signature_record["signer"]
    who = f"key {kid}" + (f" (signer {signer})" if signer else "")
    if signature_record["algorithm"] != ALGORITHM:
        raise SignatureError(f"signed with algorithm {signature_record['algorithm']!r}; cudagate accepts only {ALGORITHM}",
                             reason="malformed", key_id=kid, signer=signer)
    if purpose is not None and signature_record["purpose"] != purpose:
        raise SignatureError(f"this signature by {who} was made for {signature_record['purpose']!r}, not {purpose!r}",
                             reason="purpose", key_id=kid, signer=signer)
    public = trusted_keys.get(kid)
    if public is None:
        excluded = getattr(trusted_keys, "excluded", {}).get(kid)
        where = getattr(trusted_keys, "where", lambda: "the trusted keys")()
        why = f"it is on file but {excluded}" if excluded else f"no public key with that id in {where}"
        known = ", ".join(getattr(trusted_keys, "describe", str)(k) for k in sorted(trusted_keys)) or "none"
        raise SignatureError(f"signed by {who}, which is not trusted: {why} (trusted: {known})",
                             reason="untrusted", key_id=kid, signer=signer)
    try:
        value = base64.b64decode(signature_record["value"], validate=True)
    except (binascii.Error, ValueError):
        value = b""
    try:
        public.verify(value, _message(doc, signature_record))
    except InvalidSignature:
        raise SignatureError(f"the signature by {who} does not match the signed content: it was altered after signing",
                             reason="invalid", key_id=kid, signer=signer) from None
