"""What the history holds: commits, the gate runs measured at them, and each run's timed cases."""

from __future__ import annotations

from dataclasses import dataclass

# The ranges a history holds, whoever wrote the file: `history record` refuses a report with a value
# outside them, and `history show` skips a row of the file outside them (history/rows.py).
LATENCY_US = (1e-3, 8.64e10)  # 1 ns to a day: no launch outlives the longest watchdog (timeout_s <= 86400)
RATIO = (1e-9, 1e9)  # current / approved and its interval; the chart multiplies latencies by them
FRACTION = (0.0, 1.0)  # threshold and confidence, both bounds excluded


@dataclass(frozen=True)
class Commit:
    sha: str
    branch: str | None
    committed: str | None  # committer time, ISO 8601 UTC; None where git did not know the commit
    subject: str | None
    tags: tuple[str, ...] = ()  # release tags naming it


@dataclass(frozen=True)
class Run:
    """One gate session of a report (a merged report holds one per job)."""

    id: str  # sha256 of the run's entry and its measurements: the same run recorded twice is one
    created: str  # when the run wrote its report (ISO 8601)
    host: str
    fingerprint: str | None  # the GPU fingerprint's key
    fingerprint_description: str | None
    release: bool  # judged in release mode
    tool_version: str
    report: str  # the report.json it was recorded from, as given


@dataclass(frozen=True)
class Result:
    """One timed case of one run; latencies in µs (report.json's are in ms)."""

    run: str
    suite: str
    kernel: str
    case: str
    shape_class: str
    status: str  # the item's: failed, warning, passed
    verdict: str  # the latency verdict: pass, improved, regressed, inconclusive, incomparable, unstable
    advisory: bool
    threshold: float | None
    approved_us: float | None
    current_us: float
    level_us: float | None  # the run level: 10th percentile of the current kernel's launches
    ratio: float | None
    low: float | None
    high: float | None
    confidence: float | None
    suite_path: str | None  # relative to the repository root, as the report gives it
    approved_sha256: str | None = None  # the approved version's source hash in the ledger at the commit
    approved_at: str | None = None


@dataclass(frozen=True)
class Entry:
    """A result with its run and commit: one row of the exports."""

    commit: Commit
    run: Run
    result: Result


@dataclass(frozen=True)
class History:
    """What ``show`` reads: the commits in order (oldest first) and every entry at them."""

    commits: tuple[Commit, ...]
    entries: tuple[Entry, ...]
    skipped: tuple[str, ...] = ()  # rows of the file that are not what `record` writes: one warning each
