"""Latency verdicts: adaptive interleaved sampling against the approved kernel, and baselines.

Why interleaved: the current and the approved kernel are timed in the same run, one launch each per
round in random order, so clock, thermal and co-tenant drift hit both alike and cancel in the
per-round ratio. Why an interval: a verdict is claimed only when the whole confidence interval of
the latency ratio lies beyond (or within) the threshold; sampling continues until the interval is
narrow enough (half-width under a quarter of the threshold) or the time budget is spent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum

from pytest_cudagate.judge import stats
from pytest_cudagate.config import DEFAULT_BUDGET_S

FIRST_ROUNDS = 100  # rounds of the first chunk: the suite's timing.repeat, by default the seed tool's 100
MAX_DISTURBED_CHUNKS = 3
BASELINE_REASON = "the stored baseline"


class Latency(str, Enum):
    """The one latency verdict. The first four come from an interval (:func:`classify`); the gate
    adds INCOMPARABLE (nothing like-for-like to measure against) and UNSTABLE (the GPU was disturbed)."""

    PASS = "pass"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    INCONCLUSIVE = "inconclusive"
    INCOMPARABLE = "incomparable"
    UNSTABLE = "unstable"


# Worst first: a combined verdict (interleaved and baseline) is the worse of the two.
_SEVERITY = [Latency.REGRESSED, Latency.UNSTABLE, Latency.INCONCLUSIVE, Latency.INCOMPARABLE, Latency.PASS, Latency.IMPROVED]


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


def worst(*verdicts: Latency) -> Latency:
    return min(verdicts, key=_SEVERITY.index)


@dataclass
class LatencyResult:
    verdict: Latency
    threshold: float
    reason: str = ""
    estimate: stats.RatioEstimate | None = None
    approved: stats.SampleSummary | None = None
    current: stats.SampleSummary | None = None
    pairs: int = 0
    measurement_s: float = 0.0
    discarded: list[str] = field(default_factory=list)
    baseline: LatencyResult | None = None
    fingerprint: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)
    # Judged only against a baseline stored by an earlier run: run-to-run variation of µs kernels
    # (clock state, co-tenants) is not inside its interval, so outside release mode it only warns.
    advisory: bool = False
    telemetry: list[dict] = field(default_factory=list)  # NVML state after each measured chunk

    def headline(self) -> str:
        est = self.estimate
        if est is None:
            return f"latency {self.verdict.value}: {self.reason}"
        change = (est.ratio - 1) * 100
        direction = "slower" if change >= 0 else "faster"
        return (f"latency {self.verdict.value}: current is {abs(change):.1f}% {direction} than {self.reason or 'approved'} "
                f"(ratio {est.ratio:.3f}, {est.confidence:.0%} CI [{est.low:.3f}, {est.high:.3f}], threshold ±{self.threshold:.0%})")

    def describe(self) -> str:
        lines = [self.headline()]
        if self.approved is not None and self.current is not None:
            label = "stored baseline" if self.reason == BASELINE_REASON else "approved"
            lines.append(f"  {label} median {self.approved.median * 1000:.2f} µs, current median {self.current.median * 1000:.2f} µs")
            if self.reason == BASELINE_REASON:
                lines.append(f"  {self.current.n} timed launches of this run against {self.approved.n} stored at approval")
            else:
                lines.append(f"  {self.pairs} interleaved rounds, {self.measurement_s:.2f} s of measurement")
        if self.discarded:
            lines.append(f"  {len(self.discarded)} chunk(s) discarded as disturbed: {'; '.join(self.discarded[:3])}")
        if self.baseline is not None:
            lines.append("  against the stored baseline: " + self.baseline.headline())
        if self.fingerprint:
            lines.append(f"  fingerprint {self.fingerprint}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict.value, "threshold": self.threshold, "reason": self.reason,
            "estimate": self.estimate.to_dict() if self.estimate else None,
            "approved": self.approved.to_dict() if self.approved else None,
            "current": self.current.to_dict() if self.current else None,
            "pairs": self.pairs, "measurement_s": self.measurement_s, "discarded": self.discarded,
            "baseline": self.baseline.to_json() if self.baseline else None, "fingerprint": self.fingerprint,
            "advisory": self.advisory, "telemetry": self.telemetry,
        }


class AdaptiveSampler:
    """Decides, chunk by chunk, whether the interleaved comparison has seen enough.

    Chunks double the rounds so far (r, r, 2r, 4r, ... for r = ``rounds``, the suite's timing.repeat)
    within the time budget. A chunk during which the GPU throttled or another process ran is
    discarded and measured again; after :data:`MAX_DISTURBED_CHUNKS` such chunks the comparison is
    ``unstable``.
    """

    def __init__(self, threshold: float, budget_s: float = DEFAULT_BUDGET_S, confidence: float = 0.99,
                 rounds: int = FIRST_ROUNDS):
        self.threshold = threshold
        self.rounds = rounds  # the first chunk's rounds; no later chunk is smaller
        self.budget_s = budget_s
        self.confidence = confidence
        self.approved: list[float] = []
        self.current: list[float] = []
        self.discarded: list[str] = []
        self.spent = 0.0
        self.estimate: stats.RatioEstimate | None = None
        self.stopped_by = "budget"
        self.telemetry: list[dict] = []

    def decide(self, chunk: dict) -> int:
        self.spent += chunk["wall_s"]
        self.telemetry.append(chunk.get("state") or {})
        if chunk.get("disturbances"):
            self.discarded.append(", ".join(chunk["disturbances"]))
            if len(self.discarded) > MAX_DISTURBED_CHUNKS:
                self.stopped_by = "disturbed"
                return 0
        else:
            self.approved.extend(chunk["approved"])
            self.current.extend(chunk["current"])
        if len(self.current) >= stats.MIN_STOP_N:
            self.estimate = stats.paired_ratio(self.current, self.approved, confidence=self.confidence)
            if stats.precise_enough(self.estimate, self.threshold):
                self.stopped_by = "precise"
                return 0
        remaining = self.budget_s - self.spent
        if remaining <= 0:
            return 0
        done = len(self.current) + len(chunk["current"]) * len(self.discarded)
        rate = max(done, 1) / max(self.spent, 1e-6)  # rounds per second, disturbed chunks included
        return max(1, min(max(len(self.current), self.rounds), int(rate * remaining)))

    def result(self, fingerprint: str = "") -> LatencyResult:
        if self.stopped_by == "disturbed" or not self.current:
            return LatencyResult(Latency.UNSTABLE, self.threshold,
                                 reason="the GPU was disturbed in every attempt (throttling or other processes); "
                                        "free the runner and re-run", discarded=self.discarded,
                                 measurement_s=self.spent, fingerprint=fingerprint, telemetry=self.telemetry)
        estimate = self.estimate or stats.paired_ratio(self.current, self.approved, confidence=self.confidence)
        verdict = classify(estimate, self.threshold)
        return LatencyResult(
            verdict, self.threshold, reason="approved", estimate=estimate,
            approved=stats.summarize(self.approved), current=stats.summarize(self.current),
            pairs=len(self.current), measurement_s=self.spent, discarded=self.discarded, fingerprint=fingerprint,
            samples={"approved": self.approved, "current": self.current}, telemetry=self.telemetry,
        )


def against_baseline(current: list[float], baseline: list[float], threshold: float) -> LatencyResult:
    """Current samples of this run against samples stored at approval on the same fingerprint."""
    estimate = stats.unpaired_ratio(current, baseline)
    verdict = classify(estimate, threshold)
    return LatencyResult(verdict, threshold, reason=BASELINE_REASON, estimate=estimate,
                         approved=stats.summarize(baseline), current=stats.summarize(current), pairs=len(current))


def incomparable(threshold: float, reason: str, fingerprint: str = "") -> LatencyResult:
    return LatencyResult(Latency.INCOMPARABLE, threshold, reason=reason, fingerprint=fingerprint)


@dataclass(frozen=True)
class RunSpreadJudgement:
    """Today's run median against the spread of the approval runs' medians.

    ``low``/``high`` bound the ratio today/baseline that an unchanged kernel reaches with
    probability ``confidence``; ``ratio`` is today's median over the geometric mean of the runs.
    """

    verdict: Latency
    ratio: float
    low: float
    high: float
    confidence: float
    runs: int
    measured_spread: float  # sample standard deviation of ln(run median)
    floored: bool  # the floor, not the measured spread, set the interval

    @property
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
        return (f"{change:+.1f}% against the approval runs (ratio {self.ratio:.3f}; an unchanged kernel stays "
                f"within {self.low:.3f}–{self.high:.3f} at {self.confidence:.0%}; {self.spread_text})")

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["verdict"] = self.verdict.value
        data["spread_text"] = self.spread_text
        return data


def judge_run_spread(run_medians, today_median: float, threshold: float, *, confidence: float = 0.99,
                     floor: float = stats.RUN_SPREAD_FLOOR) -> RunSpreadJudgement:
    """Judge today's run median against the medians of n independent approval runs
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
    spread = stats.run_spread(run_medians, today_median, confidence=confidence, floor=floor)
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
