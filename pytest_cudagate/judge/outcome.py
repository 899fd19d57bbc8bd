"""One judged kernel × case, and its one JSON shape: the reports' items and the optimize pack's
gate cases are both built from :meth:`CaseOutcome.to_json` (``schemas/report.schema.json``, item).

JSON has no NaN or infinity, yet a relative norm can be infinite and a wrong output can hold NaN:
such floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.judge.elementwise import OutputCheck
from pytest_cudagate.judge.latency import LatencyResult
from pytest_cudagate.judge.library import LibraryResult

class Failure(Enum):
    """What failed before any verdict, named where it is found: the failures table's category."""

    COMPILE = "compile"
    CASE_DATA = "case data"


SAMPLE_DECIMALS = 6  # ms to the nanosecond: below CUDA event resolution, and keeps the file small


@dataclass
class CaseOutcome:
    suite: str
    kernel: str
    case: str
    kind: str
    correctness: CaseVerdict | None = None
    latency: LatencyResult | None = None
    failed: bool = False
    warning: str | None = None
    message: str = ""
    requests: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # relaxed or skipped checks: shown with the outcome
    worker_s: float = 0.0  # time the worker spent on this case: allocation, validation, warm-up, timing
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds by phase (pytest_cudagate.phases)
    shape_class: str = "default"  # the case's `class:` in the suite
    library: LibraryResult | None = None  # the kernel's library baseline on this case: informational only
    # Its run was begun and sent to the worker this long before its item started, while the case before
    # was judged (Gate.expect); that case's item lent it the main-thread part of the begin (lent_s).
    head_start_s: float = 0.0
    lent_s: float = 0.0
    failure: Failure | None = None  # a failure before any verdict (None: a verdict, or another error)

    @property
    def outcome(self) -> str:
        return "failed" if self.failed else "passed"

    @property
    def status(self) -> str:
        return "failed" if self.failed else ("warning" if self.warning else "passed")

    def category(self) -> str | None:
        """What kind of problem the outcome has, for the failures table."""
        if not (self.failed or self.warning):
            return None
        if self.correctness is None:
            return self.failure.value if self.failure is not None else "error"
        if not self.correctness.passed:
            return self.correctness.error_kind or "correctness"
        return f"latency {self.latency.verdict.value}" if self.latency is not None else "error"

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

    def samples(self) -> dict[str, list[float]]:
        if self.latency is not None and self.latency.samples:
            return samples_json(self.latency.samples)
        if self.correctness is not None and self.correctness.samples_ms:
            return samples_json({"current": self.correctness.samples_ms})
        return {}

    def to_json(self) -> dict:
        return {
            "suite": self.suite, "kernel": self.kernel, "case": self.case, "kind": self.kind, "class": self.shape_class,
            "status": self.status, "passed": not self.failed, "category": self.category(),
            "headline": self.headline(), "message": self.message, "warning": self.warning,
            "notes": list(dict.fromkeys(self.notes)),
            "correctness": correctness_json(self.correctness) if self.correctness is not None else None,
            "latency": latency_json(self.latency) if self.latency is not None else None,
            "samples_ms": self.samples(), "worker_s": self.worker_s,
            "phases": dict(self.phases), "head_start_s": round(self.head_start_s, 6),
            "library": plain(self.library.to_json()) if self.library is not None else None,
        }


def plain(value: Any) -> Any:
    """A JSON-safe copy: dataclasses and enums unwrapped, tuples as lists, non-finite floats as text."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):
        return plain(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return plain(value.item())
    return str(value)


def _tolerance_json(tolerance) -> dict | None:
    """A comparison's tolerance; ``ulp`` only where the suite gives it, so reports of suites without it
    read as they did before it existed."""
    if tolerance is None:
        return None
    return {k: v for k, v in dataclasses.asdict(tolerance).items() if k != "ulp" or v is not None}


def comparison_json(c: OutputCheck) -> dict:
    return plain({
        "buffer": c.buffer, "ok": c.ok, "total": c.total, "mismatches": c.mismatches, "rel_norm": c.rel_norm,
        "max_abs_error": c.max_abs_error, "worst_index": list(c.worst_index) if c.worst_index is not None else None,
        "worst_expected": c.worst_expected, "worst_actual": c.worst_actual, "worst_allowed": c.worst_allowed,
        "rel_norm_limit": c.rel_norm_limit, "unwritten": c.unwritten,
        "tolerance": _tolerance_json(c.tolerance),
        "description": c.describe(),
    })


def correctness_json(v: CaseVerdict) -> dict:
    return plain({
        "passed": v.passed, "problems": list(v.problems), "error_kind": v.error_kind, "median_ms": v.median_ms,
        "rel_norm": v.rel_norm, "comparisons": [comparison_json(c) for c in v.comparisons],
    })


def latency_json(r: LatencyResult) -> dict:
    data = plain(r.to_json())
    data["headline"] = r.headline()
    return data


def samples_json(samples: dict[str, list[float]]) -> dict[str, list[float]]:
    return {role: [round(float(x), SAMPLE_DECIMALS) for x in values] for role, values in samples.items() if values}
