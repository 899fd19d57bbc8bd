"""compute-sanitizer in the gate: once per kernel, on its smallest case, skipped with a note when
the tool is absent; a finding fails the case (docs/hardening.md).

A tool that gives no verdict (it timed out, crashed, exited oddly or left no readable report) is
never a pass. Under a trust root (``cudagate gate --trusted-ref``) it fails the case, since a
kernel can tell it is instrumented (a slow first load) and spin or crash only then; elsewhere it
is a warning, so a local run on a machine with a broken sanitizer still judges the kernel.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from cudagate_harness import sanitizer

from pytest_cudagate.suite.model import Case, Checks, Suite

# Errors after which a sanitizer run has nothing to add (or would only hang again).
_NOT_SANITIZED = frozenset({"fault", "timeout", "crash", "launch", "oom", "input", "compile"})
# What an instrumented run gets beyond the case timeout: compute-sanitizer's own start (the tool, a
# CUDA context and the module's instrumentation; the examples' kernels take about 3 s side by side on
# the H200), at most half the timeout. The runs ahead of the cases (Gate.sanitize_ahead) get half the
# timeout: a kernel still running then is run again by its item, so one that hangs under
# instrumentation costs at most twice the case timeout, its three tools at once.
INSTRUMENTED_START_S = 5.0
AHEAD_SHARE = 0.5


def sanitizer_case(suite: Suite, kernel: str | None = None) -> Case:
    """The case compute-sanitizer runs ``kernel`` on: its smallest non-holdout correctness case among
    those it runs (its ``requires`` may leave out the suite's smallest)."""
    program = next((k for k in suite.kernels if k.name == kernel), None)
    cases = [c for c in suite.cases if program is None or program.runs(c)] or list(suite.cases)
    pool = ([c for c in cases if c.kind == "correctness" and not c.holdout]
            or [c for c in cases if not c.holdout] or cases)
    return min(pool, key=lambda c: (sum(suite.counts(c).values()), c.name))


def wants_sanitizer(checks: Checks, suite: Suite, kernel: str, case: Case, body: dict) -> bool:
    if not checks.sanitizer or case.name != sanitizer_case(suite, kernel).name:
        return False
    return body.get("status") == "ok" or body.get("error", {}).get("kind") not in _NOT_SANITIZED


def find() -> str | None:
    """The compute-sanitizer binary, or None."""
    return sanitizer.find()


def start_allowance(case_timeout_s: float) -> float:
    """The seconds an instrumented run gets on top of the case timeout (see :data:`INSTRUMENTED_START_S`)."""
    return min(AHEAD_SHARE * case_timeout_s, INSTRUMENTED_START_S)


def sanitize(request: dict, tools, *, case_timeout_s: float, env: dict | None = None,
             required: bool = False, ahead: bool = False) -> tuple[list[str], list[str]]:
    """Run ``tools`` on the one-case ``request`` within the case timeout and the instrumented start
    (``ahead``: within :data:`AHEAD_SHARE` of the case timeout): (problems that fail the case, notes).
    ``required`` (a trust root): no verdict is a problem."""
    exe = find()
    if exe is None:
        return [], [f"compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the "
                    f"{', '.join(tools)} step was skipped"]
    allowance = start_allowance(case_timeout_s)
    limit = AHEAD_SHARE * case_timeout_s if ahead else case_timeout_s + allowance
    with tempfile.TemporaryDirectory(prefix="cudagate-sanitize-") as work:
        results = sanitizer.run_tools(request, tuple(tools), exe=exe, timeout_s=limit, env=env, workdir=Path(work))
    problems, notes = [], []
    for tool in tools:
        result = results.get(tool)
        if result is None:
            continue
        if result.status == "errors":
            problems.append(result.describe())
        elif result.status == "skipped":
            line = result.describe()
            if result.timed_out:
                line += (f" (the case timeout {case_timeout_s:g} s + {allowance:g} s for the instrumented start); "
                         "a kernel under instrumentation must finish")
            if required:
                problems.append(f"{line}: under --trusted-ref a sanitizer without a verdict fails the case")
            else:
                notes.append(f"{line}: not a pass (under --trusted-ref it fails the case)")
    return problems, notes
