"""Tolerances judged against the output's own scale.

An absolute tolerance (``atol``) chosen for outputs of order one lets a kernel that writes zeros
pass when a case's expected outputs are tiny; and a case whose expected output is nearly constant
lets a kernel that writes that constant pass. Both are visible from the expected output and the
tolerance alone: if a *trivial* output (all zeros, or one constant) would pass the elementwise
tolerance, the tolerance cannot tell a kernel from a fake on that case.

The gate then applies a second rule (:func:`scale_check`): the kernel's error must be at most
:data:`SCALE_FRACTION` of the distance between the expected output and that trivial output (both
as Euclidean norms). A correct float32 kernel is many orders of magnitude inside it; zeros or a
constant sit exactly at 100 %.

At signing time (:func:`flag_cases`, for ``cudagate check``, ``cudagate cases generate`` and
``cudagate sign``) the same test flags such cases so a maintainer can fix the data or the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cudagate_harness.protocol import LOW_PRECISION, finfo, unit_roundoff, values

from pytest_cudagate.judge.norms import euclidean_norm
from pytest_cudagate.judge.ulp import allowed as ulp_allowed
from pytest_cudagate.suite.model import default_rtol

SCALE_FRACTION = 0.25  # the error may be at most this fraction of the distance to a passing trivial output
MIN_ELEMENTS = 32  # below this an output's "scale" means little; flag_cases still reports such outputs


@dataclass(frozen=True)
class Trivial:
    """A trivial output that passes the elementwise tolerance on an expected output."""

    label: str  # "all zeros", "the constant 0.5"
    value: float
    distance: float  # ||expected - value||


@dataclass(frozen=True)
class Allowance:
    """What decides whether a trivial output passes on an expected output ``e`` with per-element
    allowance ``allowed = atol + rtol*|e|``; the elementwise check gathers it in its own pass."""

    zeros_pass: bool  # every |e| <= allowed
    lowest_top: float  # min(e + allowed)
    highest_bottom: float  # max(e - allowed)
    largest: float  # max |e|
    widest: float  # max allowed

    @classmethod
    def of(cls, e: np.ndarray, magnitude: np.ndarray, allowed: np.ndarray) -> Allowance:
        return cls(bool(np.all(magnitude <= allowed)), float(np.min(e + allowed)), float(np.max(e - allowed)),
                   float(np.max(magnitude)), float(np.max(allowed)))

    def merged(self, other: Allowance) -> Allowance:
        """Both parts of an output together (min and max are exact, so blocks merge without rounding)."""
        return Allowance(self.zeros_pass and other.zeros_pass, min(self.lowest_top, other.lowest_top),
                         max(self.highest_bottom, other.highest_bottom), max(self.largest, other.largest),
                         max(self.widest, other.widest))

    def constant_may_pass(self) -> bool:
        """False only when no constant can pass: one that does lies in every [e - allowed, e + allowed],
        so max(e - allowed) <= min(e + allowed) up to rounding, for which the margin allows generously.
        On a real output the intervals are far apart, and this saves the mean, the median and three
        passes over the output that cannot succeed."""
        margin = 8 * np.finfo(np.float64).eps * (self.largest + self.widest)
        return not self.highest_bottom - self.lowest_top > margin


def trivial_output(expected: np.ndarray, atol: float, rtol: float, ulp: int | None = None,
                   dtype: str | None = None) -> Trivial | None:
    """The trivial output nearest to ``expected`` that passes ``|t - e| <= atol + rtol*|e|`` (or
    ``ulp`` units of ``e`` in ``dtype``) everywhere, or None. Only finite expected outputs qualify (a
    constant never matches an infinity or a NaN)."""
    e = np.asarray(expected).reshape(-1).astype(np.float64)
    if e.size == 0 or not np.all(np.isfinite(e)):
        return None
    magnitude = np.abs(e)
    allowed = ulp_allowed(atol, rtol, ulp, dtype, e, magnitude)
    return trivial_given(e, Allowance.of(e, magnitude, allowed), euclidean_norm(e), lambda: allowed)


def trivial_given(e: np.ndarray, allowance: Allowance, norm: float, allowed) -> Trivial | None:
    """:func:`trivial_output` of the finite, non-empty float64 output ``e`` from its
    :class:`Allowance` and ``norm`` (||e||); ``allowed()`` gives the allowance array, needed only
    when a constant may pass (rare: the expected output is nearly constant)."""
    if allowance.zeros_pass:  # zeros first: the fake people actually write
        return Trivial("all zeros", 0.0, norm)
    if not allowance.constant_may_pass():
        return None
    allowed = allowed()
    best = None
    for value in dict.fromkeys((float(np.mean(e)), float(np.median(e)), float((e.min() + e.max()) / 2))):
        if not np.all(np.abs(value - e) <= allowed):
            continue
        distance = euclidean_norm(e - value)
        if best is None or distance < best.distance:
            best = Trivial(f"the constant {value:.6g}", value, distance)
    return best


@dataclass(frozen=True)
class ScaleVerdict:
    ok: bool
    trivial: Trivial
    error_norm: float
    fraction: float  # error_norm / trivial.distance
    wrote: str = ""  # what the kernel's output looks like, when it is itself trivial

    def describe(self, buffer: str, atol: float) -> str:
        wrote = self.wrote or "values unrelated to the expected output"
        return (f"output {buffer!r}: {self.trivial.label} would pass its tolerance on this case (atol={atol:g} is not "
                f"small against the expected values), so the error is also judged against the output's own scale: "
                f"it is {self.fraction:.0%} of the distance from the expected output to {self.trivial.label} "
                f"(limit {SCALE_FRACTION:.0%}); the kernel wrote {wrote}")


def scale_check(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float, ulp: int | None = None,
                dtype: str | None = None) -> ScaleVerdict | None:
    """None when the tolerance alone can tell a trivial output from the expected one (nothing to add),
    when the expected output is exactly constant (then nothing can: :func:`flag_cases` says so), or
    when it has fewer than :data:`MIN_ELEMENTS` elements."""
    if np.asarray(expected).size < MIN_ELEMENTS:
        return None
    trivial = trivial_output(expected, atol, rtol, ulp, dtype)
    if trivial is None:
        return None
    a = np.asarray(actual).reshape(-1).astype(np.float64)
    e = np.asarray(expected).reshape(-1).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        error = euclidean_norm(a - e) if np.all(np.isfinite(a)) else float("inf")
    return scale_verdict(actual, trivial, error)


def scale_verdict(actual: np.ndarray, trivial: Trivial, error: float) -> ScaleVerdict | None:
    """The rule itself, given the trivial output that passes and the kernel's error ||actual - e||
    (None when the expected output is exactly that trivial output)."""
    if trivial.distance == 0.0:
        return None
    fraction = error / trivial.distance
    a = np.asarray(actual).reshape(-1)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)  # integers compare as the float64 values the error was taken from
    wrote = ""
    if a.size and np.all(a == 0):
        wrote = "all zeros"
    elif a.size and np.all(a == a[0]):
        wrote = f"the constant {float(a[0]):.6g} everywhere"
    return ScaleVerdict(fraction <= SCALE_FRACTION, trivial, error, fraction, wrote)


def degenerate_outputs(suite, case) -> list[str]:
    """Why a case's expected outputs cannot tell a kernel from a trivial fake (empty: they can, or the
    suite says ``constant_ok: true`` on the case: a maintainer signed that a constant may pass it)."""
    if case.constant_ok:
        return []
    problems = []
    for param in suite.outputs:
        path = suite.resolved(case).expected[param.name]
        try:
            expected = values(np.load(path, allow_pickle=False))
        except (OSError, ValueError, EOFError):
            continue  # missing or unreadable data is check_case_data's to report
        tol = suite.tolerance.get(param.name)
        if tol is None or expected.size == 0:
            continue
        e = expected.reshape(-1).astype(np.float64)
        finite = e[np.isfinite(e)]
        if finite.size == e.size and finite.size > 1 and np.all(finite == finite[0]):
            problems.append(f"case {case.name}: output {param.name!r} is constant (every element is {finite[0]:.6g}): "
                            f"a kernel that writes that constant passes it; draw inputs with real variation (or, where that "
                            f"is meant, set `constant_ok: true` on the case)")
            continue
        trivial = trivial_output(expected, tol.atol, tol.rtol, tol.ulp, param.dtype)
        if trivial is not None:
            biggest = float(np.max(np.abs(finite))) if finite.size else 0.0
            problems.append(f"case {case.name}: output {param.name!r}: {trivial.label} passes its tolerance "
                            f"(atol={tol.atol:g}, rtol={tol.rtol:g}; the largest |expected| is {biggest:.3g}), so on "
                            f"correctness alone a kernel writing {trivial.label} passes this case; the gate also "
                            f"requires the error to stay under {SCALE_FRACTION:.0%} of the output's own scale, but "
                            f"widen the inputs or tighten atol so the tolerance itself means something (or, where a "
                            f"constant passing is meant, as in a one-element case, set `constant_ok: true` on the case)")
    return problems


def tolerance_flags(suite) -> list[str]:
    """A bfloat16 or float8 output's tolerance that its type makes meaningless: looser than the type
    can express (rtol of 1 or more lets zeros pass anywhere, an atol of the largest finite value lets
    any finite output pass), or tighter than the reference's own rounding (rtol below 2u, one unit in
    the last place where units are widest, fails a kernel whose float32 result rounds the other way;
    an exact tolerance, atol and rtol 0, is taken as meant)."""
    flags = []
    for param in suite.outputs:
        tol = suite.tolerance.get(param.name)
        if param.dtype not in LOW_PRECISION or tol is None:
            continue
        ulp, largest, where = 2 * unit_roundoff(param.dtype), float(finfo(param.dtype).max), f"tolerance.{param.name}"
        if tol.rtol >= 1 or tol.atol >= largest:
            what = f"rtol={tol.rtol:g} lets an output of zeros pass" if tol.rtol >= 1 else \
                f"atol={tol.atol:g} is at least {param.dtype}'s largest value {largest:g}, so any finite output passes"
            flags.append(f"{where}: looser than {param.dtype} can express: {what}; tighten it (leave rtol out for "
                         f"the default {default_rtol(param.dtype):g}, 4 units of roundoff)")
        elif tol.rtol < ulp and (tol.rtol, tol.atol) != (0.0, 0.0):
            beyond = f" wherever |expected| > atol/{ulp:g} = {tol.atol / ulp:.3g}" if tol.atol else ""
            flags.append(f"{where}: rtol={tol.rtol:g} is tighter than the reference's own rounding to {param.dtype}: "
                         f"its outputs are rounded to {param.dtype}, whose unit in the last place is up to {ulp:g} "
                         f"(2u) of a value, so a correct kernel whose float32 result rounds the other way fails"
                         f"{beyond}; use rtol of at least {ulp:g} (leave it out for the default "
                         f"{default_rtol(param.dtype):g})")
    return flags


def flag_cases(suite) -> list[str]:
    """Every low-precision output's meaningless tolerance (:func:`tolerance_flags`), and every case of
    ``suite`` whose expected output is (nearly) constant under its tolerance.

    For ``cudagate check``, ``cudagate cases generate`` and ``cudagate sign``: warnings a
    maintainer should read before signing, not errors (a suite may still be signed)."""
    return tolerance_flags(suite) + [problem for case in suite.cases for problem in degenerate_outputs(suite, case)]
