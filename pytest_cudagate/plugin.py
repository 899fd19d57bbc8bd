"""The pytest plugin: ``pytest --cuda-gate`` collects every ``cudagate.yaml`` into test items.

Node ids read ``SUITE::KERNEL::CASE`` (and ``SUITE::KERNEL::compile``). A suite that does not load
becomes one failing item rather than a collection error, so one broken suite never stops the
others from being judged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.reports import pytest_hooks as reports
from pytest_cudagate.gate import CaseOutcome, GateOptions
from pytest_cudagate.session import GateRuntime
from pytest_cudagate.reports.terminal import render_table
from pytest_cudagate.trust import UNSIGNED_WARNING
from pytest_cudagate.config import load_settings
from pytest_cudagate.errors import FileError
from pytest_cudagate.suite.cases import case_data_fix, check_case_data
from pytest_cudagate.suite.loader import SUITE_FILENAME, load_suite
from pytest_cudagate.suite.model import Case, Program, Suite

RUNTIME = pytest.StashKey[GateRuntime]()


class GateFailure(Exception):
    """An item's failure, reported as its message alone (no Python traceback)."""


class CudagateWarning(UserWarning):
    """A verdict that does not fail the build but must not pass unseen (inconclusive, incomparable)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudagate", "CUDA kernel regression gate")
    group.addoption("--cuda-gate", action="store_true", help="collect cudagate.yaml suites and replay them on the GPU")
    group.addoption("--cuda-gate-require-gpu", action="store_true",
                    help="fail (instead of skip) replay items when no CUDA device is present; for reserved GPU runners")
    group.addoption("--cuda-gate-arch", default=None, metavar="SM",
                    help="compile target when no GPU is present (default: [tool.cudagate] arch, else sm_90)")
    group.addoption("--cuda-gate-timeout", type=float, default=None, metavar="S",
                    help="watchdog per case in seconds; a kernel silent for longer is killed (default 60)")
    group.addoption("--cuda-gate-strict", action="store_true",
                    help="fail on inconclusive or unstable latency verdicts instead of warning")
    group.addoption("--cuda-gate-release", action="store_true",
                    help="release mode: also judge against the stored baseline of this hardware; incomparable fails")
    group.addoption("--cuda-gate-budget", type=float, default=2.0, metavar="S",
                    help="measurement time per performance case for the interleaved comparison (default 2)")
    group.addoption("--cuda-gate-threshold", type=float, default=None, metavar="F",
                    help="latency drift tolerated, as a fraction (overrides each suite's gate.threshold)")
    group.addoption("--cuda-gate-fresh-seed", type=int, default=None, metavar="N",
                    help="seed of the fresh random inputs (default: $CUDAGATE_FRESH_SEED, else new each run; "
                         "the report names the seed so a failure can be replayed)")
    group.addoption("--cuda-gate-allow-unsigned", action="store_true",
                    help="judge suites whose cases or approvals are unsigned or altered (local experiments only)")
    reports.add_options(group)
    group.addoption("--cuda-gate-lock-timeout", type=float, default=600.0, metavar="S",
                    help="how long to wait for another gate run to release the GPU (default 600)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped cleanly without one")
    if not config.getoption("cuda_gate"):
        return
    try:
        settings = load_settings(Path(config.rootpath))
    except FileError as exc:  # one clear error, not INTERNALERROR
        raise pytest.UsageError(str(exc)) from None
    config.stash[RUNTIME] = GateRuntime(
        timeout_s=config.getoption("cuda_gate_timeout") or settings.timeout_s or 60.0,
        default_arch=config.getoption("cuda_gate_arch") or settings.arch or "sm_90",
        require_gpu=config.getoption("cuda_gate_require_gpu"),
        options=GateOptions(strict=config.getoption("cuda_gate_strict"), release=config.getoption("cuda_gate_release"),
                            budget_s=config.getoption("cuda_gate_budget"), threshold=config.getoption("cuda_gate_threshold"),
                            fresh_seed=config.getoption("cuda_gate_fresh_seed")),
        lock_timeout_s=config.getoption("cuda_gate_lock_timeout"),
        allow_unsigned=config.getoption("cuda_gate_allow_unsigned"),
    )
    # `pytest --cuda-gate` with no paths replays the suites the project lists.
    if settings.suites and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(Path(config.rootpath) / s) for s in settings.suites]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    runtime = session.config.stash.get(RUNTIME, None)
    if runtime is not None:
        reports.session_finish(session.config, runtime, exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    runtime = config.stash.get(RUNTIME, None)
    if runtime is not None:
        runtime.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.name == SUITE_FILENAME and RUNTIME in parent.config.stash:
        return SuiteFile.from_parent(parent, path=file_path)
    return None


class SuiteFile(pytest.File):
    def collect(self):
        try:
            suite = load_suite(self.path)
        except CudagateError as exc:
            yield SuiteErrorItem.from_parent(self, name="suite", message=str(exc))
            return
        except Exception as exc:  # a loader bug must cost this suite only, never the whole session
            yield SuiteErrorItem.from_parent(self, name="suite", message=f"{self.path}: cannot load: {exc!r}")
            return
        if suite.reference.program is not None:
            yield ProgramNode.from_parent(self, name="reference", suite=suite, program=suite.reference.program, cases=())
        for kernel in suite.kernels:
            yield ProgramNode.from_parent(self, name=kernel.name, suite=suite, program=kernel, cases=suite.cases)


class ProgramNode(pytest.Collector):
    def __init__(self, *, suite: Suite, program: Program, cases, **kwargs):
        super().__init__(**kwargs)
        self.suite = suite
        self.program = program
        self.cases = cases

    def collect(self):
        yield CompileItem.from_parent(self, name="compile")
        for case in self.cases:
            yield CaseItem.from_parent(self, name=case.name, case=case)


class GateItem(pytest.Item):
    @property
    def runtime(self) -> GateRuntime:
        return self.config.stash[RUNTIME]

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, GateFailure):
            return str(excinfo.value)
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
    def runtest(self) -> None:
        node: ProgramNode = self.parent
        result = compile_program(node.program, self.runtime.arch())
        self.user_properties.append(("arch", result.arch))
        for key, value in result.resources.items():
            self.user_properties.append((key, value))
        if not result.ok:
            raise GateFailure(f"{node.program.source} does not compile for {result.arch}:\n{result.log}")


class CaseItem(GateItem):
    def __init__(self, *, case: Case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        node: ProgramNode = self.parent
        suite, program, case = node.suite, node.program, self.case
        runtime = self.runtime
        distrust = runtime.trust_problems(suite)
        if distrust:
            runtime.outcomes.append(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                                message="suite not trusted"))
            raise GateFailure("the gate refuses to judge this suite: its oracle or approvals are not trusted\n"
                              + "\n".join(f"  - {p}" for p in distrust))
        problems = check_case_data(suite, case)
        if problems:
            runtime.outcomes.append(CaseOutcome(suite.name, program.name, case.name, case.kind, failed=True,
                                                message="bad case data"))
            raise GateFailure("case data does not match the signature:\n" + "\n".join(f"  - {p}" for p in problems)
                              + f"\n{case_data_fix(suite)}")
        if runtime.client() is None:
            reason = runtime.unavailable_reason
            if runtime.require_gpu:
                raise GateFailure(f"{reason} (--cuda-gate-require-gpu is set)")
            runtime.skipped.append((suite.name, program.name, case.name, case.kind))
            pytest.skip(reason if reason.startswith("no CUDA device") else f"no CUDA device: {reason}")
        outcome = runtime.gate().replay(suite, program, case, runtime.ledger(suite))
        runtime.outcomes.append(outcome)
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


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    runtime = config.stash.get(RUNTIME, None)
    if runtime is None or not (runtime.outcomes or runtime.skipped):
        return
    terminalreporter.write_sep("=", "cudagate")
    if runtime.allow_unsigned:
        terminalreporter.write_line(UNSIGNED_WARNING, red=True, bold=True)
    if runtime._gate is not None:
        terminalreporter.write_line(f"fingerprint {runtime._gate.fingerprint_text}")
    for line in render_table(runtime.outcomes, runtime.skipped):
        terminalreporter.write_line(line)
