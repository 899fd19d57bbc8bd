"""Latency verdicts: adaptive interleaved sampling against the approved kernel (or a release's), and
stored approval runs for a kernel identical to its approval.

Why interleaved: the current and the approved kernel are timed in the same run, one launch each per
round in random order, so clock, thermal and co-tenant drift hit both alike and cancel in the
per-round ratio. Why an interval: a verdict is claimed only when the whole confidence interval of
the latency ratio lies beyond (or within) the threshold; sampling continues until the interval is
narrow enough (half-width under a quarter of the threshold) or the time budget is spent.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from enum import Enum

from cudagate_harness.telemetry import OTHER_PROCESS

from pytest_cudagate.judge import stats
from pytest_cudagate.config import DEFAULT_BUDGET_S
from pytest_cudagate.host.paths import command
from pytest_cudagate.boundary.wire import derived, json_field

FIRST_ROUNDS = 100  # rounds of the first chunk: the suite's timing.repeat, by default the seed tool's 100
MAX_DISTURBED_CHUNKS = 3
# Rounds each input set needs before the fresh/signed comparison is made (and the sampler may stop).
MIN_SET_ROUNDS = 10
# A probe that finds one kernel's SM clock this much lower than the other's blames it for a clock drop.
CLOCK_DROP = 0.05
# Who a disturbance came from (LatencyResult.disturbed_by): shown to come from outside the comparison;
# brought on by the current kernel alone, the approved one alone, or both; or not shown either way.
OUTSIDE, CURRENT, APPROVED, BOTH, UNKNOWN = "outside", "current", "approved", "both", "unknown"
# A stored baseline whose interval reaches past +25% cannot see most regressions worth gating (two
# runs give a t quantile of 63.7): its line says so and how to narrow it.
WEAK_ABOVE = 1.25


class Latency(str, Enum):
    """The one latency verdict. The first four come from an interval (:func:`classify`); the gate
    adds INCOMPARABLE (nothing like-for-like to measure against) and UNSTABLE (the GPU was disturbed)."""

    PASS = "pass"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    INCONCLUSIVE = "inconclusive"
    INCOMPARABLE = "incomparable"
    UNSTABLE = "unstable"


def _change(ratio: float) -> str:
    """``3.1% slower`` or ``2.0% faster``, for a latency ratio."""
    change = (ratio - 1) * 100
    return f"{abs(change):.1f}% {'slower' if change >= 0 else 'faster'}"


def classify(estimate: stats.RatioEstimate, threshold: float) -> Latency:
    """Verdict at a relative ``threshold`` (0.02 = 2%), claimed only when the interval supports it.

    REGRESSED: the whole interval is above 1+threshold.  IMPROVED: the whole
    interval is below 1-threshold.  PASS: the interval is within
    [1-threshold, 1+threshold] (closed) or straddles only its lower bound; a
    possible improvement is not a failure.  INCONCLUSIVE: the interval
    straddles 1+threshold, so a regression can be neither claimed nor ruled out.
    """
    threshold = stats.check_threshold(threshold)
    upper, lower = 1.0 + threshold, 1.0 - threshold
    if estimate.low > upper:
        return Latency.REGRESSED
    if estimate.high < lower:
        return Latency.IMPROVED
    if estimate.high <= upper:
        return Latency.PASS
    return Latency.INCONCLUSIVE


@dataclass
class InputsCheck:
    """The comparison split by the inputs it ran on: ``signed`` and ``fresh`` (a set drawn this run)
    ratios, and ``shift``, the fresh rounds' ratios against the signed rounds'. ``keyed``: the
    current kernel is slower, against the approved one, on inputs it cannot know in advance than on
    the signed ones, beyond the threshold: it recognises them."""

    signed: stats.RatioEstimate
    fresh: stats.RatioEstimate
    shift: stats.RatioEstimate
    keyed: bool


def inputs_check(current: list[float], approved: list[float], fresh: list[bool], threshold: float,
                 confidence: float) -> InputsCheck | None:
    """The fresh/signed split of interleaved rounds (None: too few rounds on either side)."""
    signed_rounds = [i for i, f in enumerate(fresh) if not f]
    fresh_rounds = [i for i, f in enumerate(fresh) if f]
    if min(len(signed_rounds), len(fresh_rounds)) < MIN_SET_ROUNDS:
        return None

    def paired(rounds: list[int]) -> stats.RatioEstimate:
        return stats.paired_ratio([current[i] for i in rounds], [approved[i] for i in rounds], confidence=confidence)

    ratio = [c / a for c, a in zip(current, approved)]
    shift = stats.unpaired_ratio([ratio[i] for i in fresh_rounds], [ratio[i] for i in signed_rounds],
                                 confidence=confidence)
    return InputsCheck(paired(signed_rounds), paired(fresh_rounds), shift,
                       keyed=classify(shift, threshold) is Latency.REGRESSED)


def blame(prior: list[str], disturbances: list[list[str]], probes: list[dict]) -> str:
    """Who disturbed an interleaved comparison: :data:`OUTSIDE` where NVML saw another process, before
    either kernel ran (``prior``) or during a chunk; else what the probes of each kernel alone
    (harness worker._probe) found: clock events or a clock drop with one kernel and not the other."""
    # Only another process is shown to come from outside: a clock event or heat found before either
    # kernel ran may be what the pull request's own kernel left behind in its case before.
    if any(reason.startswith(OTHER_PROCESS) for reasons in [prior, *disturbances] for reason in reasons):
        return OUTSIDE
    found = set()
    for probe in probes:
        current, approved = probe.get("current") or {}, probe.get("approved") or {}
        mine, theirs = set(current.get("events") or ()), set(approved.get("events") or ())
        if mine - theirs:
            found.add(CURRENT)
        elif theirs - mine:
            found.add(APPROVED)
        elif mine:
            found.add(BOTH)
        else:
            clock, other = current.get("sm_clock_mhz"), approved.get("sm_clock_mhz")
            if clock and other and clock < other * (1 - CLOCK_DROP):
                found.add(CURRENT)
            elif clock and other and other < clock * (1 - CLOCK_DROP):
                found.add(APPROVED)
    return next((who for who in (CURRENT, BOTH, APPROVED) if who in found), UNKNOWN)


BLAMED = {
    OUTSIDE: "it came from outside the comparison (another process on the GPU)",
    CURRENT: "a probe of each kernel alone found it with the current kernel only: the current kernel brings it on",
    APPROVED: "a probe of each kernel alone found it with the approved version only",
    BOTH: "a probe of each kernel alone found it with both kernels",
    UNKNOWN: "it was not shown to come from outside the comparison",
}


@dataclass
class LatencyResult:
    verdict: Latency
    threshold: float
    reason: str = ""  # what current was compared with ("approved", a release's label), or why it could not be
    estimate: stats.RatioEstimate | None = None
    approved: stats.SampleSummary | None = None
    current: stats.SampleSummary | None = None
    pairs: int = 0
    measurement_s: float = 0.0
    discarded: list[str] = field(default_factory=list)
    # Release mode: current against the version approved at the release ref (see gate._against_release).
    release: LatencyResult | None = None
    fingerprint: str = ""
    samples: dict[str, list[float]] = json_field(hidden=True, default_factory=dict)  # the item's samples_ms
    # Supplementary evidence: a byte-identical kernel judged against its stored approval runs, or a
    # release that had no such kernel. Its `regressed` fails only in release mode; its `incomparable`
    # never fails (see :func:`blocks`).
    advisory: bool = False
    telemetry: list[dict] = field(default_factory=list)  # NVML state after each measured chunk
    run_spread: RunSpreadJudgement | None = None  # set when judged against stored approval runs
    note: str = ""  # said under the headline: what the comparison could not see (a toolchain change)
    # Release mode: no release to compare with (a first release, a kernel new since it). The kernel's
    # `release` item says so once; its cases do not repeat it as a warning.
    said_by_kernel: bool = json_field(hidden=True, default=False)
    inputs: InputsCheck | None = None  # the comparison split by input set (interleaved, with fresh timing)
    disturbed_by: str | None = None  # who disturbed chunks of an interleaved comparison (BLAMED), if any were
    kept_disturbed: list[str] = field(default_factory=list)  # chunks the current kernel disturbed, kept

    @derived()
    def headline(self) -> str:
        if self.run_spread is not None:
            return f"latency {self.verdict.value}: today's run level is {self.run_spread.describe()}"
        est = self.estimate
        if est is None:
            return f"latency {self.verdict.value}: {self.reason}"
        if self.inputs is not None and self.inputs.keyed:
            fresh, signed, shift = self.inputs.fresh, self.inputs.signed, self.inputs.shift
            return (f"latency {self.verdict.value}: current is {_change(fresh.ratio)} than {self.reason or 'approved'} "
                    f"on inputs drawn in this run, and {_change(signed.ratio)} on the signed inputs (fresh/signed "
                    f"{shift.ratio:.3f}, {shift.confidence:.0%} CI [{shift.low:.3f}, {shift.high:.3f}], threshold "
                    f"±{self.threshold:.0%}): its speed depends on recognising the inputs it is timed on")
        change = (est.ratio - 1) * 100
        direction = "slower" if change >= 0 else "faster"
        return (f"latency {self.verdict.value}: current is {abs(change):.1f}% {direction} than {self.reason or 'approved'} "
                f"(ratio {est.ratio:.3f}, {est.confidence:.0%} CI [{est.low:.3f}, {est.high:.3f}], threshold ±{self.threshold:.0%})")

    def details(self) -> list[str]:
        """The lines under the headline: medians, how much was measured, what was not seen."""
        lines = []
        if self.run_spread is not None and self.current is not None:
            lines.append(f"  today's run: {self.current.n} timed launches, median {self.current.median * 1000:.2f} µs; "
                         f"a run's level is its {stats.RUN_QUANTILE:.0%} quantile; per-launch samples are for the "
                         "plots, the interval comes from whole runs")
        elif self.approved is not None and self.current is not None:
            label = "approved" if self.reason in ("", "approved") else self.reason
            lines.append(f"  {label} median {self.approved.median * 1000:.2f} µs, current median {self.current.median * 1000:.2f} µs")
            lines.append(f"  {self.pairs} interleaved rounds, {self.measurement_s:.2f} s of measurement")
        if self.inputs is not None and not self.inputs.keyed:
            lines.append(f"  on the signed inputs {_change(self.inputs.signed.ratio)}, on inputs drawn in this run "
                         f"{_change(self.inputs.fresh.ratio)}")
        if self.discarded:
            lines.append(f"  {len(self.discarded)} chunk(s) discarded as disturbed: {'; '.join(self.discarded[:3])}")
        if self.kept_disturbed:
            lines.append(f"  {len(self.kept_disturbed)} chunk(s) disturbed by the current kernel itself kept: its "
                         f"throttling counts in its latency ({'; '.join(self.kept_disturbed[:2])})")
        if self.disturbed_by is not None and (self.discarded or self.kept_disturbed):
            lines.append(f"  who disturbed the GPU: {BLAMED[self.disturbed_by]}")
        if self.note:
            lines.append(f"  {self.note}")
        return lines

    def describe(self) -> str:
        lines = [self.headline(), *self.details()]
        if self.release is not None:
            lines.append("  release gate: " + self.release.headline())
            lines += ["  " + line for line in self.release.details()]
        if self.fingerprint:
            lines.append(f"  fingerprint {self.fingerprint}")
        return "\n".join(lines)



def blocks(result: LatencyResult, *, strict: bool, release: bool, trusted: bool = False) -> bool:
    """Whether ``result`` fails the case.

    regressed fails, except supplementary evidence outside release mode: a byte-identical kernel
    judged against its stored approval runs, whose interval rests on the between-card floor
    (:data:`stats.RUN_SPREAD_FLOOR`) rather than on an interleaved comparison, only warns in a PR
    gate; inconclusive and unstable fail under --cuda-gate-strict; an interleaved comparison left
    unstable also fails where the current kernel brought the disturbance on, and under a trust
    root (``trusted``: `cudagate gate --trusted-ref`) unless it was shown to come from outside;
    incomparable fails in release mode unless it is supplementary (a kernel new since the release,
    an unchanged kernel without stored runs), where the PR gate still judged it.
    """
    verdict = result.verdict
    if verdict is Latency.REGRESSED:
        return not result.advisory or release
    if verdict is Latency.UNSTABLE:
        who = result.disturbed_by
        return strict or who == CURRENT or (trusted and who is not None and who != OUTSIDE)
    if verdict is Latency.INCONCLUSIVE:
        return strict
    return verdict is Latency.INCOMPARABLE and release and not result.advisory


def warns(result: LatencyResult) -> bool:
    return not result.said_by_kernel and result.verdict in (Latency.INCONCLUSIVE, Latency.UNSTABLE,
                                                             Latency.INCOMPARABLE, Latency.REGRESSED)


class AdaptiveSampler:
    """Decides, chunk by chunk, whether the interleaved comparison has seen enough.

    Chunks double the rounds so far (r, r, 2r, 4r, ... for r = ``rounds``, the suite's timing.repeat)
    within the time budget. A chunk during which the GPU throttled or another process ran is
    discarded and measured again, unless the worker's probe found the current kernel brings it on
    (:func:`blame`): then its rounds count, throttled as they are. After
    :data:`MAX_DISTURBED_CHUNKS` discarded chunks the comparison is ``unstable``. Rounds timed on a
    fresh input set (the chunk's ``fresh`` flags) count in the estimate as any other, and are
    compared with the signed rounds (:func:`inputs_check`); the sampler stops only once each set
    has :data:`MIN_SET_ROUNDS`.
    """

    def __init__(self, threshold: float, budget_s: float = DEFAULT_BUDGET_S, confidence: float = 0.99,
                 rounds: int = FIRST_ROUNDS):
        self.threshold = threshold
        self.rounds = rounds  # the first chunk's rounds; no later chunk is smaller
        self.budget_s = budget_s
        self.confidence = confidence
        self.approved: list[float] = []
        self.current: list[float] = []
        self.fresh: list[bool] = []  # per kept round: timed on a fresh input set
        self.discarded: list[str] = []
        self.kept_disturbed: list[str] = []
        self.disturbances: list[list[str]] = []
        self.prior: list[str] = []
        self.probes: list[dict] = []
        self.spent = 0.0
        self.estimate: stats.RatioEstimate | None = None
        self.stopped_by = "budget"
        self.telemetry: list[dict] = []

    def decide(self, chunk: dict) -> int:
        self.spent += chunk["wall_s"]
        self.telemetry.append(chunk.get("state") or {})
        self.prior = self.prior or list(chunk.get("prior") or ())
        if chunk.get("probe"):
            self.probes.append(chunk["probe"])
        disturbed = chunk.get("disturbances") or []
        if disturbed:
            self.disturbances.append(list(disturbed))
        if disturbed and blame(self.prior, self.disturbances, self.probes) != CURRENT:
            self.discarded.append(", ".join(disturbed))
            if len(self.discarded) > MAX_DISTURBED_CHUNKS:
                self.stopped_by = "disturbed"
                return 0
        else:
            if disturbed:
                self.kept_disturbed.append(", ".join(disturbed))
            self.approved.extend(chunk["approved"])
            self.current.extend(chunk["current"])
            self.fresh.extend(chunk.get("fresh") or [False] * len(chunk["current"]))
        if len(self.current) >= stats.MIN_STOP_N:
            self.estimate = stats.paired_ratio(self.current, self.approved, confidence=self.confidence)
            if stats.precise_enough(self.estimate, self.threshold) and self._sets_seen():
                self.stopped_by = "precise"
                return 0
        remaining = self.budget_s - self.spent
        if remaining <= 0:
            return 0
        done = len(self.current) + len(chunk["current"]) * len(self.discarded)
        rate = max(done, 1) / max(self.spent, 1e-6)  # rounds per second, disturbed chunks included
        return max(1, min(max(len(self.current), self.rounds), int(rate * remaining)))

    def _sets_seen(self) -> bool:
        """Each input set timed (the signed one; a fresh one where the worker times one) has its rounds."""
        fresh = sum(self.fresh)
        return not fresh or min(fresh, len(self.fresh) - fresh) >= MIN_SET_ROUNDS

    def result(self, fingerprint: str = "") -> LatencyResult:
        who = blame(self.prior, self.disturbances, self.probes) if self.disturbances else None
        if self.stopped_by == "disturbed" or not self.current:
            return LatencyResult(Latency.UNSTABLE, self.threshold,
                                 reason="the GPU was disturbed in every attempt (throttling or other processes); "
                                        "free the runner and re-run", discarded=self.discarded,
                                 measurement_s=self.spent, fingerprint=fingerprint, telemetry=self.telemetry,
                                 disturbed_by=who or UNKNOWN)
        estimate = self.estimate or stats.paired_ratio(self.current, self.approved, confidence=self.confidence)
        inputs = inputs_check(self.current, self.approved, self.fresh, self.threshold, self.confidence)
        verdict = classify(estimate, self.threshold)
        if inputs is not None and inputs.keyed:
            verdict, estimate = Latency.REGRESSED, inputs.fresh
        return LatencyResult(
            verdict, self.threshold, reason="approved", estimate=estimate,
            approved=stats.summarize(self.approved), current=stats.summarize(self.current),
            pairs=len(self.current), measurement_s=self.spent, discarded=self.discarded, fingerprint=fingerprint,
            samples={"approved": self.approved, "current": self.current}, telemetry=self.telemetry,
            inputs=inputs, disturbed_by=who, kept_disturbed=self.kept_disturbed,
        )


def against_runs(baseline_case: dict, today_samples: list[float], threshold: float, *, suite: str | os.PathLike,
                 kernel: str = "", fingerprint: str = "") -> LatencyResult:
    """A byte-identical kernel: today's run level against the levels of the independent runs
    recorded at approval (:func:`judge_run_spread`), never against one run's launches.

    ``baseline_case`` is the ledger's entry for the case (``run_p10_ms``, ``samples_ms``); its
    per-launch samples go to the plots only. A baseline with fewer than two runs (recorded before
    runs were) is incomparable, saying how to record them; ``suite`` (and ``kernel``) name them in that
    fix, and in the fix of a weak baseline.
    """
    runs = baseline_case.get("run_p10_ms") or []
    if len(runs) < 2:
        return LatencyResult(
            Latency.INCOMPARABLE, threshold, advisory=True, fingerprint=fingerprint,
            reason=f"the kernel is identical to the approved version, whose baseline here holds {len(runs)} "
                   f"independent run(s); judging an unchanged kernel needs the spread of >= 2 runs: re-approve to "
                   f"record runs: `{command('cudagate', 'approve', suite, '--runs', stats.DEFAULT_APPROVAL_RUNS)}`")
    stored = list(baseline_case.get("samples_ms") or [])
    judgement = judge_run_spread(runs, stats.run_level(today_samples), threshold)
    if judgement.weak:
        again = command("cudagate", "approve", suite, *([kernel] if kernel else []), "--runs",
                        max(stats.DEFAULT_APPROVAL_RUNS, 2 * judgement.runs))
        judgement = dataclasses.replace(judgement, fix=f"`{again}`")
    return LatencyResult(judgement.verdict, threshold, reason="the stored approval runs", run_spread=judgement,
                         approved=stats.summarize(stored) if stored else None, current=stats.summarize(today_samples),
                         samples={"approved": stored, "current": list(today_samples)}, advisory=True,
                         fingerprint=fingerprint)


def incomparable(threshold: float, reason: str, fingerprint: str = "") -> LatencyResult:
    return LatencyResult(Latency.INCOMPARABLE, threshold, reason=reason, fingerprint=fingerprint)


@dataclass(frozen=True)
class RunSpreadJudgement:
    """Today's run level against the spread of the approval runs' levels.

    ``low``/``high`` bound the ratio today/baseline that an unchanged kernel reaches with
    probability ``confidence``; ``ratio`` is today's level over the geometric mean of the runs.
    """

    verdict: Latency
    ratio: float
    low: float
    high: float
    confidence: float
    runs: int
    measured_spread: float  # sample standard deviation of ln(run level)
    floored: bool  # the floor, not the measured spread, set the interval
    fix: str = json_field(hidden=True, default="")  # the command that narrows a weak baseline (re-approving the kernel with more runs)

    @property
    def weak(self) -> bool:
        """Too few or too noisy runs: an interval this wide hides a slowdown a user would call a regression."""
        return self.high > WEAK_ABOVE

    @property
    @derived()
    def spread_text(self) -> str:
        """Which spread was used, e.g. 'spread of 5 approval runs: ±1.2%, floored at ±8.6% (between-card spread)'."""
        measured = math.expm1(stats.prediction_half_width(self.measured_spread, self.runs, self.confidence)) * 100
        text = f"spread of {self.runs} approval runs: ±{measured:.1f}%"
        if self.floored:
            text += f", floored at ±{(self.high - 1) * 100:.1f}% (between-card spread)"
        return text

    def describe(self) -> str:
        """One line: the change, the interval an unchanged kernel stays in, and the spread used."""
        change = (self.ratio - 1) * 100
        line = (f"{change:+.1f}% against the approval runs (ratio {self.ratio:.3f}; an unchanged kernel stays "
                f"within {self.low:.3f}–{self.high:.3f} at {self.confidence:.0%}; {self.spread_text})")
        if self.weak and self.verdict in (Latency.PASS, Latency.INCONCLUSIVE):
            line += (f"; a weak baseline: an unchanged kernel's runs reach +{(self.high - 1) * 100:.0f}%, so a slowdown "
                     f"that small passes; record more runs on this card: {self.fix or 'cudagate approve --runs'}")
        return line



def judge_run_spread(run_levels, today_level: float, threshold: float, *, confidence: float = 0.99,
                     floor: float = stats.RUN_SPREAD_FLOOR) -> RunSpreadJudgement:
    """Judge today's run level against the levels of n independent approval runs
    (:func:`stats.run_spread`), with the suite threshold widening the interval:

      REGRESSED: d > h + ln(1 + threshold): slower than any unchanged run, by more than threshold.
      IMPROVED: d < -h + ln(1 - threshold).
      INCONCLUSIVE: h < d <= h + ln(1 + threshold): outside an unchanged kernel's runs, but not
        by the threshold; neither a regression nor "unchanged" can be claimed (a warning).
      PASS: otherwise.  An unchanged kernel warns with probability (1 - confidence)/2.
    The price: at the floor, h is 8.6%, so only slowdowns beyond ~10.8% (at a 2% threshold)
    are caught, and reliably only beyond ~20%.  That is what a stored number can honestly say
    across cards; the interleaved comparison exists for everything else.
    """
    threshold = stats.check_threshold(threshold)
    spread = stats.run_spread(run_levels, today_level, confidence=confidence, floor=floor)
    d, h = spread.d, spread.half_width
    if d > h + math.log1p(threshold):
        verdict = Latency.REGRESSED
    elif d < -h + math.log1p(-threshold):
        verdict = Latency.IMPROVED
    elif d > h:
        verdict = Latency.INCONCLUSIVE
    else:
        verdict = Latency.PASS
    return RunSpreadJudgement(verdict=verdict, ratio=math.exp(d), low=math.exp(-h), high=math.exp(h),
                              confidence=spread.confidence, runs=spread.runs, measured_spread=spread.measured_spread,
                              floored=spread.floored)
