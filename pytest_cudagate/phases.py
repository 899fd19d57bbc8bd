"""Where a case's wall time goes: one clock per phase, kept in :attr:`CaseOutcome.phases`.

The worker reports its own time per step (``seconds``, ``step_seconds`` and each compile line's
``seconds``); the host clocks what it does itself (fresh inputs and the reference, the comparison
with the expected outputs, the sanitizer, the statistics) and the round trip of each request. IPC
is what the round trip took beyond the worker's reported time, the host's own work inside it and
any worker restart, so the phases add up to the item's wall time (``other`` takes the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_cudagate.judge.outcome import CaseOutcome

# In pipeline order; the durations table and report.json use these names.
PHASES = ("worker_start", "compile", "fresh_inputs", "checks", "warm_up", "timing", "sanitizer", "statistics",
          "ipc", "other")
HOST_IN_CALL = ("statistics",)  # host phases that can run while a request is in flight (compare's decide)


def add(outcome: CaseOutcome, phase: str, seconds: float) -> None:
    outcome.phases[phase] = outcome.phases.get(phase, 0.0) + max(0.0, seconds)


@contextmanager
def clock(outcome: CaseOutcome, phase: str) -> Iterator[None]:
    """Add the wall time spent inside to ``outcome.phases[phase]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(outcome, phase, time.perf_counter() - start)


def clocked(outcome: CaseOutcome, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, its calls counted under ``phase`` (for callbacks the worker client makes)."""
    def inner(*args, **kwargs):
        with clock(outcome, phase):
            return function(*args, **kwargs)
    return inner


class RoundTrip:
    """One request to the worker: clocks it, then splits it with :meth:`answered`."""

    def __init__(self, outcome: CaseOutcome, client: object):
        self.outcome = outcome
        self.client = client
        self.wall = 0.0

    def __enter__(self) -> RoundTrip:
        self._host = sum(self.outcome.phases.get(p, 0.0) for p in HOST_IN_CALL)
        self._starts = float(getattr(self.client, "start_seconds", 0.0))
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t0
        self._host = sum(self.outcome.phases.get(p, 0.0) for p in HOST_IN_CALL) - self._host
        self._starts = float(getattr(self.client, "start_seconds", 0.0)) - self._starts

    def answered(self, compiles: list[dict], body: dict) -> None:
        """Split the round trip: worker restarts, compiles, the worker's steps on the case, IPC."""
        outcome = self.outcome
        compile_s = sum(float(c.get("seconds") or 0.0) for c in compiles if c)
        busy = worker_steps(outcome, body)
        add(outcome, "worker_start", self._starts)
        add(outcome, "compile", compile_s)
        add(outcome, "ipc", self.wall - self._host - self._starts - compile_s - busy)


def worker_steps(outcome: CaseOutcome, body: dict) -> float:
    """Add the worker's own time on the case to the phases; return it (waits for the host excluded)."""
    seconds = float(body.get("seconds") or 0.0)
    steps = body.get("step_seconds") or {}
    waiting = float(steps.get("waiting", 0.0))  # compare: blocked on the host's next decision
    named = {"warm_up": "warm_up", "timing": "timing", "fresh_inputs": "fresh_inputs"}
    spent = 0.0
    for step, phase in named.items():
        if step in steps:
            value = float(steps[step])
            add(outcome, phase, value)
            spent += value
    # Allocation, validation launches, guard and input checks, output capture: the rest of its time.
    add(outcome, "checks", seconds - waiting - spent)
    return max(0.0, seconds - waiting)


def finish(outcome: CaseOutcome, wall: float) -> None:
    """Close the split at the item's wall time: what no phase claimed is ``other``."""
    claimed = sum(v for k, v in outcome.phases.items() if k != "other")
    add(outcome, "other", wall - claimed)
    outcome.phases = {p: round(outcome.phases[p], 6) for p in PHASES if p in outcome.phases}
