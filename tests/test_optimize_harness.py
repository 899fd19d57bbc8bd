"""The optimizer's harness layer (HarnessEvaluator) on the CPU: its requests, its reading of the worker's answers,
and the winner's full gate through the real Gate.replay, with a client that answers like a worker would (outputs
computed by the suite's Python reference; "// fake: wrong" perturbs them)."""

from __future__ import annotations

import numpy as np
import pytest

from optimize_fakes import fake_source, opt_suite
from pytest_cudagate.approvals import Ledger, approval_for
from pytest_cudagate.worker.client import CompareResult, RunResult
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import GateOptions
from pytest_cudagate.optimize.candidate import Candidate
from pytest_cudagate.optimize.evaluator import HarnessEvaluator
from pytest_cudagate.defences.reference import python_expected
from pytest_cudagate.suite.loader import load_suite
from pathlib import Path

HELLO = {"type": "hello", "ok": True, "device": {"name": "Fake H200", "arch": "sm_90", "compute_capability": "9.0",
                                                 "memory_total_bytes": 1 << 37, "cuda_driver_version": "13.0",
                                                 "uuid": "GPU-fake", "sm_count": 132, "l2_bytes": 60 << 20},
         "identity": {"driver_version": "580"}, "nvrtc_version": "13.0", "cuda_bindings_version": "13"}


class WorkerLikeClient:
    """Answers run and compare requests the way the worker does, without a GPU."""

    def __init__(self, suite, latency_ms=None):
        self.suite = suite
        self.latency_ms = latency_ms or {}
        self.requests = []
        self.device = HELLO["device"]
        self.hello = HELLO
        self.env = {}
        self.timeout_s = 60.0

    def _outputs(self, kernel: dict, case: dict, inputs: dict[str, str], out_dir, prefix="") -> dict:
        scalars = case["scalars"]
        model_case = next((c for c in self.suite.cases if c.name == case["name"]), None)
        arrays = {name: np.load(path) for name, path in inputs.items()}
        shaped = {p.name: arrays[p.name].reshape(self.suite.shape(p, model_case)) for p in self.suite.buffers if p.is_input}
        result = python_expected(self.suite, model_case, shaped)
        folder = out_dir / case["name"]
        folder.mkdir(parents=True, exist_ok=True)
        outputs = {}
        for name, array in result.items():
            array = np.asarray(array, dtype=np.float32).reshape(-1)
            if "fake: wrong" in kernel["source"]:
                array = array + 1.0
            path = folder / f"{prefix}{name}.npy"
            np.save(path, array)
            outputs[name] = {"path": str(path), "differing_second_launch": 0, "unwritten": 0}
        del scalars
        return outputs

    def _body(self, kernel: dict, case: dict, out_dir, prefix="") -> dict:
        inputs = {name: spec["input"] for name, spec in case["buffers"].items() if "input" in spec}
        body = {"status": "ok", "case": case["name"], "seconds": 0.01, "inputs_modified": {},
                "outputs": self._outputs(kernel, case, inputs, out_dir, prefix)}
        fresh = []
        for spec in case.get("fresh") or []:
            entry = {"label": spec["label"], "inputs_modified": {}, "expected": spec.get("expected", {}),
                     "atol_scale": spec.get("atol_scale", {}),
                     "outputs": {k: {"path": v["path"]} for k, v in
                                 self._outputs(kernel, case, spec["inputs"], out_dir, f"{prefix}fresh.{spec['label']}.").items()}}
            fresh.append(entry)
        if fresh:
            body["fresh"] = fresh
        return body

    def run(self, request: dict) -> RunResult:
        self.requests.append(request)

        result = RunResult(compile={"ok": True, "log": "", "resources": {"registers": 16}, "seconds": 0.1})
        for case in request["cases"]:
            body = self._body(request["kernel"], case, Path(request["output_dir"]))
            if request.get("timing"):
                body["timing"] = {"samples_ms": [self._latency(request["kernel"], case["name"])] * request["timing"]["repeat"]}
            result.cases[case["name"]] = body
        return result

    def _latency(self, kernel: dict, case: str) -> float:
        return 0.010 if "latency=0.010" in kernel["source"] else 0.020

    def compare(self, request: dict, decide) -> CompareResult:
        self.requests.append(request)
        result = CompareResult(compile={"approved": {"ok": True, "log": ""}, "current": {"ok": True, "log": ""}})
        rng = np.random.default_rng(0)
        rounds = request["timing"].get("chunk", 100)
        for _ in range(50):
            current = self._latency(request["kernels"]["current"], request["case"]["name"])
            approved = self._latency(request["kernels"]["approved"], request["case"]["name"])
            noise = rng.normal(1, 0.01, size=(2, rounds))
            chunk = {"approved": list(approved * noise[0]), "current": list(current * noise[1]), "wall_s": 0.01,
                     "state": {}, "disturbances": []}
            result.chunks.append(chunk)
            rounds = decide(chunk)
            if rounds <= 0:
                break
        out = Path(request["output_dir"])
        body = self._body(request["kernels"]["current"], request["case"], out)
        body["approved"] = {k: v for k, v in self._body(request["kernels"]["approved"], request["case"], out,
                                                          "approved.").items() if k not in ("status", "case", "seconds")}
        result.body = body
        return result


@pytest.fixture
def setup(tmp_path):
    suite = load_suite(opt_suite(tmp_path / "scale"))
    program = suite.kernel("scale2")
    ledger = Ledger.for_suite(suite)
    ledger.approvals[program.name] = approval_for(ledger, program, approved_by="test", approved_at="now", git={},
                                                  tool_version="0")
    client = WorkerLikeClient(suite)
    evaluator = HarnessEvaluator(suite, program, ledger, client, Fingerprint.from_hello(HELLO),
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
    assert evaluator.device()["description"].startswith("Fake H200")


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
