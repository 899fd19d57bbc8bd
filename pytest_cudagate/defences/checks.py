"""The gate's defences against kernels that game it, as the gate applies them (docs/hardening.md).

- :func:`effective_checks`: a suite's ``checks:`` relaxations count only when its signature covers
  them (``cudagate.sig.json``'s manifest holds the same ``checks`` entry, see
  :func:`manifest_entry`); a pull request that relaxes a check without a maintainer's signature
  gets every check, and the outcome says why.
- :func:`worker_checks`: the request's ``checks`` (the worker-side switches).
- :func:`sanitizer_case` and :func:`sanitize`: compute-sanitizer once per kernel, on its smallest
  case, skipped with a note when the tool is absent.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from cudagate_harness import sanitizer

from pytest_cudagate.suite.model import DEFAULT_CHECKS, Case, Checks, Suite

SIGNATURE_FILENAME = "cudagate.sig.json"  # trust.suite_signing.SIGNATURE_FILENAME (not imported: no cycle)


def manifest_entry(suite: Suite) -> dict | None:
    """What the signed manifest holds for the suite's ``checks:``: its relaxations, or None when it
    relaxes nothing (so every suite signed before ``checks`` existed keeps its signature).

    trust/manifest.py: ``entry = manifest_entry(suite); if entry: manifest["checks"] = entry``.
    """
    relaxed = suite.checks.relaxations()
    return relaxed or None


def _signed_checks(suite: Suite) -> tuple[bool, dict | None]:
    """(is there a signature file, the ``checks`` entry of its manifest)."""
    path = suite.root / SIGNATURE_FILENAME
    if not path.is_file():
        return False, None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8")).get("manifest", {})
    except (OSError, ValueError, AttributeError):
        return True, None
    return True, manifest.get("checks") if isinstance(manifest, dict) else None


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


def sanitizer_case(suite: Suite) -> Case:
    """The case compute-sanitizer runs each kernel on: its smallest non-holdout correctness case."""
    pool = ([c for c in suite.cases if c.kind == "correctness" and not c.holdout]
            or [c for c in suite.cases if not c.holdout] or list(suite.cases))
    return min(pool, key=lambda c: (sum(suite.counts(c).values()), c.name))


# Errors after which a sanitizer run has nothing to add (or would only hang again).
_NOT_SANITIZED = frozenset({"fault", "timeout", "crash", "launch", "oom", "input", "compile"})


def wants_sanitizer(checks: Checks, suite: Suite, case: Case, body: dict) -> bool:
    if not checks.sanitizer or case.name != sanitizer_case(suite).name:
        return False
    return body.get("status") == "ok" or body.get("error", {}).get("kind") not in _NOT_SANITIZED


def sanitize(request: dict, tools, *, timeout_s: float, env: dict | None = None) -> tuple[list[str], list[str]]:
    """Run ``tools`` on the one-case ``request``: (problems that fail the case, notes)."""
    exe = sanitizer.find()
    if exe is None:
        return [], [f"compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the "
                    f"{', '.join(tools)} step was skipped"]
    with tempfile.TemporaryDirectory(prefix="cudagate-sanitize-") as work:
        results = sanitizer.run_tools(request, tuple(tools), exe=exe, timeout_s=timeout_s, env=env, workdir=Path(work))
    problems, notes = [], []
    for tool in tools:
        result = results.get(tool)
        if result is None:
            continue
        if result.status == "errors":
            problems.append(result.describe())
        elif result.status == "skipped":
            notes.append(result.describe())
    return problems, notes
