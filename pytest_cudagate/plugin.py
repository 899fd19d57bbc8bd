"""The pytest plugin: ``pytest --cuda-gate`` collects every ``cudagate.yaml`` into test items.

Node ids read ``SUITE::KERNEL::CASE`` (and ``SUITE::KERNEL::compile``). A suite that does not load
becomes one failing item rather than a collection error, so one broken suite never stops the
others from being judged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .build import compile_program
from .errors import CudagateError
from .requests import run_request
from .runtime import GateRuntime, ItemRecord
from .settings import load_settings
from .suite.cases import case_data_fix, check_case_data
from .suite.loader import SUITE_FILENAME, load_suite
from .suite.model import Case, Program, Suite
from .verdicts import judge, load_expected

RUNTIME = pytest.StashKey[GateRuntime]()


class GateFailure(Exception):
    """An item's failure, reported as its message alone (no Python traceback)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudagate", "CUDA kernel regression gate")
    group.addoption("--cuda-gate", action="store_true", help="collect cudagate.yaml suites and replay them on the GPU")
    group.addoption("--cuda-gate-require-gpu", action="store_true",
                    help="fail (instead of skip) replay items when no CUDA device is present; for reserved GPU runners")
    group.addoption("--cuda-gate-arch", default=None, metavar="SM",
                    help="compile target when no GPU is present (default: [tool.cudagate] arch, else sm_90)")
    group.addoption("--cuda-gate-timeout", type=float, default=None, metavar="S",
                    help="watchdog per case in seconds; a kernel silent for longer is killed (default 60)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped cleanly without one")
    if not config.getoption("cuda_gate"):
        return
    settings = load_settings(Path(config.rootpath))
    config.stash[RUNTIME] = GateRuntime(
        timeout_s=config.getoption("cuda_gate_timeout") or settings.timeout_s or 60.0,
        default_arch=config.getoption("cuda_gate_arch") or settings.arch or "sm_90",
        require_gpu=config.getoption("cuda_gate_require_gpu"),
    )
    # `pytest --cuda-gate` with no paths replays the suites the project lists.
    if settings.suites and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(Path(config.rootpath) / s) for s in settings.suites]


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
        return self.path, None, self.nodeid.split("::", 1)[-1]


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
        record = ItemRecord(suite.name, program.name, case.name, case.kind, "failed")
        self.runtime.records.append(record)
        problems = check_case_data(suite, case)
        if problems:
            record.detail = "bad case data"
            raise GateFailure("case data does not match the signature:\n" + "\n".join(f"  - {p}" for p in problems)
                              + f"\n{case_data_fix(suite)}")
        client = self.runtime.client()
        if client is None:
            reason = self.runtime.unavailable_reason
            if self.runtime.require_gpu:
                record.detail = "no CUDA device"
                raise GateFailure(f"{reason} (--cuda-gate-require-gpu is set)")
            record.outcome = "skipped"
            pytest.skip(reason if reason.startswith("no CUDA device") else f"no CUDA device: {reason}")
        timing = suite.timing.to_json() if case.kind == "performance" else None
        request = run_request(suite, program, [case], output_dir=self.runtime.output_dir / program.name, timing=timing)
        result = client.run(request)
        if not result.compile.get("ok"):
            record.detail = "compile error"
            raise GateFailure(f"{program.source} does not compile:\n{result.compile.get('log', '')}")
        body = result.cases[case.name]
        expected = load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs})
        shapes = {p.name: suite.shape(p, case) for p in suite.buffers}
        verdict = judge(program.name, case.name, body, expected, suite.tolerance, shapes)
        record.median_ms, record.rel_norm = verdict.median_ms, verdict.rel_norm
        if verdict.median_ms is not None:
            self.user_properties.append(("median_ms", verdict.median_ms))
        if not verdict.passed:
            record.detail = (verdict.problems or [c.describe().splitlines()[0] for c in verdict.comparisons if not c.ok])[0]
            raise GateFailure(verdict.describe())
        record.outcome = "passed"


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    runtime = config.stash.get(RUNTIME, None)
    if runtime is None or not runtime.records:
        return
    from .summary import render_table

    terminalreporter.write_sep("=", "cudagate")
    if runtime.client() is not None:
        device = runtime.client().device
        terminalreporter.write_line(f"device: {device.get('name')} ({device.get('arch')}), driver CUDA {device.get('cuda_driver_version')}")
    for line in render_table(runtime.records):
        terminalreporter.write_line(line)
