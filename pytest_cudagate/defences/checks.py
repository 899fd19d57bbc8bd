"""Which of the gate's defences apply to a suite (docs/hardening.md).

- :func:`effective_checks`: a suite's ``checks:`` relaxations count only when its signature covers
  them (the signed manifest holds the same ``checks`` entry, see
  :func:`pytest_cudagate.suite.model.manifest_entry`); a pull request that relaxes a check without a
  maintainer's signature gets every check, and the outcome says why.
- :func:`worker_checks`: the request's ``checks`` (the worker-side switches).

The compute-sanitizer step is :mod:`pytest_cudagate.defences.sanitizer`.
"""

from __future__ import annotations

from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.model import DEFAULT_CHECKS, Checks, Suite
from pytest_cudagate.trust import SIGNATURE_FILENAME, instance_manifest, load_signature_file, signature_path


def _signed_checks(suite: Suite) -> tuple[bool, dict | None]:
    """(is there a signature file, the ``checks`` entry of its manifest; None when unreadable)."""
    path = signature_path(suite)
    if not path.is_file():
        return False, None
    try:
        manifest = instance_manifest(load_signature_file(path)["manifest"], suite)
    except (FileError, KeyError, TypeError):
        return True, None
    return True, manifest.get("checks")


def effective_checks(suite: Suite) -> tuple[Checks, list[str]]:
    """The checks the gate applies to ``suite`` and the notes every outcome of it carries."""
    checks = suite.checks
    relaxed = checks.relaxations()
    if not relaxed:
        return checks, []
    signed_file, signed = _signed_checks(suite)
    if signed_file and signed != relaxed:
        shown = ", ".join(f"{k}: {v}" for k, v in relaxed.items())
        return DEFAULT_CHECKS, [f"the suite relaxes checks ({shown}) but {SIGNATURE_FILENAME} does not cover that, so "
                                f"every check applies; a maintainer reviews and runs `cudagate sign` to relax them"]
    notes = checks.describe_relaxations()
    if not signed_file:
        notes.append("(the suite is unsigned, so these relaxations are not signed either)")
    return checks, notes


def worker_checks(checks: Checks) -> dict:
    """The ``checks`` of a harness request (schemas/harness-request.schema.json)."""
    return {"guards": checks.guard_zones, "scrub_shared": checks.scrub_shared, "timed_outputs": checks.timed_outputs}
