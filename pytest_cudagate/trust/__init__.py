"""Trust: Ed25519 signatures over a suite's canonical manifest (``cudagate.sig.json``) and over any
JSON document (approvals-ledger entries), trusted keys, and the check the gate runs before replay.

Public API::

    keygen / keys:   generate_key_pair, load_private_key, load_public_key, load_trusted_keys, key_id,
                     find_project_root, TrustedKeys
    documents:       sign_document, verify_document, SignatureError, canonical_bytes
    suites:          suite_manifest, diff_manifests, instance_manifest, sign_suite, verify_suite, VerifyResult,
                     load_signature_file, gate_problems, UNSIGNED_WARNING
"""

from pytest_cudagate.trust.canonical import canonical_bytes, file_sha256
from pytest_cudagate.trust.documents import SignatureError, sign_document, verify_document
from pytest_cudagate.trust.keys import (PASSPHRASE_ENV, SIGNING_KEY_ENV, TRUSTED_IDS_ENV, TRUSTED_KEYS_DIR, GeneratedKey, TrustedKeys,
                   default_key_dir, find_project_root, generate_key_pair, key_id, load_private_key, load_public_key,
                   load_trusted_keys)
from pytest_cudagate.trust.manifest import (MANIFEST_FORMAT, collect_manifest, diff_manifests, instance_manifest, manifest_bytes,
                                           suite_manifest)
from pytest_cudagate.trust.suite_signing import (SIGNATURE_FILENAME, UNSIGNED_WARNING, VerifyResult, gate_problems, load_signature_file,
                            sign_suite, signature_path, verify_suite)

__all__ = [
    "MANIFEST_FORMAT", "PASSPHRASE_ENV", "SIGNATURE_FILENAME", "SIGNING_KEY_ENV", "TRUSTED_IDS_ENV",
    "TRUSTED_KEYS_DIR", "UNSIGNED_WARNING", "GeneratedKey", "SignatureError", "TrustedKeys", "VerifyResult",
    "canonical_bytes", "collect_manifest", "default_key_dir", "diff_manifests", "file_sha256", "find_project_root",
    "gate_problems", "generate_key_pair", "instance_manifest", "key_id", "load_private_key", "load_public_key", "load_signature_file",
    "load_trusted_keys", "manifest_bytes", "sign_document", "sign_suite", "signature_path", "suite_manifest",
    "verify_document", "verify_suite",
]
