"""The latency gate's host side: adaptive sampling decisions, verdict policy, and the ledger."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pytest_cudagate.trust.approvals import Baseline, Ledger, approval_for, build_identity
from pytest_cudagate.errors import FileError
from fake_worker import FakeWorker, scale_kernels
from helpers import write_suite
from pytest_cudagate.gate import Gate, GateOptions, decide
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.judge.latency import AdaptiveSampler, Latency, LatencyResult, against_runs
from pytest_cudagate.judge.stats import RatioEstimate
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.judge.correctness import CaseVerdict
import pytest_cudagate.gate.measure as measure_module
from pytest_cudagate.judge.latency import MAX_DISTURBED_CHUNKS
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.boundary.wire import to_json

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "softmax"


def chunk(rng, n, slowdown=0.0, disturbances=(), wall=0.01):
    base = rng.lognormal(np.log(0.015), 0.04, n)
    noise = rng.lognormal(0, 0.01, n)
    return {"approved": list(base), "current": list(base * noise * (1 + slowdown)), "wall_s": wall,
            "disturbances": list(disturbances), "state": {"sm_clock_mhz": 1980}}


def drive(sampler, rng, slowdown=0.0, limit=50):
    rounds = 100
    for _ in range(limit):
        rounds = sampler.decide(chunk(rng, rounds, slowdown))
        if rounds == 0:
            break
    return sampler.result()


def test_identical_kernels_pass_and_stop_early():
    result = drive(AdaptiveSampler(0.02, budget_s=2.0), np.random.default_rng(1))
    assert result.verdict is Latency.PASS
    assert 0.99 < result.estimate.ratio < 1.01 and result.pairs <= 1600
    assert len(result.telemetry) >= 1 and result.telemetry[0]["sm_clock_mhz"] == 1980


def test_a_clear_slowdown_regresses_after_one_chunk():
    result = drive(AdaptiveSampler(0.02), np.random.default_rng(2), slowdown=0.10)
    assert result.verdict is Latency.REGRESSED and result.pairs == 100
    assert "10." in result.headline() or "9." in result.headline()
    assert "slower than approved" in result.headline() and "99% CI" in result.headline()


def test_a_speedup_is_improved():
    assert drive(AdaptiveSampler(0.02), np.random.default_rng(3), slowdown=-0.08).verdict is Latency.IMPROVED


def test_the_budget_stops_sampling():
    sampler = AdaptiveSampler(0.02, budget_s=0.05)
    rng = np.random.default_rng(4)
    decisions = [sampler.decide(chunk(rng, 100, 0.02, wall=0.03)) for _ in range(2)]
    assert decisions[-1] == 0


def test_disturbed_chunks_are_discarded_then_unstable():
    sampler = AdaptiveSampler(0.02, budget_s=100)
    rng = np.random.default_rng(5)
    for _ in range(4):
        last = sampler.decide(chunk(rng, 100, disturbances=["hw_slowdown"]))
    assert last == 0
    result = sampler.result()
    assert result.verdict is Latency.UNSTABLE and "disturbed" in result.reason and result.discarded == ["hw_slowdown"] * 4


def test_one_disturbed_chunk_does_not_count_its_samples():
    sampler = AdaptiveSampler(0.02, budget_s=100)
    rng = np.random.default_rng(6)
    sampler.decide(chunk(rng, 100, slowdown=0.5, disturbances=["other process pid 42"]))
    assert sampler.current == [] and sampler.discarded


def test_against_runs_uses_the_spread_of_whole_runs_not_the_launches():
    rng = np.random.default_rng(7)
    stored = list(rng.lognormal(np.log(0.015), 0.03, 1000))
    case = {"samples_ms": stored, "run_p10_ms": [0.0150, 0.0151, 0.0149, 0.0150, 0.0152]}
    # +6%: a per-launch interval would call this regressed; against whole runs it is inside the floor.
    today = list(rng.lognormal(np.log(0.015 * 1.06), 0.03, 1000))
    result = against_runs(case, today, 0.02, suite="examples/softmax/cudagate.yaml")
    assert result.verdict is Latency.PASS and result.advisory and result.estimate is None
    assert "spread of 5 approval runs" in result.headline() and "floored at ±8.6% (between-card spread)" in result.headline()
    assert result.samples["approved"] == stored and "per-launch samples are for the plots" in result.describe()
    far = list(rng.lognormal(np.log(0.015 * 1.3), 0.03, 1000))
    assert against_runs(case, far, 0.02, suite="s").verdict is Latency.REGRESSED


def test_a_weak_baseline_passes_but_says_it_is_weak_and_how_to_narrow_it():
    """Two runs 4% apart: at 99% the interval reaches 8.7x, so no regression short of that is seen."""
    weak = {"samples_ms": [0.015] * 10, "run_p10_ms": [0.0150, 0.0156]}
    result = against_runs(weak, [0.0153] * 100, 0.02, suite="examples/soft max/cudagate.yaml", kernel="softmax_rows")
    assert result.verdict is Latency.PASS
    assert ("a weak baseline: an unchanged kernel's runs reach +769%, so a slowdown that small passes" in result.headline()
            and result.headline().endswith("record more runs on this card: "
                                           "`cudagate approve 'examples/soft max/cudagate.yaml' softmax_rows --runs 5`"))
    assert "fix" not in to_json(result.run_spread)
    steady = {**weak, "run_p10_ms": [0.0150, 0.0151, 0.0149, 0.0150, 0.0152]}
    assert "weak" not in against_runs(steady, [0.0153] * 100, 0.02, suite="s").headline()


@pytest.mark.parametrize("runs", [None, [0.015]])
def test_a_baseline_without_runs_says_how_to_record_them(runs):
    case = {"samples_ms": [0.015] * 10, **({"run_p10_ms": runs} if runs else {})}
    result = against_runs(case, [0.015] * 10, 0.02, suite="examples/softmax/cudagate.yaml")
    assert result.verdict is Latency.INCOMPARABLE and result.advisory
    assert result.reason.endswith("re-approve to record runs: `cudagate approve examples/softmax/cudagate.yaml --runs 5`")


def latency(verdict, advisory=False, reason="approved"):
    return LatencyResult(verdict, 0.02, reason=reason, estimate=RatioEstimate(1.05, 1.03, 1.07, 0.99, 300, "test"),
                         advisory=advisory)


@pytest.mark.parametrize("verdict, options, advisory, failed, warned", [
    (Latency.PASS, GateOptions(), False, False, False),
    (Latency.IMPROVED, GateOptions(), False, False, False),
    (Latency.REGRESSED, GateOptions(), False, True, False),
    (Latency.REGRESSED, GateOptions(), True, False, True),  # stored-runs evidence warns...
    (Latency.REGRESSED, GateOptions(release=True), True, True, False),  # ...and blocks a release
    (Latency.INCONCLUSIVE, GateOptions(), False, False, True),
    (Latency.INCONCLUSIVE, GateOptions(strict=True), False, True, False),
    (Latency.UNSTABLE, GateOptions(strict=True), False, True, False),
    (Latency.INCOMPARABLE, GateOptions(), False, False, True),
    (Latency.INCOMPARABLE, GateOptions(release=True), False, True, False),
    (Latency.INCOMPARABLE, GateOptions(release=True), True, False, True),  # e.g. a kernel new since the release
])
def test_verdict_policy(verdict, options, advisory, failed, warned):
    outcome = CaseOutcome("s", "k", "c", "performance", correctness=CaseVerdict("k", "c", True),
                          latency=latency(verdict, advisory))
    decide(outcome, options)
    assert outcome.failed is failed and (outcome.warning is not None) is warned
    if failed:
        assert f"latency {verdict.value}" in outcome.message


@pytest.mark.parametrize("pr, release, failed, warned", [
    (Latency.PASS, Latency.REGRESSED, True, False),  # creep: each step passed, the release sees the sum
    (Latency.PASS, Latency.PASS, False, False),
    (Latency.PASS, Latency.INCONCLUSIVE, False, True),
    (Latency.REGRESSED, Latency.PASS, True, False),
])
def test_release_mode_judges_both_comparisons(pr, release, failed, warned):
    result = latency(pr)
    result.release = latency(release, reason="v1.3.0")
    outcome = CaseOutcome("s", "k", "c", "performance", correctness=CaseVerdict("k", "c", True), latency=result)
    decide(outcome, GateOptions(release=True))
    assert outcome.failed is failed and (outcome.warning is not None) is warned
    said = outcome.message or outcome.warning or ""
    assert f"release gate: latency {release.value}: current is 5.0% slower than v1.3.0 (ratio 1.050, 99% CI" in said \
        or not (failed or warned)


def test_a_correctness_failure_fails_whatever_the_latency():
    outcome = CaseOutcome("s", "k", "c", "performance", correctness=CaseVerdict("k", "c", False, ["wrong"]),
                          latency=latency(Latency.IMPROVED))
    decide(outcome, GateOptions())
    assert outcome.failed and "wrong" in outcome.message


# -- the ledger ---------------------------------------------------------------------------------------

@pytest.fixture()
def suite(tmp_path):
    target = tmp_path / "softmax"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved"))
    return load_suite(target / "cudagate.yaml")


def approve(suite):
    ledger = Ledger.for_suite(suite)
    approval = approval_for(ledger, suite.kernels[0], approved_by="alice", approved_at="2026-11-29T00:00:00Z",
                            git={"commit": "abc", "dirty": False}, tool_version="test")
    approval.baselines["00112233aabbccdd"] = Baseline({"gpu_name": "NVIDIA H200"}, "2026-11-29",
                                                      {"perf_256x1024": {"summary": {"median": 0.006},
                                                                         "samples_ms": [0.006, 0.0061], "cache": "cold"}})
    ledger.approvals[approval.kernel] = approval
    ledger.save()
    return ledger


def test_ledger_round_trip_and_identity(suite):
    approve(suite)
    again = Ledger.for_suite(suite)
    approval = again.approvals["softmax_rows"]
    assert approval.baselines["00112233aabbccdd"].cases["perf_256x1024"]["samples_ms"] == [0.006, 0.0061]
    assert build_identity(suite.kernels[0]) == approval.identity()
    assert again.approved_version(approval).source == suite.kernels[0].source.read_text()
    (suite.root / "softmax.cu").write_text(suite.kernels[0].source.read_text() + "\n// changed\n")
    assert build_identity(load_suite(suite.path).kernels[0]) != approval.identity()


def test_a_missing_ledger_is_empty(suite):
    assert Ledger.for_suite(suite).approvals == {}


def test_a_corrupt_ledger_is_a_clear_error(suite):
    (suite.root / "cudagate.approvals.json").write_text("{not json")
    with pytest.raises(FileError, match="cannot read the approvals ledger.*cudagate approve"):
        Ledger.for_suite(suite)


def test_a_ledger_violating_its_schema_is_a_clear_error(suite):
    approve(suite)
    path = suite.root / "cudagate.approvals.json"
    raw = json.loads(path.read_text())
    raw["approvals"]["softmax_rows"]["source_sha256"] = "not-a-hash"
    path.write_text(json.dumps(raw))
    with pytest.raises(FileError, match="source_sha256"):
        Ledger.for_suite(suite)


def test_a_missing_or_altered_pinned_copy_is_refused(suite):
    ledger = approve(suite)
    approval = ledger.approvals["softmax_rows"]
    blob = suite.root / approval.source_blob
    blob.write_text("// tampered")
    with pytest.raises(FileError, match="does not match its hash"):
        ledger.approved_version(approval)
    blob.unlink()
    with pytest.raises(FileError, match="is missing"):
        ledger.approved_version(approval)


# -- the identical-kernel path: NVML snapshots around the timed run ----------------------------------

@pytest.fixture()
def identical(tmp_path, monkeypatch):
    """The `scale` suite approved as it is, a fake worker, and NVML reporting ``states`` in turn."""
    scale = load_suite(write_suite(tmp_path / "scale"))
    ledger = Ledger.for_suite(scale)
    ledger.approvals["scale2"] = approval_for(ledger, scale.kernels[0], approved_by="alice", approved_at="now",
                                              git={}, tool_version="test")
    worker_states: list = []  # what the worker's own NVML reads after the timed launches, in turn (none: {})
    worker = FakeWorker(scale_kernels(), state=lambda: worker_states.pop(0) if worker_states else {})
    fingerprint = Fingerprint.from_hello(worker.start())

    def replay(states, at_worker=()):
        worker_states[:] = list(at_worker)
        feed = iter(states)

        def fake_state(ordinal, pci_bus_id=None):
            value = next(feed)
            if isinstance(value, Exception):
                raise value
            return value

        monkeypatch.setattr(measure_module, "device_state", fake_state)
        gate = Gate(worker, fingerprint, GateOptions(fresh_seed=1), tmp_path / "out")
        outcome = gate.replay(scale, scale.kernels[0], scale.case("perf"), ledger)
        timed = [r for r in worker.requests if r.get("timing")]
        worker.requests.clear()
        return outcome, len(timed)

    return replay


QUIET = {"throttle_reasons": ["gpu_idle"], "other_processes": [], "sm_clock_mhz": 345, "temperature_c": 35}
BUSY = {**QUIET, "other_processes": [{"pid": 999, "used_memory_bytes": 1 << 30}]}
MINE = {**QUIET, "other_processes": [{"pid": os.getpid(), "used_memory_bytes": 1 << 30}]}  # the worker itself


def test_a_quiet_run_is_measured_once(identical):
    outcome, runs = identical([QUIET, {**QUIET, "sm_clock_mhz": 1980}])  # idle → boost is no disturbance
    assert not outcome.failed and outcome.latency.discarded == [] and runs == 1
    assert outcome.latency.verdict is Latency.INCOMPARABLE and "no baseline was recorded" in outcome.latency.reason


def test_the_worker_itself_is_not_another_process(identical):
    assert identical([MINE, MINE])[0].latency.discarded == []


def test_a_disturbed_run_is_repeated(identical):
    outcome, runs = identical([QUIET, BUSY, BUSY, QUIET, QUIET, QUIET])
    assert runs == 3 and len(outcome.latency.discarded) == 2 and "999" in outcome.latency.discarded[0]


def test_a_run_that_is_never_clean_ends_unstable(identical):
    outcome, runs = identical([BUSY] * 20)
    assert outcome.latency.verdict is Latency.UNSTABLE and len(outcome.latency.discarded) == MAX_DISTURBED_CHUNKS + 1
    assert runs == MAX_DISTURBED_CHUNKS + 2


def test_the_workers_snapshot_after_the_timed_launches_decides_not_the_hosts_after_the_library(identical):
    """The worker reads NVML right after the kernel's timed launches; the host's later snapshot also spans the
    library baseline's rounds, so it is used only where the worker has no reading."""
    outcome, runs = identical([QUIET, BUSY], at_worker=[QUIET])
    assert outcome.latency.discarded == [] and runs == 1
    outcome, runs = identical([QUIET, QUIET, QUIET, QUIET], at_worker=[BUSY, QUIET])
    assert runs == 2 and len(outcome.latency.discarded) == 1 and "999" in outcome.latency.discarded[0]


def test_telemetry_failure_is_not_a_disturbance(identical):
    assert identical([RuntimeError("nvml broke"), RuntimeError("nvml broke")])[0].latency.discarded == []


def recorded_elsewhere(tmp_path, there: Fingerprint | None = None) -> LatencyResult:
    """The `scale` kernel, identical to its approval, whose only baseline was recorded on ``there``
    (default: this fake card with launches unheld), judged on the fake card."""
    scale = load_suite(write_suite(tmp_path / "scale"))
    worker = FakeWorker(scale_kernels())
    here = Fingerprint.from_hello(worker.start())
    there = there or dataclasses.replace(here, timing_hold=None)
    ledger = Ledger.for_suite(scale)
    approval = approval_for(ledger, scale.kernels[0], approved_by="alice", approved_at="now", git={},
                            tool_version="test")
    approval.baselines = {there.key(): Baseline(there.to_dict(), "2026-11-29", {
        "perf": {"summary": {}, "samples_ms": [0.006], "cache": "cold"}})}
    ledger.approvals["scale2"] = approval
    gate = Gate(worker, here, GateOptions(fresh_seed=1), tmp_path / "out")
    return gate.replay(scale, scale.kernels[0], scale.case("perf"), ledger).latency


def test_incomparable_names_what_differs_from_the_recorded_hardware(tmp_path):
    there = Fingerprint("NVIDIA H100 80GB HBM3", "9.0", 85_000_000_000, "580.00", "13.0", "13.0", "13.0", 700.0,
                        True, False, sm_count=132)
    result = recorded_elsewhere(tmp_path, there)
    assert result.verdict is Latency.INCOMPARABLE
    assert "gpu_name (NVIDIA H100 80GB HBM3 there, Fake GPU here)" in result.reason
    assert "memory_total_bytes" in result.reason and "cudagate approve" in result.reason


def test_a_baseline_timed_before_launches_were_held_is_not_compared(tmp_path):
    """The same card, recorded when timed launches were not held (no timing_hold): another
    fingerprint, and the message names only that."""
    result = recorded_elsewhere(tmp_path)
    assert result.verdict is Latency.INCOMPARABLE and result.advisory
    assert ("the nearest recorded hardware differs in timing_hold (launches unheld there, launches held here); "
            "a maintainer records one with `cudagate approve` on this runner") in result.reason, result.reason
