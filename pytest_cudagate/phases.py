"""Where a gate run's wall time goes: per case (:attr:`CaseOutcome.phases`) and for the whole run
(:class:`RunClock`, kept by the hooks of :class:`pytest_cudagate.items.RunPhases`).

A case: one clock per phase, kept in :attr:`CaseOutcome.phases`.

The worker reports its own time per step (``seconds``, ``step_seconds`` and each compile line's
``seconds``); the host clocks what it does itself (fresh inputs and the reference, the comparison
with the expected outputs, the sanitizer, the statistics) and the round trip of each request. IPC
is what the round trip took beyond the worker's reported time, the host's own work inside it and
any worker restart, so the phases add up to the case's span (``other`` takes the rest): its item's
wall time, plus its head start where its run was sent while the case before was judged, less what
its item spent beginning the next case (:attr:`CaseOutcome.head_start_s`, ``lent_s``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_cudagate.judge.outcome import CaseOutcome
    from pytest_cudagate.worker.client import Worker

# In pipeline order; the durations table and report.json use these names.
PHASES = ("worker_start", "compile", "fresh_inputs", "checks", "warm_up", "timing", "sanitizer", "statistics",
          "ipc", "other")
# A run's phases, in the order a run meets them; --cuda-gate-durations and report.json use these names.
RUN_PHASES = ("startup", "configure", "collection", "suites", "trust", "worker_wait", "ahead", "compile", "release", "cases",
              "other_tests", "pytest", "report_build", "report_requests", "plots", "report_html", "report_json",
              "benchmark_json", "github", "worker_shutdown")
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

    def __init__(self, outcome: CaseOutcome, client: Worker):
        self.outcome = outcome
        self.client = client
        self.wall = 0.0

    def __enter__(self) -> RoundTrip:
        self._host = sum(self.outcome.phases.get(p, 0.0) for p in HOST_IN_CALL)
        self._starts = self.client.start_seconds
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t0
        self._host = sum(self.outcome.phases.get(p, 0.0) for p in HOST_IN_CALL) - self._host
        self._starts = self.client.start_seconds - self._starts

    def answered(self, compiles: list[dict], body: dict) -> None:
        """Split the round trip: worker restarts, compiles, the worker's steps on the case, IPC."""
        outcome = self.outcome
        compile_s = sum(float(c.get("seconds") or 0.0) for c in compiles if c)
        busy = worker_steps(outcome, body)
        clock = RUN.get()
        if clock is not None:
            steps = body.get("step_seconds") or {}
            clock.worker(busy, float(steps.get("warm_up", 0.0)) + float(steps.get("timing", 0.0)))
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
    """Close the split at the case's span (see the module docstring): what no phase claimed is ``other``."""
    claimed = sum(v for k, v in outcome.phases.items() if k != "other")
    add(outcome, "other", wall - claimed)
    outcome.phases = {p: round(outcome.phases[p], 6) for p in PHASES if p in outcome.phases}


class RunClock:
    """A run's wall time by phase, exclusive: entering a phase pauses the one it interrupts, so the
    phases never overlap and add up to the time since the clock started (plus ``startup``, which
    is measured before it). Time no phase claims is pytest's own (``base``)."""

    def __init__(self, base: str = "pytest"):
        self.seconds: dict[str, float] = {}
        self._worker_s = self._launches_s = 0.0  # the worker's own time on this process's cases
        self._span: tuple[float, float] | None = None  # perf_counter() at the first case's start, the last one's end
        self._stack = [base]
        self._mark = time.perf_counter()

    def _charge(self) -> None:
        now = time.perf_counter()
        self.add(self._stack[-1], now - self._mark)
        self._mark = now

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    def transfer(self, source: str, target: str, seconds: float) -> None:
        """Move time a hook measured inside ``source`` (at most what it holds) to ``target``."""
        self._charge()
        moved = min(max(0.0, seconds), self.seconds.get(source, 0.0))
        self.seconds[source] = self.seconds.get(source, 0.0) - moved
        self.add(target, moved)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._charge()
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def worker(self, busy_s: float, launches_s: float) -> None:
        """Count a case's worker time: all of it (waits for the host excluded), and its warm-up and timed launches."""
        self._worker_s += max(0.0, busy_s)
        self._launches_s += max(0.0, launches_s)

    def case_ran(self, start: float, end: float) -> None:
        """A case item ran from ``start`` to ``end`` (perf_counter()): the span the worker is judged over."""
        self._span = (start, end) if self._span is None else (min(self._span[0], start), max(self._span[1], end))

    def cases_busy(self) -> dict[str, float] | None:
        """How busy the worker was while the case items ran: its own time on the cases, and their
        warm-up and timed launches alone, in seconds and as shares of the span from the first case's
        start to the last one's end (a run sent ahead works on while pytest reports the case before,
        which is no phase ``cases``). None before any case reached the worker in this process."""
        self._charge()
        if self._span is None or self._worker_s <= 0.0:
            return None
        # the shares from the rounded seconds, so that a reader's worker_s / span_s is the share shown
        span, worker, launches = (round(v, 6) for v in (self._span[1] - self._span[0], self._worker_s, self._launches_s))
        return {"span_s": span, "cases_s": round(self.seconds.get("cases", 0.0), 6), "worker_s": worker,
                "launches_s": launches, "worker_fraction": round(worker / span, 4) if span else 0.0,
                "launches_fraction": round(launches / span, 4) if span else 0.0}

    def snapshot(self) -> dict[str, float]:
        """The phases so far, in :data:`RUN_PHASES` order, rounded to the microsecond."""
        self._charge()
        return {p: round(self.seconds[p], 6) for p in RUN_PHASES if p in self.seconds}


# The run's clock, for code deep in a run (trust checks, report writers) to charge its phase
# without passing the clock down. A context variable: a thread started by the run (the worker's
# start) begins with an empty context, so work overlapped with the run never claims its time.
RUN: ContextVar[RunClock | None] = ContextVar("cudagate_run_clock", default=None)


@contextmanager
def run_phase(name: str) -> Iterator[None]:
    """Charge the time inside to the run's phase ``name``; nothing outside a clocked run."""
    clock = RUN.get()
    if clock is None:
        yield
        return
    with clock.phase(name):
        yield


def process_age() -> float | None:
    """Seconds since this process started: its start time in /proc/self/stat (clock ticks since
    boot, 10 ms steps) against CLOCK_BOOTTIME. None where /proc is missing (not Linux)."""
    try:
        fields = open("/proc/self/stat", encoding="ascii").read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5); fields[0] is field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None
