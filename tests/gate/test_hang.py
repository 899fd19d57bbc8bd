"""A build that hangs costs one case timeout per gate run: its later cases fail without running,
naming the case it hung on (the real gate and judge, over a worker whose kernel never answers)."""

from __future__ import annotations

import pytest

from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, honest
from helpers import SUITE_YAML, write_suite
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.client import RunResult

TIMEOUT = {"kind": "timeout", "code": "TIMEOUT",
           "message": "no answer within 1 s (the kernel hung or ran too long); the worker was killed"}


class Fingerprint:
    def key(self) -> str:
        return "fake0000"

    def describe(self) -> str:
        return "a simulated GPU"


class HangingWorker(FakeWorker):
    """Answers every case of the source marked ``// hangs`` as the watchdog does; others honestly."""

    def run(self, request: dict) -> RunResult:
        if "// hangs" not in request["kernel"]["source"]:
            return super().run(request)
        self.requests.append(request)
        return RunResult(compile={"ok": True, "log": ""},
                         cases={c["name"]: {"case": c["name"], "status": "error", "error": TIMEOUT}
                                for c in request["cases"]})


@pytest.fixture
def gate_and_suite(tmp_path):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + "checks: {sanitizer: off}\n"))
    worker = HangingWorker({"scale2": FakeKernel(honest, SCALE_PARAMS)})
    worker.start()
    return Gate(worker, Fingerprint(), GateOptions(fresh_seed=1), tmp_path / "out"), suite, worker


def test_a_hung_build_is_not_run_again_in_the_same_gate(gate_and_suite):
    gate, suite, worker = gate_and_suite
    program, ledger = suite.kernels[0], Ledger.for_suite(suite)
    source = program.source.read_text() + "// hangs\n"
    first = gate.replay(suite, program, suite.case("small"), ledger, source_text=source)
    assert first.failed and "timeout" in first.correctness.describe()
    second = gate.replay(suite, program, suite.case("perf"), ledger, source_text=source)
    assert second.failed and second.message.startswith(
        "not run: scale2 did not finish case small within the case timeout earlier in this run")
    assert "--cuda-gate-timeout" in second.message
    assert len(worker.requests) == 1  # the second case cost no worker time


def test_another_build_of_the_kernel_still_runs(gate_and_suite):
    """An optimizer's next proposal (another source text) is judged as if nothing had hung."""
    gate, suite, worker = gate_and_suite
    program, ledger = suite.kernels[0], Ledger.for_suite(suite)
    gate.replay(suite, program, suite.case("small"), ledger, source_text=program.source.read_text() + "// hangs\n")
    fixed = gate.replay(suite, program, suite.case("small"), ledger)
    assert not fixed.failed, fixed.message
