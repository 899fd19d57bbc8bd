"""One case of one kernel version as the gate carries it from step to step (:class:`CaseJob`), and
the comparison it gets (:class:`Route`)."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from pathlib import Path

from cudagate_harness.stopping import Settle

from pytest_cudagate.trust.approvals import Approval
from pytest_cudagate.defences.checks import worker_checks
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.outcome import CaseOutcome
from pytest_cudagate.suite.cases import case_data_fix, check_case_data
from pytest_cudagate.suite.model import Case, Checks, Suite
from pytest_cudagate.worker.requests import KernelVersion

# The share of an interleaved comparison's rounds timed on a fresh input set (checks.fresh_timing): half,
# so that the fresh/signed comparison of judge/latency.py has the power of two equal groups.
FRESH_SHARE = 0.5
# A kernel timed alone stops before Timing.baseline_rounds once its run level is known to ±0.5% at 99%
# (cudagate_harness.stopping): a long kernel after a few dozen launches, where hundreds cost most of a
# second of GPU time; its verdict's interval is at least ±8.6% (stats.RUN_SPREAD_FLOOR).
RUN_LEVEL_WITHIN = 0.005


@dataclass
class CaseJob:
    """``case`` of ``version`` of a kernel of ``suite``: its outputs go under ``out``; ``checks`` and
    ``fresh`` (the fresh input sets' specs) harden its requests (None: a bare comparison, as bisect's,
    which no defence rides on). Its ``outcome`` is filled in step by step."""

    suite: Suite
    version: KernelVersion
    case: Case
    out: Path
    checks: Checks | None
    fresh: list[dict]
    outcome: CaseOutcome
    threshold: float

    @classmethod
    def bare(cls, suite: Suite, version: KernelVersion, case: Case, out: Path, threshold: float) -> CaseJob:
        """A comparison with no defences riding on it (checks and fresh inputs are the PR gate's)."""
        return cls(suite, version, case, out, None, [], outcome_for(suite, version, case), threshold)

    @property
    def failed(self) -> bool:
        return self.outcome.failed

    def harden(self, request: dict, entry: dict) -> dict:
        """Add the checks and fresh inputs to ``request`` (``entry``: its case); return the copy a report
        keeps, without the fresh sets, whose files live only as long as this run (their seed is in any
        failure)."""
        if self.checks is None:
            return request
        request["checks"] = worker_checks(self.checks)
        if self.fresh:
            entry["fresh"] = copy.deepcopy(self.fresh)
            # An interleaved comparison also times rounds on the resampled sets (values the author cannot
            # know in advance); the adversarial ones, with their extreme magnitudes, are for correctness.
            timed = [spec for spec in entry["fresh"] if spec["label"].startswith("resampled")]
            if "case" in request and self.checks.fresh_timing and timed:
                for spec in timed:
                    spec["timed"] = True
                request["timing"]["fresh_share"] = FRESH_SHARE
        recorded = copy.deepcopy(request)
        for case in recorded.get("cases", []) + ([recorded["case"]] if "case" in recorded else []):
            case.pop("fresh", None)
        return recorded


def outcome_for(suite: Suite, version: KernelVersion, case: Case) -> CaseOutcome:
    return CaseOutcome(suite.name, version.name, case.name, case.kind, shape_class=case.shape_class)


def baseline_timing(suite: Suite) -> dict:
    """The timing of a kernel measured alone: a stored baseline, or a kernel identical to it. The
    settle rule's 1% error is shared between the looks it may take (99% over all of them)."""
    rounds = suite.timing.baseline_rounds
    return {**suite.timing.to_json(), "repeat": rounds,
            "settle": Settle.over_looks(stats.RUN_QUANTILE, RUN_LEVEL_WITHIN, rounds).to_json()}


def case_data_problem(suite: Suite, case: Case) -> str | None:
    """Why a case's data cannot be judged, in the gate's words (None when it is sound)."""
    problems = check_case_data(suite, case)
    if not problems:
        return None
    return ("case data does not match the signature:\n" + "\n".join(f"  - {p}" for p in problems)
            + f"\n{case_data_fix(suite)}")


class Route(enum.Enum):
    """How a case is measured: the comparison chosen for it."""

    CORRECTNESS = "correctness"  # not a performance case: one run, untimed
    UNAPPROVED = "unapproved"  # no approved version: timed alone, nothing to compare with
    IDENTICAL = "identical"  # byte-identical to its approval: timed alone, against the stored runs
    INTERLEAVED = "interleaved"  # changed: timed interleaved with the approved version

    def timing(self, suite: Suite) -> dict | None:
        """The timing of a run of this route (not of an interleaved comparison)."""
        if self is Route.CORRECTNESS:
            return None
        return baseline_timing(suite) if self is Route.IDENTICAL else suite.timing.to_json()


def route(case: Case, current: KernelVersion, approval: Approval | None, *, proposal: bool) -> Route:
    """The comparison ``case`` of ``current`` gets (``proposal``: an optimizer's text, never timed as
    its approval however alike)."""
    if case.kind != "performance":
        return Route.CORRECTNESS
    if approval is None:
        return Route.UNAPPROVED
    if not proposal and current.identity == approval.identity():
        return Route.IDENTICAL
    return Route.INTERLEAVED
