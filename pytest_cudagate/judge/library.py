"""The library baseline column: the kernel's latency as a multiple of a vendor library's, per case.

Informational only: nothing here feeds a verdict. The worker times the library beside the current
kernel in interleaved rounds (``cudagate_harness.library``); the ratio current/library is the
gate's own paired rule (:func:`stats.paired_ratio`), and the library's output is checked against
the reference like a kernel's, so a wrong mapping of the suite's parameters shows as an error in
the column rather than as a plausible number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cudagate_harness.library import ADAPTERS

from pytest_cudagate.judge import stats
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.suite.model import Checks, Tolerance
from pytest_cudagate.boundary.wire import derived, json_field


@dataclass
class LibraryResult:
    adapter: str
    label: str  # the library's name in reports, e.g. "cuBLAS SGEMM"
    # Why there is no ratio (not found, mapping, wrong output); empty (null in the report) when there is one.
    error: str = json_field(default="", convert=lambda error: error or None, revert=lambda error: error or "")
    estimate: stats.RatioEstimate | None = None  # current / library, paired per round
    library: stats.SampleSummary | None = None
    current: stats.SampleSummary | None = None

    def cell(self) -> str:
        """The terminal table's cell: ``1.234× [1.210, 1.262]``, or ``error``."""
        est = self.estimate
        return f"{est.ratio:.3f}× [{est.low:.3f}, {est.high:.3f}]" if est else "error"

    @derived(after="label")
    def headline(self) -> str:
        est = self.estimate
        if est is None:
            return f"{self.label}: no ratio: {self.error}"
        return (f"current takes {est.ratio:.3f}× the time of {self.label} ({est.confidence:.0%} CI "
                f"[{est.low:.3f}, {est.high:.3f}], {est.n} interleaved rounds; informational, not a verdict)")



def judge_library(entry: dict, case: str, expected: dict[str, np.ndarray], tolerance: dict[str, Tolerance],
                  shapes: dict[str, tuple[int, ...]], checks: Checks | None = None,
                  confidence: float = 0.99) -> LibraryResult:
    """A worker's ``library`` entry for one case: its ratio, or why there is none."""
    adapter = str(entry.get("adapter"))
    known = ADAPTERS.get(adapter)
    result = LibraryResult(adapter, known.label if known else adapter)
    if entry.get("error"):
        result.error = str(entry["error"])
        return result
    check = judge_case(result.label, case, {"status": "ok", **entry}, expected, tolerance, shapes, checks=checks)
    if not check.passed:
        wrong = [*(c.describe().splitlines()[0] for c in check.comparisons if not c.ok), *check.problems]
        result.error = ("its output does not match the reference (check the suite's library_baseline args): "
                        + "; ".join(wrong[:2]))
        return result
    try:
        result.estimate = stats.paired_ratio(entry["current_ms"], entry["library_ms"], confidence=confidence)
    except ValueError as exc:  # no rounds, or a sample a CUDA event cannot have given
        result.error = f"its samples cannot be compared: {exc}"
        return result
    result.library, result.current = stats.summarize(entry["library_ms"]), stats.summarize(entry["current_ms"])
    return result
