"""The gate for one kernel on one case: correctness, then latency against the approved version.

Shared by the pytest items, ``cudagate approve`` and the optimizer, so a proposal is judged by
exactly the rules a pull request is.
"""

from __future__ import annotations

import copy
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cudagate_harness.telemetry import device_state, disturbances

from pytest_cudagate.approvals import Ledger, build_identity
from pytest_cudagate.config import DEFAULT_BUDGET_S, DEFAULT_TIMEOUT_S
from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.worker.fingerprint import Fingerprint, differences
from pytest_cudagate.defences.fresh_inputs import make_sets
from pytest_cudagate.defences.checks import effective_checks, worker_checks
from pytest_cudagate.defences.sanitizer import sanitize, wants_sanitizer
from pytest_cudagate.judge.latency import (FIRST_ROUNDS, MAX_DISTURBED_CHUNKS, AdaptiveSampler, Latency, LatencyResult, against_baseline, incomparable,
                      worst)
from pytest_cudagate.worker.requests import compare_request, run_request
from pytest_cudagate.suite.model import Case, Program, Suite
from pytest_cudagate.judge.correctness import judge_case, load_expected
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate import phases

BASELINE_ROUNDS = 1000  # launches timed for a stored baseline, and for a kernel identical to it


@dataclass(frozen=True)
class GateOptions:
    strict: bool = False  # inconclusive and unstable fail
    release: bool = False  # also judge against the stored baseline; incomparable fails
    budget_s: float = DEFAULT_BUDGET_S  # measurement time per case
    threshold: float | None = None  # overrides the suite's
    fresh_seed: int | None = None  # seed of the fresh inputs; default $CUDAGATE_FRESH_SEED, else random per run


class Gate:
    """Judges cases on one worker, for one hardware fingerprint."""

    def __init__(self, client: HarnessClient, fingerprint, options: GateOptions, output_dir: Path):
        self.client = client
        self.fingerprint = fingerprint
        self.options = options
        self.output_dir = output_dir
        seed = options.fresh_seed if options.fresh_seed is not None else os.environ.get("CUDAGATE_FRESH_SEED")
        self.fresh_seed = int(seed) if seed not in (None, "") else secrets.randbits(32)
        self._fresh: dict[tuple, tuple[list[dict], list[str]]] = {}

    @property
    def fingerprint_text(self) -> str:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}"

    def replay(self, suite: Suite, program: Program, case: Case, ledger: Ledger, source_text: str | None = None) -> CaseOutcome:
        outcome = CaseOutcome(suite.name, program.name, case.name, case.kind)
        threshold = suite.threshold if self.options.threshold is None else self.options.threshold
        approval = ledger.approvals.get(program.name)
        out = self.output_dir / program.name
        checks, notes = effective_checks(suite)
        outcome.notes.extend(notes)
        with phases.clock(outcome, "fresh_inputs"):
            extra = {"checks": checks, "fresh": self._fresh_specs(suite, case, checks, outcome)}
        if case.kind != "performance":
            body, compile_info = self._run(outcome, suite, program, case, None, out, source_text, extra)
        elif approval is None:
            body, compile_info = self._run(outcome, suite, program, case, suite.timing.to_json(), out, source_text, extra)
            outcome.latency = incomparable(threshold, f"no approved version of {program.name} in {ledger.path.name}; "
                                           f"run `cudagate approve {suite.path} {program.name}` on a GPU runner",
                                           self.fingerprint_text)
        elif source_text is None and build_identity(program) == approval.identity():
            timing = {**suite.timing.to_json(), "repeat": BASELINE_ROUNDS}
            body, compile_info, discarded = self._quiet_run(outcome, suite, program, case, timing, out, extra)
            if len(discarded) > MAX_DISTURBED_CHUNKS:
                outcome.latency = LatencyResult(
                    Latency.UNSTABLE, threshold, reason="the GPU was disturbed in every attempt (throttling or other "
                    "processes); free the runner and re-run", discarded=discarded, fingerprint=self.fingerprint_text)
            else:
                with phases.clock(outcome, "statistics"):
                    outcome.latency = self._identical(approval, case, body, threshold)
                outcome.latency.discarded = discarded
        else:
            body, compile_info, outcome.latency = self._interleaved(outcome, suite, program, case, ledger, approval,
                                                                threshold, out, source_text, extra)
        if compile_info is not None and not compile_info.get("ok"):
            outcome.failed = True
            outcome.message = f"{program.source} does not compile:\n{compile_info.get('log', '')}"
            return outcome
        expected = load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs})
        shapes = {p.name: suite.shape(p, case) for p in suite.buffers}
        with phases.clock(outcome, "checks"):
            outcome.correctness = judge_case(program.name, case.name, body, expected, suite.tolerance, shapes, checks=checks)
        outcome.notes.extend(outcome.correctness.notes)
        with phases.clock(outcome, "sanitizer"):
            self._sanitize(outcome, suite, program, case, body, checks, source_text)
        self._decide(outcome)
        return outcome

    # -- hardening (docs/hardening.md) ------------------------------------------------------------
    def _fresh_specs(self, suite: Suite, case: Case, checks, outcome: CaseOutcome) -> list[dict]:
        """The fresh input sets of a case (drawn once per gate run, shared by the suite's kernels)."""
        if checks.fresh_inputs <= 0:
            return []
        key = (str(suite.path), case.name, checks.fresh_inputs, checks.adversarial_inputs)
        if key not in self._fresh:
            tag = hashlib.sha256(str(suite.path).encode()).hexdigest()[:8]
            root = self.output_dir / "fresh" / f"{suite.name}-{tag}" / case.name
            try:
                sets, notes = make_sets(suite, case, count=checks.fresh_inputs, adversarial=checks.adversarial_inputs,
                                        seed=self.fresh_seed, root=root, client=self.client)
            except (CudagateError, OSError, ValueError, KeyError) as exc:
                sets, notes = [], [f"fresh inputs could not be drawn for case {case.name}: {exc}"]
            self._fresh[key] = ([s.spec(suite, case) for s in sets], notes)
        specs, notes = self._fresh[key]
        outcome.notes.extend(notes)
        return copy.deepcopy(specs)

    @staticmethod
    def _harden(request: dict, case_entry: dict, extra: dict | None) -> dict:
        """Add the checks and fresh inputs to ``request``; return the copy a report keeps: without the
        fresh sets, whose files live only as long as this run (their seed is in any failure)."""
        if extra is None:
            return request
        request["checks"] = worker_checks(extra["checks"])
        if extra.get("fresh"):
            case_entry["fresh"] = extra["fresh"]
        recorded = copy.deepcopy(request)
        for entry in recorded.get("cases", []) + ([recorded["case"]] if "case" in recorded else []):
            entry.pop("fresh", None)
        return recorded

    def _sanitize(self, outcome: CaseOutcome, suite: Suite, program: Program, case: Case, body: dict, checks,
                  source_text: str | None) -> None:
        """compute-sanitizer on the kernel's smallest case (once per kernel; the verdicts are cached)."""
        if outcome.correctness is None or not wants_sanitizer(checks, suite, case, body):
            return
        request = run_request(suite, program, [case], output_dir=self.output_dir / "sanitizer", source_text=source_text)
        timeout = max(DEFAULT_TIMEOUT_S, 2 * float(getattr(self.client, "timeout_s", DEFAULT_TIMEOUT_S)))
        problems, notes = sanitize(request, checks.sanitizer, timeout_s=timeout, env=getattr(self.client, "env", None))
        outcome.notes.extend(notes)
        if problems:
            outcome.correctness.problems.extend(problems)
            outcome.correctness.passed = False

    # -- the three measurement paths ------------------------------------------------------------
    def _run(self, outcome, suite, program, case, timing, out, source_text, extra=None):
        request = run_request(suite, program, [case], output_dir=out, timing=timing, source_text=source_text)
        outcome.requests.append(self._harden(request, request["cases"][0], extra))
        with phases.RoundTrip(outcome, self.client) as trip:
            result = self.client.run(request)
        body = result.cases.get(case.name, {"status": "error", "error": {"kind": "compile", "message": "not run"}})
        trip.answered([result.compile], body)
        outcome.worker_s += body.get("seconds", 0.0)
        return body, result.compile

    def _quiet_run(self, outcome, suite, program, case, timing, out, extra):
        """The timed run of a kernel identical to its approval, repeated while NVML saw the GPU
        disturbed (harmful throttling or another process) around it; the discarded reasons too."""
        discarded: list[str] = []
        while True:
            before = self._device_state()
            body, compile_info = self._run(outcome, suite, program, case, timing, out, None, extra)
            after = self._device_state()
            # Each snapshot is judged alone: between items an idle GPU's clock is legitimately low,
            # so a clock change from `before` to `after` says nothing here.
            reasons = sorted(set(disturbances(before, before) + disturbances(after, after)))
            if not reasons or body.get("status") != "ok" or len(discarded) > MAX_DISTURBED_CHUNKS:
                return body, compile_info, discarded
            discarded.append(", ".join(reasons))

    def _device_state(self) -> dict:
        """NVML's view of the worker's GPU from this process (no CUDA context here); {} without NVML."""
        device = self.client.device
        try:
            state = device_state(device.get("ordinal", 0), device.get("pci_bus_id"))
        except Exception:  # telemetry is best effort: without it the run is judged as before
            return {}
        worker = (self.client.hello or {}).get("pid")
        if isinstance(state.get("other_processes"), list):
            state["other_processes"] = [p for p in state["other_processes"] if p.get("pid") != worker]
        return state

    def _identical(self, approval, case: Case, body: dict, threshold: float) -> LatencyResult:
        baseline = approval.baselines.get(self.fingerprint.key())
        if baseline is None or case.name not in baseline.cases:
            return incomparable(threshold, "the kernel is identical to the approved version, and no baseline was "
                                           f"recorded on this hardware ({self.fingerprint.key()}){self._nearest(approval)}; "
                                           "a maintainer records one with `cudagate approve` on this runner",
                                self.fingerprint_text)
        samples = (body.get("timing") or {}).get("samples_ms") or []
        if not samples:
            return incomparable(threshold, "no timing samples (the case did not run)", self.fingerprint_text)
        result = against_baseline(samples, baseline.cases[case.name]["samples_ms"], threshold)
        result.fingerprint = self.fingerprint_text
        result.advisory = True
        return result

    def _nearest(self, approval) -> str:
        """How this hardware differs from the closest one that has a baseline (empty if none has)."""
        recorded = []
        for baseline in approval.baselines.values():
            try:
                recorded.append(Fingerprint.from_dict(baseline.fingerprint))
            except TypeError:  # a fingerprint missing fields (hand-edited or from an old ledger)
                continue
        if not recorded:
            return ""
        closest = min(recorded, key=lambda other: len(differences(self.fingerprint, other)))
        changed = ", ".join(f"{name} ({theirs} there, {ours} here)"
                            for name, ours, theirs in differences(self.fingerprint, closest))
        return f"; the nearest recorded hardware differs in {changed}" if changed else ""

    def _interleaved(self, outcome, suite, program, case, ledger: Ledger, approval, threshold, out, source_text, extra=None):
        request = compare_request(suite, program, case, approved=ledger.approved_spec(approval),
                                  approved_launch=ledger.approved_launch(approval, case.name), output_dir=out,
                                  chunk=FIRST_ROUNDS, source_text=source_text)
        outcome.requests.append(self._harden(request, request["case"], extra))
        sampler = AdaptiveSampler(threshold, self.options.budget_s)
        with phases.RoundTrip(outcome, self.client) as trip:
            result = self.client.compare(request, phases.clocked(outcome, "statistics", sampler.decide))
        trip.answered(list(result.compile.values()), result.body or {})
        outcome.worker_s += (result.body or {}).get("seconds", 0.0)
        compile_info = result.compile.get("current") or {"ok": False, "log": "not compiled"}
        approved_compile = result.compile.get("approved")
        body = result.body or {"status": "error", "error": {"kind": "crash", "message": "no answer"}}
        if approved_compile is not None and not approved_compile.get("ok"):
            return body, compile_info, incomparable(threshold, "the approved version no longer compiles here:\n"
                                                    + approved_compile.get("log", ""), self.fingerprint_text)
        if body.get("status") != "ok":
            return body, compile_info, None
        with phases.clock(outcome, "checks"):
            approved_check = judge_case(f"{program.name}@approved", case.name, {"status": "ok", **body["approved"]},
                                   load_expected({p.name: suite.expected_path(case, p) for p in suite.outputs}),
                                   suite.tolerance, {p.name: suite.shape(p, case) for p in suite.buffers},
                                   checks=(extra or {}).get("checks"))
        if not approved_check.passed:
            return body, compile_info, incomparable(threshold, "the approved version fails this case now, so its "
                                                    "latency means nothing: " + approved_check.describe(), self.fingerprint_text)
        with phases.clock(outcome, "statistics"):
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
        if outcome.notes:  # relaxed or skipped checks are said with every outcome, never silently
            said = "\n".join(f"note: {note}" for note in dict.fromkeys(outcome.notes))
            if outcome.failed:
                parts.append(said)
            else:
                outcome.warning = f"{outcome.warning}\n{said}" if outcome.warning else said
        outcome.message = "\n".join(parts)
