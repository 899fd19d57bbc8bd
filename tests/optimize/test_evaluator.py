"""The optimizer's harness layer (HarnessEvaluator) on the CPU: its requests, its reading of the worker's answers,
and the winner's full gate through the real Gate.replay, on the fake worker (a candidate's "// fake:" markers say
what its kernel does)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, scale_xy
from optimize_fakes import fake_source, opt_suite
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.candidate import Candidate
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.suite.loader import load_suite


def kernel_from_source(spec: dict) -> FakeKernel:
    """The `scale` kernel a candidate's source stands for: its ``// fake:`` markers say whether it is
    wrong (y = 2x + 1) and how long a launch takes (``latency=0.010`` ms; default 0.020, 1 % noise)."""
    wrong = "fake: wrong" in spec["source"]
    latency = 0.010 if "latency=0.010" in spec["source"] else 0.020
    rng = np.random.default_rng(zlib.crc32(spec["source"].encode()))  # each kernel its own noise

    def body(launch) -> None:
        x, y, _ = scale_xy(launch)
        y[:] = 2 * x + (1 if wrong else 0)
        launch.device.clock += latency * rng.normal(1, 0.01) - 0.01  # the fake device adds 0.01 per launch

    return FakeKernel(body, SCALE_PARAMS)


@pytest.fixture
def setup(tmp_path):
    suite = load_suite(opt_suite(tmp_path / "scale"))
    program = suite.kernel("scale2")
    ledger = Ledger.for_suite(suite)
    ledger.approvals[program.name] = approval_for(ledger, program, approved_by="test", approved_at="now", git={},
                                                  tool_version="0")
    client = FakeWorker(kernel_from_source)
    evaluator = HarnessEvaluator(suite, program, ledger, client, Fingerprint.from_hello(client.start()),
                                 gate_options=GateOptions(budget_s=0.5, fresh_seed=7), work_dir=tmp_path / "work")
    return suite, program, client, evaluator


def test_search_evaluation_times_each_case_against_the_initial_kernel(setup):
    suite, program, client, evaluator = setup
    fast = Candidate(fake_source("latency=0.010"), program.launch, origin="replay", label="fast")
    evaluation = evaluator.evaluate(fast)
    assert evaluation.passed and evaluation.stage == "done"
    kinds = [(r.get("op"), [c["name"] for c in r.get("cases", [])] or [r["case"]["name"]]) for r in client.requests]
    assert kinds == [("run", ["small"]), ("compare", ["perf"]), ("compare", ["perf2"])]  # never the holdout
    compare = client.requests[1]
    assert compare["kernels"]["approved"]["source"] == (suite.root / "scale.cu").read_text()
    assert compare["kernels"]["current"]["source"] == fast.text and compare["timing"]["chunk"] == 100
    assert client.requests[0]["timing"] is None
    perf = evaluation.case("perf")
    assert perf.samples == 100 and perf.latency_ms == pytest.approx(0.010, rel=0.01)
    assert perf.initial_ms == pytest.approx(0.020, rel=0.01) and perf.ratio["ratio"] == pytest.approx(0.5, rel=0.01)
    assert perf.ratio["low"] < 0.5 < perf.ratio["high"] and perf.launch == {"grid": [64, 1, 1], "block": [128, 1, 1],
                                                                           "shared_bytes": 0}
    assert evaluator.device()["description"].startswith("Fake GPU")


def test_a_wrong_candidate_stops_at_the_first_failing_case(setup):
    suite, program, client, evaluator = setup
    evaluation = evaluator.evaluate(Candidate(fake_source("wrong"), program.launch, origin="replay"))
    assert not evaluation.passed and evaluation.stage == "correctness" and len(client.requests) == 1
    assert "150 of 150 elements outside tolerance" in evaluation.rejection
    assert "expected" not in evaluation.rejection_for_model and "worst at index" in evaluation.rejection_for_model


def test_the_winner_is_gated_on_every_case_with_the_real_gate(setup):
    suite, program, client, evaluator = setup
    validation = evaluator.validate(Candidate(fake_source("latency=0.010"), program.launch, origin="replay"))
    assert validation.passed, validation.rejection
    cases = {c["case"]: c for c in validation.cases}
    assert set(cases) == {"small", "perf", "perf2", "hidden_77x300"} and cases["hidden_77x300"]["holdout"]
    assert cases["perf"]["latency"]["verdict"] == "improved" and cases["perf"]["latency"]["estimate"]["ratio"] < 0.55
    assert cases["hidden_77x300"]["latency"]["verdict"] == "improved"
    compared = [r for r in client.requests if r.get("op") == "compare"]
    assert {r["case"]["name"] for r in compared} == {"perf", "perf2", "hidden_77x300"}
    assert any(r["case"].get("fresh") for r in compared)  # the gate's fresh inputs went along
    assert validation.fresh_seed == 7


def test_the_gate_rejects_a_candidate_wrong_only_on_the_gates_cases(setup):
    suite, program, client, evaluator = setup
    validation = evaluator.validate(Candidate(fake_source("wrong"), program.launch, origin="replay"))
    assert not validation.passed and validation.rejection.startswith("case small:")
    assert all(not c["passed"] for c in validation.cases)
