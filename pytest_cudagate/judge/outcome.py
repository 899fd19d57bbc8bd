"""One judged kernel × case, and its one JSON shape: the reports' items and the optimize pack's
gate cases are both :func:`pytest_cudagate.boundary.wire.to_json` of a :class:`CaseOutcome`
(``schemas/report.schema.json``, item).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.judge.latency import LatencyResult
from pytest_cudagate.judge.library import LibraryResult
from pytest_cudagate.boundary.wire import FIGURES, TIME, derived, json_field


class Failure(Enum):
    """What failed before any verdict, named where it is found: the failures table's category."""

    COMPILE = "compile"
    CASE_DATA = "case data"


SAMPLE_DECIMALS = 6  # ms to the nanosecond: below CUDA event resolution, and keeps the file small


@dataclass
class CaseOutcome:
    """Its report item is its fields in this order (:mod:`pytest_cudagate.boundary.wire`), with what is derived."""

    suite: str
    kernel: str
    case: str
    kind: str
    shape_class: str = json_field(key="class", default="default")  # the case's `class:` in the suite
    message: str = json_field(default="", per_run=FIGURES)  # its words may quote a measured figure
    warning: str | None = json_field(default=None, per_run=FIGURES)
    # Relaxed or skipped checks: shown with the outcome, each once.
    notes: list[str] = json_field(default_factory=list, convert=lambda notes: list(dict.fromkeys(notes)))
    correctness: CaseVerdict | None = None
    latency: LatencyResult | None = json_field(default=None, per_run=TIME)
    # time the worker spent on this case: allocation, validation, warm-up, timing
    worker_s: float = json_field(default=0.0, per_run=TIME)
    # wall seconds by phase (pytest_cudagate.phases)
    phases: dict[str, float] = json_field(default_factory=dict, per_run=TIME)
    # Its run was begun and sent to the worker this long before its item started, while the case before
    # was judged (Gate.expect); that case's item lent it the main-thread part of the begin (lent_s).
    head_start_s: float = json_field(default=0.0, convert=lambda s: round(s, 6), per_run=TIME)
    # the kernel's library baseline on this case: informational only
    library: LibraryResult | None = json_field(default=None, per_run=TIME)
    failed: bool = json_field(hidden=True, default=False)  # written as status and passed
    requests: list[dict] = json_field(hidden=True, default_factory=list)  # saved beside the report instead
    lent_s: float = json_field(hidden=True, default=0.0)
    failure: Failure | None = json_field(hidden=True, default=None)  # a failure before any verdict: its category

    @property
    def outcome(self) -> str:
        return "failed" if self.failed else "passed"

    @property
    @derived(after="shape_class")
    def status(self) -> str:
        return "failed" if self.failed else ("warning" if self.warning else "passed")

    @property
    @derived(after="shape_class")
    def passed(self) -> bool:
        return not self.failed

    @property
    @derived(after="shape_class")
    def category(self) -> str | None:
        """What kind of problem the outcome has, for the failures table."""
        if not (self.failed or self.warning):
            return None
        if self.correctness is None:
            return self.failure.value if self.failure is not None else "error"
        if not self.correctness.passed:
            return self.correctness.error_kind or "correctness"
        return f"latency {self.latency.verdict.value}" if self.latency is not None else "error"

    @property
    @derived(after="shape_class", per_run=FIGURES)
    def headline(self) -> str:
        """One line saying what happened, for tables: the first wrong output or the latency verdict."""
        verdict = self.correctness
        if verdict is not None and not verdict.passed:
            lines = [*verdict.problems, *(c.describe().splitlines()[0] for c in verdict.comparisons if not c.ok)]
            if lines:
                return lines[0]
        if self.latency is not None and (verdict is None or verdict.passed):
            return self.latency.headline()
        text = (self.message or self.warning or "").strip()
        if text:
            return text.splitlines()[0]
        return "correct" if verdict is not None and verdict.passed else ""

    @property
    @derived(after="latency", per_run=TIME)
    def samples_ms(self) -> dict[str, list[float]]:
        if self.latency is not None and self.latency.samples:
            return samples_json(self.latency.samples)
        if self.correctness is not None and self.correctness.samples_ms:
            return samples_json({"current": self.correctness.samples_ms})
        return {}


def samples_json(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    return {role: [round(float(x), SAMPLE_DECIMALS) for x in values] for role, values in samples.items() if values}
