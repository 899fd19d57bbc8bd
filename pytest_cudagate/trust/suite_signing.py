"""``cudagate.sig.json``: a suite's signed manifest, written by ``cudagate sign``, checked by
``cudagate verify`` and by the gate before any replay."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudagate import boundary

from pytest_cudagate.boundary import schema
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.trust.canonical import canonical_bytes
from pytest_cudagate.trust.documents import SignatureError, sign_document, verify_document
from pytest_cudagate.trust.ledger import ledger_problems, sign_ledger
from pytest_cudagate.trust.keys import TRUSTED_KEYS_DIR, find_project_root, key_id, load_trusted_keys
from pytest_cudagate.trust.manifest import (MANIFEST_FORMAT, change_fix, collect_manifest, diff_manifests, sign_fix,
                                            suite_manifest)
from pytest_cudagate.suite.cases import check_case_data, sign_command

SIGNATURE_FILENAME = "cudagate.sig.json"
SIGNATURE_FORMAT = 1
PURPOSE = "suite-manifest"
UNSIGNED_WARNING = ("WARNING: cudagate trust checks are OFF (unsigned suites allowed): case data, references and "
                    "tolerances are NOT verified against a maintainer's signature; never allow this in CI")


def signature_path(suite: Suite) -> Path:
    return suite.root / SIGNATURE_FILENAME


@dataclass
class VerifyResult:
    ok: bool
    suite: str  # the suite file, as shown to people
    signature_file: str
    key_id: str | None = None
    signer: str | None = None
    signed_at: str | None = None
    problems: list[str] = field(default_factory=list)
    fix: str = ""

    def summary(self) -> str:
        """One line when trusted; the problems and the fix otherwise."""
        if self.ok:
            who = f"{self.signer} " if self.signer else ""
            return f"{self.suite}: OK, signed by {who}(key {self.key_id}) at {self.signed_at}"
        head = f"{self.suite}: NOT TRUSTED"
        if self.key_id:
            head += f" ({SIGNATURE_FILENAME} signed by {self.signer or 'unnamed signer'}, key {self.key_id})"
        return "\n".join([head] + [f"  - {p}" for p in self.problems] + ([f"  {self.fix}"] if self.fix else []))


def _schema_locator(text: str):
    """Best-effort line numbers for schema errors in a pretty-printed JSON file."""
    lines = text.splitlines()

    def locate(parts):
        line = None
        start = 0
        for part in parts:
            if isinstance(part, int):
                continue
            needle = json.dumps(str(part)) + ":"
            for i in range(start, len(lines)):
                if needle in lines[i]:
                    line, start = i + 1, i + 1
                    break
            else:
                return line
        return line

    return locate


def load_signature_file(path: Path) -> dict:
    """Read and schema-check a ``cudagate.sig.json``; :class:`FileError` naming the file otherwise."""
    path = Path(path)
    try:
        text = boundary.read_text(path, boundary.MAX_SIGNATURE_BYTES, "signature file")
    except FileNotFoundError:
        raise FileError(path, ["missing: this suite has not been signed"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FileError(path, [f"cannot read the signature file: {getattr(exc, 'strerror', None) or exc}"]) from None
    try:
        doc = boundary.parse_json(text, path, "signature file")
    except ValueError as exc:
        raise FileError(path, [f"not valid JSON (truncated or hand-edited?): {exc}"]) from None
    if not isinstance(doc, dict):
        raise FileError(path, ["(top level): expected an object with format, manifest and signature"])
    schema.validate(doc, "signature", path, _schema_locator(text))
    return doc


def write_signature_file(path: Path, doc: dict) -> None:
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".cudagate.sig.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sign_suite(suite: Suite, key, signer: str | None = None, pull_request: int | None = None) -> Path:
    """Sign the suite's manifest with ``key`` (an Ed25519 private key) and write ``cudagate.sig.json``
    next to the suite file, then sign its approvals ledger as one document, for ``pull_request`` where
    given (creating it, every kernel pending, when there is none; see :func:`sign_ledger`). Refuses (:class:`FileError`) when case data is
    missing, unreferenced or does not match the signature, since a signature vouches for exactly what is
    on disk."""
    manifest = suite_manifest(suite)
    bad = [f"case {case.name}: {p}" for case in suite.cases for p in check_case_data(suite, case)]
    if bad:
        raise FileError(suite.path, bad + [f"fix: run `{command('cudagate', 'cases', 'generate', suite.path)}`, "
                                           "review the data, then sign"])
    record = sign_document(manifest, key, signer=signer or "", purpose=PURPOSE)
    path = signature_path(suite)
    write_signature_file(path, {"format": SIGNATURE_FORMAT, "manifest": manifest, "signature": record})
    ledger = Ledger.for_suite(suite)
    sign_ledger(ledger, key, signer or "", pull_request)
    ledger.save()
    return path


def _untrusted_fix(suite: Suite, kid: str, pull_request: int | None) -> str:
    return (f"fix: if key {kid} is a maintainer's, commit its public key to {TRUSTED_KEYS_DIR.as_posix()}/ on the base "
            "branch (reviewed; the gate trusts the keys of the base commit); "
            f"otherwise a maintainer reviews the change and runs `{sign_command(suite, pull_request)}`")


def verify_suite(suite: Suite, trusted_keys: dict, pull_request: int | None = None) -> VerifyResult:
    """Check ``cudagate.sig.json`` against the suite on disk and ``trusted_keys``.

    ``ok`` only when the file is well formed, its signature verifies with a trusted key, and the
    manifest recomputed from disk is byte-identical to the signed one. ``problems`` name the file
    or field of each difference; ``fix`` says what to do (``pull_request``: the signing it asks for is
    for that pull request, as `cudagate gate --pull-request` requires).
    """
    path = signature_path(suite)
    result = VerifyResult(ok=False, suite=display_path(suite.path), signature_file=display_path(path),
                          fix=sign_fix(suite, pull_request))
    try:
        doc = load_signature_file(path)
    except FileError as exc:
        result.problems = [f"{result.signature_file}: {p}" for p in exc.problems]
        return result
    record, signed = doc["signature"], doc["manifest"]
    result.key_id, result.signer, result.signed_at = record["key_id"], record["signer"] or None, record["signed_at"]
    try:
        verify_document(signed, record, trusted_keys, purpose=PURPOSE)
    except SignatureError as exc:
        result.problems.append(f"{result.signature_file}: {exc}")
        if exc.reason == "untrusted":
            result.fix = _untrusted_fix(suite, exc.key_id, pull_request)
    if signed.get("format") != MANIFEST_FORMAT:
        result.problems.append(f"{result.signature_file}: manifest format {signed.get('format')!r}; this cudagate "
                               f"reads format {MANIFEST_FORMAT}")
    current, found = collect_manifest(suite)
    result.problems.extend(found)
    try:
        same = canonical_bytes(signed) == canonical_bytes(current)
    except ValueError:
        same = False
    if not same:
        result.problems.extend(p for p in diff_manifests(signed, current) if p not in result.problems)
        if result.fix == sign_fix(suite, pull_request):
            result.fix = change_fix(suite, signed, current, pull_request)
    result.ok = not result.problems
    if result.ok:
        result.fix = ""
    return result


def gate_problems(suite: Suite, project_root: Path | None, settings=None, allow_unsigned: bool = False,
                  trust_root=None, ledger: Ledger | CudagateError | None = None) -> list[str]:
    """What stops the gate from trusting ``suite``: ``[]`` when its signature verifies (or when
    ``allow_unsigned``; the caller then prints :data:`UNSIGNED_WARNING`). Otherwise the problems,
    each naming a file or field, with the fix as the last line.

    ``trust_root`` (a :class:`~pytest_cudagate.trust.base_ref.TrustRoot`): the keys and the ledger to
    equal or extend come from the trusted ref instead of the working tree, a changed ledger must be
    signed for its pull request (where it names one), and unsigned is never allowed.
    ``ledger``: the suite's ledger as the caller read it (or why it could not), so that the ledger
    verified is the one used; None reads it here.
    """
    if allow_unsigned and trust_root is None:
        return []
    rootless = project_root is None and find_project_root(suite.root) is None
    if project_root is None:
        project_root = find_project_root(suite.root) or suite.root
    try:
        keys = trust_root.keys if trust_root is not None else load_trusted_keys(Path(project_root), settings)
    except CudagateError as exc:
        return [f"cannot load the trusted keys: {exc}"]
    if not keys and rootless and trust_root is None:
        # keygen writes NAME.pub under the project root's .cudagate/trusted_keys/; without a root it refuses
        return [f"no trusted signing keys: no project root (a folder holding pyproject.toml or .git) at or above "
                f"{display_path(suite.root)}, where the trusted keys are read from "
                f"<project root>/{TRUSTED_KEYS_DIR.as_posix()}/*.pub",
                "fix: make the project's top folder a repository (`git init`) or give it a pyproject.toml; there a "
                "maintainer runs `cudagate keygen --name NAME`, commits the .pub it writes, and runs "
                f"`{command('cudagate', 'sign', suite.path)}`"]
    if not keys:
        excluded = getattr(keys, "excluded", {})
        why = (f"keys are on file ({', '.join(sorted(excluded))}) but none is listed in the allow-list"
               if excluded else f"there is no public key in {keys.where()}")
        return [f"no trusted signing keys: {why}",
                "fix: a maintainer runs `cudagate keygen --name NAME`, commits the .pub it writes, and runs "
                f"`{command('cudagate', 'sign', suite.path)}`"]
    base, pull_request = (trust_root.ledger(suite), trust_root.pull_request) if trust_root is not None else (None, None)
    result = verify_suite(suite, keys, pull_request)
    problems = [] if result.ok else list(result.problems) + [result.fix]
    if ledger is None:
        try:
            ledger = Ledger.for_suite(suite)
        except CudagateError as exc:
            ledger = exc
    if isinstance(ledger, CudagateError):
        return problems + [str(ledger)]
    return problems + ledger_problems(ledger, keys, suite, base, pull_request)


def signer_from_keys(key, trusted_keys: dict) -> str | None:
    """The trusted .pub file's stem for ``key``'s id (``alice.pub`` → ``alice``), if any."""
    sources = getattr(trusted_keys, "sources", {}).get(key_id(key))
    return Path(sources[0]).stem if sources else None
