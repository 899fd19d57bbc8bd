"""``--cuda-gate-durations N``: the N slowest cases, each with its wall time split by phase, then
the run's phases (where the rest of the wall time went)."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.phases import PHASES, RUN_PHASES

_SHORT = {"worker_start": "start", "fresh_inputs": "fresh", "statistics": "stats", "sanitizer": "sanit"}


def render_durations(outcomes: Iterable[CaseOutcome], count: int, worker_start_s: float | None = None) -> list[str]:
    """Lines of the table, slowest first; ``count`` 0 lists every case (as pytest's ``--durations``)."""
    ranked = sorted(outcomes, key=lambda o: -sum(o.phases.values()))
    shown = ranked if count == 0 else ranked[:count]
    title = "all cases" if count == 0 or count >= len(ranked) else f"slowest {len(shown)} of {len(ranked)} cases"
    lines = [f"cudagate durations: {title}, seconds by phase"]
    if worker_start_s is not None:
        lines.append("worker start before the first item (overlapped with configure and collection): "
                     f"{worker_start_s:.3f} s")
    columns = [p for p in PHASES if any(o.phases.get(p, 0.0) >= 0.0005 for o in shown)]
    lines.append(" ".join(["  total", *(f"{_SHORT.get(p, p):>7}" for p in columns), " case"]))
    for o in shown:
        cells = [f"{o.phases.get(p, 0.0):7.3f}" for p in columns]
        lines.append(" ".join([f"{sum(o.phases.values()):7.3f}", *cells, f" {o.suite}::{o.kernel}::{o.case}"]))
    return lines


RUN_PHASE_WORDS = {
    "startup": "process start to cudagate's configure: interpreter, pytest, plugins, conftests",
    "configure": "cudagate's configure: its modules (numpy, PyYAML, cryptography, ...) and settings",
    "collection": "pytest's collection, suite files aside",
    "suites": "loading suite files: YAML, signature, case data",
    "trust": "signatures, manifest hashes of the case files, approvals ledgers",
    "worker_wait": "the first item's wait for the worker (its start overlaps configure and collection)",
    "ahead": "before the first item: every kernel compiled, and sanitized where not cached, side by side",
    "compile": "compile items (NVRTC, cached)",
    "release": "release items (the released kernels read from git)",
    "cases": "case items (their split is the table above, where a case sent ahead also counts its head start)",
    "other_tests": "ordinary pytest tests in the same run",
    "pytest": "pytest's own work: per-item setup, teardown, reporting; session start and finish",
    "report_build": "the report document: items, inputs' sha256, suites",
    "report_requests": "requests/: schema checks and files",
    "plots": "the HTML report's timing plots",
    "report_html": "report.html, plots aside",
    "report_json": "report.json: schema check and file",
    "benchmark_json": "--cuda-gate-benchmark-json file",
    "github": "job summary and annotations (GitHub Actions)",
    "worker_shutdown": "the worker's exit and the GPU lock's release, beyond the report writing",
}


def render_run_phases(seconds: dict[str, float]) -> list[str]:
    """The run's phases in order, with their sum: what this process spent up to its summary."""
    lines = ["cudagate run phases: seconds of this process's wall time until this summary"]
    for phase in RUN_PHASES:
        if phase in seconds:
            lines.append(f"{seconds[phase]:8.3f}  {phase:<16} {RUN_PHASE_WORDS[phase]}")
    lines.append(f"{sum(seconds.values()):8.3f}  {'total':<16} after it: the terminal summary, teardown, exit")
    return lines
