"""Realistic gate outcomes for the report tests, built with the real comparison, statistics and
request code on a real (generated) suite, so the reports render what a GPU run would give.

One of each: passed, correctness failure (wrong values and a NaN), latency regressed (interleaved
samples, interval, telemetry), inconclusive, incomparable, and a case skipped for want of a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from helpers import SUITE_YAML, write_suite
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.gate import GateOptions, decide
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.judge.latency import AdaptiveSampler, Latency, LatencyResult, classify, incomparable
from pytest_cudagate.worker.requests import case_spec, kernel_spec, run_request
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.judge.correctness import CaseVerdict
from pytest_cudagate.boundary.wire import from_json, to_json
from pytest_cudagate.reports.document import Built, build_report
from pytest_cudagate.reports.model import Report
from pytest_cudagate.reports.locate import from_items

CASES = """\
cases:
  - {name: small, kind: correctness, scalars: {rows: 3, cols: 50}}
  - {name: edge, kind: correctness, scalars: {rows: 2, cols: 7}}
  - {name: perf, kind: performance, scalars: {rows: 64, cols: 256}}
  - {name: perf_wide, kind: performance, scalars: {rows: 8, cols: 1024}}
  - {name: perf_tall, kind: performance, scalars: {rows: 256, cols: 32}}
  - {name: perf_odd, kind: performance, scalars: {rows: 33, cols: 65}}
"""
REPORT_SUITE_YAML = SUITE_YAML[: SUITE_YAML.index("cases:\n")] + CASES
THRESHOLD = 0.02


def h200(driver: str = "570.124.06", name: str = "NVIDIA H200") -> Fingerprint:
    return Fingerprint(gpu_name=name, compute_capability="9.0", memory_total_bytes=150_754_820_096,
                       driver_version=driver, cuda_driver_version="12.8", nvrtc_version="12.8.93",
                       cuda_bindings_version="12.8.0", power_limit_w=700.0, ecc=True, mig=False,
                       uuid="GPU-1a2b3c4d-0000-1111-2222-333344445555", sm_count=132, l2_bytes=62_914_560)


def h100() -> Fingerprint:
    return Fingerprint(gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_total_bytes=85_520_809_984,
                       driver_version="550.90.07", cuda_driver_version="12.4", nvrtc_version="12.8.93",
                       cuda_bindings_version="12.8.0", power_limit_w=700.0, ecc=True, mig=False, sm_count=132)


def _state(rng: np.random.Generator, chunk: int) -> dict:
    return {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 41 + chunk, "power_w": round(rng.uniform(300, 360), 1),
            "throttle_reasons": ["gpu_idle"] if chunk == 0 else [], "utilization_gpu_pct": 97, "other_processes": []}


def interleaved(ratio: float, rounds_per_chunk: list[int], noise: float, seed: int, base_ms: float = 0.0123) -> LatencyResult:
    """Feed an AdaptiveSampler chunks shaped like the worker's (``compare`` op answers)."""
    rng = np.random.default_rng(seed)
    sampler = AdaptiveSampler(THRESHOLD, budget_s=2.0)
    for number, rounds in enumerate(rounds_per_chunk):
        drift = 1 + 0.01 * np.sin(np.arange(rounds) / 40)  # slow clock drift: hits both kernels alike
        approved = base_ms * drift * rng.lognormal(0, noise, rounds)
        current = base_ms * ratio * drift * rng.lognormal(0, noise, rounds)
        sampler.decide({"approved": approved.tolist(), "current": current.tolist(), "wall_s": 0.05 * rounds / 100,
                        "disturbances": [], "state": _state(rng, number)})
    return sampler.result()


def _inconclusive() -> LatencyResult:
    rng = np.random.default_rng(7)
    approved = (0.050 * rng.lognormal(0, 0.04, 24)).tolist()
    current = (0.050 * 1.025 * rng.lognormal(0, 0.04, 24)).tolist()
    estimate = stats.paired_ratio(current, approved)
    return LatencyResult(classify(estimate, THRESHOLD), THRESHOLD, reason="approved", estimate=estimate,
                         approved=stats.summarize(approved), current=stats.summarize(current), pairs=24,
                         measurement_s=2.01, samples={"approved": approved, "current": current},
                         telemetry=[_state(rng, 1)])


@dataclass
class Scenario:
    suite: Suite
    fingerprint: Fingerprint
    options: GateOptions
    outcomes: list[CaseOutcome]
    skipped: list[tuple[str, str, str, str]]
    trust: dict[str, str] = field(default_factory=dict)

    def items(self) -> list[SimpleNamespace]:
        """Stand-ins for the collected pytest items: what the report reads from them."""
        root = self.suite.root
        program = self.suite.kernels[0]
        parent = SimpleNamespace(suite=self.suite, program=program)
        return [SimpleNamespace(nodeid=f"{root.name}/cudagate.yaml::{program.name}::{c.name}", parent=parent, case=c)
                for c in self.suite.cases]

    def runtime(self) -> SimpleNamespace:
        return SimpleNamespace(outcomes=self.outcomes, skipped=self.skipped, options=self.options, trust=self.trust,
                               fingerprint=self.fingerprint)


def _outcome(suite: Suite, case_name: str, out: Path, *, timing: dict | None = None) -> CaseOutcome:
    case = suite.case(case_name)
    program = suite.kernels[0]
    outcome = CaseOutcome(suite.name, program.name, case.name, case.kind)
    outcome.requests.append(run_request(suite, program, [case], output_dir=out, timing=timing))
    return outcome


def _compare_request(suite: Suite, case_name: str, out: Path) -> dict:
    program, case = suite.kernels[0], suite.case(case_name)
    launch = program.launch_for(case.name).resolve(case.scalars)
    return {"protocol": 1, "op": "compare", "suite": str(suite.path),
            "kernels": {"approved": kernel_spec(program), "current": kernel_spec(program)},
            "launches": {"approved": launch, "current": launch}, "signature": [p.protocol() for p in suite.signature],
            "case": case_spec(suite, program, case), "timing": {**suite.timing.to_json(), "chunk": 100},
            "output_dir": str(out)}


def _passing_verdict(suite: Suite, case_name: str, samples_ms: list[float] | None = None) -> CaseVerdict:
    case = suite.case(case_name)
    expected = np.load(suite.expected_path(case, suite.outputs[0]))
    result = check_output("y", expected.copy(), expected, suite.tolerance["y"], suite.shape(suite.outputs[0], case))
    return CaseVerdict("scale2", case_name, True, comparisons=[result], samples_ms=samples_ms)


def build_scenario(folder: Path, *, fingerprint: Fingerprint | None = None, options: GateOptions | None = None) -> Scenario:
    """Write the suite into ``folder`` and return the six outcomes a gate run on it could give."""
    return scenario_for(load_suite(write_suite(folder, yaml_text=REPORT_SUITE_YAML)), fingerprint=fingerprint,
                        options=options)


def scenario_for(suite: Suite, *, fingerprint: Fingerprint | None = None, options: GateOptions | None = None) -> Scenario:
    """The outcomes for a suite written by :func:`build_scenario` (its case data already generated)."""
    folder = suite.root
    fingerprint = fingerprint or h200()
    options = options or GateOptions()
    fp_text = f"{fingerprint.key()}: {fingerprint.describe()}"
    out = folder / "out" / "scale2"

    passed = _outcome(suite, "small", out)
    passed.correctness = _passing_verdict(suite, "small")

    wrong = _outcome(suite, "edge", out)
    case = suite.case("edge")
    expected = np.load(suite.expected_path(case, suite.outputs[0]))
    actual = expected.copy()
    actual[1, 3] += 0.5  # off by a lot: the worst element
    actual[0, 2] = np.nan  # an element the kernel never wrote sensibly
    actual[1, 6] *= 1.001
    comparison = check_output("y", actual, expected, suite.tolerance["y"], suite.shape(suite.outputs[0], case))
    wrong.correctness = CaseVerdict("scale2", "edge", False, comparisons=[comparison])

    regressed = CaseOutcome(suite.name, "scale2", "perf", "performance")  # timed against the approved version:
    regressed.requests.append(_compare_request(suite, "perf", out))  # one `compare` conversation, no `run`
    regressed.latency = interleaved(1.21, [100, 100, 200, 400], noise=0.03, seed=1)
    regressed.latency.fingerprint = fp_text
    regressed.worker_s = 2.41  # allocation, checks, warm-up and the interleaved timing
    regressed.correctness = _passing_verdict(suite, "perf")
    assert regressed.latency.verdict is Latency.REGRESSED, regressed.latency.describe()

    unsure = CaseOutcome(suite.name, "scale2", "perf_wide", "performance")
    unsure.requests.append(_compare_request(suite, "perf_wide", out))
    unsure.latency = _inconclusive()
    unsure.latency.fingerprint = fp_text
    unsure.correctness = _passing_verdict(suite, "perf_wide")
    assert unsure.latency.verdict is Latency.INCONCLUSIVE, unsure.latency.describe()

    other = _outcome(suite, "perf_tall", out, timing={**suite.timing.to_json(), "repeat": 1000})
    samples = (0.0081 * np.random.default_rng(3).lognormal(0, 0.02, 1000)).tolist()
    other.latency = incomparable(THRESHOLD, "the kernel is identical to the approved version, and no baseline was "
                                            f"recorded on this hardware ({fingerprint.key()}); a maintainer records one "
                                            "with `cudagate approve` on this runner", fp_text)
    other.correctness = _passing_verdict(suite, "perf_tall", samples)

    outcomes = [passed, wrong, regressed, unsure, other]
    for outcome in outcomes:
        decide(outcome, options)
    assert wrong.failed and regressed.failed and unsure.warning and other.warning and not passed.failed
    skipped = [(suite.name, "scale2", "perf_odd", "performance")]
    trust = {str(suite.path): "signed by maintainer@example.com (ed25519 7f3a…c2): 6 cases verified"}
    return Scenario(suite, fingerprint, options, outcomes, skipped, trust)


def built_report(scenario: Scenario, report_dir: Path | None = None, *, root: Path | None = None, exitstatus: int = 1):
    """The report (and request files) the pytest hook would build for ``scenario``, its document as
    report.json holds it (JSON: a test edits it as a hand-edited file would be)."""
    built = build_report(scenario.outcomes, scenario.skipped, index=from_items(scenario.items()),
                        fingerprint=scenario.fingerprint, options=scenario.options, trust=scenario.trust,
                        root=root or scenario.suite.root.parent, exitstatus=exitstatus,
                        report_dir=str(report_dir) if report_dir else None)
    return Built(to_json(built.document), built.requests)


def as_report(document: dict) -> Report:
    """A report document (JSON, as a test edited it) as the objects the renderers take."""
    return from_json(Report, document)
