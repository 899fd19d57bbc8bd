"""compute-sanitizer in the gate: once per kernel, on its smallest case, skipped with a note when
the tool is absent; a finding fails the case (docs/hardening.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cudagate_harness import sanitizer

from pytest_cudagate.suite.model import Case, Checks, Suite

# Errors after which a sanitizer run has nothing to add (or would only hang again).
_NOT_SANITIZED = frozenset({"fault", "timeout", "crash", "launch", "oom", "input", "compile"})


def sanitizer_case(suite: Suite) -> Case:
    """The case compute-sanitizer runs each kernel on: its smallest non-holdout correctness case."""
    pool = ([c for c in suite.cases if c.kind == "correctness" and not c.holdout]
            or [c for c in suite.cases if not c.holdout] or list(suite.cases))
    return min(pool, key=lambda c: (sum(suite.counts(c).values()), c.name))


def wants_sanitizer(checks: Checks, suite: Suite, case: Case, body: dict) -> bool:
    if not checks.sanitizer or case.name != sanitizer_case(suite).name:
        return False
    return body.get("status") == "ok" or body.get("error", {}).get("kind") not in _NOT_SANITIZED


def find() -> str | None:
    """The compute-sanitizer binary, or None."""
    return sanitizer.find()


def sanitize(request: dict, tools, *, timeout_s: float, env: dict | None = None) -> tuple[list[str], list[str]]:
    """Run ``tools`` on the one-case ``request``: (problems that fail the case, notes)."""
    exe = find()
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
