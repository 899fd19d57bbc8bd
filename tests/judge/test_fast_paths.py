"""The judge's fast paths give exactly the verdicts of the straightforward formulas they replaced
(the judge as of 5ad7a70, kept here as the oracle): every field of every check, bit for bit, on
outputs that pass, fail, hold NaN, infinities and signed zeros, are integers, or are trivial fakes.
Both take their Euclidean norms from one primitive (judge/norms.py, checked against numpy's below)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_cudagate.judge.norms import euclidean_norm
from pytest_cudagate.judge.elementwise import OutputCheck, _scalar, check_output
from pytest_cudagate.judge.output_scale import SCALE_FRACTION, MIN_ELEMENTS, ScaleVerdict, Trivial, trivial_output
from pytest_cudagate.suite.model import Tolerance


def oracle_trivial(expected, atol, rtol):
    e = np.asarray(expected).reshape(-1).astype(np.float64)
    if e.size == 0 or not np.all(np.isfinite(e)):
        return None
    allowed = atol + rtol * np.abs(e)
    if np.all(np.abs(e) <= allowed):
        return Trivial("all zeros", 0.0, euclidean_norm(e))
    best = None
    for value in dict.fromkeys((float(np.mean(e)), float(np.median(e)), float((e.min() + e.max()) / 2))):
        if not np.all(np.abs(value - e) <= allowed):
            continue
        distance = euclidean_norm(e - value)
        if best is None or distance < best.distance:
            best = Trivial(f"the constant {value:.6g}", value, distance)
    return best


def oracle_scale(actual, expected, atol, rtol):
    if np.asarray(expected).size < MIN_ELEMENTS:
        return None
    trivial = oracle_trivial(expected, atol, rtol)
    if trivial is None or trivial.distance == 0.0:
        return None
    a = np.asarray(actual).reshape(-1).astype(np.float64)
    e = np.asarray(expected).reshape(-1).astype(np.float64)
    error = euclidean_norm(a - e) if np.all(np.isfinite(a)) else float("inf")
    fraction = error / trivial.distance
    wrote = ""
    if a.size and np.all(a == 0):
        wrote = "all zeros"
    elif a.size and np.all(a == a[0]):
        wrote = f"the constant {a[0]:.6g} everywhere"
    return ScaleVerdict(fraction <= SCALE_FRACTION, trivial, error, fraction, wrote)


def oracle_check(name, actual, expected, tol, shape=None, unwritten=0):
    a = actual.reshape(-1).astype(np.float64)
    e = expected.reshape(-1).astype(np.float64)
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    finite = np.isfinite(a) & np.isfinite(e)
    allowed = tol.atol + tol.rtol * np.abs(e)
    diff = np.where(finite, np.abs(a - e), np.inf)
    ok = finite & (diff <= allowed)
    if actual.dtype.kind in "iu" and expected.dtype.kind in "iu":
        ints = zip(actual.reshape(-1).tolist(), expected.reshape(-1).tolist())
        ok = np.fromiter((abs(x - y) <= tol.atol + tol.rtol * abs(y) for x, y in ints), dtype=bool, count=a.size)
    ok |= np.isinf(e) & (a == e)
    if tol.nan == "equal":
        ok |= e_nan & a_nan
    mismatches = int(np.count_nonzero(~ok))
    both = finite
    ref_norm = euclidean_norm(e[both]) if both.any() else 0.0
    err_norm = euclidean_norm((a - e)[both]) if both.any() else 0.0
    if mismatches and not both.all():
        err_norm = float("inf") if (~ok & ~both).any() else err_norm
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    max_abs = float(diff[both].max()) if both.any() else 0.0
    norm_ok = tol.max_rel_norm is None or rel_norm <= tol.max_rel_norm
    passed = mismatches == 0 and norm_ok
    scale = None
    if passed:
        scale = oracle_scale(actual, expected, tol.atol, tol.rtol)
        passed = scale is None or scale.ok
    worst = None
    if mismatches and (~ok).any():
        excess = np.where(ok, -1.0, np.where(finite, diff / np.maximum(allowed, np.finfo(np.float64).tiny), np.inf))
        flat = int(np.argmax(excess))
        worst = np.unravel_index(flat, shape) if shape and int(np.prod(shape)) == a.size else (flat,)
        worst = tuple(int(i) for i in worst)
        worst_values = (_scalar(expected.reshape(-1)[flat]), _scalar(actual.reshape(-1)[flat]), float(allowed[flat]))
    return OutputCheck(name, passed, int(a.size), mismatches, rel_norm, max_abs, worst,
                       worst_values[0] if worst else None, worst_values[1] if worst else None,
                       worst_values[2] if worst else None, tol.max_rel_norm, unwritten, tol, scale)


def outputs(kind: str, size: int, rng: np.random.Generator):
    """(expected, actual) of one kind of kernel output."""
    e = rng.uniform(-50, 50, size).astype(np.float32)
    if kind == "right":
        return e, (e.astype(np.float64) * (1 + rng.normal(0, 1e-7, size))).astype(np.float32)
    if kind == "exact":
        return e, e.copy()
    if kind == "wrong":
        a = e.copy()
        a[rng.choice(size, max(1, size // 100), replace=False)] += 1
        return e, a
    if kind == "zeros":
        return e, np.zeros_like(e)
    if kind == "tiny":  # zeros pass the tolerance: the scale rule decides
        small = (e * 1e-9).astype(np.float32)
        return small, np.zeros_like(small)
    if kind == "nearly-constant":  # a constant passes the tolerance
        flat = (0.5 + e * 1e-8).astype(np.float32)
        return flat, np.full_like(flat, 0.5)
    if kind == "specials":
        e[::7], e[1::11], e[2::13], e[3::17] = np.nan, np.inf, -np.inf, -0.0
        a = e.copy()
        a[5::19] = np.nan
        a[3::17] = 0.0
        return e, a
    if kind == "integers":
        ints = rng.integers(-2**40, 2**40, size)
        return ints, ints + (rng.random(size) < 0.01)
    raise AssertionError(kind)


@pytest.mark.parametrize("size", [1, 40, 5000, 300_000])
@pytest.mark.parametrize("kind", ["right", "exact", "wrong", "zeros", "tiny", "nearly-constant", "specials", "integers"])
@pytest.mark.parametrize("tol", [Tolerance(atol=1e-4, rtol=1e-4), Tolerance(atol=1e-6, rtol=1e-5, nan="equal"),
                                 Tolerance(atol=1e-3, rtol=0.0, max_rel_norm=1e-7)])
def test_check_output_equals_the_oracle(size, kind, tol):
    expected, actual = outputs(kind, size, np.random.default_rng([size, len(kind)]))
    with np.errstate(all="ignore"):
        want = oracle_check("c", actual, expected, tol, (size,), 3)
    assert repr(check_output("c", actual, expected, tol, (size,), 3)) == repr(want)


@pytest.mark.parametrize("kind", ["right", "zeros", "tiny", "nearly-constant"])
@pytest.mark.parametrize("atol, rtol", [(1e-4, 1e-4), (1e-6, 1e-5), (1.0, 0.0), (0.0, 0.5), (100.0, 0.0)])
def test_trivial_output_equals_the_oracle(kind, atol, rtol):
    expected, _ = outputs(kind, 20000, np.random.default_rng(len(kind)))
    assert repr(trivial_output(expected, atol, rtol)) == repr(oracle_trivial(expected, atol, rtol))


def test_a_constant_at_the_edge_of_the_tolerance_is_still_found():
    # Every interval [e - allowed, e + allowed] just touches 1.0: only that constant passes.
    expected = np.array([0.5, 1.5] * 32)
    assert trivial_output(expected, 0.5, 0.0) == oracle_trivial(expected, 0.5, 0.0) == Trivial(
        "the constant 1", 1.0, 4.0)


@pytest.mark.parametrize("values", [np.zeros(0), np.array([3.0, -4.0]), np.linspace(-7, 9, 100_003),
                                    np.array([1.0, np.nan]), np.array([np.inf, 1.0]), np.zeros(5)],
                         ids=["empty", "3-4-5", "long", "nan", "inf", "zeros"])
def test_norm_is_the_euclidean_norm(values):
    """The BLAS-free norm agrees with numpy's to rounding, and carries NaN and infinities as it does."""
    want = float(np.linalg.norm(values))
    got = euclidean_norm(values.reshape(-1, 1) if values.size % 2 == 0 and values.size else values)
    if np.isnan(want):
        assert np.isnan(got)
    else:
        assert got == pytest.approx(want, rel=1e-13, abs=0.0)


@pytest.mark.parametrize("scale", [1e200, 1e-200], ids=["overflowing squares", "underflowing squares"])
def test_norm_of_values_whose_squares_leave_float64(scale):
    """Squares past float64's range (where numpy's norm says inf or 0): still the norm, so a relative
    norm of such an output still judges it; integers count as their float64 values."""
    assert euclidean_norm(np.array([3.0, -4.0]) * scale) == pytest.approx(5 * scale, rel=1e-15)
    e = np.full(100, 7.0 * scale)
    assert euclidean_norm(e * (1 + 1e-7) - e) / euclidean_norm(e) == pytest.approx(1e-7, rel=1e-6)
    assert euclidean_norm(np.array([2**32, 2**32], dtype=np.int64)) == pytest.approx(2**32 * 2**0.5, rel=1e-15)


def test_a_huge_float64_output_is_held_to_max_rel_norm():
    """rel_norm of outputs near float64's limit: once 0 (inf over inf read as passing), now the real 1e-7."""
    expected = np.full(100, 1e160)
    result = check_output("c", expected * (1 + 1e-7), expected, Tolerance(atol=0.0, rtol=1e-6, max_rel_norm=1e-8), (100,))
    assert not result.ok and result.rel_norm == pytest.approx(1e-7, rel=1e-6)
