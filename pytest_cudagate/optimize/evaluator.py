"""The harness side of the loop: compile, check and time a candidate; gate the winner.

Search (:meth:`HarnessEvaluator.evaluate`): the candidate is compiled on the host first (NVRTC
needs no GPU, so a compile error costs no GPU time), then every visible correctness case runs,
then every visible performance case is timed **interleaved with the initial kernel** (the worker's
``compare``: one launch of each per round, random order, cold L2, the suite's warm-up and
``timing.repeat`` rounds). Each case thus yields the candidate's median and its latency ratio to
the initial kernel measured side by side, so clock and placement drift between rounds cancels.

Library baseline (a kernel's ``library_baseline:``, e.g. cuBLAS SGEMM): the library does not change
between candidates, so it is timed **once per visible performance case per session**, beside the
initial kernel (a timed ``run`` with the library's interleaved rounds, its output checked against the
reference by :func:`judge_library`). A candidate's multiple of the library is then derived through the
initial kernel: (candidate / initial) × (initial / library), its interval the product of the two
intervals' bounds. It informs the model and the pack; it never decides a candidate.

Winner (:meth:`HarnessEvaluator.validate`): :meth:`Gate.replay` on **every** case of the suite,
holdout cases included, exactly as a pull request is judged: correctness with the gate's checks
(fresh inputs, compute-sanitizer where present), then interleaved, adaptive timing against the
approved kernel and a verdict from its confidence interval.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pytest_cudagate.judge import stats
from pytest_cudagate.worker.build import compile_builds
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.worker.client import Worker
from pytest_cudagate.worker.fingerprint import Fingerprint
from pytest_cudagate.worker.requests import compare_request, current_version, run_request
from pytest_cudagate.defences.expected import materialise
from pytest_cudagate.suite.model import Case, Program, Suite, judged
from pytest_cudagate.judge.correctness import CaseVerdict, judge_case
from pytest_cudagate.judge.library import LibraryResult, judge_library
from pytest_cudagate.defences import sanitizer
from pytest_cudagate.defences.checks import effective_checks
from pytest_cudagate.optimize.candidate import Candidate
from pytest_cudagate.optimize.nsight import profile
from pytest_cudagate.boundary.wire import to_json

RATIO_CONFIDENCE = 0.99
# Both 99% intervals hold together with probability >= 98% (Bonferroni); when they do, the product of
# their bounds holds the true candidate/library ratio (both ratios are positive).
DERIVED_CONFIDENCE = 1 - 2 * (1 - RATIO_CONFIDENCE)


def finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


@dataclass
class CaseResult:
    case: str
    kind: str
    passed: bool
    launch: dict | None = None  # resolved: {grid, block, shared_bytes}
    message: str = ""  # for people (history.json, the report)
    for_model: str = ""  # what a proposer may read: no expected values
    latency_ms: float | None = None  # median of the candidate's timed launches
    initial_ms: float | None = None  # median of the initial kernel's launches in the same interleaved run
    ratio: dict | None = None  # candidate / initial: {ratio, low, high, confidence, n}
    samples: int = 0
    disturbances: list[str] = field(default_factory=list)
    vs_library: dict | None = None  # candidate / the suite's library baseline, via the initial kernel (see vs_library)

    def to_json(self) -> dict:
        return {"case": self.case, "kind": self.kind, "passed": self.passed, "launch": self.launch,
                "message": self.message, "latency_ms": self.latency_ms, "initial_ms": self.initial_ms,
                "ratio_vs_initial": self.ratio, "samples": self.samples, "disturbances": self.disturbances,
                "vs_library": self.vs_library}


@dataclass
class Evaluation:
    stage: str  # where it ended: compile / correctness / performance / done
    passed: bool
    compile: dict = field(default_factory=dict)  # ok, log, seconds, resources, cache_hit
    cases: list[CaseResult] = field(default_factory=list)
    rejection: str | None = None  # for people
    rejection_for_model: str | None = None
    gpu_s: float = 0.0

    def case(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.case == name), None)


@dataclass
class Validation:
    """The winner's full gate: one entry per suite case (holdout cases included)."""

    passed: bool
    cases: list[dict] = field(default_factory=list)
    rejection: str | None = None
    notes: list[str] = field(default_factory=list)
    fresh_seed: int | None = None
    gpu_s: float = 0.0
    skipped: str | None = None  # why it did not run (interrupted, budget)
    checks: dict = field(default_factory=dict)  # which of the gate's defences applied (fresh inputs, sanitizer)

    def to_json(self) -> dict:
        return {"passed": self.passed, "rejection": self.rejection, "cases": self.cases, "notes": self.notes,
                "fresh_seed": self.fresh_seed, "gpu_seconds": round(self.gpu_s, 3), "skipped": self.skipped,
                "checks": self.checks}


def compile_summary(result) -> dict:
    data = result.to_json() if hasattr(result, "to_json") else dict(result)
    return {"ok": bool(data.get("ok")), "log": (data.get("log") or "")[-20000:], "seconds": data.get("seconds"),
            "resources": data.get("resources") or {}, "cache_hit": data.get("cache_hit"), "arch": data.get("arch")}


def for_model(verdict: CaseVerdict) -> str:
    """A failed case as a proposer may read it: what went wrong and where, never an expected value."""
    lines = [f"case {verdict.case}: FAILED"]
    lines += [p for p in verdict.problems]
    for c in verdict.comparisons:
        if c.ok:
            continue
        where = "" if c.worst_index is None else f", worst at index {list(c.worst_index)}"
        lines.append(f"output {c.buffer!r}: {c.mismatches} of {c.total} elements outside tolerance"
                     f"{f', {c.unwritten} never written' if c.unwritten else ''}{where}; max |error| "
                     f"{c.max_abs_error:.3g}, relative norm error {c.rel_norm:.3g}")
    return "\n".join(lines)


def ratio_json(estimate) -> dict:
    return {"ratio": finite(estimate.ratio), "low": finite(estimate.low), "high": finite(estimate.high),
            "confidence": estimate.confidence, "n": estimate.n}


def vs_library(ratio: dict | None, library: LibraryResult) -> dict:
    """A candidate's latency as a multiple of the library's on one case: its ratio to the initial kernel
    (``ratio``, paired) times the initial kernel's to the library (``library``, paired, timed once);
    or, with no ratio, why (the library's error, or no ratio to the initial kernel)."""
    est = library.estimate
    error = library.error or ("" if ratio and ratio.get("ratio") and ratio.get("low") and ratio.get("high")
                              else "no ratio to the initial kernel in this run")
    derived = {"ratio": None, "low": None, "high": None}
    if not error:
        derived = {"ratio": finite(ratio["ratio"] * est.ratio), "low": finite(ratio["low"] * est.low),
                   "high": finite(ratio["high"] * est.high)}
    return {"adapter": library.adapter, "label": library.label, "via": "the initial kernel", **derived,
            "confidence": DERIVED_CONFIDENCE,
            "initial_vs_library": ratio_json(est) if est else None,
            "library_ms": finite(library.library.median) if library.library else None,
            "error": error or None}


class HarnessEvaluator:
    """Candidates on one GPU worker (``client``), judged against ``suite``'s visible cases."""

    def __init__(self, suite: Suite, program: Program, ledger, client: Worker, fingerprint: Fingerprint, *,
                 gate_options: GateOptions, work_dir: Path | None = None):
        self.suite = suite
        self.program = program
        self.ledger = ledger
        self.client = client
        self.fingerprint = fingerprint
        self.gate_options = gate_options
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="cudagate-optimize-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.initial = Candidate.initial(program)
        # The cases the kernel is held to: those its `requires` meet (the others are absent for it, as in the gate).
        self.cases = [c for c in suite.cases if program.runs(c)]
        self.visible = [c for c in self.cases if not c.holdout]
        for case in self.cases:  # a generated case's arrays are drawn, verified and written once, for every candidate
            if case.generated:
                materialise(suite, case, client=client, root=self.work_dir / "generated")
        self.arch = client.device.get("arch", "sm_90")
        self._seed = 0
        self._library: dict[str, LibraryResult] = {}  # per performance case: the initial kernel / the library

    # -- what the loop asks -----------------------------------------------------------------------
    def device(self) -> dict:
        fp = self.fingerprint
        return {"key": fp.key(), "description": fp.describe(), "fields": fp.to_dict()}

    def validation_reserve_s(self) -> float:
        """GPU seconds the final gate of one winner may take: each case's measurement budget plus
        its validation, fresh inputs and (once) compute-sanitizer."""
        return len(self.cases) * (self.gate_options.budget_s + 1.0) + 15.0

    def compile(self, candidate: Candidate) -> dict:
        """Every build the visible cases run (one per class variant), on the host: the first that
        fails, naming its variant, else the shared build's (or the first variant's) summary."""
        summaries = []
        for build, result in compile_builds(candidate.program(self.program), self.visible, self.arch, candidate.text):
            summary = compile_summary(result)
            if not summary["ok"]:
                summary["log"] = (f"{build.build_name}:\n" if build.variant else "") + summary["log"]
                return summary
            summaries.append(summary)
        return summaries[0]

    def evaluate(self, candidate: Candidate) -> Evaluation:
        start = time.monotonic()
        program = candidate.program(self.program)
        out = Path(tempfile.mkdtemp(prefix="eval-", dir=self.work_dir))
        try:
            evaluation = self._evaluate(candidate, program, out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        evaluation.gpu_s = time.monotonic() - start
        return evaluation

    def _evaluate(self, candidate: Candidate, program: Program, out: Path) -> Evaluation:
        evaluation = Evaluation(stage="correctness", passed=False)
        checks = [c for c in self.visible if c.kind != "performance"]
        for build in program.builds(checks) if checks else []:  # one request per class variant in use
            cases = [c for c in checks if program.for_case(c) == build]
            request = run_request(self.suite, program, cases, output_dir=out, timing=None, source_text=candidate.text)
            result = self.client.run(request)
            evaluation.compile = evaluation.compile or compile_summary(result.compile)
            if not result.compile.get("ok"):
                evaluation.stage = "compile"
                what = f" ({build.build_name})" if build.variant else ""
                evaluation.rejection = evaluation.rejection_for_model = (f"compile error{what}:\n"
                                                                         + compile_summary(result.compile)["log"])
                return evaluation
            for case in cases:
                body = result.cases.get(case.name, {"status": "error", "error": {"kind": "crash", "message": "not run"}})
                if self._judged(evaluation, program, case, body) is None:
                    return evaluation
        evaluation.stage = "performance"
        for case in [c for c in self.visible if c.kind == "performance"]:
            if not self._timed(evaluation, candidate, program, case, out):
                return evaluation
        evaluation.stage, evaluation.passed = "done", True
        return evaluation

    def _judged(self, evaluation: Evaluation, program: Program, case: Case, body: dict) -> CaseResult | None:
        resolved = self.suite.resolved(case)  # judged on the outputs its `outputs:` names, as the gate judges it
        verdict = judge_case(program.name, case.name, body, *judged(self.suite, program.name, resolved), resolved.shapes)
        result = CaseResult(case.name, case.kind, verdict.passed, resolved.launch(program))
        evaluation.cases.append(result)
        if not verdict.passed:
            result.message = verdict.describe()
            result.for_model = for_model(verdict)
            evaluation.rejection = result.message
            evaluation.rejection_for_model = result.for_model
            return None
        return result

    def _timed(self, evaluation: Evaluation, candidate: Candidate, program: Program, case: Case, out: Path) -> bool:
        suite, initial = self.suite, self.initial.program(self.program).for_case(case)
        self._seed += 1
        request = compare_request(suite, case, current=current_version(program, candidate.text),
                                  baseline=current_version(initial, self.initial.text), output_dir=out,
                                  chunk=suite.timing.repeat, seed=self._seed)
        chunks = []

        def decide(chunk: dict) -> int:  # one chunk of timing.repeat rounds: the seed tool's 100 launches
            chunks.append(chunk)
            return 0

        result = self.client.compare(request, decide)
        current = result.compile.get("current") or {"ok": False, "log": "not compiled"}
        if not evaluation.compile:
            evaluation.compile = compile_summary(current)
        if not current.get("ok"):
            build = program.for_case(case)
            evaluation.stage = "compile"
            evaluation.rejection = evaluation.rejection_for_model = (
                f"compile error{f' ({build.build_name})' if build.variant else ''}:\n" + current.get("log", ""))
            return False
        body = result.body or {"status": "error", "error": {"kind": "crash", "message": "no answer"}}
        verdict_result = self._judged(evaluation, program, case, body)
        if verdict_result is None:
            return False
        samples = {"current": [], "approved": []}
        for chunk in chunks:
            samples["current"] += chunk.get("current", [])
            samples["approved"] += chunk.get("approved", [])
            verdict_result.disturbances += chunk.get("disturbances") or []
        if samples["current"] and len(samples["current"]) == len(samples["approved"]):
            estimate = stats.paired_ratio(samples["current"], samples["approved"], confidence=RATIO_CONFIDENCE)
            verdict_result.ratio = ratio_json(estimate)
            verdict_result.latency_ms = float(np.median(samples["current"]))
            verdict_result.initial_ms = float(np.median(samples["approved"]))
            verdict_result.samples = len(samples["current"])
        library = self._library_baseline(case, out)
        if library is not None:
            verdict_result.vs_library = vs_library(verdict_result.ratio, library)
        return True

    def _library_baseline(self, case: Case, out: Path) -> LibraryResult | None:
        """The initial kernel / the kernel's library baseline on ``case``, measured the first time the
        case is timed in this session (the library and the initial kernel never change); None when the
        kernel names no baseline. Its GPU time counts in the evaluation that measured it."""
        initial = self.initial.program(self.program)
        if initial.library_baseline is None:
            return None
        if case.name not in self._library:
            request = run_request(self.suite, initial, [case], output_dir=out, timing=self.suite.timing.to_json(),
                                  source_text=self.initial.text, library=True)
            result = self.client.run(request)
            body = result.cases.get(case.name) or {}
            entry = body.get("library")
            if not entry:  # the initial kernel's own run failed: say why instead of a ratio
                why = ((body.get("error") or {}).get("message") or (result.compile or {}).get("log") or "no answer")
                entry = {"adapter": initial.library_baseline.adapter,
                         "error": f"the initial kernel's timed run beside it failed: {why.strip()[:300]}"}
            resolved = self.suite.resolved(case)
            self._library[case.name] = judge_library(entry, case.name, *judged(self.suite, initial.name, resolved),
                                                     resolved.shapes, confidence=RATIO_CONFIDENCE)
        return self._library[case.name]

    def validate(self, candidate: Candidate) -> Validation:
        start = time.monotonic()
        program = candidate.program(self.program)
        out = Path(tempfile.mkdtemp(prefix="gate-", dir=self.work_dir))
        gate = Gate(self.client, self.fingerprint, self.gate_options, out)
        validation = Validation(passed=True, fresh_seed=getattr(gate, "fresh_seed", None))
        try:
            for case in self.cases:
                outcome = gate.replay(self.suite, program, case, self.ledger, source_text=candidate.text)
                validation.cases.append({**to_json(outcome), "holdout": case.holdout})
                notes = getattr(outcome, "notes", []) or []
                validation.notes += [f"{case.name}: {n}" for n in notes if f"{case.name}: {n}" not in validation.notes]
                if outcome.failed and validation.passed:
                    validation.passed = False
                    validation.rejection = f"case {case.name}{' (holdout)' if case.holdout else ''}: {outcome.message}"
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if not hasattr(gate, "fresh_seed"):
            validation.notes.append("this version of the gate draws no fresh inputs: only the signed cases were checked")
        validation.checks = self.gate_checks(validation)
        validation.gpu_s = time.monotonic() - start
        return validation

    def gate_checks(self, validation: Validation) -> dict:
        """What the gate applied beyond the signed cases, for the audit pack (a finding fails its case;
        a check that could not run leaves a note)."""
        checks, _ = effective_checks(self.suite)
        binary = sanitizer.find()
        return {
            "fresh_inputs": {"sets_per_case": checks.fresh_inputs, "adversarial": checks.adversarial_inputs,
                             "seed": validation.fresh_seed, "cases": "every case, holdout included"},
            "sanitizer": {"tools": list(checks.sanitizer),
                          "case": sanitizer.sanitizer_case(self.suite, self.program.name).name,
                          "binary": binary, "ran": bool(binary and checks.sanitizer)},
        }

    def profile(self, candidate: Candidate) -> dict:
        perf = [c for c in self.visible if c.kind == "performance"]
        case = max(perf, key=lambda c: sum(self.suite.counts(c).values()))
        program = candidate.program(self.program)
        request = run_request(self.suite, program, [case], output_dir=self.work_dir / "ncu", source_text=candidate.text)
        start = time.monotonic()
        summary = profile(request, program.entry, env=self.client.env)
        summary["case"] = case.name
        summary["seconds"] = round(time.monotonic() - start, 3)
        return summary

    def close(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)

