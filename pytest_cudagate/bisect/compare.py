"""``cudagate bisect``'s measurements: one version of a kernel read from git, timed interleaved against
another on one case, in one worker, exactly as the gate times a pull request against its approved
version (the gate's :class:`~pytest_cudagate.gate.measure.Interleaved`: the same request, sampler,
interval and correctness check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_cudagate.bisect.history import Version
from pytest_cudagate.gate import CaseJob, Gate
from pytest_cudagate.gate.measure import Interleaved
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.judge.latency import Latency, LatencyResult, incomparable
from pytest_cudagate.suite.model import Case, Program, Suite, judged
from pytest_cudagate.boundary.wire import to_json

# Verdicts that come from an interval, so that a search can act on them.
JUDGED = (Latency.PASS, Latency.IMPROVED, Latency.REGRESSED, Latency.INCONCLUSIVE)


@dataclass(frozen=True)
class Comparison:
    """``version`` timed interleaved against ``reference``: the gate's verdict and the worker's time."""

    reference: Version
    version: Version
    result: LatencyResult
    worker_s: float

    @property
    def judged(self) -> bool:
        return self.result.verdict in JUDGED and self.result.estimate is not None

    def describe(self) -> str:
        """``1a2b3c4d5e6f 'subject': 3.1% slower than 0f9e8d7c6b5a (ratio 1.031, 99% CI [1.027, 1.035]): regressed``."""
        head = f"{self.version.short} {self.version.subject!r}"
        estimate = self.result.estimate
        if estimate is None:
            return f"{head} against {self.reference.short}: {self.result.verdict.value}: {self.result.reason}"
        return f"{head}: {ratio_text(estimate, self.reference.short)}: {self.result.verdict.value}"

    def to_json(self) -> dict:
        estimate = self.result.estimate
        return {"reference": self.reference.commit, "commit": self.version.commit, "verdict": self.result.verdict.value,
                "estimate": to_json(estimate), "reason": self.result.reason,
                "pairs": self.result.pairs, "measurement_s": self.result.measurement_s, "worker_s": self.worker_s}


def ratio_text(estimate: stats.RatioEstimate, than: str = "", approximate: bool = False) -> str:
    """``3.1% slower than X (ratio 1.031, 99% CI [1.027, 1.035])``; ``approximate``: a :func:`step_estimate`'s ``~99%``."""
    change = (estimate.ratio - 1) * 100
    return (f"{abs(change):.1f}% {'slower' if change >= 0 else 'faster'}{f' than {than}' if than else ''} "
            f"(ratio {estimate.ratio:.3f}, {'~' if approximate else ''}{estimate.confidence:.0%} CI "
            f"[{estimate.low:.3f}, {estimate.high:.3f}])")


def step_estimate(later: stats.RatioEstimate, earlier: stats.RatioEstimate) -> stats.RatioEstimate:
    """later/earlier, both measured against the same reference in the same worker: the change between
    the two versions, with the two intervals' log half-widths added in quadrature (an approximate
    interval of two independent comparisons; unbounded when either is)."""
    centre = math.log(later.ratio) - math.log(earlier.ratio)
    half = math.hypot(later.half_width, earlier.half_width)
    low, high = (0.0, math.inf) if math.isinf(half) else (math.exp(centre - half), math.exp(centre + half))
    return stats.RatioEstimate(math.exp(centre), low, high, min(later.confidence, earlier.confidence),
                               min(later.n, earlier.n), "quotient of two paired ratios")


class Bench:
    """Comparisons of versions of ``program`` on ``case``, each a request to the gate's one worker."""

    def __init__(self, gate: Gate, suite: Suite, program: Program, case: Case, threshold: float, output_dir: Path):
        self.gate, self.suite, self.program, self.case = gate, suite, program, case
        self.threshold = threshold
        self.output_dir = output_dir
        self.done: list[Comparison] = []

    def compare(self, reference: Version, version: Version) -> Comparison:
        suite, case = self.suite, self.case
        out = self.output_dir / f"comparison-{len(self.done) + 1}"
        job = CaseJob.bare(suite, version.approval.version, case, out, self.threshold)
        measured = Interleaved(self.gate.bench, reference.approval.version, self.gate.options.budget_s,
                               which=f"the version approved at {reference.short}").measure(job)
        result = self._checked(version, measured.body, measured.compile, measured.latency)
        if result.estimate is not None:  # named by what it was timed against, as the gate names "approved"
            result = replace(result, reason=reference.short)
        done = Comparison(reference, version, result, job.outcome.worker_s)
        self.done.append(done)
        return done

    def _checked(self, version: Version, body: dict, compile_info: dict, result: LatencyResult | None) -> LatencyResult:
        """The comparison's verdict, unless ``version`` itself could not be judged on the case."""
        fingerprint = self.gate.fingerprint_text
        if not compile_info.get("ok"):
            return incomparable(self.threshold, f"the version approved at {version.short} does not compile here:\n"
                                + compile_info.get("log", ""), fingerprint)
        resolved = self.suite.resolved(self.case)
        verdict = judge_case(f"{self.program.name}@{version.short}", self.case.name, body,
                             *judged(self.suite, self.program.name, resolved), resolved.shapes)
        if not verdict.passed:
            return incomparable(self.threshold, f"the version approved at {version.short} fails this case now, so its "
                                "latency means nothing: " + verdict.describe(), fingerprint)
        return result if result is not None else incomparable(self.threshold, "the comparison did not complete",
                                                              fingerprint)
