"""The report document as typed objects (``schemas/report.schema.json``): what a gate run writes to
report.json (:func:`pytest_cudagate.boundary.wire.to_json`) and what every reader and renderer takes
(:func:`pytest_cudagate.boundary.wire.from_json` of a report.json). A report field is a field here or
in the objects these hold (a :class:`CaseOutcome`'s), and a line in the schema."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pytest_cudagate.boundary.wire import FIGURES, TIME, derived, json_field
from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.judge.latency import LatencyResult
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.worker.build import BuildFacts

REPORT_FORMAT = "cudagate-report"
REPORT_VERSION = 1
STATUS_ORDER = ("failed", "warning", "passed", "skipped")


@dataclass
class Fingerprint:
    key: str
    description: str
    fields: dict[str, Any]  # the fingerprint's own fields (GPU name, driver, clocks), as it writes them


@dataclass
class Run:
    """One gate run (one job): where it ran, with which options, and what its compile items built."""

    fingerprint: Fingerprint | None
    host: str
    created: str
    tool_version: str
    exitstatus: int | None
    options: dict[str, Any]
    report_dir: str | None
    github: dict[str, str | None] | None
    # pytest's counts of the run's gate items: None for a report built from outcomes alone
    pytest_counts: dict[str, int] | None = json_field(default=None, omit_default=True)
    compiles: list[BuildFacts] = field(default_factory=list)
    # The live run's wall seconds by phase and its worker's busy share of the cases, set as report.json is written.
    phases: dict[str, float] | None = json_field(default=None, omit_default=True)
    cases_busy: float | None = json_field(default=None, omit_default=True)


@dataclass
class Suite:
    name: str
    path: str
    signature: str | None  # the status the trust check reported for the file; None: not reported


@dataclass
class Counts:
    """pytest's counts of the gate's items, summed over the runs, then cases among the passed that
    warned and latency regressions (:func:`pytest_cudagate.reports.document.summarize`)."""

    failed: int = 0
    errors: int = 0
    passed: int = 0
    skipped: int = 0
    total: int = 0
    warning: int = 0
    regressed: int = 0


@dataclass
class Item(CaseOutcome):
    """A replayed kernel × case: its outcome and where the evidence is."""

    nodeid: str = json_field(default="", first=True)
    run: int = 0  # its run among the report's runs
    suite_path: str | None = None
    source: str | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # case file -> sha256
    request_files: list[str] = json_field(key="requests", default_factory=list)  # requests/NAME beside the report
    reproduce: list[str] = field(default_factory=list)  # commands that run it again

    @classmethod
    def of(cls, outcome: CaseOutcome, **own: Any) -> Item:
        return cls(**{f.name: getattr(outcome, f.name) for f in fields(CaseOutcome)}, **own)


@dataclass
class SkippedItem:
    """A case not replayed (no CUDA device): what an item says, with nothing measured."""

    nodeid: str
    suite: str
    kernel: str
    case: str
    kind: str
    shape_class: str = json_field(key="class")
    status: str = "skipped"
    category: str | None = None
    run: int = 0
    headline: str = json_field(default="", per_run=FIGURES)
    message: str = json_field(default="", per_run=FIGURES)
    warning: str | None = json_field(default=None, per_run=FIGURES)
    suite_path: str | None = None
    source: str | None = None
    correctness: CaseVerdict | None = None
    latency: LatencyResult | None = json_field(default=None, per_run=TIME)
    samples_ms: dict[str, list[float]] = json_field(default_factory=dict, per_run=TIME)
    inputs: dict[str, str] = field(default_factory=dict)
    request_files: list[str] = json_field(key="requests", default_factory=list)
    reproduce: list[str] = field(default_factory=list)
    library = None  # nothing was timed, against the library either
    worker_s = 0.0


@dataclass
class Report:
    """report.json: the verdict and counts of its items, its runs, suites and items (failures first)."""

    format: str
    version: int
    created: str
    tool_version: str
    runs: list[Run]
    suites: list[Suite]
    items: list[Item | SkippedItem]
    extra: dict[str, Any] | None = json_field(default=None, omit_default=True)  # a plugin's fields

    @property
    @derived(after="tool_version")
    def verdict(self) -> str:
        return summarize(self.items, self.runs)[0]

    @property
    @derived(after="tool_version")
    def counts(self) -> Counts:
        return summarize(self.items, self.runs)[1]


def regressed(item: Item | SkippedItem) -> bool:
    return item.latency is not None and item.latency.verdict.value == "regressed"


def summarize(items: list[Item | SkippedItem], runs: list[Run]) -> tuple[str, Counts]:
    """Overall verdict and counts. failed, errors, passed and skipped are pytest's for the gate's items
    (compile and release items too), summed over the runs: a run that holds no pytest counts (a report
    built from outcomes alone) counts its items. warning (cases that passed with a warning, among the
    passed) and regressed count items. A case not replayed was not judged, so it cannot make a PASS;
    neither can a run that judged nothing."""
    counts = Counts()
    for number, run in enumerate(runs):
        tested = run.pytest_counts
        if tested is None:
            mine = [i.status for i in items if i.run == number]
            tested = {"failed": mine.count("failed"), "passed": mine.count("passed") + mine.count("warning"),
                      "skipped": mine.count("skipped")}
        for name in ("failed", "errors", "passed", "skipped"):
            setattr(counts, name, getattr(counts, name) + tested.get(name, 0))
    counts.total = counts.failed + counts.errors + counts.passed + counts.skipped
    counts.warning = sum(1 for i in items if i.status == "warning")
    counts.regressed = sum(1 for i in items if regressed(i))
    failed = counts.failed or counts.errors or any(i.status == "failed" for i in items)
    unjudged = counts.warning or counts.skipped or not items
    verdict = "fail" if failed else ("warn" if unjudged else "pass")
    return verdict, counts
