"""The rows of a history file, checked as they are read back.

A history is an artifact carried from run to run (or edited by hand), so :mod:`.store` checks every
value it reads against what ``history record`` writes before anything uses it. A row that fails is
skipped with one warning naming the file, the table, the row and the column, and how to delete the
row; the rest of the history is still shown (with the results recorded under a skipped commit or
run). The tables themselves are SQLite's to check: a missing column is one error line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from pytest_cudagate.history.model import FRACTION, LATENCY_US, RATIO, Commit, Entry, Result, Run
from pytest_cudagate.host.paths import command

_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
_RUN_ID = re.compile(r"[0-9a-f]{64}")
STATUSES = ("failed", "warning", "passed", "skipped")
VERDICTS = ("pass", "improved", "regressed", "inconclusive", "incomparable", "unstable")


@dataclass(frozen=True)
class Column:
    name: str
    check: Callable[[object], bool]
    expected: str  # what the column holds, for the warning


def _text(value) -> bool:
    return isinstance(value, str)


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _matches(pattern: re.Pattern) -> Callable[[object], bool]:
    return lambda value: isinstance(value, str) and pattern.fullmatch(value) is not None


def _one_of(values: tuple[str, ...]) -> Callable[[object], bool]:
    return lambda value: value in values and isinstance(value, str)


def _flag(value) -> bool:
    return type(value) is int and value in (0, 1)


def _within(bounds: tuple[float, float], *, open_bounds: bool = False) -> Callable[[object], bool]:
    low, high = bounds

    def check(value) -> bool:
        if type(value) not in (int, float) or not math.isfinite(value):
            return False
        return low < value < high if open_bounds else low <= value <= high
    return check


_TEXT, _MAYBE_TEXT = (_text, "text"), (_optional(_text), "text or NULL")
_LATENCY = f"a latency in µs from {LATENCY_US[0]:g} to {LATENCY_US[1]:g}"
_RATIO = f"a ratio from {RATIO[0]:g} to {RATIO[1]:g}"
_FRACTION = "a fraction strictly between 0 and 1"


def _columns(dataclass_type, checks: dict[str, tuple[Callable[[object], bool], str]], *extra: Column
             ) -> tuple[Column, ...]:
    """A column per field of ``dataclass_type``, in its order (what the store writes), then ``extra``."""
    return tuple(Column(f.name, *checks.get(f.name, _TEXT)) for f in fields(dataclass_type)
                 if f.name != "tags") + extra


COMMITS = _columns(Commit, {"sha": (_matches(_SHA), "a commit sha (40 or 64 hex digits)"), "branch": _MAYBE_TEXT,
                            "committed": _MAYBE_TEXT, "subject": _MAYBE_TEXT})
TAGS = (Column("sha", *_TEXT), Column("tag", *_TEXT))
RUNS = _columns(Run, {"id": (_matches(_RUN_ID), "a run id (64 hex digits)"), "fingerprint": _MAYBE_TEXT,
                      "fingerprint_description": _MAYBE_TEXT, "release": (_flag, "0 or 1")},
                Column("sha", *_TEXT))
RESULTS = _columns(Result, {
    "status": (_one_of(STATUSES), f"one of {', '.join(STATUSES)}"),
    "verdict": (_one_of(VERDICTS), f"one of {', '.join(VERDICTS)}"),
    "advisory": (_flag, "0 or 1"),
    "threshold": (_optional(_within(FRACTION, open_bounds=True)), _FRACTION + " or NULL"),
    "approved_us": (_optional(_within(LATENCY_US)), _LATENCY + " or NULL"),
    "current_us": (_within(LATENCY_US), _LATENCY),
    "level_us": (_optional(_within(LATENCY_US)), _LATENCY + " or NULL"),
    **{name: (_optional(_within(RATIO)), _RATIO + " or NULL") for name in ("ratio", "low", "high")},
    "confidence": (_optional(_within(FRACTION, open_bounds=True)), _FRACTION + " or NULL"),
    **{name: _MAYBE_TEXT for name in ("suite_path", "approved_sha256", "approved_at")}})


def select(columns: Sequence[Column]) -> str:
    """The columns' names for a SELECT, after the row's rowid."""
    return ", ".join(["rowid", *(f'"{c.name}"' for c in columns)])


class Skipped:
    """The rows skipped while one history is read, each as one warning line."""

    def __init__(self, db: str):
        self.db = db
        self.lines: list[str] = []

    def add(self, table: str, rowid, column: str, value, expected: str, also: str = "") -> None:
        long = isinstance(value, (str, bytes)) and len(value) > 40
        shown = repr(value[:40]) + "..." if long else repr(value)
        self.lines.append(f"{self.db}: table {table}, row {rowid}, column {column}: {shown} is not {expected}; "
                          f"skipped{also}; delete the row: "
                          + command("sqlite3", self.db, f"DELETE FROM {table} WHERE rowid = {rowid}"))

    def checked(self, table: str, columns: Sequence[Column], row: Sequence, also: str = "") -> tuple | None:
        """The row's values (rowid dropped) if every one is what its column holds, else None (noted)."""
        for column, value in zip(columns, row[1:]):
            if not column.check(value):
                self.add(table, row[0], column.name, value, column.expected, also)
                return None
        return tuple(row[1:])


def _commit(values: tuple, tags: tuple[str, ...]) -> Commit:
    return Commit(*values, tags)


def _run(values: tuple) -> tuple[str, Run]:
    """(the run's commit sha, the run)."""
    *values, sha = values
    found = Run(*values)
    return sha, replace(found, release=bool(found.release))  # SQLite gives 0 or 1 back


def _result(values: tuple) -> Result:
    found = Result(*values)
    return replace(found, advisory=bool(found.advisory))


@dataclass(frozen=True)
class Tables:
    """The rows of each table as SELECTed with :func:`select` (rowid first)."""

    tags: list[tuple]
    commits: list[tuple]
    runs: list[tuple]
    results: list[tuple]

    def entries(self, db: str) -> tuple[dict[str, Commit], dict[str, list[Entry]], tuple[str, ...]]:
        """(the commits in the tables' order, by sha; each commit's entries; a warning per row skipped)."""
        skipped = Skipped(db)
        tags: dict[str, list[str]] = {}
        for sha, tag in filter(None, (skipped.checked("tags", TAGS, row) for row in self.tags)):
            tags.setdefault(sha, []).append(tag)
        commits = {}
        for row in self.commits:
            values = skipped.checked("commits", COMMITS, row, " with the runs recorded at it")
            if values is not None:
                commits[values[0]] = _commit(values, tuple(tags.get(values[0], ())))
        runs: dict[str, tuple[str, Run]] = {}
        stored_commits, stored_runs = {row[1] for row in self.commits}, {row[1] for row in self.runs}
        for row in self.runs:
            values = skipped.checked("runs", RUNS, row, " with its results")
            if values is None:
                continue
            sha, run = _run(values)
            if sha in commits:
                runs[run.id] = (sha, run)
            elif sha not in stored_commits:  # a commit skipped already is one warning
                skipped.add("runs", row[0], "sha", sha, "a commit of table commits", " with its results")
        by_commit: dict[str, list[Entry]] = {}
        for row in self.results:
            values = skipped.checked("results", RESULTS, row)
            if values is None:
                continue
            result = _result(values)
            if result.run in runs:
                sha, run = runs[result.run]
                by_commit.setdefault(sha, []).append(Entry(commits[sha], run, result))
            elif result.run not in stored_runs:  # a run skipped already is one warning
                skipped.add("results", row[0], "run", result.run, "a run of table runs")
        return commits, by_commit, tuple(skipped.lines)
