"""The gate for one kernel on one case: correctness, then latency against the approved version.

Shared by the pytest items, ``cudagate approve`` and the optimizer, so a proposal is judged by
exactly the rules a pull request is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .approvals import Ledger, build_identity
from .client import HarnessClient
from .latency import AdaptiveSampler, Latency, LatencyResult, against_baseline, incomparable, worst
from .requests import case_spec, kernel_spec, run_request
from .suite.model import Case, Program, Suite
from .verdicts import CaseVerdict, judge, load_expected

BASELINE_ROUNDS = 1000  # launches timed for a stored baseline, and for a kernel identical to it


@dataclass(frozen=True)
class GateOptions:
    strict: bool = False  # inconclusive and unstable fail
    release: bool = False  # also judge against the stored baseline; incomparable fails
    budget_s: float = 2.0  # measurement time per case
    threshold: float | None = None  # overrides the suite's


@dataclass
class CaseOutcome:
    suite: str
    kernel: str
    case: str
    kind: str
    correctness: CaseVerdict | None = None
    latency: LatencyResult | None = None
    failed: bool = False
    warning: str | None = None
    message: str = ""
    requests: list[dict] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return "failed" if self.failed else "passed"


class Gate:
    """Judges cases on one worker, for one hardware fingerprint."""

    def __init__(self, client: HarnessClient, fingerprint, options: GateOptions, output_dir: Path):
        self.client = client
        self.fingerprint = fingerprint
        self.options = options
        self.output_dir = output_dir

    @property
    def fingerprint_text(self) -> str:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}"

    def replay(self, suite: Suite, program: Program, case: Case, ledger: Ledger, source_text: str | None = None) -> CaseOutcome:
        outcome = CaseOutcome(suite.name, program.name, case.name, case.kind)
        threshold = self.options.threshold or suite.threshold
        approval = ledger.approvals.get(program.name)
        out = self.output_dir / program.name
        if case.kind != "performance":
            body, compile_info = self._run(outcome, suite, program, case, None, out, source_text)
        elif approval is None:
            body, compile_info = self._run(outcome, suite, program, case, suite.timing.to_json(), out, source_text)
            outcome.latency = incomparable(threshold, f"no approved version of {program.name} in {ledger.path.name}; "
                                           f"run `cudagate approve {suite.path} {program.name}` on a GPU runner",
                                           self.fingerprint_text)
        elif source_text is None and build_identity(program) == approval.identity():
            timing = {**suite.timing.to_json(), "repeat": BASELINE_ROUNDS}
            body, compile_info = self._run(outcome, suite, program, case, timing, out, source_text)
            outcome.latency = self._identical(approval, case, body, threshold)
        else:
            body, compile_info, outcome.latency = self._compare(outcome, suite, program, case, ledger, approval,
                                                                threshold, out, source_text)
        if compile_info is not None and not compile_info.get("ok"):
            outcome.failed = True
            outcome.message = f"{program.source} does not compile:\n{compile_info.get('log', '')}"
            return outcome
        expected = load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs})
        shapes = {p.name: suite.shape(p, case) for p in suite.buffers}
        outcome.correctness = judge(program.name, case.name, body, expected, suite.tolerance, shapes)
        self._decide(outcome)
        return outcome

    # -- the three measurement paths ------------------------------------------------------------
    def _run(self, outcome, suite, program, case, timing, out, source_text):
        request = run_request(suite, program, [case], output_dir=out, timing=timing, source_text=source_text)
        outcome.requests.append(request)
        result = self.client.run(request)
        return result.cases.get(case.name, {"status": "error", "error": {"kind": "compile", "message": "not run"}}), result.compile

    def _identical(self, approval, case: Case, body: dict, threshold: float) -> LatencyResult:
        baseline = approval.baselines.get(self.fingerprint.key())
        if baseline is None or case.name not in baseline.cases:
            return incomparable(threshold, "the kernel is identical to the approved version, and no baseline was "
                                           f"recorded on this hardware ({self.fingerprint.key()}); a maintainer "
                                           "records one with `cudagate approve` on this runner", self.fingerprint_text)
        samples = (body.get("timing") or {}).get("samples_ms") or []
        if not samples:
            return incomparable(threshold, "no timing samples (the case did not run)", self.fingerprint_text)
        result = against_baseline(samples, baseline.cases[case.name]["samples_ms"], threshold)
        result.fingerprint = self.fingerprint_text
        result.advisory = True
        return result

    def _compare(self, outcome, suite, program, case, ledger: Ledger, approval, threshold, out, source_text):
        request = {
            "protocol": 1, "op": "compare", "suite": str(suite.path),
            "kernels": {"approved": ledger.approved_spec(approval), "current": kernel_spec(program, source_text)},
            "launches": {"approved": ledger.approved_launch(approval, case.name).resolve(case.scalars),
                         "current": program.launch_for(case.name).resolve(case.scalars)},
            "signature": [p.protocol() for p in suite.signature],
            "case": case_spec(suite, program, case),
            "timing": {**suite.timing.to_json(), "chunk": 100},
            "output_dir": str(out),
        }
        outcome.requests.append(request)
        sampler = AdaptiveSampler(threshold, self.options.budget_s)
        result = self.client.compare(request, sampler.decide)
        compile_info = result.compile.get("current") or {"ok": False, "log": "not compiled"}
        approved_compile = result.compile.get("approved")
        body = result.body or {"status": "error", "error": {"kind": "crash", "message": "no answer"}}
        if approved_compile is not None and not approved_compile.get("ok"):
            return body, compile_info, incomparable(threshold, "the approved version no longer compiles here:\n"
                                                    + approved_compile.get("log", ""), self.fingerprint_text)
        if body.get("status") != "ok":
            return body, compile_info, None
        approved_check = judge(f"{program.name}@approved", case.name, {"status": "ok", **body["approved"]},
                               load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs}),
                               suite.tolerance, {p.name: suite.shape(p, case) for p in suite.buffers})
        if not approved_check.passed:
            return body, compile_info, incomparable(threshold, "the approved version fails this case now, so its "
                                                    "latency means nothing: " + approved_check.describe(), self.fingerprint_text)
        latency = sampler.result(self.fingerprint_text)
        if self.options.release and latency.current is not None:
            baseline = approval.baselines.get(self.fingerprint.key())
            if baseline is None or case.name not in baseline.cases:
                latency.baseline = incomparable(threshold, f"no baseline for this hardware ({self.fingerprint.key()})")
            else:
                latency.baseline = against_baseline(latency.samples["current"], baseline.cases[case.name]["samples_ms"], threshold)
            latency.verdict = worst(latency.verdict, latency.baseline.verdict)
        return body, compile_info, latency

    # -- the decision -----------------------------------------------------------------------------
    def _decide(self, outcome: CaseOutcome) -> None:
        parts = []
        if not outcome.correctness.passed:
            outcome.failed = True
            parts.append(outcome.correctness.describe())
        latency = outcome.latency
        if latency is not None and outcome.correctness.passed:
            verdict = latency.verdict
            fails = (verdict is Latency.REGRESSED and (not latency.advisory or self.options.release)
                     or (verdict in (Latency.INCONCLUSIVE, Latency.UNSTABLE) and self.options.strict)
                     or (verdict is Latency.INCOMPARABLE and self.options.release))
            if fails:
                outcome.failed = True
                parts.append(latency.describe())
            elif verdict in (Latency.INCONCLUSIVE, Latency.UNSTABLE, Latency.INCOMPARABLE, Latency.REGRESSED):
                outcome.warning = latency.describe()
        outcome.message = "\n".join(parts)
