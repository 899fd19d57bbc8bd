"""A report's timed cases as history rows: report.json read within the boundary's rules and checked
against its schema (another job's artifact), each run named by what it measured."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.history.commit import Approvals
from pytest_cudagate.history.model import FRACTION, LATENCY_US, RATIO, Result, Run
from pytest_cudagate.judge.stats import run_level
from pytest_cudagate.reports.fmt import as_float
from pytest_cudagate.reports.writer import read_document

_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1, or a SHA-256 repository's


@dataclass(frozen=True)
class Measured:
    """What one report holds for the history, before git adds its commit's facts."""

    sha: str | None  # the commit the runs recorded (GitHub Actions' GITHUB_SHA), if any
    ref: str | None
    runs: tuple[Run, ...]  # the runs that timed something
    results: tuple[Result, ...]


class _Numbers:
    """The numbers of one report item, each checked against the range the history holds: a report
    outside it is refused whole (one line naming the file and the field), never stored to break
    every later `history show`."""

    def __init__(self, path: Path, index: int):
        self.path, self.index = path, index

    def get(self, value, where: str, bounds: tuple[float, float], what: str, *, scale: float = 1.0,
            open_bounds: bool = False) -> float | None:
        """``value`` × ``scale`` (None where the report gives none) if within ``bounds``."""
        if value is None:
            return None
        number = as_float(value)
        scaled = None if number is None else number * scale
        low, high = bounds
        if scaled is None or not math.isfinite(scaled) or not (low < scaled < high if open_bounds else
                                                                low <= scaled <= high):
            raise CudagateError(f"{self.path}: items[{self.index}].{where}: {str(value)[:40]} is not {what} "
                                f"({'strictly between' if open_bounds else 'from'} {low / scale:g} "
                                f"{'and' if open_bounds else 'to'} {high / scale:g}); record the report.json the "
                                "gate wrote")
        return scaled

    def ms(self, value, where: str) -> float | None:
        """A latency in ms, as µs."""
        return self.get(value, where, LATENCY_US, "a latency in ms", scale=1000.0)


def _run_id(run: dict, items: list[dict]) -> str:
    """The run's entry and what it measured: a report re-rendered or merged keeps both, a new run has
    other timings (``created`` alone has a resolution of one second)."""
    measured = [[i["suite"], i["kernel"], i["case"], i.get("latency"), (i.get("correctness") or {}).get("median_ms")]
                for i in items]
    text = json.dumps([run, measured], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _result(run_id: str, item: dict, numbers: _Numbers) -> Result | None:
    """The item as a timed case, or None when it has no latency verdict or no current latency."""
    latency = item.get("latency")
    if not latency:
        return None
    current = (numbers.ms((latency.get("current") or {}).get("median"), "latency.current.median")
               or numbers.ms((item.get("correctness") or {}).get("median_ms"), "correctness.median_ms"))
    if current is None:
        return None
    # The interleaved comparison's ratio; for a kernel identical to its approval, today's run level
    # against the approval runs'.
    kind = "estimate" if latency.get("estimate") else "run_spread"
    interval = latency.get(kind) or {}

    def ratio(key: str) -> float | None:
        return numbers.get(interval.get(key), f"latency.{kind}.{key}", RATIO, "a latency ratio")

    # The schema holds samples positive and the boundary's parse finite: their level is checked once.
    samples = (item.get("samples_ms") or {}).get("current") or []
    return Result(
        run=run_id, suite=item["suite"], kernel=item["kernel"], case=item["case"],
        shape_class=item.get("class") or "default", status=item["status"], verdict=latency["verdict"],
        advisory=bool(latency.get("advisory")),
        threshold=numbers.get(latency.get("threshold"), "latency.threshold", FRACTION, "a fraction", open_bounds=True),
        approved_us=numbers.ms((latency.get("approved") or {}).get("median"), "latency.approved.median"),
        current_us=current,
        level_us=numbers.ms(run_level(samples), "samples_ms.current (their 10th percentile)") if samples else None,
        ratio=ratio("ratio"), low=ratio("low"), high=ratio("high"),
        confidence=numbers.get(interval.get("confidence"), f"latency.{kind}.confidence", FRACTION, "a confidence",
                               open_bounds=True),
        suite_path=item.get("suite_path"))


def _commit(path: Path, runs: list[dict]) -> tuple[str | None, str | None]:
    """The commit and ref the runs recorded (one for all of them), or (None, None)."""
    recorded = [(n, run["github"]) for n, run in enumerate(runs) if (run.get("github") or {}).get("sha")]
    for number, github in recorded:
        if not _SHA.fullmatch(github["sha"]):
            raise CudagateError(f"{path}: runs[{number}].github.sha: {github['sha'][:60]!r} is not a commit sha; "
                                "record the report.json the gate wrote")
        if github["sha"] != recorded[0][1]["sha"]:
            raise CudagateError(f"{path}: runs[{number}].github.sha differs from runs[{recorded[0][0]}]'s: a report "
                                "merged from jobs at different commits; record each job's report on its own")
    return (recorded[0][1]["sha"], recorded[0][1].get("ref")) if recorded else (None, None)


def read_measured(report: Path) -> Measured:
    """The timed cases of the report folder (or report.json) ``report``; a bad report is one line."""
    document = read_document(report)
    path = Path(report) / "report.json" if Path(report).is_dir() else Path(report)
    sha, ref = _commit(path, document["runs"])
    runs, results = [], []
    for number, entry in enumerate(document["runs"]):
        items = [(index, item) for index, item in enumerate(document["items"]) if item["run"] == number]
        run_id = _run_id(entry, [item for _, item in items])
        timed = [r for r in (_result(run_id, item, _Numbers(path, index)) for index, item in items) if r is not None]
        if timed:
            fingerprint = entry.get("fingerprint") or {}
            runs.append(Run(run_id, entry["created"], entry["host"], fingerprint.get("key"),
                            fingerprint.get("description"), bool((entry.get("options") or {}).get("release")),
                            entry["tool_version"], str(path)))
            results += timed
    return Measured(sha, ref, tuple(runs), tuple(results))


def with_approvals(results: tuple[Result, ...], approvals: dict[str, Approvals]) -> tuple[Result, ...]:
    """Each result with its kernel's approval in its suite's ledger at the commit, where there is one."""
    def approved(result: Result) -> Result:
        found = approvals.get(result.suite_path or "", {}).get(result.kernel)
        return replace(result, approved_sha256=found[0], approved_at=found[1]) if found else result
    return tuple(approved(result) for result in results)
