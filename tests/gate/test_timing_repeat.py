"""`timing.repeat` means one thing on every path: the timed launches of one measurement block."""

from __future__ import annotations

from fake_worker import FakeWorker, install, scale_kernels
from helpers import SUITE_YAML, changed_after_approval, write_suite
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.cli import main
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint

REPEAT = 20


def scale_suite(folder):
    return load_suite(write_suite(folder, yaml_text=SUITE_YAML + f"timing: {{warmup: 1, repeat: {REPEAT}, cache: cold}}\n"))


def timed(worker: FakeWorker) -> list[dict]:
    return [r["timing"] for r in worker.requests if r.get("timing")]


def test_without_an_approval_one_block_is_timed(tmp_path):
    suite = scale_suite(tmp_path / "scale")
    worker = FakeWorker(scale_kernels())
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=1), tmp_path / "out")
    outcome = gate.replay(suite, suite.kernels[0], suite.case("perf"), Ledger.for_suite(suite))
    assert [t["repeat"] for t in timed(worker)] == [REPEAT]
    assert len(outcome.correctness.samples_ms) == REPEAT


def interleaved(tmp_path) -> tuple[FakeWorker, CaseOutcome]:
    """The perf case of a kernel changed since its approval: timed interleaved against it."""
    suite, ledger = changed_after_approval(scale_suite(tmp_path / "scale"))
    worker = FakeWorker(scale_kernels())
    gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=1, budget_s=0.2), tmp_path / "o")
    return worker, gate.replay(suite, suite.kernels[0], suite.case("perf"), ledger)


def test_the_interleaved_comparison_starts_with_one_block(tmp_path):
    worker, outcome = interleaved(tmp_path)
    (compare,) = [r for r in worker.requests if r["op"] == "compare"]
    assert compare["timing"]["chunk"] == REPEAT and outcome.latency.pairs >= REPEAT


def test_a_baseline_is_three_blocks(tmp_path, monkeypatch, capsys):
    suite = scale_suite(tmp_path / "scale")
    workers = install(monkeypatch, tmp_path, scale_kernels())
    assert main(["approve", str(suite.path), "--approved-by", "reviewer"]) == 0
    assert [t["repeat"] for t in timed(workers[0])] == [3 * REPEAT]
    (baseline,) = Ledger.for_suite(suite).approvals["scale2"].baselines.values()
    assert len(baseline.cases["perf"]["samples_ms"]) == 3 * REPEAT
