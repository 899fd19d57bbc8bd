"""The terminal table: one row per replayed case, failures first."""

from __future__ import annotations

from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.host.paths import visible


def _micros(ms: float | None) -> str:
    return f"{ms * 1000:.2f}" if ms is not None else "-"


def row(o: CaseOutcome, library: bool = False) -> tuple[str, ...]:
    lat = o.latency
    est = lat.estimate if lat else None
    approved = lat.approved.median if lat and lat.approved else None
    current = lat.current.median if lat and lat.current else (o.correctness.median_ms if o.correctness else None)
    ratio = f"{est.ratio:.3f} [{est.low:.3f}, {est.high:.3f}]" if est else "-"
    rel = o.correctness.rel_norm if o.correctness else None
    detail = (o.message or o.warning or "").splitlines()[0] if (o.message or o.warning) else ""
    verdict = lat.verdict.value if lat else "-"
    if lat is not None and lat.release is not None:
        verdict += f" / release {lat.release.verdict.value}"
    cells = (o.suite, o.kernel, o.case, o.kind, o.shape_class, o.outcome, f"{rel:.1e}" if rel is not None else "-",
             _micros(approved), _micros(current), ratio, verdict, detail[:70])
    if library:
        cells = cells[:10] + (o.library.cell() if o.library else "-",) + cells[10:]
    return cells


def library_header(outcomes: list[CaseOutcome]) -> str | None:
    """The library column's title (``× cuBLAS SGEMM [99% CI]``), or None when no case has a baseline."""
    labels = sorted({o.library.label for o in outcomes if o.library is not None})
    if not labels:
        return None
    return f"× {labels[0] if len(labels) == 1 else 'library'} [99% CI]"


def library_notes(outcomes: list[CaseOutcome]) -> list[str]:
    """Why a case's library column has no ratio, once per reason (informational: no verdict changes)."""
    cases: dict[tuple[str, str], list[str]] = {}
    for o in outcomes:
        if o.library is not None and o.library.error:
            cases.setdefault((o.library.label, o.library.error), []).append(f"{o.kernel} × {o.case}")
    return [f"library baseline {label}, no ratio for {', '.join(names)}: {error}"
            for (label, error), names in sorted(cases.items())]


def render_table(outcomes: list[CaseOutcome], skipped: list[tuple[str, str, str, str]] = (),
                 classes: dict[tuple[str, str], str] | None = None) -> list[str]:
    """``classes``: the shape class of each skipped ``(suite, case)`` this process collected ("-" when
    unknown: an xdist controller collects no items)."""
    classes = classes or {}
    header = ["suite", "kernel", "case", "kind", "class", "result", "rel. error", "approved µs", "current µs",
              "ratio [99% CI]", "latency", "detail"]
    library = library_header(outcomes)
    if library:
        header.insert(10, library)
    rows = [tuple(header)]
    ordered = sorted(outcomes, key=lambda o: (not o.failed, o.warning is None, o.suite, o.kernel, o.case))
    rows += [row(o, bool(library)) for o in ordered]
    rows += [(s, k, c, kind, classes.get((s, c), "-"), "skipped", "-", "-", "-", "-", *(["-"] if library else []),
              "-", "no CUDA device") for s, k, c, kind in sorted(skipped)]
    rows = [tuple(visible(cell) for cell in r) for r in rows]  # names from the checkout: a newline in one is shown
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines + library_notes(outcomes)
