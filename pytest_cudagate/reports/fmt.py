"""Numbers as people read them, shared by the HTML page, the job summary and annotations."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_cudagate.judge.stats import RatioEstimate
    from pytest_cudagate.reports.model import Counts, Item, SkippedItem

VERDICT_WORD = {"fail": "FAIL", "warn": "WARN", "pass": "PASS"}


def as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # "inf" / "nan" strings included
    except (TypeError, ValueError):
        return None


def us(ms: Any) -> str:
    """A latency given in ms, shown in µs (the scale of most kernels)."""
    value = as_float(ms)
    return "–" if value is None else f"{value * 1000:,.2f} µs"


def sig(value: Any, digits: int = 3) -> str:
    number = as_float(value)
    if number is None:
        return "–" if value is None else str(value)
    if math.isnan(number) or math.isinf(number):
        return str(number)
    return f"{number:.{digits}g}"


def ratio(estimate: RatioEstimate | None) -> str:
    if not estimate:
        return "–"
    return f"{estimate.ratio:.3f}"


def _bounded(end: float) -> bool:
    return math.isfinite(end) and end > 0


def interval(estimate: RatioEstimate | None, confidence: bool = True) -> str:
    """``[low, high]`` with its confidence; an unbounded end (too few samples) shows as such."""
    if not estimate:
        return "–"
    low = f"{estimate.low:.3f}" if _bounded(estimate.low) else "0"
    high = f"{estimate.high:.3f}" if _bounded(estimate.high) else "∞"
    return f"[{low}, {high}]" + (f" at {estimate.confidence:.0%}" if confidence else "")


def change(estimate: RatioEstimate | None) -> str:
    if not estimate:
        return "–"
    pct = (estimate.ratio - 1) * 100
    return f"{pct:+.1f}% ({'slower' if pct >= 0 else 'faster'})"


def counts_line(counts: Counts) -> str:
    """The gate's items as pytest's summary line counts them (failed and passed always, the rest where
    any), then the cases among the passed that warned and the latency regressions."""
    parts = [f"{counts.failed} failed", f"{counts.passed} passed"]
    if counts.warning:
        parts[-1] += f" ({counts.warning} with a warning)"
    parts += [f"{getattr(counts, name)} {name}" for name in ("skipped", "errors") if getattr(counts, name)]
    line = " · ".join(parts) + f" of {counts.total}"
    if counts.regressed:
        line += f" ({counts.regressed} latency regression{'s' if counts.regressed != 1 else ''})"
    return line


def compile_time(seconds: float | None) -> str:
    """A build's compile time, or that it came from the compile cache."""
    return "cached" if seconds is None else f"{seconds:.2f} s"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def item_title(item: Item | SkippedItem) -> str:
    return f"{item.kernel} × {item.case}"
