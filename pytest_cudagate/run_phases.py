"""The hooks that clock a ``--cuda-gate`` run by phase, from the process's start to the terminal
summary, so that every second of its wall time has a name (:class:`~pytest_cudagate.phases.RunClock`).

Registered by :mod:`pytest_cudagate.plugin` beside :class:`~pytest_cudagate.items.GateSession`.
Inside the run, the trust checks and the report writers charge their own phases
(:func:`~pytest_cudagate.phases.run_phase`).
"""

from __future__ import annotations

import threading
from contextvars import Token

import pytest

from pytest_cudagate import phases
from pytest_cudagate.items import CaseItem, CompileItem, GateSession, ReleaseItem, SuiteFile
from pytest_cudagate.reports.durations import render_run_phases

_ITEM_PHASES = ((CaseItem, "cases"), (CompileItem, "compile"), (ReleaseItem, "release"))


class RunPhases:
    def __init__(self, clock: phases.RunClock, token: Token, session: GateSession):
        self.clock = clock
        self._token = token
        self.session = session

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session):
        with self.clock.phase("collection"):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector):
        """A suite file's collection: loading and checking its YAML, signature and case data."""
        if not isinstance(collector, SuiteFile):
            return (yield)
        with self.clock.phase("suites"):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        try:
            return (yield)
        finally:  # the first item's wait for the worker, measured by the session, is not pytest's
            self.clock.transfer("pytest", "worker_wait", self.session.worker_start_s or 0.0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        name = next((phase for kind, phase in _ITEM_PHASES if isinstance(item, kind)), "other_tests")
        with self.clock.phase(name):
            return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int):
        """The worker exits (CUDA teardown) while the reports are written; what is left of its
        shutdown after them is ``worker_shutdown``."""
        failed: list[BaseException] = []

        def close() -> None:
            try:
                self.session.runtime.close_worker()
            except BaseException as exc:  # raised again in this thread, as a close in place would
                failed.append(exc)

        closing = threading.Thread(target=close, name="cudagate-worker-close", daemon=True)
        closing.start()
        try:
            return (yield)
        finally:
            with self.clock.phase("worker_shutdown"):
                closing.join()
            if failed:
                raise failed[0]

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config: pytest.Config) -> None:
        if config.getoption("cuda_gate_durations") is None:
            return
        terminalreporter.write_sep("-", "cudagate run phases")
        for line in render_run_phases(self.clock.snapshot()):
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        phases.RUN.reset(self._token)
