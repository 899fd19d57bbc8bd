"""The history as the page shows it: one series per case and GPU fingerprint, one point per commit,
the approvals along it, and the largest moves since the last release."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_cudagate.history.model import Entry, History


@dataclass(frozen=True)
class Point:
    index: int  # the commit's position among the commits shown (0: the oldest)
    entry: Entry
    approval: bool  # the approved version differs from the previous point's: an approval landed here


@dataclass(frozen=True)
class Series:
    suite: str
    kernel: str
    case: str
    fingerprint: str | None
    fingerprint_description: str | None
    points: tuple[Point, ...]  # oldest first

    @property
    def title(self) -> str:
        return f"{self.suite} / {self.kernel} × {self.case}"

    @property
    def shape_class(self) -> str:
        return self.points[-1].entry.result.shape_class


@dataclass(frozen=True)
class Move:
    series: Series
    since: Point  # at the last release (or the first point shown, with none)
    latest: Point

    @property
    def change(self) -> float:
        """Latest over then, as a ratio of current latencies."""
        return self.latest.entry.result.current_us / self.since.entry.result.current_us


def build_series(history: History) -> list[Series]:
    """Every case × fingerprint; at a commit measured more than once, its latest run."""
    index = {commit.sha: n for n, commit in enumerate(history.commits)}
    groups: dict[tuple, dict[int, Entry]] = {}
    for entry in history.entries:  # oldest run first at each commit: the latest overwrites
        result = entry.result
        key = (result.suite, result.kernel, result.case, entry.run.fingerprint or "")
        groups.setdefault(key, {})[index[entry.commit.sha]] = entry
    found = []
    for (suite, kernel, case, fingerprint), by_index in sorted(groups.items()):
        points, previous = [], None
        for n in sorted(by_index):
            entry = by_index[n]
            approved = entry.result.approved_sha256
            points.append(Point(n, entry, previous is not None and approved is not None and approved != previous))
            previous = approved if approved is not None else previous
        found.append(Series(suite, kernel, case, fingerprint or None, points[-1].entry.run.fingerprint_description,
                            tuple(points)))
    return found


def last_release(history: History) -> int | None:
    """The index of the newest commit shown that a release tag names."""
    return next((n for n in range(len(history.commits) - 1, -1, -1) if history.commits[n].tags), None)


def moves(series: list[Series], release: int | None) -> list[Move]:
    """Each series' latest point against its point at the last release (its last one at or before
    it; its first one where it starts later, or where no release is shown), largest change first."""
    found = []
    for s in series:
        before = [p for p in s.points if release is not None and p.index <= release]
        since = before[-1] if before else s.points[0]
        if since is not s.points[-1]:
            found.append(Move(s, since, s.points[-1]))
    return sorted(found, key=lambda m: (-abs(math.log(m.change)), m.series.title))
