"""The terminal table: one row per replayed case, failures first."""

from __future__ import annotations

from .runtime import ItemRecord

_ORDER = {"failed": 0, "skipped": 1, "passed": 2}


def _micros(ms: float | None) -> str:
    return f"{ms * 1000:.2f}" if ms is not None else "-"


def render_table(records: list[ItemRecord]) -> list[str]:
    rows = [("suite", "kernel", "case", "kind", "result", "median µs", "rel. error", "detail")]
    for r in sorted(records, key=lambda r: (_ORDER.get(r.outcome, 3), r.suite, r.kernel, r.case)):
        rows.append((r.suite, r.kernel, r.case, r.kind, r.outcome, _micros(r.median_ms),
                     f"{r.rel_norm:.1e}" if r.rel_norm is not None else "-", r.detail[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
