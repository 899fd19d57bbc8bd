"""A suite's ``inputs:``: a distribution for an input buffer only, with parameters its type can be
drawn from (numpy refuses or overflows otherwise; a low-precision type's draw stays within its range)."""

from __future__ import annotations

import numpy as np

from cudagate_harness.protocol import LOW_PRECISION, finfo

from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.model import INT_DTYPES, Distribution, Param, default_bounds

NORMAL_SPAN = 6  # a normal draw's mean ± 6 std must fit a low-precision type; the rarer tail is clipped


def inputs(checker: Checker, raw: dict, signature: list[Param]) -> dict[str, Distribution]:
    """Each input's distribution, by name, with the defaults of its type filled in."""
    inputs = {p.name for p in signature if p.is_input}
    scratch = {p.name for p in signature if p.is_scratch}
    distributions = {}
    for name, dist in raw.items():
        if name in scratch:
            checker.add(["inputs", name], f"{name!r} is a scratch buffer: it is poisoned before every run, never "
                                          "drawn; remove it from `inputs`, or make it an input (intent: in)")
        elif name not in inputs:
            checker.add(["inputs", name], f"{name!r} is not an input buffer (inputs: {', '.join(sorted(inputs))})")
        dtype = next((p.dtype for p in signature if p.name == name), None)
        low, high = default_bounds(dist.get("distribution", "uniform"), dtype or "float32")
        if dist.get("distribution") == "outliers":
            base = {"distribution": "uniform", **dist.get("base", {})}
            dist = {**dist, "per": dist.get("per", "row"), "base": Distribution(**{
                "low": -1.0, "high": 1.0, **base, "adversarial_max": None})}
        distributions[name] = Distribution(**{"low": low, "high": high, **dist})
        if dtype is not None:
            distribution(checker, distributions[name], dtype, ["inputs", name])
    return distributions


def distribution(checker: Checker, dist: Distribution, dtype: str, parts: list) -> None:
    """Parameters the generator can draw from for ``dtype`` (numpy refuses or overflows otherwise)."""
    if dist.low > dist.high:
        checker.add(parts, f"low ({dist.low}) is above high ({dist.high}); swap them")
    if dist.adversarial_max is not None:
        adversarial_max(checker, dtype, parts + ["adversarial_max"])
    if dist.distribution == "outliers" or dist.base is not None or dist.k is not None or dist.scale is not None:
        outliers(checker, dist, dtype, parts)
        if dist.base is not None and dist.base.distribution != "outliers":
            distribution(checker, dist.base, dtype, parts + ["base"])
    if dtype in LOW_PRECISION:
        low_precision_distribution(checker, dist, dtype, parts)
        return
    info = np.iinfo(dtype) if dtype in INT_DTYPES else np.finfo(dtype)
    limit = float(info.max) / 2  # the draw spans high - low, which must stay finite
    for key in ("low", "high", "mean", "std"):
        value = getattr(dist, key)
        if dtype in INT_DTYPES and key in ("low", "high") and not info.min <= value <= info.max:
            checker.add(parts + [key], f"{value} does not fit {dtype} ({info.min} to {info.max})")
        elif abs(value) > limit:
            checker.add(parts + [key], f"{value} is too large for {dtype} (at most {limit:g})")


def adversarial_max(checker: Checker, dtype: str, parts: list) -> None:
    """(The schema has refused a number that is not positive, the loader one that is not finite.)"""
    if dtype in INT_DTYPES:
        checker.add(parts, f"{dtype} input: adversarial fresh inputs leave integers unchanged, so a bound means "
                           "nothing; remove `adversarial_max`")


def outliers(checker: Checker, dist: Distribution, dtype: str, parts: list) -> None:
    if dist.distribution != "outliers":
        checker.add(parts, "`base`, `k`, `scale` and `per` belong to `distribution: outliers`; remove them, or "
                           "write `distribution: outliers` with the distribution as its `base`")
    elif dist.k is None or dist.scale is None:
        checker.add(parts, "an outliers distribution needs `k` (outliers per row) and `scale` (their size), e.g. "
                           "{distribution: outliers, base: {distribution: normal}, k: 2, scale: 100}")
    elif dtype in INT_DTYPES:
        checker.add(parts, f"outliers are drawn for float inputs; {dtype} takes uniform, normal or integers")
    elif dist.base.distribution in ("outliers", "integers"):
        checker.add(parts + ["base", "distribution"], f"{dist.base.distribution!r} cannot be an outliers "
                                                      "distribution's base; use uniform or normal")


def low_precision_distribution(checker: Checker, dist: Distribution, dtype: str, parts: list) -> None:
    """Refused where the draw reaches past ``dtype``'s largest finite value (448 for float8_e4m3fn,
    57344 for float8_e5m2), which rounds to NaN or Inf: uniform and integers bounds, and a normal
    draw's mean ± 6 std (a value further out is clipped to the range, see suite/draw.py)."""
    limit = float(finfo(dtype).max)
    if dist.distribution == "normal":
        reach = abs(dist.mean) + NORMAL_SPAN * dist.std
        if reach > limit:
            checker.add(parts, f"mean ± {NORMAL_SPAN} std reaches {reach:g}, beyond {dtype}'s largest value "
                               f"{limit:g}; lower mean or std so the draws stay representable")
        return
    for key in ("low", "high"):
        value = getattr(dist, key)
        if abs(value) > limit:
            checker.add(parts + [key], f"{value:g} is beyond {dtype}'s largest value {limit:g} (it would round to "
                                       f"NaN or Inf); keep the range within ±{limit:g}")
