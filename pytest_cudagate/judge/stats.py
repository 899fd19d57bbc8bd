"""Statistics that estimate the latency ratio of two CUDA-event samples (pure maths; the
verdict drawn from an estimate is :func:`pytest_cudagate.judge.latency.classify`).

Paired method (``paired_ratio``): Hodges-Lehmann estimate of the per-pair log
ratio ln(B_i/A_i) with the Wilcoxon signed-rank confidence interval.  Because
A and B run adjacent in time and in random order, the log ratios of an A/A
comparison are exchangeable, hence symmetric: exactly the assumption under
which this interval has its stated coverage, with no resampling noise (the
verdict is deterministic).  It keeps ~95% of the mean's efficiency on Gaussian
noise (the median of log ratios keeps 64%, so it needs ~1.5x more GPU rounds
for the same interval) yet tolerates up to 29% contamination, so a preempted
launch 10x slower barely moves it.

Unpaired method (``unpaired_ratio``): ratio of medians with a percentile
bootstrap, each side resampled independently.  The gate no longer judges
stored baselines with it: its interval on one run's launches misses the
run-to-run spread (docs/release-gate.md); ``run_spread`` replaced it.

Run-spread method (``run_spread``): where nothing can be timed side by
side (a new driver or card), today's run level is placed in a prediction
interval built from the levels of independent approval runs (see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Sequence, Union

import numpy as np
from numpy.typing import NDArray

from pytest_cudagate.boundary.wire import derived, json_field

__all__ = [
    "SampleSummary",
    "RatioEstimate",
    "check_threshold",
    "summarize",
    "paired_ratio",
    "unpaired_ratio",
    "precise_enough",
    "RunSpread",
    "run_spread",
    "run_level",
    "RUN_QUANTILE",
    "prediction_half_width",
    "DEFAULT_APPROVAL_RUNS",
    "RUN_SPREAD_FLOOR",
    "rule_median_percent",
    "rule_mann_whitney",
    "rule_asv",
]

# Measured CPU cost (one core of the CI box, numpy 2.4, lognormal samples):
#   paired_ratio    n=300: ~2 ms   n=1000: ~4 ms   n=2000: ~6-8 ms   n=5000: ~17-21 ms
#   unpaired_ratio  ~4-6 ms for 300..5000 per side (10k bootstrap resamples)
# A naive bootstrap (resample n values, take the median) costs ~300 ms for
# 2000 samples x 2000 resamples; drawing each replicate median directly from
# its order-statistic distribution (``bootstrap_medians``) avoids that.

Samples = Union[Sequence[float], NDArray[np.floating[Any]]]

# Bootstrap resamples for ``unpaired_ratio``.  Enough that the 0.5% / 99.5%
# percentiles wobble by well under 0.1% between seeds; cheap because each
# resampled median is drawn directly (see ``bootstrap_medians``).
_BOOTSTRAP_RESAMPLES = 10_000
# Up to this many pairs the signed-rank critical value uses the exact null
# distribution; above it the normal approximation (within ~0.2% of the exact
# rank at n=100, on the conservative side) is used.
_EXACT_WILCOXON_MAX_N = 100
# An interval built from fewer pairs rests entirely on a handful of launches;
# never let adaptive sampling stop before this many.
MIN_STOP_N = 20


def _bounded(x: float) -> float | None:
    return x if math.isfinite(x) and x > 0 else None


@dataclass(frozen=True)
class SampleSummary:
    """Descriptive statistics of one latency sample (ms), kept for reports and baselines."""

    n: int
    median: float
    mean: float
    stdev: float
    min: float
    max: float
    q1: float
    q3: float
    cv: float  # stdev / mean: the noise level that decides how many rounds are needed
    mad: float  # raw median absolute deviation (not scaled by 1.4826)


@dataclass(frozen=True)
class RatioEstimate:
    """Current/approved latency ratio with a two-sided interval at ``confidence``.

    ``low`` may be 0 and ``high`` infinite when too few samples exist for the
    requested confidence; such an estimate is never judged conclusively.
    """

    ratio: float
    low: float = json_field(convert=_bounded, revert=lambda low: 0.0 if low is None else low)  # unbounded: null
    high: float = json_field(convert=_bounded, revert=lambda high: math.inf if high is None else high)
    confidence: float
    n: int  # pairs (paired) or the smaller per-side count (unpaired)
    method: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 0):
            raise ValueError(f"ratio must be finite and > 0, got {self.ratio!r}")
        if math.isnan(self.low) or math.isnan(self.high) or not 0 <= self.low <= self.high:
            raise ValueError(f"need 0 <= low <= high, got low={self.low!r} high={self.high!r}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n!r}")

    @property
    def half_width(self) -> float:
        """Half the interval width in log space, i.e. roughly its relative +-precision."""
        if self.low <= 0 or math.isinf(self.high):
            return math.inf
        return (math.log(self.high) - math.log(self.low)) / 2

    @derived("half_width")
    def reported_half_width(self) -> float | None:
        return _bounded(self.half_width)


# --------------------------------------------------------------------------- input checks


def _as_samples(samples: Samples, name: str) -> NDArray[np.float64]:
    """Validate latencies: a non-empty 1-D array of finite, positive floats."""
    try:
        arr = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: samples must be numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: samples must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: no samples")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name}: {int(bad.sum())} non-finite sample(s) (NaN or inf)")
    bad = arr <= 0
    if bad.any():
        raise ValueError(f"{name}: {int(bad.sum())} non-positive sample(s); latencies must be > 0")
    return arr


def _check_confidence(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def check_threshold(threshold: float) -> float:
    if not (math.isfinite(threshold) and 0 < threshold < 1):
        raise ValueError(f"threshold must be a fraction in (0, 1), e.g. 0.02; got {threshold!r}")
    return float(threshold)


# --------------------------------------------------------------------------- summary


def summarize(samples: Samples) -> SampleSummary:
    """Summarise one latency sample (validated like every other input)."""
    x = _as_samples(samples, "samples")
    median = float(np.median(x))
    mean = float(x.mean())
    stdev = float(x.std(ddof=1)) if x.size > 1 else 0.0
    q1, q3 = (float(v) for v in np.percentile(x, [25, 75]))
    return SampleSummary(
        n=int(x.size),
        median=median,
        mean=mean,
        stdev=stdev,
        min=float(x.min()),
        max=float(x.max()),
        q1=q1,
        q3=q3,
        cv=stdev / mean,
        mad=float(np.median(np.abs(x - median))),
    )


# --------------------------------------------------------------------------- paired


@lru_cache(maxsize=256)
def wilcoxon_lower_rank(n: int, confidence: float, exact: bool | None = None) -> int:
    """1-based rank c such that [W_(c), W_(N+1-c)] of the sorted Walsh averages is the
    signed-rank interval: the largest c with P(T+ <= c-1) <= alpha/2 under the null.

    Returns 0 when no interval reaches ``confidence`` (n too small).
    """
    alpha = 1.0 - confidence
    total = n * (n + 1) // 2
    if exact is None:
        exact = n <= _EXACT_WILCOXON_MAX_N
    if exact:
        # Null distribution of T+ = sum of ranks with a positive sign: each rank
        # i joins with probability 1/2, so pmf = prod_i (1 + x^i) / 2.
        pmf = np.zeros(total + 1)
        pmf[0] = 1.0
        for i in range(1, n + 1):
            pmf[i:] = pmf[i:] + pmf[:-i]
            pmf *= 0.5
        return int(np.count_nonzero(np.cumsum(pmf) <= alpha / 2 * (1 + 1e-12)))
    z = NormalDist().inv_cdf(1 - alpha / 2)
    sigma = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return max(0, math.floor(total / 2 + 0.5 - z * sigma))


def _walsh_count(d: NDArray[np.float64], t: NDArray[np.float64]) -> NDArray[np.int64]:
    """For each t, how many Walsh averages (d_i + d_j)/2 with i <= j are <= t (d sorted)."""
    n = d.size
    rows = np.arange(n - 1, -1, -1)  # keys are built from d reversed so they ascend
    keys = 2.0 * t[:, None] - d[None, ::-1]
    upto = np.searchsorted(d, keys.ravel(), side="right").reshape(t.size, n)
    return np.maximum(upto - rows, 0).sum(axis=1)


def _walsh_order_stats(d: NDArray[np.float64], ks: NDArray[np.int64]) -> NDArray[np.float64]:
    """k-th smallest (1-based) Walsh averages of sorted ``d`` without building all n(n+1)/2.

    Bisect on the value, counting with binary searches (O(n log n) per step),
    until at most ~8n candidates remain in the bracket, then select among them
    exactly.  Heavy ties (quantised timers) can keep many candidates in a
    bracket of zero width; those are then a single value, taken directly.
    Cost: see the measured-cost comment at the top of the module.
    """
    n = d.size
    rows = np.arange(n)
    cap = 8 * n
    lo = np.full(ks.shape, d[0] - 1.0)  # count(lo) < k <= count(hi)
    hi = np.full(ks.shape, d[-1])
    c_lo = np.zeros(ks.shape, dtype=np.int64)
    c_hi = np.full(ks.shape, n * (n + 1) // 2, dtype=np.int64)
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    while True:
        active = np.flatnonzero((c_hi - c_lo > cap) & (hi - lo > tol))
        if active.size == 0:
            break
        mid = 0.5 * (lo[active] + hi[active])
        counts = _walsh_count(d, mid)
        up = counts >= ks[active]
        hi[active[up]], c_hi[active[up]] = mid[up], counts[up]
        lo[active[~up]], c_lo[active[~up]] = mid[~up], counts[~up]
    out = np.empty(ks.shape)
    for m in range(ks.size):
        if c_hi[m] - c_lo[m] <= cap:
            # Materialise the Walsh averages in (lo, hi], row by row, and select.
            first = np.maximum(np.searchsorted(d, 2 * lo[m] - d, side="right"), rows)
            stop = np.maximum(np.searchsorted(d, 2 * hi[m] - d, side="right"), rows)
            lengths = stop - first
            offsets = np.cumsum(lengths) - lengths
            i = np.repeat(rows, lengths)
            j = np.arange(int(lengths.sum())) - np.repeat(offsets - first, lengths)
            vals = 0.5 * (d[i] + d[j])
            rank = int(ks[m] - c_lo[m] - 1)
            out[m] = np.partition(vals, rank)[rank]
        else:
            # Bracket narrower than rounding: the answer is the largest Walsh average <= hi.
            j = np.searchsorted(d, 2 * hi[m] - d, side="right") - 1
            ok = j >= rows
            out[m] = float((0.5 * (d[ok] + d[j[ok]])).max())
    return out


def paired_ratio(
    current: Samples, approved: Samples, *, confidence: float = 0.99, seed: int = 0
) -> RatioEstimate:
    """Latency ratio current/approved from interleaved pairs (element i of each from round i).

    Hodges-Lehmann estimate of ln(current_i/approved_i) with the Wilcoxon
    signed-rank interval (see module docstring).  ``seed`` is accepted for a
    uniform signature but unused: the method is deterministic.
    """
    del seed
    confidence = _check_confidence(confidence)
    b = _as_samples(current, "current")
    a = _as_samples(approved, "approved")
    if a.size != b.size:
        raise ValueError(
            f"paired samples need equal lengths (one of each per round): "
            f"current has {b.size}, approved has {a.size}"
        )
    d = np.sort(np.log(b) - np.log(a))
    n = int(d.size)
    total = n * (n + 1) // 2
    c = wilcoxon_lower_rank(n, confidence)
    ks = [(total + 1) // 2, total // 2 + 1]  # the median (two middle ranks if even)
    if c > 0:
        ks += [c, total + 1 - c]
    stats = _walsh_order_stats(d, np.asarray(ks, dtype=np.int64))
    center = 0.5 * (stats[0] + stats[1])
    low, high = (math.exp(stats[2]), math.exp(stats[3])) if c > 0 else (0.0, math.inf)
    return RatioEstimate(
        ratio=math.exp(center),
        low=low,
        high=high,
        confidence=confidence,
        n=n,
        method="hodges-lehmann+wilcoxon-signed-rank (paired log ratio)",
    )


# --------------------------------------------------------------------------- unpaired


def bootstrap_medians(
    x_sorted: NDArray[np.float64], rng: np.random.Generator, size: int
) -> NDArray[np.float64]:
    """``size`` bootstrap replicates of the median of ``x_sorted``, drawn in O(size).

    A resample's order statistics are the sample's empirical quantile function
    at the order statistics of n uniforms; U_(m) ~ Beta(m, n-m+1) and, given
    it, U_(m+1) = U_(m) + (1-U_(m)) Beta(1, n-m).  This is the same
    distribution as resampling n values and taking their median, but it costs
    O(resamples) instead of O(resamples * n).
    """
    n = x_sorted.size
    m = (n + 1) // 2

    def at(u: NDArray[np.float64]) -> NDArray[np.float64]:
        return x_sorted[np.clip(np.ceil(n * u).astype(np.int64) - 1, 0, n - 1)]

    u = rng.beta(m, n - m + 1, size)
    if n % 2:
        return at(u)
    u_next = u + (1.0 - u) * rng.beta(1, n - m, size)
    return 0.5 * (at(u) + at(u_next))


def unpaired_ratio(
    current: Samples, approved: Samples, *, confidence: float = 0.99, seed: int = 0
) -> RatioEstimate:
    """Ratio of medians current/approved against a stored baseline (independent runs).

    Percentile bootstrap with each side resampled independently, from a seeded
    ``numpy.random.Generator`` so the verdict is reproducible.  Without pairing,
    run-to-run machine drift is not cancelled, so intervals are wider and a
    baseline should come from the same machine class.
    Cost: see the measured-cost comment at the top of the module.
    """
    confidence = _check_confidence(confidence)
    b = np.sort(_as_samples(current, "current"))
    a = np.sort(_as_samples(approved, "approved"))
    rng = np.random.default_rng(seed)
    log_ratio = np.log(bootstrap_medians(b, rng, _BOOTSTRAP_RESAMPLES)) - np.log(
        bootstrap_medians(a, rng, _BOOTSTRAP_RESAMPLES)
    )
    alpha = 1.0 - confidence
    lo, hi = np.quantile(log_ratio, [alpha / 2, 1 - alpha / 2])
    return RatioEstimate(
        ratio=float(np.median(b) / np.median(a)),
        low=math.exp(lo),
        high=math.exp(hi),
        confidence=confidence,
        n=int(min(a.size, b.size)),
        method="median-ratio+percentile-bootstrap (unpaired)",
    )


# --------------------------------------------------------------------------- stopping rule


def precise_enough(estimate: RatioEstimate, threshold: float) -> bool:
    """Whether the adaptive sampler may stop adding rounds.

    Stop once the interval's half-width (log space, ~relative) is under
    threshold/4: any verdict it gives then has a quarter-threshold resolution.
    Also stop early when the interval clears 1+threshold on either side by
    that same margin: more rounds will not change the verdict, and the margin
    keeps repeated looks (optional stopping) from cashing in on a lucky
    interval that barely touches the line.  Never stop below MIN_STOP_N pairs.
    """
    threshold = check_threshold(threshold)
    if estimate.n < MIN_STOP_N:
        return False
    resolution = threshold / 4
    if estimate.half_width < resolution:
        return True
    line = math.log1p(threshold)
    clearly_above = estimate.low > 0 and math.log(estimate.low) - line >= resolution
    clearly_below = math.isfinite(estimate.high) and line - math.log(estimate.high) >= resolution
    return clearly_above or clearly_below


# --------------------------------------------------------------------------- run spread
# Stored baselines judge what cannot be timed side by side (a new driver or card).  One run's
# launches say nothing about the next run's placement, clocks or card, so the unit of evidence
# is a whole run's level: approval records several independent runs, each one level.

# Runs ``cudagate approve`` records by default.
DEFAULT_APPROVAL_RUNS = 5
# A run's level is this quantile of its launch latencies, not the median. Measured on the H200
# (2026-12-01, examples, 1000 launches a run): some runs of µs kernels put half their launches or
# more in a slow tail (softmax 256x1024: p10 5.2 µs, median 10.7 µs, p90 19 µs, against 5.6 / 6.1 /
# 6.8 µs in the approval runs), which moved the median by +80% on an unchanged kernel, while the
# 10th percentile stayed within a few percent. A slower kernel moves every quantile.
RUN_QUANTILE = 0.10
# Widest offset of an unchanged kernel's run level between cards: one card's run against another
# card's approval runs. First measured between fresh H200 machines (2026-11-30, -6% ... +8.6%); the
# script is `python benchmarks/card_floor.py measure` on each card, then `derive` over its files, and
# tests/benchmarks/test_card_floor.py fails when the kept files derive a wider floor than this.
_BETWEEN_CARD_OFFSET = 0.086
# Floor on the spread of d = ln(today's level / approval runs' mean): the standard deviation at
# which the widest measured offset is the 99% point, ln(1.086) / z_0.995 = 3.2%.  Approval runs
# recorded minutes apart on one machine share its card, so their spread misses the card-to-card
# part, and averaging more of them does not shrink it: the floor applies to d, whatever n.
RUN_SPREAD_FLOOR = math.log1p(_BETWEEN_CARD_OFFSET) / NormalDist().inv_cdf(0.995)


def run_level(samples: Samples) -> float:
    """A run's level: the :data:`RUN_QUANTILE` quantile of its launch latencies."""
    return float(np.quantile(_as_samples(samples, "run samples"), RUN_QUANTILE))


def prediction_half_width(spread: float, n: int, confidence: float) -> float:
    """Half-width (log space) of the prediction interval for one more run, from n runs' spread."""
    # Student's t quantile from scipy.special, imported here: only a kernel judged against its stored
    # approval runs needs it, and importing it costs ~0.25 s on the H200 runner (scipy.stats ~0.45 s),
    # which a gate run on a GPU pays in the background during its run phase `ahead` (items.py).
    from scipy.special import stdtrit

    return float(stdtrit(n - 1, 0.5 + confidence / 2)) * spread * math.sqrt(1 + 1 / n)


@dataclass(frozen=True)
class RunSpread:
    """Where today's run level falls among n independent approval runs' levels (log space)."""

    d: float  # ln(today's level) - mean(ln run levels)
    half_width: float  # h: an unchanged kernel's d stays within +-h with probability ``confidence``
    confidence: float
    runs: int
    measured_spread: float  # sample standard deviation of ln(run level)
    floored: bool  # the floor, not the measured spread, set h


def run_spread(run_levels: Samples, today_level: float, *, confidence: float = 0.99,
               floor: float = RUN_SPREAD_FLOOR) -> RunSpread:
    """The prediction interval for one more run's log level, never narrower than ``floor``.

    Model: ln(run level) = ln(true latency) + e, e ~ N(0, s^2) independently per run (a run's
    median of hundreds of launches is close to normal in log space; the spread comes from
    placement, clocks and the card, which act multiplicatively).  For a new run of an unchanged
    kernel, d = ln(today) - mean(ln runs) has sd s*sqrt(1 + 1/n), and with s estimated from the
    n runs, d / (s*sqrt(1 + 1/n)) follows Student's t with n-1 degrees of freedom: the
    prediction interval +-h, h = t_{n-1} * s * sqrt(1 + 1/n).  It is the right question (where
    does one more run fall?), not a confidence interval on the mean of the runs, which shrinks
    with n and would again ask what nobody asked.

    The interval is never narrower than the between-card spread ``floor`` (a known standard
    deviation of d itself, so its interval uses the normal quantile): h = max(that, z * floor).
    """
    confidence = _check_confidence(confidence)
    if not (math.isfinite(floor) and floor >= 0):
        raise ValueError(f"floor must be a finite spread >= 0, got {floor!r}")
    logs = np.log(_as_samples(run_levels, "run levels"))
    if logs.size < 2:
        raise ValueError(
            f"judging against stored runs needs >= 2 approval runs, got {logs.size}; "
            f"re-approve to record runs (`cudagate approve --runs {DEFAULT_APPROVAL_RUNS}`)"
        )
    today = float(np.log(_as_samples([today_level], "today's level")[0]))
    n = int(logs.size)
    measured = float(logs.std(ddof=1))
    from_runs = prediction_half_width(measured, n, confidence)
    from_floor = NormalDist().inv_cdf(0.5 + confidence / 2) * floor
    return RunSpread(d=today - float(logs.mean()), half_width=max(from_runs, from_floor), confidence=confidence,
                     runs=n, measured_spread=measured, floored=from_floor > from_runs)


# --------------------------------------------------------------------------- peer rules
# Decision rules of other tools, applied to the same samples by the benchmark
# that compares cudagate with them.  Each returns True when it would flag a
# regression.


def rule_median_percent(current: Samples, approved: Samples, percent: float = 5.0) -> bool:
    """pytest-benchmark ``--benchmark-compare-fail=median:5%``: median grew by more than percent."""
    b = _as_samples(current, "current")
    a = _as_samples(approved, "approved")
    return bool(np.median(b) > np.median(a) * (1 + percent / 100))


def rule_mann_whitney(
    current: Samples, approved: Samples, *, p: float = 0.05, min_ratio: float = 1.1
) -> bool:
    """gpucheck style: one-sided Mann-Whitney U ('greater') p < p AND median ratio >= min_ratio."""
    from scipy.stats import mannwhitneyu

    b = _as_samples(current, "current")
    a = _as_samples(approved, "approved")
    pvalue = mannwhitneyu(b, a, alternative="greater").pvalue
    return bool(pvalue < p and np.median(b) / np.median(a) >= min_ratio)


def rule_asv(current: Samples, approved: Samples) -> bool:
    """asv ``compare`` style: two-sided Mann-Whitney U p < 0.002 AND median ratio > 1.1."""
    from scipy.stats import mannwhitneyu

    b = _as_samples(current, "current")
    a = _as_samples(approved, "approved")
    pvalue = mannwhitneyu(b, a, alternative="two-sided").pvalue
    return bool(pvalue < 0.002 and np.median(b) / np.median(a) > 1.1)
