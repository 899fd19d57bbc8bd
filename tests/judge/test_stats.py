"""Tests for pytest_cudagate.judge.stats on synthetic GPU-like latencies with known answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import ks_2samp

from pytest_cudagate.judge import stats
from pytest_cudagate.judge.latency import Latency, classify
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.judge.stats import (
    MIN_STOP_N,
    RatioEstimate,
    SampleSummary,
    paired_ratio,
    precise_enough,
    rule_asv,
    rule_mann_whitney,
    rule_median_percent,
    summarize,
    unpaired_ratio,
)

THRESHOLD = 0.02
BASE_MS = 0.015  # a 15 us kernel


# --------------------------------------------------------------------------- generators


def launches(
    rng: np.random.Generator,
    n: int,
    *,
    cv: float = 0.04,
    outlier_rate: float = 0.01,
    bimodal: bool = False,
) -> np.ndarray:
    """Per-launch multiplicative noise: lognormal, occasional 5-10x preemptions,
    optionally a second mode 12% slower (e.g. a clock or cache state) hit 30% of the time."""
    x = rng.lognormal(0.0, cv, n)
    if bimodal:
        x *= np.where(rng.random(n) < 0.3, 1.12, 1.0)
    hit = rng.random(n) < outlier_rate
    x[hit] *= rng.uniform(5.0, 10.0, int(hit.sum()))
    return x


def interleaved(
    seed: int,
    n: int,
    shift: float,
    *,
    order_effect: float = 0.0,
    **noise: float | bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(current, approved) measured in n rounds.  Machine drift (a slow random walk
    plus a clock step halfway) is shared by both launches of a round; whichever
    launch runs second in a round may be faster by ``order_effect``."""
    rng = np.random.default_rng(seed)
    drift = np.exp(np.cumsum(rng.normal(0.0, 0.003, n)))
    drift[n // 2 :] *= 1.04
    b_second = rng.random(n) < 0.5
    approved = BASE_MS * drift * launches(rng, n, **noise)  # type: ignore[arg-type]
    current = BASE_MS * shift * drift * launches(rng, n, **noise)  # type: ignore[arg-type]
    current = np.where(b_second, current * (1 - order_effect), current)
    approved = np.where(b_second, approved, approved * (1 - order_effect))
    return current, approved


def paired_verdicts(shift: float, n: int, seeds: range, **kw: float | bool) -> list[Latency]:
    return [classify(paired_ratio(*interleaved(s, n, shift, **kw)), THRESHOLD) for s in seeds]


def rate(verdicts: list[Latency], which: Latency) -> float:
    return sum(v is which for v in verdicts) / len(verdicts)


# --------------------------------------------------------------------------- paired: error rates


def test_identical_kernels_pass() -> None:
    current, approved = interleaved(0, 300, 1.0)
    est = paired_ratio(current, approved)
    assert est.low < 1.0 < est.high
    assert abs(est.ratio - 1.0) < 0.01
    assert classify(est, THRESHOLD) is Latency.PASS


def test_aa_false_alarm_rate_at_most_1pct() -> None:
    verdicts = paired_verdicts(1.0, 300, range(200))
    assert rate(verdicts, Latency.REGRESSED) <= 0.01  # measured: 0/200
    assert rate(verdicts, Latency.PASS) >= 0.95  # measured: 200/200


def test_5pct_slowdown_detected_in_99pct_with_300_pairs() -> None:
    verdicts = paired_verdicts(1.05, 300, range(100))
    assert rate(verdicts, Latency.REGRESSED) >= 0.99  # measured: 100/100


def test_3pct_slowdown_detected_in_95pct_with_1000_pairs() -> None:
    verdicts = paired_verdicts(1.03, 1000, range(100))
    assert rate(verdicts, Latency.REGRESSED) >= 0.95  # measured: 100/100


def test_5pct_speedup_is_improved() -> None:
    verdicts = paired_verdicts(0.95, 300, range(50))
    assert rate(verdicts, Latency.IMPROVED) >= 0.99


def test_slowdown_within_threshold_is_not_called_regressed() -> None:
    # A "+2%" change measures 1.9%: inside a 2% threshold, so it must not fail CI;
    # with enough rounds the interval straddles 1.02 (INCONCLUSIVE) or sits under it.
    verdicts = paired_verdicts(1.019, 1000, range(100))
    assert rate(verdicts, Latency.REGRESSED) <= 0.02  # measured: 1/100 (2/1000 seeds)
    assert set(verdicts) <= {Latency.PASS, Latency.INCONCLUSIVE, Latency.REGRESSED}


def test_noisier_kernel_cv7_still_controlled() -> None:
    aa = paired_verdicts(1.0, 300, range(50), cv=0.07)
    slow = paired_verdicts(1.05, 600, range(50), cv=0.07)
    assert rate(aa, Latency.REGRESSED) == 0
    assert rate(slow, Latency.REGRESSED) >= 0.95


def test_pairing_cancels_drift_and_launch_order_effect() -> None:
    # Whichever kernel runs second is 5% faster (warm caches); random order makes
    # that symmetric, so it must neither fake nor hide a regression.
    aa = paired_verdicts(1.0, 300, range(30), order_effect=0.05)
    slow = paired_verdicts(1.05, 600, range(30), order_effect=0.05)
    assert rate(aa, Latency.REGRESSED) == 0
    assert rate(slow, Latency.REGRESSED) >= 0.95


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("shift, expected", [(1.0, Latency.PASS), (1.05, Latency.REGRESSED)])
def test_outliers_on_one_side_do_not_flip_verdict(shift: float, expected: Latency) -> None:
    for seed in range(10):
        current, approved = interleaved(seed, 400, shift, outlier_rate=0.0)
        clean = paired_ratio(current, approved)
        dirty_current = current.copy()
        rng = np.random.default_rng(1000 + seed)
        hit = rng.choice(current.size, size=12, replace=False)  # 3% preempted launches
        dirty_current[hit] *= rng.uniform(5.0, 10.0, hit.size)
        dirty = paired_ratio(dirty_current, approved)
        assert classify(clean, THRESHOLD) is expected
        assert classify(dirty, THRESHOLD) is expected
        # A mean of log ratios would move ~6% here.
        assert abs(math.log(dirty.ratio / clean.ratio)) < 0.005


def test_single_10x_preemption_barely_moves_estimate() -> None:
    current, approved = interleaved(3, 100, 1.0, outlier_rate=0.0)
    base = paired_ratio(current, approved)
    current[17] *= 10.0
    hit = paired_ratio(current, approved)
    assert abs(hit.ratio / base.ratio - 1) < 0.002
    assert hit.high / base.high < 1.005


def test_bimodal_latencies() -> None:
    # Two modes 12% apart roughly double the per-pair spread, so more rounds are
    # needed for a PASS, but it must never look like a regression.
    aa_short = paired_verdicts(1.0, 400, range(30), bimodal=True)
    aa = paired_verdicts(1.0, 1500, range(30), bimodal=True)
    slow = paired_verdicts(1.05, 400, range(30), bimodal=True)
    assert rate(aa_short, Latency.REGRESSED) == 0
    assert rate(aa, Latency.PASS) >= 0.95
    assert rate(slow, Latency.REGRESSED) >= 0.95


def test_quantised_timer_ties() -> None:
    # CUDA events resolve ~0.5 us: on a 15 us kernel most log ratios tie (many are 0).
    def quantised(seed: int, shift: float) -> Latency:
        current, approved = interleaved(seed, 1000, shift)
        q = 0.0005
        est = paired_ratio(np.ceil(current / q) * q, np.ceil(approved / q) * q)
        return classify(est, THRESHOLD)

    assert all(quantised(s, 1.0) is not Latency.REGRESSED for s in range(10))
    assert all(quantised(s, 1.06) is Latency.REGRESSED for s in range(10))


# --------------------------------------------------------------------------- adaptive sampling


def adaptive(seed: int, shift: float, cap: int = 4000) -> tuple[Latency, int]:
    """What the gate does: add rounds until precise_enough or the GPU-time cap."""
    current, approved = interleaved(seed, cap, shift)
    n = 100
    while True:
        est = paired_ratio(current[:n], approved[:n])
        if precise_enough(est, THRESHOLD) or n >= cap:
            return classify(est, THRESHOLD), n
        n = min(cap, int(n * 1.5))


def test_adaptive_sampling_error_rates() -> None:
    seeds = range(40)
    aa = [adaptive(s, 1.0) for s in seeds]
    slow3 = [adaptive(s, 1.03) for s in seeds]
    slow5 = [adaptive(s, 1.05) for s in seeds]
    within = [adaptive(s, 1.019) for s in seeds]
    assert all(v is Latency.PASS for v, _ in aa)
    assert all(v is Latency.REGRESSED for v, _ in slow3)
    assert all(v is Latency.REGRESSED for v, _ in slow5)
    assert all(v is not Latency.REGRESSED for v, _ in within)
    # Clear cases stop early; the borderline case needs the most rounds.
    assert max(n for _, n in slow5) < np.median([n for _, n in within])


# --------------------------------------------------------------------------- paired internals


@pytest.mark.parametrize("n, quantum", [(8, 0.0), (30, 0.0), (250, 0.0), (250, 0.01), (40, 0.2)])
def test_paired_matches_brute_force_walsh_averages(n: int, quantum: float) -> None:
    rng = np.random.default_rng(n)
    d = rng.normal(0.01, 0.05, n)
    d[:3] += 2.0  # outliers
    if quantum:
        d = np.round(d / quantum) * quantum
    approved = np.full(n, BASE_MS)
    current = approved * np.exp(d)
    est = paired_ratio(current, approved, confidence=0.95)
    d = np.log(current) - np.log(approved)
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2)
    c = stats.wilcoxon_lower_rank(n, 0.95)
    assert c >= 1
    assert est.ratio == pytest.approx(math.exp(np.median(walsh)), rel=1e-12)
    assert est.low == pytest.approx(math.exp(walsh[c - 1]), rel=1e-12)
    assert est.high == pytest.approx(math.exp(walsh[walsh.size - c]), rel=1e-12)


@pytest.mark.parametrize("n, critical", [(8, 3), (10, 8), (20, 52), (30, 137)])
def test_wilcoxon_rank_matches_published_tables(n: int, critical: int) -> None:
    # Two-sided alpha=0.05 critical values of the signed-rank statistic.
    assert stats.wilcoxon_lower_rank(n, 0.95) == critical + 1


def test_wilcoxon_normal_approximation_close_to_exact() -> None:
    exact = stats.wilcoxon_lower_rank(100, 0.99, exact=True)
    approx = stats.wilcoxon_lower_rank(100, 0.99, exact=False)
    assert abs(exact - approx) <= 0.005 * exact


def test_too_few_pairs_gives_unbounded_interval() -> None:
    est = paired_ratio([1.0, 1.1, 1.2, 1.3, 1.4], [1.0] * 5)
    assert est.low == 0.0 and math.isinf(est.high)
    assert classify(est, THRESHOLD) is Latency.INCONCLUSIVE
    assert not precise_enough(est, THRESHOLD)
    assert to_json(est)["low"] is None and to_json(est)["high"] is None


def test_paired_is_deterministic() -> None:
    current, approved = interleaved(5, 500, 1.03)
    assert paired_ratio(current, approved, seed=1) == paired_ratio(current, approved, seed=2)


# --------------------------------------------------------------------------- unpaired


def stored_baseline(seed: int, n_current: int, n_baseline: int, shift: float):
    rng = np.random.default_rng(seed)
    baseline = BASE_MS * launches(rng, n_baseline)
    current = BASE_MS * shift * launches(rng, n_current)
    return current, baseline


def test_unpaired_against_stored_baseline() -> None:
    aa_est = [unpaired_ratio(*stored_baseline(s, 500, 800, 1.0), seed=s) for s in range(100)]
    slow_est = [unpaired_ratio(*stored_baseline(s, 500, 800, 1.05), seed=s) for s in range(100)]
    aa = [classify(e, THRESHOLD) for e in aa_est]
    slow = [classify(e, THRESHOLD) for e in slow_est]
    fast = [classify(unpaired_ratio(*stored_baseline(s, 500, 800, 0.95), seed=s), THRESHOLD) for s in range(30)]
    assert rate(aa, Latency.REGRESSED) <= 0.01  # measured: 0/100
    assert rate(slow, Latency.REGRESSED) >= 0.99  # measured: 100/100
    assert rate(fast, Latency.IMPROVED) >= 0.95
    covered = sum(e.low <= 1.0 <= e.high for e in aa_est) + sum(e.low <= 1.05 <= e.high for e in slow_est)
    assert covered >= 196  # 99% intervals; measured: 200/200
    # Width matches the asymptotic s.e. of a log median, 1/(2 f sqrt(n)), on both sides:
    # resampling only one side would make it ~20% too narrow.
    f = 0.99 / (0.04 * math.sqrt(2 * math.pi))
    expected = 2.5758 * math.sqrt(1 / 500 + 1 / 800) / (2 * f)
    assert np.median([e.half_width for e in aa_est]) == pytest.approx(expected, rel=0.1)
    est = unpaired_ratio(*stored_baseline(0, 500, 800, 1.05))
    assert est.n == 500
    assert est.low < est.ratio < est.high
    assert est.ratio == pytest.approx(1.05, abs=0.01)


def test_unpaired_is_reproducible_per_seed() -> None:
    current, baseline = stored_baseline(1, 300, 300, 1.0)
    assert unpaired_ratio(current, baseline, seed=7) == unpaired_ratio(current, baseline, seed=7)
    assert unpaired_ratio(current, baseline, seed=7) != unpaired_ratio(current, baseline, seed=8)


@pytest.mark.parametrize("n", [51, 50])
def test_fast_bootstrap_median_matches_naive_resampling(n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.sort(rng.lognormal(0.0, 0.3, n))
    fast = stats.bootstrap_medians(x, np.random.default_rng(1), 20_000)
    naive = np.median(x[np.random.default_rng(2).integers(0, n, (8_000, n))], axis=1)
    assert ks_2samp(fast, naive).statistic < 0.03
    for q in (0.005, 0.5, 0.995):
        assert np.quantile(fast, q) == pytest.approx(np.quantile(naive, q), rel=0.01)


# --------------------------------------------------------------------------- judge / precise_enough


def est(low: float, high: float, ratio: float | None = None, n: int = 1000) -> RatioEstimate:
    if ratio is None:
        ratio = math.sqrt(low * high) if low > 0 and math.isfinite(high) else 1.0
    return RatioEstimate(ratio=ratio, low=low, high=high, confidence=0.99, n=n, method="hand-made")


T = THRESHOLD


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (1 + T + 1e-9, 1.05, Latency.REGRESSED),  # just above the line
        (1 + T, 1.05, Latency.INCONCLUSIVE),  # touching it is not "above"
        (1.01, 1.03, Latency.INCONCLUSIVE),  # straddles 1+T
        (0.95, 1.05, Latency.INCONCLUSIVE),  # straddles both bounds
        (0.0, math.inf, Latency.INCONCLUSIVE),
        (1 + T, 1 + T, Latency.PASS),  # degenerate, on the closed bound
        (0.99, 1 + T, Latency.PASS),  # high exactly at 1+T
        (0.99, 1.01, Latency.PASS),
        (0.97, 0.99, Latency.PASS),  # straddles only the lower bound
        (0.97, 1 - T, Latency.PASS),  # high exactly at 1-T: inside the closed band
        (0.95, 1 - T - 1e-9, Latency.IMPROVED),
    ],
)
def test_classify_boundaries(low: float, high: float, expected: Latency) -> None:
    assert classify(est(low, high), T) is expected


def test_judge_uses_threshold() -> None:
    e = est(1.03, 1.04)
    assert classify(e, 0.02) is Latency.REGRESSED
    assert classify(e, 0.05) is Latency.PASS


def test_verdict_values() -> None:
    assert [v.value for v in Latency] == ["pass", "improved", "regressed", "inconclusive", "incomparable", "unstable"]
    assert Latency("regressed") is Latency.REGRESSED and Latency.PASS == "pass"


@pytest.mark.parametrize(
    "low, high, n, expected",
    [
        (math.exp(-0.0049), math.exp(0.0049), 1000, True),  # half-width < T/4
        (1.02 * math.exp(-0.0049), 1.02 * math.exp(0.0049), 1000, True),  # on the line, but precise
        (1.02 * math.exp(-0.0051), 1.02 * math.exp(0.0051), 1000, False),  # on the line, just too wide
        (1.01, 1.04, 1000, False),  # straddles 1+T
        ((1 + T) * math.exp(0.006), 1.2, 1000, True),  # clearly regressed, wide
        (1 + T + 0.001, 1.2, 1000, False),  # above, but without margin
        (0.8, (1 + T) * math.exp(-0.006), 1000, True),  # clearly not regressed, wide
        (0.8, 1.015, 1000, False),  # below, but without margin
        (math.exp(-0.001), math.exp(0.001), MIN_STOP_N - 1, False),  # too few pairs
        (0.0, math.inf, 1000, False),
    ],
)
def test_precise_enough(low: float, high: float, n: int, expected: bool) -> None:
    assert precise_enough(est(low, high, n=n), T) is expected


def test_half_width_is_log_space() -> None:
    assert est(1 / 1.01, 1.01).half_width == pytest.approx(math.log(1.01))
    assert math.isinf(est(0.0, 2.0).half_width)


# --------------------------------------------------------------------------- summaries / dicts


def test_summarize_known_values() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert isinstance(s, SampleSummary)
    assert (s.n, s.median, s.mean, s.min, s.max, s.q1, s.q3, s.mad) == (5, 3.0, 22.0, 1.0, 100.0, 2.0, 4.0, 1.0)
    assert s.stdev == pytest.approx(float(np.std([1, 2, 3, 4, 100], ddof=1)))
    assert s.cv == pytest.approx(s.stdev / 22.0)
    assert summarize([0.5]).stdev == 0.0


def test_the_report_view_is_json_ready() -> None:
    current, approved = interleaved(0, 200, 1.0)
    for obj in (summarize(current), paired_ratio(current, approved), unpaired_ratio(current, approved)):
        d = to_json(obj)
        assert json.loads(json.dumps(d, allow_nan=False)) == d
    d = to_json(paired_ratio(current, approved))
    assert set(d) == {"ratio", "low", "high", "confidence", "n", "method", "half_width"}
    assert d["n"] == 200


def test_dataclasses_are_frozen() -> None:
    e = est(0.99, 1.01)
    with pytest.raises(AttributeError):
        e.ratio = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ratio=1.0, low=1.1, high=1.0),
        dict(ratio=0.0, low=0.9, high=1.1),
        dict(ratio=1.0, low=math.nan, high=1.1),
        dict(ratio=1.0, low=-0.1, high=1.1),
    ],
)
def test_ratio_estimate_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RatioEstimate(confidence=0.99, n=10, method="x", **kwargs)


# --------------------------------------------------------------------------- peer rules


def test_peer_rules_on_clear_cases() -> None:
    rng = np.random.default_rng(0)
    approved = BASE_MS * launches(rng, 200)
    same = BASE_MS * launches(rng, 200)
    slow20 = 1.2 * BASE_MS * launches(rng, 200)
    slow6 = 1.06 * BASE_MS * launches(rng, 200)
    for rule in (rule_median_percent, rule_mann_whitney, rule_asv):
        assert rule(slow20, approved) is True
        assert rule(same, approved) is False
        assert rule(approved, slow20) is False  # faster is never a regression
    # 6%: over pytest-benchmark's 5%, under the 10% ratio floor of gpucheck / asv.
    assert rule_median_percent(slow6, approved) is True
    assert rule_median_percent(slow6, approved, percent=10.0) is False
    assert rule_mann_whitney(slow6, approved) is False
    assert rule_mann_whitney(slow6, approved, min_ratio=1.03) is True
    assert rule_asv(slow6, approved) is False


# --------------------------------------------------------------------------- input validation

GOOD = [0.015, 0.016, 0.014]


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "no samples"),
        ([0.015, math.nan, 0.016], "non-finite"),
        ([0.015, math.inf, 0.016], "non-finite"),
        ([0.015, 0.0, 0.016], "non-positive"),
        ([0.015, -1.0, 0.016], "non-positive"),
        ([[0.015, 0.016, 0.014]], "one-dimensional"),
        (["fast", "slow", "x"], "numbers"),
    ],
)
@pytest.mark.parametrize(
    "func",
    [paired_ratio, unpaired_ratio, rule_median_percent, rule_mann_whitney, rule_asv],
)
def test_bad_samples_raise(func, bad, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        func(bad, GOOD)
    with pytest.raises(ValueError, match=message):
        func(GOOD, bad)


def test_bad_summary_input_raises() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summarize([])
    with pytest.raises(ValueError, match="non-positive"):
        summarize([1.0, 0.0])


def test_mismatched_pairs_raise() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        paired_ratio([0.015] * 10, [0.015] * 9)
    unpaired_ratio([0.015] * 10, [0.015] * 9)  # fine when unpaired


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.5])
def test_bad_confidence_raises(confidence: float) -> None:
    for func in (paired_ratio, unpaired_ratio):
        with pytest.raises(ValueError, match="confidence"):
            func(GOOD, GOOD, confidence=confidence)


@pytest.mark.parametrize("threshold", [0.0, -0.02, 1.0, math.nan, math.inf])
def test_bad_threshold_raises(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        classify(est(0.99, 1.01), threshold)
    with pytest.raises(ValueError, match="threshold"):
        precise_enough(est(0.99, 1.01), threshold)
