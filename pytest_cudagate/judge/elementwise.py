"""Elementwise check of one output against its expected output under a suite tolerance.

(In cudagate "compare" means one thing only: the interleaved latency comparison of a kernel with
its approved version, the worker's ``compare`` op.)

Elementwise ``|actual - expected| <= atol + rtol * |expected|`` with explicit rules for the values
that rule says nothing about: NaN in the output fails unless the expected value is NaN and the
suite says ``nan: equal``; an infinity must match exactly, sign included; -0.0 equals 0.0. With
``ulp: n`` a finite element also passes within n units in the last place of the expected value in the
output's own type (:mod:`pytest_cudagate.judge.ulp`): its allowance is the larger of the two. The
relative norm ``||actual - expected|| / ||expected||`` is always reported, and is a rule of its
own when the suite sets ``max_rel_norm``. When an all-zeros or constant output would pass the
tolerance, the error is also judged against the output's own scale (:mod:`pytest_cudagate.judge.output_scale`).
A bfloat16 or float8 output (its bits, see cudagate_harness.protocol.DTYPES) is judged on its
values, converted exactly to float32 and compared in float64 like any float output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cudagate_harness.protocol import dtype_name, values

from pytest_cudagate.judge.norms import euclidean_norm
from pytest_cudagate.judge.output_scale import MIN_ELEMENTS, Allowance, ScaleVerdict, scale_check, scale_verdict, trivial_given
from pytest_cudagate.judge.ulp import ULP_DTYPES, allowed as allowance_of, distance
from pytest_cudagate.suite.model import Tolerance
from pytest_cudagate.boundary.wire import derived, json_field

BLOCK = 1 << 14  # elements per step of the one-pass check: its float64 temporaries stay in the CPU cache


@dataclass(frozen=True)
class OutputCheck:
    buffer: str
    ok: bool
    total: int
    mismatches: int
    rel_norm: float
    max_abs_error: float
    worst_index: tuple[int, ...] | None = None
    worst_expected: float | None = None
    worst_actual: float | None = None
    worst_allowed: float | None = None
    rel_norm_limit: float | None = None
    unwritten: int = 0
    tolerance: Tolerance | None = None
    # The output-scale rule, when a trivial output passes the tolerance; its words are the description's.
    scale: ScaleVerdict | None = json_field(hidden=True, default=None)
    # The worst element's distance in ulps, under a tolerance with `ulp`; said in the description.
    worst_ulp: float | None = json_field(hidden=True, default=None)

    @derived("description")
    def describe(self) -> str:
        tol = self.tolerance
        if self.ok:
            return (f"output {self.buffer!r}: {self.total} elements within tolerance "
                    f"(max |error| {self.max_abs_error:.3g}, relative norm {self.rel_norm:.3g})")
        if self.mismatches:
            lines = [f"output {self.buffer!r}: {self.mismatches} of {self.total} elements outside tolerance "
                     f"(atol={tol.atol:g}, rtol={tol.rtol:g}{_ulp_text(tol)}, nan={tol.nan})"]
        elif self.scale is not None and not self.scale.ok:
            lines = [self.scale.describe(self.buffer, tol.atol)]
        else:
            lines = [f"output {self.buffer!r}: relative norm error {self.rel_norm:.3g} exceeds max_rel_norm {self.rel_norm_limit:g}"]
        if self.unwritten:
            lines.append(f"  {self.unwritten} elements were never written by the kernel (still held the poison pattern)")
        if self.worst_index is not None:
            index = self.worst_index[0] if len(self.worst_index) == 1 else list(self.worst_index)
            ulps = f" ({self.worst_ulp:.3g} ulp)" if self.worst_ulp is not None else ""
            lines.append(f"  worst at index {index}: expected {self.worst_expected!r}, actual {self.worst_actual!r}, "
                         f"|diff| {abs_diff(self.worst_actual, self.worst_expected)}{ulps} > allowed "
                         f"{self.worst_allowed:.3g}")
        limit = f" (limit {self.rel_norm_limit:g})" if self.rel_norm_limit is not None else ""
        lines.append(f"  relative norm error {self.rel_norm:.3g}{limit}; max |error| {self.max_abs_error:.3g}")
        return "\n".join(lines)


def _ulp_text(tol: Tolerance) -> str:
    return f", ulp={tol.ulp}" if tol.ulp is not None else ""


def _worst_ulp(actual, expected, dtype: str | None) -> float | None:
    """The worst element's distance in ulps (None without a `ulp` tolerance, or where either value is not finite)."""
    if dtype is None or not (np.isfinite(actual) and np.isfinite(expected)):
        return None
    return distance(float(actual), float(expected), dtype)


def abs_diff(a, b) -> str:
    try:
        return f"{abs(float(a) - float(b)):.3g}"
    except (TypeError, ValueError):
        return "n/a"


def check_output(name: str, actual: np.ndarray, expected: np.ndarray, tol: Tolerance,
            shape: tuple[int, ...] | None = None, unwritten: int = 0, *, output_scale: bool = True) -> OutputCheck:
    # inf - inf and 0 * inf are expected along the way; a project running with -W error must not
    # see a correct kernel fail on them.
    # The type whose ulps a `ulp` tolerance counts: the output's own (refused on integers by the loader).
    dtype = dtype_name(actual.dtype) if tol.ulp is not None else None
    dtype = dtype if dtype in ULP_DTYPES else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _check_output(name, values(actual), values(expected), tol, shape, unwritten, output_scale, dtype)


def _check_output(name, actual, expected, tol, shape, unwritten, output_scale=True, dtype=None) -> OutputCheck:
    if actual.size != expected.size:
        return OutputCheck(name, False, int(expected.size), int(expected.size), float("inf"), float("inf"),
                          tolerance=tol, unwritten=unwritten)
    if actual.size and not (actual.dtype.kind in "iu" and expected.dtype.kind in "iu") \
            and _all_finite(actual) and _all_finite(expected):
        return _check_finite(name, actual, expected, tol, shape, unwritten, output_scale, dtype)
    a = actual.reshape(-1).astype(np.float64)
    e = expected.reshape(-1).astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(e)
    everywhere = bool(finite.all())  # the usual case: no masked copies below
    allowed = allowance_of(tol.atol, tol.rtol, tol.ulp, dtype, e)
    error = a - e
    diff = np.abs(error)
    if not everywhere:
        diff[~finite] = np.inf
    ok = finite & (diff <= allowed)
    if actual.dtype.kind in "iu" and expected.dtype.kind in "iu":
        # float64 cannot tell 2**53 from 2**53 + 1: integers are compared in exact Python arithmetic.
        ints = zip(actual.reshape(-1).tolist(), expected.reshape(-1).tolist())
        ok = np.fromiter((abs(x - y) <= tol.atol + tol.rtol * abs(y) for x, y in ints), dtype=bool, count=a.size)
    ok |= np.isinf(e) & (a == e)  # infinities must match exactly, sign included
    if tol.nan == "equal":
        ok |= np.isnan(e) & np.isnan(a)
    mismatches = int(np.count_nonzero(~ok))

    both = finite
    if everywhere:
        ref_norm, err_norm = euclidean_norm(e), euclidean_norm(error)  # 0.0 when empty
        max_abs = float(diff.max()) if e.size else 0.0
    else:
        any_finite = bool(both.any())
        ref_norm, err_norm = euclidean_norm(e[both]), euclidean_norm(error[both])
        if mismatches:
            err_norm = float("inf") if (~ok & ~both).any() else err_norm
        max_abs = float(diff[both].max()) if any_finite else 0.0
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    norm_ok = tol.max_rel_norm is None or rel_norm <= tol.max_rel_norm
    passed = mismatches == 0 and norm_ok
    scale = None
    if passed and output_scale:
        scale = scale_check(actual, expected, tol.atol, tol.rtol, tol.ulp, dtype)
        passed = scale is None or scale.ok

    worst = None
    if mismatches and (~ok).any():
        # Non-finite mismatches first, then the element furthest beyond its allowance.
        excess = np.where(ok, -1.0, np.where(finite, diff / np.maximum(allowed, np.finfo(np.float64).tiny), np.inf))
        flat = int(np.argmax(excess))
        worst = np.unravel_index(flat, shape) if shape and int(np.prod(shape)) == a.size else (flat,)
        worst = tuple(int(i) for i in worst)
        worst_values = (_scalar(expected.reshape(-1)[flat]), _scalar(actual.reshape(-1)[flat]), float(allowed[flat]))
    return OutputCheck(
        buffer=name, ok=passed, total=int(a.size), mismatches=mismatches, rel_norm=rel_norm,
        max_abs_error=max_abs, worst_index=worst,
        worst_expected=worst_values[0] if worst else None,
        worst_actual=worst_values[1] if worst else None,
        worst_allowed=worst_values[2] if worst else None,
        rel_norm_limit=tol.max_rel_norm, unwritten=unwritten, tolerance=tol, scale=scale,
        worst_ulp=_worst_ulp(a[flat], e[flat], dtype) if worst else None,
    )


def _all_finite(x: np.ndarray) -> bool:
    """No NaN or infinity, in two passes without a temporary (min and max are NaN or infinite if any element is)."""
    return x.dtype.kind != "f" or bool(np.isfinite(x.min()) and np.isfinite(x.max()))


def _check_finite(name, actual, expected, tol, shape, unwritten, output_scale, dtype=None) -> OutputCheck:
    """:func:`_check_output` where every element of both arrays is finite (a kernel that is right or
    nearly right): the same float64 arithmetic, bit for bit, in one pass of cache-sized blocks that
    also gathers what the output-scale rule needs; only the two norms read the full float64 arrays
    (so they are the very sums the general path takes)."""
    n = int(expected.size)
    a_flat, e_flat = actual.reshape(-1), expected.reshape(-1)
    e, error = np.empty(n, np.float64), np.empty(n, np.float64)
    mismatches, max_abs, allowance = 0, 0.0, None
    scaled = output_scale and n >= MIN_ELEMENTS
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        eb, err = e[start:stop], error[start:stop]
        np.copyto(eb, e_flat[start:stop], casting="unsafe")
        np.subtract(a_flat[start:stop], eb, out=err, casting="unsafe")
        magnitude = np.abs(eb)
        allowed = allowance_of(tol.atol, tol.rtol, tol.ulp, dtype, eb, magnitude)
        diff = np.abs(err)
        mismatches += int(np.count_nonzero(diff > allowed))  # diff is never NaN here: finite minus finite
        max_abs = max(max_abs, float(diff.max()))
        if scaled and not mismatches:
            block = Allowance.of(eb, magnitude, allowed)
            allowance = block if allowance is None else allowance.merged(block)
    ref_norm, err_norm = euclidean_norm(e), euclidean_norm(error)
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    passed = mismatches == 0 and (tol.max_rel_norm is None or rel_norm <= tol.max_rel_norm)
    scale = None
    if passed and scaled:
        trivial = trivial_given(e, allowance, ref_norm, lambda: allowance_of(tol.atol, tol.rtol, tol.ulp, dtype, e))
        scale = scale_verdict(actual, trivial, err_norm) if trivial is not None else None
        passed = scale is None or scale.ok
    worst = worst_values = None
    if mismatches:
        allowed = allowance_of(tol.atol, tol.rtol, tol.ulp, dtype, e)
        diff = np.abs(error)
        excess = np.where(diff <= allowed, -1.0, diff / np.maximum(allowed, np.finfo(np.float64).tiny))
        flat = int(np.argmax(excess))
        worst = np.unravel_index(flat, shape) if shape and int(np.prod(shape)) == n else (flat,)
        worst = tuple(int(i) for i in worst)
        worst_values = (_scalar(e_flat[flat]), _scalar(a_flat[flat]), float(allowed[flat]))
    return OutputCheck(
        buffer=name, ok=passed, total=n, mismatches=mismatches, rel_norm=rel_norm, max_abs_error=max_abs,
        worst_index=worst, worst_expected=worst_values[0] if worst else None,
        worst_actual=worst_values[1] if worst else None, worst_allowed=worst_values[2] if worst else None,
        rel_norm_limit=tol.max_rel_norm, unwritten=unwritten, tolerance=tol, scale=scale,
        worst_ulp=_worst_ulp(a_flat[flat], e[flat], dtype) if worst else None)


def _scalar(value):
    value = value.item()
    return value if not isinstance(value, float) or np.isfinite(value) else float(value)
