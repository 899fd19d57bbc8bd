"""When a block of timed launches is enough: a distribution-free interval of a quantile.

A kernel timed alone is judged by its run level, a low quantile of its launch latencies, and a
library baseline by the median of its per-round ratios to the kernel. A long kernel's launches
spread by a fraction of a percent, so a few dozen of them fix either figure as well as hundreds
do, while hundreds of a 2 ms kernel cost most of a second of GPU time. The worker therefore times
such a request in blocks and stops once the order-statistic interval of the quantile, which
assumes nothing about the latencies' distribution, lies within the request's ``within`` of the
quantile itself (``timing.settle`` in the request schema).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FIRST_BLOCK = 64  # rounds before the first look at a rule (its interval needs >= 51 at q=0.1)
REST_MS = 30.0  # GPU time under which the rest of the rounds run in one go, without more looks


@dataclass(frozen=True)
class Settle:
    """``quantile`` of the samples, known to ±``within`` (relative) at ``confidence``."""

    quantile: float
    within: float
    confidence: float = 0.99

    @classmethod
    def from_json(cls, raw: dict | None) -> Settle | None:
        if not raw:
            return None
        return cls(float(raw["quantile"]), float(raw["within"]), float(raw.get("confidence", 0.99)))

    @classmethod
    def over_looks(cls, quantile: float, within: float, rounds: int, error: float = 0.01) -> Settle:
        """The rule for at most ``rounds`` rounds, its ``error`` shared between the looks it may take
        there (:func:`looks`; Bonferroni), so that it holds at 1 − ``error`` over all of them."""
        return cls(quantile, within, 1 - error / looks(rounds))

    def to_json(self) -> dict:
        return {"quantile": self.quantile, "within": self.within, "confidence": self.confidence}

    @property
    def fewest(self) -> int:
        """The fewest samples for which the interval exists (below it the sample minimum is not a
        lower bound at this confidence)."""
        tail = (1 - self.confidence) / 2
        return max(1, math.ceil(math.log(tail) / math.log1p(-self.quantile)))

    def settled(self, samples: Sequence[float]) -> bool:
        found = quantile_interval(samples, self.quantile, self.confidence)
        if found is None:
            return False
        low, high = found
        point = float(np.quantile(np.asarray(samples, dtype=float), self.quantile))
        return point > 0 and low >= point * (1 - self.within) and high <= point * (1 + self.within)


def _binomial_cdf(n: int, p: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), from log-space terms (no overflow for large n)."""
    log_p, log_q = math.log(p), math.log1p(-p)
    total, cdf = 0.0, []
    for k in range(n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        cdf.append(min(total, 1.0))
    return cdf


def quantile_interval(samples: Sequence[float], quantile: float, confidence: float) -> tuple[float, float] | None:
    """Order statistics ``(X_(l), X_(u))`` that hold the ``quantile`` of the distribution with
    probability at least ``confidence`` (equal tails); None when too few samples give one.

    B, the number of samples below the true quantile, is Binomial(n, quantile); the interval misses
    only when B < l (probability at most the lower tail) or B >= u (at most the upper tail).
    """
    if not 0 < quantile < 1 or not 0 < confidence < 1:
        raise ValueError(f"quantile and confidence lie strictly between 0 and 1 (got {quantile}, {confidence})")
    ordered = np.sort(np.asarray(samples, dtype=float))
    n = ordered.size
    if n == 0:
        return None
    tail = (1 - confidence) / 2
    cdf = _binomial_cdf(n, quantile)
    lower = max((l for l in range(1, n + 1) if cdf[l - 1] <= tail), default=None)
    upper = min((u for u in range(1, n + 1) if cdf[u - 1] >= 1 - tail), default=None)
    if lower is None or upper is None:
        return None
    return float(ordered[lower - 1]), float(ordered[upper - 1])


def looks(rounds: int) -> int:
    """The most times :func:`next_rounds` looks at a rule within ``rounds`` (after blocks of 64, 128,
    256, ... rounds in all), so that a caller can share its confidence between them (Bonferroni)."""
    count, done = 0, FIRST_BLOCK
    while done < rounds:
        count, done = count + 1, 2 * done
    return max(count, 1)


def next_rounds(settle: Settle | None, rounds: int, samples: list[list[float]],
                figure: Callable[[list[list[float]]], Sequence[float]]) -> int:
    """How many of ``rounds`` rounds to time next, ``samples`` (one list per kernel) timed so far;
    0 stops. Without a rule, all in one block. With one: a first block of :data:`FIRST_BLOCK`; then
    the rest in one go when it costs under :data:`REST_MS` of GPU time (a µs kernel is timed in two
    blocks, for every round asked); else nothing more once ``settle`` holds for ``figure(samples)``,
    or a block as large as all so far (only a long kernel stops early: its blocks cost real GPU time,
    and its latencies spread little)."""
    done = len(samples[0]) if samples else 0
    left = rounds - done
    if left <= 0 or settle is None:
        return max(left, 0)
    if not done:
        return min(left, max(FIRST_BLOCK, settle.fewest))
    if sum(float(np.median(s)) for s in samples) * left < REST_MS:
        return left
    return 0 if settle.settled(figure(samples)) else min(left, done)
