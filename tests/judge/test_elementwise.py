"""The tolerance rule and its explicit treatment of NaN, infinities, signed zero and norms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pytest_cudagate.judge.elementwise import check_output
from pytest_cudagate.suite.model import Tolerance

inf, nan = float("inf"), float("nan")


def cmp(actual, expected, dtype=np.float64, shape=None, **tol):
    return check_output("y", np.array(actual, dtype=dtype), np.array(expected, dtype=dtype), Tolerance(**tol), shape)


def test_exact_match_with_zero_tolerance():
    result = cmp([1.0, -2.5, 3e30], [1.0, -2.5, 3e30])
    assert result.ok and result.mismatches == 0 and result.total == 3
    assert result.rel_norm == 0.0 and result.max_abs_error == 0.0
    assert result.worst_index is None


def test_any_difference_fails_with_zero_tolerance():
    result = cmp([1.0, np.nextafter(2.0, 3.0)], [1.0, 2.0])
    assert not result.ok and result.mismatches == 1


def test_within_atol():
    assert cmp([0.5, 1.2], [0.5, 1.0], atol=0.25).ok


def test_within_rtol():
    # 1000.5 vs 1000: |diff| 0.5 <= 1e-3 * 1000
    assert cmp([1000.5], [1000.0], rtol=1e-3).ok
    assert not cmp([1000.5], [1000.0], atol=0.25).ok


def test_atol_and_rtol_add_up():
    # allowed = 0.25 + 0.25 * 2 = 0.75
    assert cmp([2.75], [2.0], atol=0.25, rtol=0.25).ok
    assert not cmp([2.875], [2.0], atol=0.25, rtol=0.25).ok


def test_the_boundary_is_inclusive_and_the_next_value_fails():
    # Exactly representable numbers, so the boundary is exact.
    assert cmp([1.25], [1.0], atol=0.25).ok
    assert cmp([0.75], [1.0], atol=0.25).ok
    assert not cmp([np.nextafter(1.25, 2.0)], [1.0], atol=0.25).ok
    assert not cmp([np.nextafter(0.75, 0.0)], [1.0], atol=0.25).ok


def test_rtol_uses_the_expected_value_not_the_actual():
    # |4 - 2| = 2 <= 1.0 * |2|; with |actual| it would also pass, so check the other way round
    assert cmp([4.0], [2.0], rtol=1.0).ok
    assert not cmp([2.0], [4.0], rtol=0.4).ok  # allowed 1.6 < 2


def test_nan_in_actual_fails():
    result = cmp([1.0, nan, 3.0], [1.0, 2.0, 3.0], atol=1e9, rtol=1e9)
    assert not result.ok and result.mismatches == 1
    assert result.worst_index == (1,)


def test_nan_expected_and_nan_actual_with_nan_equal_passes():
    assert cmp([1.0, nan], [1.0, nan], nan="equal").ok


def test_nan_expected_and_nan_actual_with_nan_fail_fails():
    result = cmp([1.0, nan], [1.0, nan], nan="fail", atol=1.0)
    assert not result.ok and result.mismatches == 1


def test_nan_expected_but_a_number_actual_fails_even_with_nan_equal():
    assert not cmp([1.0, 0.0], [1.0, nan], nan="equal", atol=1e9).ok


def test_nan_equal_does_not_excuse_nan_where_a_number_is_expected():
    assert not cmp([nan], [1.0], nan="equal", atol=1e9).ok


@pytest.mark.parametrize("value", [inf, -inf])
def test_infinities_that_match_pass(value):
    assert cmp([1.0, value], [1.0, value]).ok


@pytest.mark.parametrize(("actual", "expected"), [(-inf, inf), (inf, -inf)])
def test_infinity_of_the_wrong_sign_fails(actual, expected):
    result = cmp([actual], [expected], atol=1e300, rtol=1e300)
    assert not result.ok and result.mismatches == 1


@pytest.mark.parametrize("actual", [inf, -inf])
def test_infinity_where_a_number_is_expected_fails(actual):
    result = cmp([1.0, actual], [1.0, 2.0], atol=1e300, rtol=1e300)
    assert not result.ok
    assert result.worst_index == (1,)
    assert result.rel_norm == inf


def test_a_number_where_infinity_is_expected_fails():
    assert not cmp([1e308], [inf], atol=1e300, rtol=1e300).ok


def test_minus_zero_equals_zero():
    assert cmp([-0.0, 0.0], [0.0, -0.0]).ok
    assert cmp([-0.0], [0.0], dtype=np.float32).ok


def test_denormals():
    tiny = np.finfo(np.float64).smallest_subnormal
    assert cmp([2 * tiny], [2 * tiny]).ok
    assert not cmp([3 * tiny], [2 * tiny]).ok  # zero tolerance sees a one-ulp subnormal difference
    assert cmp([3 * tiny], [2 * tiny], rtol=0.5).ok
    # float32 subnormals flushed to zero by a kernel: within a small atol, not without one.
    sub32 = np.float32(1e-40)
    assert not cmp([0.0], [sub32], dtype=np.float32).ok
    assert cmp([0.0], [sub32], dtype=np.float32, atol=1e-38).ok


def test_integer_outputs():
    result = cmp([1, 2, 4, -7], [1, 2, 3, -7], dtype=np.int32)
    assert not result.ok and result.mismatches == 1 and result.worst_index == (2,)
    assert result.worst_expected == 3 and result.worst_actual == 4
    assert isinstance(result.worst_expected, int)
    assert cmp([1, 2, 4], [1, 2, 3], dtype=np.int32, atol=1).ok


def test_unsigned_outputs_do_not_wrap():
    # actual - expected would wrap to a huge number in uint32 arithmetic
    result = cmp([1, 5], [2, 5], dtype=np.uint32, atol=1)
    assert result.ok
    assert not cmp([0], [4294967295], dtype=np.uint32, atol=1).ok


@pytest.mark.parametrize(("dtype", "actual", "expected"),
                         [(np.int64, 2**53, 2**53 + 1), (np.uint64, 2**64 - 2, 2**64 - 1)])
def test_wide_integer_outputs_compare_exactly(dtype, actual, expected):
    assert not cmp([actual], [expected], dtype=dtype).ok


def test_max_rel_norm_alone_can_fail():
    # Every element is within atol, but the whole output is biased by 10 %.
    result = cmp([1.1] * 4, [1.0] * 4, atol=0.2, max_rel_norm=0.05)
    assert result.mismatches == 0
    assert result.rel_norm == pytest.approx(0.1)
    assert not result.ok
    assert result.rel_norm_limit == 0.05
    text = result.describe()
    assert "relative norm error 0.1 exceeds max_rel_norm 0.05" in text


def test_max_rel_norm_met():
    result = cmp([1.01] * 4, [1.0] * 4, atol=0.2, max_rel_norm=0.05)
    assert result.ok and result.rel_norm == pytest.approx(0.01)


def test_relative_norm_is_always_reported():
    result = cmp([3.0, 4.0], [3.0, 4.5], atol=1.0)
    assert result.ok
    assert result.rel_norm == pytest.approx(0.5 / np.hypot(3.0, 4.5))
    assert result.max_abs_error == pytest.approx(0.5)


def test_relative_norm_of_an_all_zero_expected_output():
    assert cmp([0.0, 0.0], [0.0, 0.0]).rel_norm == 0.0
    result = cmp([0.0, 1e-3], [0.0, 0.0], atol=1e-2)
    assert result.ok and result.rel_norm == inf


def test_worst_index_is_multi_dimensional_with_a_shape():
    expected = np.zeros((2, 3))
    actual = expected.copy()
    actual[0, 2] = 0.5
    actual[1, 1] = 5.0
    result = check_output("y", actual.reshape(-1), expected.reshape(-1), Tolerance(atol=0.1), shape=(2, 3))
    assert result.mismatches == 2
    assert result.worst_index == (1, 1)
    assert result.worst_expected == 0.0 and result.worst_actual == 5.0
    assert result.worst_allowed == pytest.approx(0.1)


def test_worst_index_is_flat_without_a_shape_or_with_a_wrong_one():
    actual = np.zeros(6)
    actual[4] = 1.0
    assert check_output("y", actual, np.zeros(6), Tolerance()).worst_index == (4,)
    assert check_output("y", actual, np.zeros(6), Tolerance(), shape=(4, 2)).worst_index == (4,)


def test_worst_is_the_element_furthest_beyond_its_allowance():
    # Element 0 is off by 10 with allowance 100 (ok); element 1 off by 1 with allowance ~0.1; element 2 off by 2.
    result = cmp([1010.0, 2.0, 5.0], [1000.0, 1.0, 3.0], atol=0.0, rtol=0.1)
    assert result.mismatches == 2
    assert result.worst_index == (1,)  # 1 / 0.1 = 10 times its allowance, more than 2 / 0.3


def test_non_finite_mismatches_are_worst():
    result = cmp([100.0, nan], [1.0, 1.0], atol=0.1)
    assert result.worst_index == (1,)


def test_size_mismatch():
    result = check_output("y", np.zeros(5), np.zeros(6), Tolerance(atol=1.0))
    assert not result.ok
    assert result.total == 6 and result.mismatches == 6
    assert result.rel_norm == inf
    assert "6 of 6 elements outside tolerance" in result.describe()


def test_compare_accepts_multi_dimensional_arrays():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert check_output("y", a, a.reshape(-1), Tolerance()).ok


def test_describe_a_failure():
    expected = np.zeros((4, 5), dtype=np.float32)
    actual = expected.copy()
    actual[2, 3] = 0.75
    actual[0, 0] = 0.001
    tol = Tolerance(atol=0.01, rtol=0.001)
    text = check_output("y", actual, expected, tol, shape=(4, 5)).describe()
    lines = text.splitlines()
    assert lines[0] == "output 'y': 1 of 20 elements outside tolerance (atol=0.01, rtol=0.001, nan=fail)"
    assert "worst at index [2, 3]: expected 0.0, actual 0.75, |diff| 0.75 > allowed 0.01" in text
    assert "relative norm error" in lines[-1] and "max |error| 0.75" in lines[-1]


def test_describe_a_flat_index_and_unwritten_elements():
    result = check_output("out", np.array([1.0, nan]), np.array([1.0, 2.0]), Tolerance(atol=0.5), unwritten=1)
    text = result.describe()
    assert "1 of 2 elements outside tolerance" in text
    assert "1 elements were never written by the kernel" in text
    assert "worst at index 1: expected 2.0, actual nan" in text


def test_describe_a_pass():
    text = cmp([1.0, 2.0], [1.0, 2.0]).describe()
    assert text.startswith("output 'y': 2 elements within tolerance")
    assert "relative norm 0" in text


def test_describe_names_the_rel_norm_limit():
    text = cmp([1.0, 3.0], [1.0, 2.0], atol=0.1, max_rel_norm=0.5).describe()
    assert "(limit 0.5)" in text


def test_matching_infinities_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cmp([inf, -inf, 1.0], [inf, -inf, 1.0]).ok


def test_finite_values_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not cmp([1.0, 2.0, 0.0], [1.0, 3.0, 0.0], rtol=0.1).ok
