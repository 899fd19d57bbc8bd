"""What ``pytest --cuda-gate`` collects and runs: every ``cudagate.yaml`` becomes test items.

Node ids read ``SUITE::KERNEL::CASE`` (and ``SUITE::KERNEL::compile``). A suite that does not load
becomes one failing item rather than a collection error, so one broken suite never stops the
others from being judged. :class:`GateSession` is the one object of a run: registered by
:mod:`pytest_cudagate.plugin` as the plugin :data:`PLUGIN_NAME` only when ``--cuda-gate`` is on, and
reached that way alone (:func:`gate_session`), as pytest-xdist reaches its session object.
"""

from __future__ import annotations

import importlib
import itertools
import os
import tempfile
import threading
import time
import warnings
from collections import Counter
from contextvars import Token
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_cudagate import phases, xdist_hooks
from pytest_cudagate.config import GateConfig
from pytest_cudagate.defences import fresh_ahead
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate import Gate, GateOptions, case_data_problem
from pytest_cudagate.judge.outcome import CaseOutcome, Failure
from pytest_cudagate.host import trash
from pytest_cudagate.host.paths import RUN_PREFIX, log_lines, scratch_dir
from pytest_cudagate.reports import pytest_hooks as reports
from pytest_cudagate.reports.durations import render_durations, render_run_phases
from pytest_cudagate.reports.terminal import render_table
from pytest_cudagate.session import RunWorker, SuiteTrust
from pytest_cudagate.suite.loader import SUITE_FILENAME, load_suite, refuse_folder_links
from pytest_cudagate.suite.expr import ExprError
from pytest_cudagate.suite.includes import IncludeError
from pytest_cudagate.suite.model import Case, Program, Suite
from pytest_cudagate.trust import UNSIGNED_WARNING
from pytest_cudagate.trust.ledger import release_verifier
from pytest_cudagate.worker.requests import current_version
from pytest_cudagate.worker.build import (BuildFacts, build_record, compile_ahead, compile_builds, entry_builds,
                                         entry_resources, mismatch_heading, parameter_problems)
from pytest_cudagate.worker.client import Worker
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.worker.spawn import runs_items

if TYPE_CHECKING:  # `cudagate gate --trusted-ref` and release mode only
    from pytest_cudagate.trust.base_ref import TrustRoot
    from pytest_cudagate.trust.release import ReleaseSource


PLUGIN_NAME = "cudagate-session"


def gate_session(config: pytest.Config) -> GateSession:
    """The run's :class:`GateSession` (registered under ``--cuda-gate`` only)."""
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


class GateFailure(Exception):
    """An item's failure, reported as its message alone (no Python traceback)."""


class CudagateWarning(UserWarning):
    """A verdict that does not fail the build but must not pass unseen (inconclusive, incomparable)."""


class GateSession:
    """One ``--cuda-gate`` run: its pytest hooks, and what the run holds: its settings, worker
    (:class:`RunWorker`), suites' trust (:class:`SuiteTrust`), gate, output folder, and what it judged
    (outcomes, skips, builds and pytest's counts), which the reports read."""

    def __init__(self, config: pytest.Config, gate: GateConfig, trust_root: TrustRoot | None = None,
                 spawned: Worker | None = None, worker_env: dict[str, str] | None = None):
        self.config = config
        self.settings = gate
        fresh_seed = gate.fresh_seed if gate.fresh_seed is not None else xdist_hooks.worker_fresh_seed(config)
        self.options = GateOptions(strict=gate.strict, release=gate.release, budget_s=gate.budget_s,
                                   threshold=gate.threshold, fresh_seed=fresh_seed, trusted=trust_root is not None,
                                   processes=xdist_hooks.worker_count(config))
        self.trust_root = trust_root
        self.worker = RunWorker(timeout_s=gate.timeout_s, lock_timeout_s=gate.lock_timeout_s, spawned=spawned,
                                env=worker_env)
        self.suites = SuiteTrust(allow_unsigned=gate.allow_unsigned, trust_root=trust_root)
        # What the run judged, for the reports (an xdist controller gathers its workers': xdist_hooks).
        self.outcomes: list[CaseOutcome] = []
        self.skipped: list[tuple[str, str, str, str]] = []
        self.compiles: list[BuildFacts] = []  # each compile item's builds
        self.tested: Counter = Counter()  # pytest's outcome category -> cudagate items, as it counts them
        self.selection: dict = {}  # --cuda-gate-class: the classes run and the cases left out
        self.fingerprint: Fingerprint | None = None  # the worker's hardware, once one started
        self.classes: dict[tuple[str, str], str] = {}  # (suite, case) -> shape class, for the table's skipped rows
        self.suites_collected = 0
        self._starting: threading.Thread | None = None
        self.worker_start_s: float | None = None  # how long the first item still waited for the worker
        self._positions: dict[int, int] | None = None  # id(item) -> its place in session.items
        self._gate: Gate | None = None
        self._release: ReleaseSource | None = None
        self._output_dir: Path | None = None

    @property
    def trust(self) -> dict[str, str]:
        """Suite path -> its signature status, for reports."""
        return self.suites.status

    def client(self) -> Worker | None:
        """The worker, or None with :attr:`unavailable_reason` set when there is no GPU."""
        opened = self.worker.open()
        if opened is None:
            return None
        self.fingerprint = opened.fingerprint
        return opened.client

    @property
    def unavailable_reason(self) -> str | None:
        self.client()
        return self.worker.unavailable

    @property
    def fingerprint_text(self) -> str | None:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}" if self.fingerprint is not None else None

    def arch(self) -> str:
        client = self.client()
        return client.device["arch"] if client else self.settings.arch

    def gate(self) -> Gate:
        if self._gate is None:
            opened = self.worker.open()
            self._gate = Gate(opened.client, opened.fingerprint, self.options, self.output_dir, keep_outputs=False,
                              release=self.release())
        return self._gate

    def release(self) -> ReleaseSource | None:
        """Release mode's reference, resolved once per session (None outside release mode)."""
        if self._release is None and self.options.release:
            from pytest_cudagate.trust.release import ReleaseSource

            self._release = ReleaseSource(Path(self.config.rootpath), self.settings.release_ref,
                                          self.settings.release_tags,
                                          release_verifier(self.trust_root, self.settings.allow_unsigned))
        return self._release

    @property
    def output_dir(self) -> Path:
        if self._output_dir is None:
            self._output_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-", dir=scratch_dir()))
        return self._output_dir

    def prefetch(self, upcoming: list[tuple[Suite, Case]]) -> None:
        """Hand the gate the case items about to run (this one first) to prepare their fresh inputs
        ahead: once a worker runs, and for suites already trusted (a Python reference may run)."""
        if self.worker.opened is not None:
            self.gate().ahead.prefetch([(suite, case) for suite, case in upcoming if not self.suites.problems(suite)])

    def expect(self, upcoming: tuple[Suite, Program, Case] | None) -> None:
        """Name the case item after the one about to run to the gate (None: none), where its suite is
        trusted and its ledger reads, so that its run may be sent while this one is judged."""
        if self.worker.opened is None:
            return
        if upcoming is not None:
            suite, program, case = upcoming
            upcoming = None if self.suites.problems(suite) else (suite, program, case, self.suites.ledger(suite))
        self.gate().ahead.expect(upcoming)

    def close_worker(self) -> None:
        """End the worker and release its GPU once the items are done (the reports need neither)."""
        if self._gate is not None:
            self._gate.ahead.settle()  # a run sent ahead for an item that did not come: the link is its until answered
        self.worker.close()

    def close(self) -> None:
        # First: what the gate prepares ahead is written under the output folder, which stays while a
        # job still runs there (a sweep of a later run deletes it: paths.sweep_stale).
        settled = self._gate.ahead.close() if self._gate is not None else True
        self.close_worker()
        if self._output_dir is not None and settled:
            trash.discard(self._output_dir)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before collection, and so before the GPU's lock: a link to a folder in the gated paths is
        refused (:func:`refuse_folder_links`) where pytest's collection would step into it."""
        config = self.config
        if xdist_hooks.is_worker(config):  # its controller has looked
            return
        paths = [Path(config.invocation_params.dir, arg.split("::", 1)[0]) for arg in config.args]
        # The run's own --basetemp is pytest's, not the checkout's (pytester links NAME-current to it).
        basetemp = config.option.basetemp and os.path.realpath(config.option.basetemp)

        def enter(folder: Path) -> bool:
            return (not config.hook.pytest_ignore_collect(collection_path=folder, config=config)
                    and os.path.realpath(folder) != basetemp)

        try:
            refuse_folder_links(paths, Path(config.rootpath), enter)
        except CudagateError as exc:
            raise pytest.UsageError(str(exc)) from None

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector):
        if file_path.name == SUITE_FILENAME:
            self.suites_collected += 1
            self._start_worker(parent.config)
            return SuiteFile.from_parent(parent, path=file_path)
        return None

    def _start_worker(self, config: pytest.Config) -> None:
        """Once the first suite is found, open the worker (its hello, the GPU's lock, the fingerprint)
        while pytest collects the rest; its process, spawned at configure, has been starting CUDA since.
        Not for --collect-only, nor in an xdist controller (it runs no items)."""
        if self._starting is not None or self.worker_start_s is not None or not runs_items(config):
            return
        self._starting = threading.Thread(target=self.client, name="cudagate-worker-start", daemon=True)
        self._starting.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if self._starting is not None:  # items use the session from one thread only: wait for the start
            waited = time.perf_counter()
            self._starting.join()
            self._starting = None
            self.worker_start_s = time.perf_counter() - waited
        if runs_items(self.config) and not xdist_hooks.is_worker(self.config):
            self._ahead(session.items)

    def _ahead(self, items: list) -> None:
        """Before the first item, the work that waits on no GPU timing, side by side: every trusted
        suite's programs compiled (NVRTC children at once), then, on a GPU, every kernel sanitized
        that has no cached verdict. The items then read both back from the on-disk caches. Not in an
        xdist worker, which runs only some of the items it collected."""
        nodes = list({id(item.parent): item.parent for item in items if isinstance(item, (CompileItem, CaseItem))}.values())
        with phases.run_phase("ahead"):
            # The first cases' fresh sets (and their references' imports) are drawn meanwhile.
            self._draw_ahead([i for i in items if isinstance(i, CaseItem)][:1 + fresh_ahead.MAX_WORKERS])
            trusted = [node for node in nodes if not self.suites.problems(node.suite)]
            compile_ahead([(node.program, list(node.cases)) for node in trusted], self.arch(),
                          timeout_s=self.settings.timeout_s)
            if self.client() is not None:
                # scipy.special (the Student t of a kernel judged against its approval runs, judge/stats.py)
                # costs ~0.25 s to import on the H200 runner: meanwhile, not in the first such item's turn
                threading.Thread(target=_import_quietly, args=("scipy.special",), name="cudagate-import",
                                 daemon=True).start()
                ids = {id(node) for node in trusted}
                self.gate().ahead.sanitize([(item.parent.suite, item.parent.program, item.case) for item in items
                                               if isinstance(item, CaseItem) and id(item.parent) in ids])

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Prepare the fresh inputs of this case item and the next ones while the worker is busy (Gate.prefetch),
        and name the next item to the gate when it is a case too, whose run it then sends while this
        one is judged (Gate.expect): not under --maxfail or --stepwise, where this case may be the last to run."""
        self._draw_ahead(([item] if isinstance(item, CaseItem) else []) + self._next_cases(nextitem))
        if isinstance(item, CaseItem):
            stops = self.config.option.maxfail or getattr(self.config.option, "stepwise", False)
            follows = nextitem if isinstance(nextitem, CaseItem) and not stops else None
            try:
                self.expect((follows.parent.suite, follows.parent.program, follows.case) if follows else None)
            except Exception:  # noqa: BLE001 - only a head start: the next item meets and reports the failure
                pass

    def _draw_ahead(self, cases: list[CaseItem]) -> None:
        if not cases:
            return
        try:
            self.prefetch([(i.parent.suite, i.case) for i in cases])
        except Exception:  # noqa: BLE001 - only a head start: the item meets and reports the same failure itself
            pass

    def _next_cases(self, nextitem: pytest.Item | None) -> list[CaseItem]:
        """The next case items from ``nextitem`` on that this process runs, as many as can be drawn
        ahead (the host's prepare threads, defences/fresh_ahead.py): in the session's order, past
        compile items; under xdist, which hands this process whole kernels, within ``nextitem``'s kernel."""
        if not isinstance(nextitem, GateItem):  # the last item, or another test
            return []
        scope = nextitem.parent if xdist_hooks.is_worker(self.config) else None
        items = nextitem.session.items
        if self._positions is None or len(self._positions) != len(items):  # once: index() per item is quadratic
            self._positions = {id(i): n for n, i in enumerate(items)}
        later = (items[n] for n in range(self._positions.get(id(nextitem), len(items)), len(items)))  # no copy per item
        cases = (i for i in later if isinstance(i, CaseItem) and (scope is None or i.parent is scope))
        return list(itertools.islice(cases, fresh_ahead.MAX_WORKERS))

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        """``--cuda-gate-class``: deselect the performance cases of the other classes."""
        wanted = config.getoption("cuda_gate_class")
        cases = [item for item in items if isinstance(item, CaseItem)]
        if not wanted or not cases:
            return
        # the classes of timed cases only: a class held by correctness cases alone would run nothing timed
        known = {item.case.shape_class for item in cases if item.case.kind == "performance"}
        unknown = sorted(set(wanted) - known)
        if unknown and xdist_hooks.is_worker(config):
            # A usage error raised in an xdist worker ends the run as an INTERNALERROR: run every case
            # instead (more than asked, never less) and say why.
            warnings.warn(CudagateWarning(f"--cuda-gate-class {', '.join(unknown)}: no collected performance case has "
                                          f"that class (classes: {', '.join(sorted(known))}); every case runs"))
            return
        if unknown:
            raise pytest.UsageError(f"--cuda-gate-class {', '.join(unknown)}: no collected performance case has that "
                                    f"class (classes: {', '.join(sorted(known))}); set `class:` on the cases in the "
                                    "suite, or name one of those")
        dropped = [item for item in cases if item.case.kind == "performance" and item.case.shape_class not in wanted]
        # report.json says what the run left out, so a merged report or job summary cannot pass it off as complete
        self.selection = {"classes": sorted(set(wanted)),
                                  "deselected_by_class": sorted(item.nodeid for item in dropped)}
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item not in set(dropped)]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Under a trust root, every suite the trusted ref gates in the paths given was collected with all
        its kernels (pytest's own skipping is not the pull request's way out); else the run is refused."""
        root = self.trust_root
        if root is None or xdist_hooks.is_controller(self.config):  # an xdist controller collects nothing itself
            return
        collected: dict[Path, tuple[str, set[str]] | None] = {}  # None: the suite fails to load, so the run fails
        for item in session.items:
            if isinstance(item, SuiteErrorItem):
                collected[item.path] = None
            elif isinstance(item, CompileItem) and item.parent.program is not item.parent.suite.reference.program:
                collected.setdefault(item.path, (item.parent.suite.name, set()))[1].add(item.parent.program.name)
        # a node id (PATH::KERNEL) selects items on purpose; files and folders promise every suite in them
        gated = [Path(session.config.invocation_params.dir, arg) for arg in session.config.args if "::" not in arg]
        problems = root.collection_problems(gated, collected)
        if problems:
            raise pytest.UsageError("the gate refuses to run:\n" + "\n".join(f"  - {p}" for p in problems))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if isinstance(item, GateItem) and not isinstance(item, AbsentCaseItem):  # absent: not counted as skipped
            setattr(report, xdist_hooks.GATE_ITEM, True)
        if call.when == "call" and isinstance(item, (CaseItem, CompileItem)) and xdist_hooks.is_worker(self.config):
            xdist_hooks.attach(report, item, self)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if xdist_hooks.is_worker(self.config):
            return  # its controller counts and reports
        if getattr(report, xdist_hooks.GATE_ITEM, False):
            # the report's counts are pytest's own for the gate's items: compile and release items too
            category = self.config.hook.pytest_report_teststatus(report=report, config=self.config)[0]
            if category:
                self.tested["errors" if category == "error" else category] += 1
        if xdist_hooks.is_controller(self.config):
            xdist_hooks.gather(self.config, report, self)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        xdist_hooks.configure_node(node, self.options.fresh_seed)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        return xdist_hooks.make_scheduler(config, log)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        reports.session_finish(session.config, self, exitstatus)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._starting is not None:  # a session that ended before its items: let the start finish, then close
            self._starting.join()
        self.close()

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config: pytest.Config) -> None:
        if not (self.suites_collected or self.outcomes or self.skipped):  # an xdist controller collects none
            where = ", ".join(str(a) for a in config.args) or str(config.rootpath)
            terminalreporter.write_line(
                f"cudagate: no {SUITE_FILENAME} found under {where}; pass a suite's path, or list the suites in "
                f"pyproject.toml: [tool.cudagate] suites = [\"path/to/{SUITE_FILENAME}\"]", yellow=True)
            return
        if not (self.outcomes or self.skipped):
            return
        terminalreporter.write_sep("=", "cudagate")
        if self.settings.allow_unsigned:
            terminalreporter.write_line(UNSIGNED_WARNING, red=True, bold=True)
        if self.fingerprint_text:
            terminalreporter.write_line(f"fingerprint {self.fingerprint_text}")
        if self.release() is not None:
            terminalreporter.write_line(self.release().describe())
        for line in render_table(self.outcomes, self.skipped, self.classes):
            terminalreporter.write_line(line)
        count = config.getoption("cuda_gate_durations")
        if count is not None and self.outcomes:
            terminalreporter.write_sep("-", "cudagate durations")
            for line in render_durations(self.outcomes, count, self.worker_start_s):
                terminalreporter.write_line(line)


class CheckoutCollection:
    """What ``cudagate gate`` collects from the checkout: its suites, and nothing that runs Python.

    Registered by :mod:`pytest_cudagate.trust.gate_command` only. Plain ``pytest --cuda-gate`` keeps
    pytest's own collection: the project's conftest and tests run there anyway, by the user's choice.
    """

    @pytest.hookimpl(tryfirst=True, optionalhook=True)  # the hook exists from pytest 8
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector):
        # A plain folder for every folder: a Package node would import its __init__.py to set it up.
        return pytest.Dir.from_parent(parent, path=path)

    @pytest.hookimpl(wrapper=True)
    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector):
        # Only cudagate's own collectors: not a doctest file or module, nor pytest 7's Package (which
        # it makes from an __init__.py here), nor any other plugin's view of a checkout file.
        collected = yield
        return [node for node in collected if isinstance(node, SuiteFile)]


class SuiteFile(pytest.File):
    run_phase = "suites"  # RunPhases: its collection is this run phase

    def collect(self):
        try:
            suite = load_suite(self.path, gate_session(self.config).settings.include)
        except CudagateError as exc:
            yield SuiteErrorItem.from_parent(self, name="suite", message=str(exc))
            return
        except Exception as exc:  # a loader bug must cost this suite only, never the whole session
            yield SuiteErrorItem.from_parent(self, name="suite", message=f"{self.path}: cannot load: {exc!r}")
            return
        for suite in suite.instances:  # an instantiated suite: its kernels are named for their instantiation
            if suite.reference.program is not None:
                yield ProgramNode.from_parent(self, name=suite.reference.program.name, suite=suite,
                                              program=suite.reference.program, cases=())
            for kernel in suite.kernels:
                # a case that breaks the kernel's `requires` is absent for it: not compiled for, run or judged
                yield ProgramNode.from_parent(self, name=kernel.name, suite=suite, program=kernel,
                                              cases=tuple(c for c in suite.cases if kernel.runs(c)),
                                              absent=tuple(c for c in suite.cases if not kernel.runs(c)))


class ProgramNode(pytest.Collector):
    def __init__(self, *, suite: Suite, program: Program, cases, absent=(), **kwargs):
        super().__init__(**kwargs)
        self.suite = suite
        self.program = program
        self.cases = cases
        self.absent = absent  # the cases that break the kernel's `requires`

    def collect(self):
        yield CompileItem.from_parent(self, name="compile")
        if self.cases and gate_session(self.config).release() is not None:
            yield ReleaseItem.from_parent(self, name="release")
        for case in self.suite.cases:
            if case in self.cases:
                yield CaseItem.from_parent(self, name=case.name, case=case)
            elif case in self.absent:
                yield AbsentCaseItem.from_parent(self, name=case.name, reason=self.program.skip_reason(case),
                                                 shape_class=case.shape_class)


class GateItem(pytest.Item):
    @property
    def gate_session(self) -> GateSession:
        return gate_session(self.config)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, GateFailure):  # it may quote the checkout: its names, a compiler's log
            return log_lines(str(excinfo.value))
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, self.nodeid.split("::", 1)[-1]


class SuiteErrorItem(GateItem):
    def __init__(self, *, message: str, **kwargs):
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise GateFailure(f"the suite file is invalid:\n{self.message}")


class CompileItem(GateItem):
    run_phase = "compile"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.facts: list[BuildFacts] = []  # what each build came to (an xdist worker sends them on)

    def runtest(self) -> None:
        node: ProgramNode = self.parent
        refusal = self.gate_session.suites.refusal(node.suite, self.nodeid, "compile this suite's kernels")
        if refusal:
            raise GateFailure(refusal)
        failures = []
        arch, timeout_s = self.gate_session.arch(), self.gate_session.settings.timeout_s
        builds = compile_builds(node.program, node.cases, arch, timeout_s=timeout_s)
        for number, (build, result) in enumerate(builds):
            if not number:
                self.user_properties += [("arch", result.arch), ("compiler", result.compiler)]
            for key, value in entry_resources(result).items():  # a class variant's prefixed with its class
                self.user_properties.append((f"{build.variant}.{key}" if build.variant else key, value))
            # every entry of a kernel of steps is a build of its own, with its own registers
            built = entry_builds(build, result, arch, timeout_s=timeout_s)
            self.facts += [BuildFacts.of(node.suite.name, build, entry, one) for entry, one in built.items()]
            what = f" ({build.build_name})" if build.variant else ""
            if not result.ok:
                failures.append(f"{node.program.source}{what} does not compile for {result.arch}:\n{result.log}")
            mismatch = parameter_problems(build, result, node.suite.signature, arch, timeout_s=timeout_s, built=built)
            if mismatch:
                failures.append(f"{node.program.source}{what}: {mismatch_heading(build)}:\n"
                                + "\n".join(f"  - {p}" for p in mismatch))
        self.gate_session.compiles += self.facts
        if failures:
            raise GateFailure("\n".join(failures))


class ReleaseItem(GateItem):
    """Release mode: the kernel's version at the release ref, read and verified on the host (no GPU),
    so a ref that does not resolve or a release that cannot be trusted fails once, here, per kernel."""

    run_phase = "release"

    def runtest(self) -> None:
        from pytest_cudagate.trust.release import BuildRecord  # release mode only

        node: ProgramNode = self.parent
        run = self.gate_session
        try:
            current = build_record(current_version(node.program), run.arch(), timeout_s=run.settings.timeout_s)
        except IncludeError:  # its compile item fails saying why; the release status goes on without a build
            current = None
        try:
            line, warning = run.release().kernel_status(node.suite, node.program.name,
                                                            BuildRecord.from_json(current) if current else None)
        except CudagateError as exc:
            raise GateFailure(f"release gate: {exc}") from None
        self.user_properties.append(("release", line))
        if warning:
            self.warn(CudagateWarning(f"{self.nodeid}: {line}"))


class AbsentCaseItem(GateItem):
    """A case that breaks the kernel's ``requires``: skipped with the reason, never failed, never judged."""

    run_phase = "cases"

    def __init__(self, *, reason: str, shape_class: str, **kwargs):
        super().__init__(**kwargs)
        self.reason = reason
        self.extra_keyword_matches.add(shape_class)  # `-k large` selects it as it would the case

    def runtest(self) -> None:
        pytest.skip(self.reason)


class CaseItem(GateItem):
    run_phase = "cases"

    def __init__(self, *, case: Case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.extra_keyword_matches.add(case.shape_class)  # `-k large` selects a class
        gate_session(self.config).classes[(self.parent.suite.name, case.name)] = case.shape_class
        self.outcome: CaseOutcome | None = None  # what this item judged (an xdist worker sends it on)
        self.skipped_entry: tuple[str, str, str, str] | None = None

    def _record(self, outcome: CaseOutcome) -> None:
        self.outcome = outcome
        self.gate_session.outcomes.append(outcome)

    def runtest(self) -> None:
        started = time.perf_counter()
        node: ProgramNode = self.parent
        suite, program, case = node.suite, node.program, self.case
        run = self.gate_session
        refusal = run.suites.refusal(suite, self.nodeid, "judge this suite")
        if refusal:
            self._record(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                     message="suite not trusted", shape_class=case.shape_class))
            raise GateFailure(refusal)
        problem = case_data_problem(suite, case)
        if problem:
            self._record(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                     message="bad case data", shape_class=case.shape_class, failure=Failure.CASE_DATA))
            raise GateFailure(problem)
        waited = time.perf_counter()
        if run.client() is None:
            reason = run.unavailable_reason
            if run.settings.require_gpu:
                raise GateFailure(f"{reason} (--cuda-gate-require-gpu is set)")
            self.skipped_entry = (suite.name, program.name, case.name, case.kind)
            run.skipped.append(self.skipped_entry)
            pytest.skip(reason if reason.startswith("no CUDA device") else f"no CUDA device: {reason}")
        waited = time.perf_counter() - waited
        try:
            outcome = run.gate().replay(suite, program, case, run.suites.ledger(suite), started=started)
        except IncludeError as exc:  # the kernel's headers: its compile item says the same
            self._record(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                     message="bad include", shape_class=case.shape_class))
            raise GateFailure(str(exc)) from None
        except ExprError as exc:  # a launch over this GPU's device facts (load time checked a stand-in's)
            self._record(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                     message="bad launch", shape_class=case.shape_class))
            raise GateFailure(f"{suite.path}: kernel {program.name}, case {case.name}: its launch cannot be worked "
                              f"out on this GPU: {exc}; write the launch so that it holds for every GPU's "
                              "sm_count, max_shared_per_block and warp_size") from None
        phases.add(outcome, "worker_start", waited)
        # its span: from a head start in the turn before, less what it lent the next case (Gate.expect)
        phases.finish(outcome, time.perf_counter() - started + outcome.head_start_s - outcome.lent_s)
        self._record(outcome)
        verdict = outcome.correctness
        if verdict is not None and verdict.median_ms is not None:
            self.user_properties.append(("median_ms", verdict.median_ms))
        if outcome.latency is not None:
            self.user_properties.append(("latency_verdict", outcome.latency.verdict.value))
            if outcome.latency.estimate is not None:
                self.user_properties.append(("latency_ratio", outcome.latency.estimate.ratio))
        if outcome.failed:
            raise GateFailure(outcome.message)
        if outcome.warning:
            self.warn(CudagateWarning(f"{self.nodeid}: {outcome.warning}"))


class RunPhases:
    """The pytest hooks that clock a ``--cuda-gate`` run by phase, from the process's start to the
    terminal summary, so that every second of its wall time has a name. A collector or item names
    its phase in a ``run_phase`` attribute (the items and suite files above); other tests are
    ``other_tests``. Inside the run, the trust checks and the report writers charge their own
    phases (:func:`~pytest_cudagate.phases.run_phase`)."""

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
        name = getattr(collector, "run_phase", None)
        if name is None:
            return (yield)
        with self.clock.phase(name):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        try:
            return (yield)
        finally:  # the first item's wait for the worker, measured by the session, is not pytest's
            self.clock.transfer("pytest", "worker_wait", self.session.worker_start_s or 0.0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        name = getattr(item, "run_phase", "other_tests")
        start = time.perf_counter()
        try:
            with self.clock.phase(name):
                return (yield)
        finally:
            if name == "cases":
                self.clock.case_ran(start, time.perf_counter())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int):
        """The worker exits (CUDA teardown) while the reports are written; what is left of its
        shutdown after them is ``worker_shutdown``."""
        failed: list[BaseException] = []

        def close() -> None:
            try:
                self.session.close_worker()
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


def _import_quietly(module: str) -> None:
    """Import ``module`` ahead of its use; a failure is left to the use, which imports it again and says why."""
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - only a head start
        pass


def load_trust_root(config: pytest.Config) -> TrustRoot | None:
    """The base commit's keys, policy and ledger sequences handed over by `cudagate gate --trusted-ref`."""
    path = config.getoption("cuda_gate_trust_root")
    if path is None:
        return None
    if config.getoption("cuda_gate_allow_unsigned"):
        raise pytest.UsageError("--cuda-gate-allow-unsigned cannot be combined with a trust root (cudagate gate "
                                "--trusted-ref)")
    from pytest_cudagate.trust.base_ref import TrustRoot

    try:
        return TrustRoot.load(Path(path))
    except CudagateError as exc:
        raise pytest.UsageError(str(exc)) from None
