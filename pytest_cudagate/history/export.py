"""The history shown, as files beside the page: ``history.json`` (``schemas/history-export.schema.json``)
and ``history.csv`` (one row per timed case per run, the commit's facts on each row)."""

from __future__ import annotations

import csv
import io

from pytest_cudagate import __version__
from pytest_cudagate.history.model import Commit, Entry, History
from pytest_cudagate.reports.document import now

EXPORT_FORMAT = "cudagate-history"
EXPORT_VERSION = 1
# A spreadsheet runs a cell that starts with one of these as a formula; such text gets a leading '.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def commit_json(commit: Commit) -> dict:
    return {"sha": commit.sha, "branch": commit.branch, "committed": commit.committed, "subject": commit.subject,
            "tags": list(commit.tags)}


def result_json(entry: Entry) -> dict:
    run, r = entry.run, entry.result
    return {"commit": entry.commit.sha, "run": run.id, "created": run.created, "host": run.host,
            "fingerprint": run.fingerprint, "fingerprint_description": run.fingerprint_description,
            "release": run.release, "tool_version": run.tool_version, "report": run.report,
            "suite": r.suite, "kernel": r.kernel, "case": r.case, "class": r.shape_class, "status": r.status,
            "verdict": r.verdict, "advisory": r.advisory, "threshold": r.threshold, "approved_us": r.approved_us,
            "current_us": r.current_us, "level_us": r.level_us, "ratio": r.ratio, "low": r.low, "high": r.high,
            "confidence": r.confidence, "suite_path": r.suite_path, "approved_sha256": r.approved_sha256,
            "approved_at": r.approved_at}


def export_json(history: History, filters: dict) -> dict:
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "created": now(), "tool_version": __version__,
            "filters": filters, "commits": [commit_json(c) for c in history.commits],
            "results": [result_json(e) for e in history.entries]}


def _cell(value) -> object:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return "" if value is None else value


def export_csv(history: History) -> str:
    """Every entry with its commit's branch, time and release tags (joined with ';')."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for n, entry in enumerate(history.entries):
        commit = entry.commit
        row = {**result_json(entry), "branch": commit.branch, "committed": commit.committed,
               "tags": ";".join(commit.tags)}
        if n == 0:
            writer.writerow(row)
        writer.writerow([_cell(value) for value in row.values()])
    return out.getvalue()
