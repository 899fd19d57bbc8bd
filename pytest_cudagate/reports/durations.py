"""``--cuda-gate-durations N``: the N slowest cases, each with its wall time split by phase."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.phases import PHASES

_SHORT = {"worker_start": "start", "fresh_inputs": "fresh", "statistics": "stats", "sanitizer": "sanit"}


def render_durations(outcomes: Iterable[CaseOutcome], count: int, worker_start_s: float | None = None) -> list[str]:
    """Lines of the table, slowest first; ``count`` 0 lists every case (as pytest's ``--durations``)."""
    ranked = sorted(outcomes, key=lambda o: -sum(o.phases.values()))
    shown = ranked if count == 0 else ranked[:count]
    title = "all cases" if count == 0 or count >= len(ranked) else f"slowest {len(shown)} of {len(ranked)} cases"
    lines = [f"cudagate durations: {title}, seconds by phase"]
    if worker_start_s is not None:
        lines.append(f"worker start before the first item (overlapped with collection): {worker_start_s:.3f} s")
    columns = [p for p in PHASES if any(o.phases.get(p, 0.0) >= 0.0005 for o in shown)]
    lines.append(" ".join(["  total", *(f"{_SHORT.get(p, p):>7}" for p in columns), " case"]))
    for o in shown:
        cells = [f"{o.phases.get(p, 0.0):7.3f}" for p in columns]
        lines.append(" ".join([f"{sum(o.phases.values()):7.3f}", *cells, f" {o.suite}::{o.kernel}::{o.case}"]))
    return lines
