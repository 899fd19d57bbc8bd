"""`cases:` (suite/check_cases.py): each name once, a performance case, a value of its type for each scalar."""

from __future__ import annotations

from helpers import SUITE_YAML, line_of, load_text, problems_of, replace_once


def test_duplicate_case_names(tmp_path):
    text = replace_once(SUITE_YAML, "{name: perf,", "{name: small,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'kind: performance')}: cases[1].name: case name 'small' is used twice" in message


def test_a_suite_needs_a_performance_case(tmp_path):
    text = replace_once(SUITE_YAML, "kind: performance", "kind: correctness")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'name: small')}: cases: at least one non-holdout case needs kind: performance" in message


def test_a_holdout_performance_case_does_not_count(tmp_path):
    text = replace_once(SUITE_YAML, "kind: performance,", "kind: performance, holdout: true,")
    _, message = problems_of(tmp_path, text)
    assert "needs kind: performance" in message


def test_int_scalar_given_a_fraction(tmp_path):
    text = replace_once(SUITE_YAML, "rows: 3,", "rows: 2.5,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'rows: 2.5')}: cases[0].scalars.rows: rows is int32, so its value must be a whole number, not 2.5" in message


def test_float_scalar_accepts_a_fraction(tmp_path):
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: cols, scalar: int32}\n  - {name: alpha, scalar: float32}")
    text = text.replace("cols: 50}", "cols: 50, alpha: 2.5}").replace("cols: 256}", "cols: 256, alpha: 1}")
    suite = load_text(tmp_path, text)
    assert suite.case("small").scalars["alpha"] == 2.5


def test_case_missing_a_scalar_and_giving_an_unknown_one(tmp_path):
    text = replace_once(SUITE_YAML, "scalars: {rows: 3, cols: 50}", "scalars: {rows: 3, colz: 50}")
    _, message = problems_of(tmp_path, text)
    assert "cases[0].scalars: scalar 'cols' has no value in case 'small'" in message
    assert "cases[0].scalars.colz: 'colz' is not a scalar parameter of the signature" in message


def test_int_scalar_out_of_range(tmp_path):
    text = replace_once(SUITE_YAML, "cols: 256}", "cols: 3000000000}")
    _, message = problems_of(tmp_path, text)
    assert "cases[1].scalars.cols" in message
