"""`signature:` (suite/check_signature.py): known types, sizes over the scalars, each name once, an output."""

from __future__ import annotations

from cudagate_harness.protocol import DTYPES

from helpers import SUITE_YAML, line_of, problems_of, replace_once


def test_unknown_dtype(tmp_path):
    """The schema takes any name; the loader refuses one not in DTYPES, listing them (the one list)."""
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: cols, scalar: int31}")
    _, message = problems_of(tmp_path, text)
    assert (f"line {line_of(text, 'name: cols')}: signature[3].scalar: 'int31' is not a dtype cudagate knows; "
            f"write one of {', '.join(DTYPES)}") in message


def test_size_expression_with_an_unknown_name(tmp_path):
    text = replace_once(SUITE_YAML, "{name: x, buffer: float32, intent: in, size: rows*cols,",
                        "{name: x, buffer: float32, intent: in, size: rows*colz,")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'colz')}: signature[0].size:" in message
    assert "'rows*colz' uses colz" in message
    assert "scalars: cols, rows" in message


def test_duplicate_param_names(tmp_path):
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: rows, scalar: int64}")
    _, message = problems_of(tmp_path, text)
    assert f"line {line_of(text, 'scalar: int64')}: signature[3].name: parameter name 'rows' is used twice" in message


def test_a_suite_needs_an_output(tmp_path):
    text = replace_once(SUITE_YAML, "intent: out", "intent: in")
    _, message = problems_of(tmp_path, text)
    assert "no buffer has intent out or inout" in message
