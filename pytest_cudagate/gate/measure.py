"""How a case is measured: one :class:`Measure` per route (docs/judging.md). A run once (a
correctness case, or a kernel with no approved version), a quiet run judged against the stored runs
(a kernel identical to its approval), interleaved with the approved version (a changed kernel);
release mode wraps one (:class:`AgainstRelease`). :func:`for_route` picks the one of a route."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from cudagate_harness.telemetry import device_state, disturbances

from pytest_cudagate import phases
from pytest_cudagate.trust.approvals import Approval, Ledger
from pytest_cudagate.config import DEFAULT_ARCH
from pytest_cudagate.defences.fresh_inputs import kept_inputs
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate.job import CaseJob, Route, baseline_timing
from pytest_cudagate.gate.link import Link
from pytest_cudagate.gate.prepare import Hangs
from pytest_cudagate.host.paths import command
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.judge.latency import (MAX_DISTURBED_CHUNKS, AdaptiveSampler, Latency, LatencyResult,
                                           against_runs, incomparable)
from pytest_cudagate.suite.model import judged
from pytest_cudagate.worker.build import build_record
from pytest_cudagate.worker.client import RunResult
from pytest_cudagate.worker.fingerprint import Fingerprint, differences, shown
from pytest_cudagate.worker.requests import KernelVersion, compare_request, version_request

if TYPE_CHECKING:
    from pytest_cudagate.trust.release import ReleaseSource


@dataclass
class Measured:
    body: dict  # the worker's answer for the case
    compile: dict | None  # the current version's build ({"ok", "log", ...})
    latency: LatencyResult | None = None  # None: not timed, or the run failed

    @property
    def ran(self) -> bool:
        return self.compile is not None and bool(self.compile.get("ok")) and self.body.get("status") == "ok"


@dataclass
class Answer:
    """A run answered ahead of its case's turn (gate.lookahead): its case's first run takes it."""

    trip: phases.RoundTrip
    result: RunResult
    before: dict  # NVML's view as it was sent (a kernel identical to its approval)
    after: dict  # and as it was answered


class Measure(Protocol):
    def measure(self, job: CaseJob) -> Measured: ...


class Bench:
    """What every measurement uses: the worker link, the hardware it runs on, and the kernels that hung."""

    def __init__(self, link: Link, fingerprint: Fingerprint, hangs: Hangs, output_dir: Path):
        self.link = link
        self.fingerprint = fingerprint
        self.hangs = hangs
        self.output_dir = output_dir

    @property
    def fingerprint_text(self) -> str:
        return f"{self.fingerprint.key()}: {self.fingerprint.describe()}"

    def arch(self) -> str:
        return (self.link.client.device or {}).get("arch") or DEFAULT_ARCH

    def device_state(self) -> dict:
        """NVML's view of the worker's GPU from this process (no CUDA context here); {} without NVML."""
        client = self.link.client
        device = client.device
        try:
            state = device_state(device.get("ordinal", 0), device.get("pci_bus_id"))
        except Exception:  # telemetry is best effort: without it the run is judged as before
            return {}
        worker = (client.hello or {}).get("pid")
        if isinstance(state.get("other_processes"), list):
            state["other_processes"] = [p for p in state["other_processes"] if p.get("pid") != worker]
        return state

    def run(self, job: CaseJob, timing: dict | None, *, library: bool = False,
            answer: Answer | None = None) -> tuple[dict, dict]:
        """One run request of ``job``'s case (``answer``: the one sent ahead, already answered)."""
        outcome = job.outcome
        if answer is not None:
            trip, result = answer.trip, answer.result
        else:
            request = version_request(job.suite, job.version, [job.case], output_dir=job.out, timing=timing,
                                      library=library)
            outcome.requests.append(job.harden(request, request["cases"][0]))
            client = self.link.free()
            with phases.RoundTrip(outcome, client) as trip:
                result = client.run(request)
        name = job.case.name
        body = result.cases.get(name, {"status": "error", "error": {"kind": "compile", "message": "not run"}})
        if body.get("error", {}).get("kind") == "timeout":  # a run's kernel is this one alone (a compare's is not)
            self.hangs.record(Hangs.key(job.suite, job.version), name)
        trip.answered([result.compile], body)
        outcome.worker_s += body.get("seconds", 0.0)
        return body, result.compile


def disturbed(threshold: float, discarded: list[str], fingerprint: str) -> LatencyResult | None:
    """``unstable`` when a run alone was disturbed in every attempt (None when one attempt was clean)."""
    if len(discarded) <= MAX_DISTURBED_CHUNKS:
        return None
    return LatencyResult(Latency.UNSTABLE, threshold, reason="the GPU was disturbed in every attempt (throttling or "
                         "other processes); free the runner and re-run", discarded=discarded, fingerprint=fingerprint)


class RunOnce:
    """One run: a correctness case (untimed: ``timing`` None), or a kernel with no approved version,
    timed alone with nothing to compare with (``alone``: why, an advisory ``incomparable``)."""

    def __init__(self, bench: Bench, timing: dict | None = None, *, alone: str | None = None,
                 answer: Answer | None = None):
        self.bench, self.timing, self.alone, self.answer = bench, timing, alone, answer

    def measure(self, job: CaseJob) -> Measured:
        body, compile_info = self.bench.run(job, self.timing, library=self.alone is not None, answer=self.answer)
        latency = (incomparable(job.threshold, self.alone, self.bench.fingerprint_text)
                   if self.alone is not None else None)
        return Measured(body, compile_info, latency)


class QuietRun:
    """A kernel timed alone for :attr:`Timing.baseline_rounds` launches, run again while NVML saw the
    GPU disturbed (harmful throttling or another process) around it. With ``approval``: a kernel
    identical to it, judged against its stored runs on this hardware; without: what
    ``cudagate approve`` records (its samples are the outcome's)."""

    def __init__(self, bench: Bench, approval: Approval | None = None, *, answer: Answer | None = None):
        self.bench, self.approval, self.answer = bench, approval, answer

    def measure(self, job: CaseJob) -> Measured:
        bench, discarded, answer = self.bench, [], self.answer
        library = self.approval is not None
        while True:
            before = answer.before if answer is not None else bench.device_state()
            body, compile_info = bench.run(job, baseline_timing(job.suite), library=library, answer=answer)
            # The worker's snapshot right after the kernel's timed launches, where it has NVML: the
            # library baseline's rounds come after them and are no part of this decision.
            after = (body.get("timing") or {}).get("state") or (answer.after if answer is not None
                                                                else bench.device_state())
            answer = None  # its first attempt only: a disturbed run is run again in turn
            # Each snapshot is judged alone: between items an idle GPU's clock is legitimately low,
            # so a clock change from `before` to `after` says nothing here.
            reasons = sorted(set(disturbances(before, before) + disturbances(after, after)))
            if not reasons or body.get("status") != "ok" or len(discarded) > MAX_DISTURBED_CHUNKS:
                break
            discarded.append(", ".join(reasons))
        if self.approval is None:
            return Measured(body, compile_info, disturbed(job.threshold, discarded, bench.fingerprint_text))
        with phases.clock(job.outcome, "statistics"):
            latency = (disturbed(job.threshold, discarded, bench.fingerprint_text)
                       or self._against_stored(job, body))
        latency.discarded = discarded
        return Measured(body, compile_info, latency)

    def _against_stored(self, job: CaseJob, body: dict) -> LatencyResult:
        bench, approval, threshold = self.bench, self.approval, job.threshold
        baseline = approval.baselines.get(bench.fingerprint.key())
        if baseline is None or job.case.name not in baseline.cases:
            result = incomparable(threshold, "the kernel is identical to the approved version, and no baseline was "
                                             f"recorded on this hardware ({bench.fingerprint.key()}){self._nearest()}; "
                                             "a maintainer records one with `cudagate approve` on this runner",
                                  bench.fingerprint_text)
            result.advisory = True
            return result
        samples = (body.get("timing") or {}).get("samples_ms") or []
        if not samples:
            return incomparable(threshold, "no timing samples (the case did not run)", bench.fingerprint_text)
        return against_runs(baseline.cases[job.case.name], samples, threshold, suite=job.suite.path,
                            kernel=approval.kernel, fingerprint=bench.fingerprint_text)

    def _nearest(self) -> str:
        """How this hardware differs from the closest one that has a baseline (empty if none has)."""
        recorded = []
        for baseline in self.approval.baselines.values():
            try:
                recorded.append(Fingerprint.from_dict(baseline.fingerprint))
            except TypeError:  # a fingerprint missing fields (hand-edited or from an old ledger)
                continue
        if not recorded:
            return ""
        ours = self.bench.fingerprint
        closest = min(recorded, key=lambda other: len(differences(ours, other)))
        changed = ", ".join(f"{name} ({shown(name, theirs)} there, {shown(name, mine)} here)"
                            for name, mine, theirs in differences(ours, closest))
        return f"; the nearest recorded hardware differs in {changed}" if changed else ""


class Interleaved:
    """The current version timed interleaved against ``baseline`` (``which`` names it in messages),
    chunk by chunk until the ratio's interval is precise enough or ``budget_s`` is spent;
    ``library``: the suite's library baseline too, after the rounds that decide (the PR comparison only)."""

    def __init__(self, bench: Bench, baseline: KernelVersion, budget_s: float, *,
                 which: str = "the approved version", library: bool = False):
        self.bench, self.baseline, self.budget_s, self.which, self.library = bench, baseline, budget_s, which, library

    def measure(self, job: CaseJob) -> Measured:
        bench, outcome, suite, case, threshold = self.bench, job.outcome, job.suite, job.case, job.threshold
        request = compare_request(suite, case, current=job.version, baseline=self.baseline, output_dir=job.out,
                                  chunk=suite.timing.repeat, library=self.library)
        outcome.requests.append(job.harden(request, request["case"]))
        kept = kept_inputs(suite) if request["timing"].get("fresh_share") else []
        if kept:
            outcome.notes.append(f"fresh timing keeps the signed values of {', '.join(kept)} (integer data "
                                 "without an `inputs:` distribution): a kernel keyed on them is not told apart; "
                                 "give them a distribution to time on values drawn in the run")
        sampler = AdaptiveSampler(threshold, self.budget_s, rounds=suite.timing.repeat)
        client = bench.link.free()
        with phases.RoundTrip(outcome, client) as trip:
            result = client.compare(request, phases.clocked(outcome, "statistics", sampler.decide))
        trip.answered(list(result.compile.values()), result.body or {})
        outcome.worker_s += (result.body or {}).get("seconds", 0.0)
        compile_info = result.compile.get("current") or {"ok": False, "log": "not compiled"}
        approved_compile = result.compile.get("approved")
        body = result.body or {"status": "error", "error": {"kind": "crash", "message": "no answer"}}
        if approved_compile is not None and not approved_compile.get("ok"):
            return Measured(body, compile_info, incomparable(threshold, f"{self.which} no longer compiles here:\n"
                                                             + approved_compile.get("log", ""), bench.fingerprint_text))
        if body.get("status") != "ok":
            return Measured(body, compile_info)
        resolved = suite.resolved(case)
        with phases.clock(outcome, "checks"):
            approved_check = judge_case(f"{job.version.name} ({self.which})", case.name,
                                        {"status": "ok", **body["approved"]}, *judged(suite, job.version.name, resolved),
                                        resolved.shapes, checks=job.checks)
        if not approved_check.passed:
            return Measured(body, compile_info, incomparable(threshold, f"{self.which} fails this case now, so its "
                                                             "latency means nothing: " + approved_check.describe(),
                                                             bench.fingerprint_text))
        with phases.clock(outcome, "statistics"):
            return Measured(body, compile_info, sampler.result(bench.fingerprint_text))


def for_route(chosen: Route, bench: Bench, job: CaseJob, ledger: Ledger, approval: Approval | None, *,
              approved: Callable[[], KernelVersion], budget_s: float, answer: Answer | None) -> Measure:
    """The strategy that measures ``job`` on route ``chosen``; ``approved``: the approved version, read
    only where it is timed against (:attr:`Route.INTERLEAVED`)."""
    name = job.version.name
    if chosen is Route.CORRECTNESS:
        return RunOnce(bench, answer=answer)
    if chosen is Route.UNAPPROVED:
        return RunOnce(bench, chosen.timing(job.suite), answer=answer,
                       alone=f"no approved version of {name} in {ledger.path.name}; "
                             f"run `{command('cudagate', 'approve', job.suite.path, name)}` on a GPU runner")
    if chosen is Route.IDENTICAL:
        return QuietRun(bench, approval, answer=answer)
    return Interleaved(bench, approved(), budget_s, library=True)


class AgainstRelease:
    """Release mode (docs/release-gate.md): the route's own measurement, then the current version
    against the one approved at the release ref, timed as the PR gate times current against
    approved. When nothing differs from the release (the kernel is byte-identical to it, or the
    approved version is the released one and was just timed), nothing more is timed."""

    def __init__(self, inner: Measure, bench: Bench, release: ReleaseSource, approval: Approval | None,
                 budget_s: float, *, proposal: bool):
        self.inner, self.bench, self.release, self.approval = inner, bench, release, approval
        self.budget_s, self.proposal = budget_s, proposal

    def measure(self, job: CaseJob) -> Measured:
        measured = self.inner.measure(job)
        if measured.latency is not None and measured.ran:
            measured.latency.release = self._against_release(job, measured.latency)
        return measured

    def _against_release(self, job: CaseJob, latency: LatencyResult) -> LatencyResult:
        from pytest_cudagate.trust.release import AbsentAtRef, BuildRecord, NoReleaseYet, build_drift  # release mode only

        bench, threshold, current = self.bench, job.threshold, job.version
        try:
            released = self.release.lookup(job.suite, current.name)
        except CudagateError as exc:
            # The kernel's `release` item says it too, and fails unless this is a first release; a case
            # warns of a release it could not use (an item deselected by -k must not hide that).
            result = incomparable(threshold, str(exc), bench.fingerprint_text)
            result.advisory = True
            result.said_by_kernel = isinstance(exc, NoReleaseYet)
            return result
        if isinstance(released, AbsentAtRef):
            result = incomparable(threshold, released.describe() + "; judged by the PR gate only", bench.fingerprint_text)
            result.advisory = result.said_by_kernel = True
            return result
        built = build_record(current, bench.arch())
        drift = (build_drift(released.build, BuildRecord.from_json(built)).describe(released.label)
                 if built is not None else "")
        label = released.label
        if not self.proposal and released.identity() == current.identity:
            return LatencyResult(Latency.PASS, threshold, reason=f"identical to the version approved at {label} "
                                 "(source, headers, entry, options and launch): nothing to time side by side",
                                 note=drift, fingerprint=bench.fingerprint_text)
        if (self.approval is not None and released.identity() == self.approval.identity()
                and latency.estimate is not None and latency.run_spread is None):
            # The approved version is the released one: the comparison just made is the release's.
            return dataclasses.replace(latency, reason=label, samples={}, telemetry=[], release=None, note="; ".join(
                filter(None, [f"the approved version is the one approved at {label}: one comparison serves both", drift])))
        result = Interleaved(bench, released.version, self.budget_s,
                             which=f"the version approved at {label}").measure(job).latency
        if result is None:
            return incomparable(threshold, f"the comparison with {label} did not complete", bench.fingerprint_text)
        if result.estimate is not None:
            result.reason = label
        elif result.verdict is Latency.INCOMPARABLE:
            result.advisory = True  # the release's version cannot run this case now: nothing to fix but the ref
        result.note = drift
        return result
