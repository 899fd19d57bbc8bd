"""A measured case judged (:func:`judge`: the build, correctness with the fresh inputs, the library
column, compute-sanitizer) and decided (:func:`decide`: fail, warn or pass, in the gate's words)."""

from __future__ import annotations

from pytest_cudagate import phases
from pytest_cudagate.defences.sanitizer import sanitize, wants_sanitizer
from pytest_cudagate.gate.job import CaseJob
from pytest_cudagate.gate.measure import Bench, Measured
from pytest_cudagate.gate.options import GateOptions
from pytest_cudagate.judge.correctness import in_background, judge_case
from pytest_cudagate.judge.latency import blocks, warns
from pytest_cudagate.judge.library import judge_library
from pytest_cudagate.judge.outcome import CaseOutcome, Failure
from pytest_cudagate.suite.model import judged
from pytest_cudagate.worker.requests import shown_log, version_request


def judge(job: CaseJob, measured: Measured, bench: Bench, *, trusted: bool) -> None:
    """The build, then correctness (with the fresh inputs and the sanitizer) into ``job.outcome``;
    ``trusted``: under a trust root, where a sanitizer without a verdict fails."""
    outcome, suite, case, version, body = job.outcome, job.suite, job.case, job.version, measured.body
    outcome.latency = measured.latency
    if measured.compile is not None and not measured.compile.get("ok"):
        outcome.failed, outcome.failure = True, Failure.COMPILE
        what = f" ({version.build_name(case)})" if case.shape_class in version.classes else ""
        outcome.message = (f"{version.source_file}{what} does not compile:\n"
                           f"{shown_log(version.name, version.source_path, measured.compile.get('log', ''), version.header_paths)}")
        return
    resolved = suite.resolved(case)
    with phases.clock(outcome, "checks"):
        # informational: judged beside the verdict (and side by side with it), never into it
        library = (in_background(judge_library, body["library"], case.name, resolved.expected_outputs(), suite.tolerance,
                                 resolved.shapes, job.checks) if body.get("library") else None)
        outcome.correctness = judge_case(version.name, case.name, body, *judged(suite, version.name, resolved),
                                         resolved.shapes, checks=job.checks)
    outcome.notes.extend(outcome.correctness.notes)
    if library is not None:
        with phases.clock(outcome, "statistics"):
            outcome.library = library.result()
    with phases.clock(outcome, "sanitizer"):
        _sanitize(job, body, bench, trusted)


def _sanitize(job: CaseJob, body: dict, bench: Bench, trusted: bool) -> None:
    """compute-sanitizer on the kernel's smallest case (once per kernel; the verdicts are cached)."""
    outcome, checks = job.outcome, job.checks
    if outcome.correctness is None or not wants_sanitizer(checks, job.suite, job.version.name, job.case, body):
        return
    request = version_request(job.suite, job.version, [job.case], output_dir=bench.output_dir / "sanitizer")
    client = bench.link.client
    problems, notes = sanitize(request, checks.sanitizer, case_timeout_s=float(client.timeout_s), env=client.env,
                               required=trusted)
    outcome.notes.extend(notes)
    if problems:
        outcome.correctness.problems.extend(problems)
        outcome.correctness.passed = False


def decide(outcome: CaseOutcome, options: GateOptions) -> None:
    """Whether a judged outcome fails, warns or passes under ``options``, and the words for it."""
    if outcome.correctness is None:  # the build failed: nothing was judged, and its message says so
        return
    parts = []
    if not outcome.correctness.passed:
        outcome.failed = True
        parts.append(outcome.correctness.describe())
    latency = outcome.latency
    if latency is not None and outcome.correctness.passed:
        judged = [latency] + ([latency.release] if latency.release is not None else [])
        if any(blocks(r, strict=options.strict, release=options.release, trusted=options.trusted) for r in judged):
            outcome.failed = True
            parts.append(latency.describe())
        elif any(warns(r) for r in judged):
            outcome.warning = latency.describe()
    if outcome.notes:  # relaxed or skipped checks are said with every outcome, never silently
        said = "\n".join(f"note: {note}" for note in dict.fromkeys(outcome.notes))
        if outcome.failed:
            parts.append(said)
        else:
            outcome.warning = f"{outcome.warning}\n{said}" if outcome.warning else said
    outcome.message = "\n".join(parts)
